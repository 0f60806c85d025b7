//! What [`super::newest`] makes of the sentinels' answers when none names a master: the exit
//! class, and the way out when plain text met sentinels that speak only TLS.

use super::{newest, Answer};
use crate::error::Error;

fn failed(reason: &str) -> Answer {
    Answer::Failed(reason.to_owned(), None)
}

#[test]
fn reset_plain_connections_suggest_rediss_sentinel() {
    let reset = [
        failed("127.0.0.1:26379: Connection reset by peer (os error 104)"),
        failed("127.0.0.1:26380: Connection refused (os error 111)"),
    ];
    let Err(Error::Unavailable(message)) = newest(&reset, "m", "redis-sentinel://h/0#m") else {
        panic!("not unavailable");
    };
    assert!(message.contains("use rediss-sentinel://"), "{message}");
    // Already TLS, or no reset: no such hint.
    let Err(Error::Unavailable(message)) = newest(&reset, "m", "rediss-sentinel://h/0#m") else {
        panic!("not unavailable");
    };
    assert!(!message.contains("use rediss-sentinel://"), "{message}");
    let refused = [failed("127.0.0.1:26380: Connection refused (os error 111)")];
    let Err(Error::Unavailable(message)) = newest(&refused, "m", "redis-sentinel://h/0#m") else {
        panic!("not unavailable");
    };
    assert!(!message.contains("rediss"), "{message}");
}

#[test]
fn a_tls_failure_of_every_sentinel_is_a_configuration_error() {
    let tls = |port: u16| {
        Answer::Failed(
            format!("127.0.0.1:{port}: invalid peer certificate: UnknownIssuer"),
            Some(Error::Config(format!(
                "TLS with sentinel 127.0.0.1:{port} failed"
            ))),
        )
    };
    let answers = [tls(26379), failed("127.0.0.1:26380: no answer within 1s")];
    assert!(matches!(
        newest(&answers, "m", "rediss-sentinel://h/0#m"),
        Err(Error::Config(m)) if m.contains("TLS")
    ));
}
