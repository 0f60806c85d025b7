//! What answers at a TCP address, for the message of a client that got no answer in its own
//! protocol, or an answer it could not read: a MySQL URL pointed at a Redis port waits for a
//! greeting that never comes, a Redis client's first command at a ZooKeeper port gets the
//! connection closed. Instead of "no answer within --wait" or "broken pipe", the user reads
//! "HOST:PORT does not look like a MySQL server (it answers like a Redis server)"
//! ([`crate::wording::not_a`]).
//!
//! A few connections at once, each sending the first bytes one kind of server answers in a
//! way of its own: `PING\r\n` (Redis, memcached, an HTTP/1 server), PostgreSQL's TLS request
//! (one byte back, `S` or `N`), ZooKeeper's `srvr` command, and an HTTP request for
//! `/version` (etcd names itself there). A greeting a server sends unasked (MySQL, SSH) comes
//! back on any of them. Bounded by the caller's budget; `None` when nothing tells. The
//! servers read nothing of these as a request to change anything.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long the answer to one probe may take, from its connection.
const LISTEN: Duration = Duration::from_millis(500);

/// The most of an answer that is read.
const ANSWER_BYTES: usize = 1024;

/// What an answer tells of the server that gave it.
type Reader = fn(&[u8]) -> Option<&'static str>;

/// The first probes, each on a connection of its own: what is sent, and what the answer
/// tells. None of these servers takes them for anything but a bad request.
const PROBES: [(&[u8], Reader); 3] = [
    (b"PING\r\n", answer_to_ping),
    // PostgreSQL's SSLRequest: length 8, code 80877103.
    (&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f], answer_to_ssl_request),
    (b"srvr", answer_to_srvr),
];

/// Asked only when the first probes found nothing but an HTTP server: Redis takes an HTTP
/// request for an attack (and logs it), etcd names itself in the answer.
const HTTP_PROBE: &[u8] = b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// What kind of server answers at `host:port` ("a Redis server"), if it says so within
/// `budget`.
pub async fn what_answers(host: &str, port: u16, budget: Duration) -> Option<&'static str> {
    tokio::time::timeout(budget, identify(host, port))
        .await
        .ok()
        .flatten()
}

async fn identify(host: &str, port: u16) -> Option<&'static str> {
    let mut probes = tokio::task::JoinSet::new();
    for (bytes, read) in PROBES {
        let host = host.to_owned();
        probes.spawn(async move {
            let answer = probe(&host, port, bytes).await?;
            greeting(&answer).or_else(|| read(&answer))
        });
    }
    // The first answer that names a server ends the others (dropping the set aborts them).
    let mut seen = None;
    // Bounded: one result per probe, each within LISTEN.
    while let Some(done) = probes.join_next().await {
        match done.ok().flatten() {
            Some(HTTP) => seen = Some(HTTP),
            Some(what) => return Some(what),
            None => {}
        }
    }
    let http = probe(host, port, HTTP_PROBE).await;
    http.as_deref()
        .and_then(|answer| greeting(answer).or_else(|| answer_to_http(answer)))
        .or(seen)
}

/// What other kind of server than `ours` ("a MySQL server") answers at `host:port`, asked
/// while a client's connection attempt is slow to get an answer: after a third of the time
/// left before `deadline` (at most a second), the probes within what is left then. `None`
/// when it answers like `ours` or says nothing: the attempt goes on.
pub async fn other_server(
    host: &str,
    port: u16,
    deadline: tokio::time::Instant,
    ours: &str,
) -> Option<&'static str> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    tokio::time::sleep((left / 3).min(Duration::from_secs(1))).await;
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    what_answers(host, port, left)
        .await
        .filter(|what| *what != ours)
}

/// What other kind of server than `ours` answers at `host:port` within `budget` (at most
/// [`AFTER_FAILURE`]), asked after a client's first exchange failed in a way a server of
/// another kind causes (the connection closed or reset at the first request, an answer that
/// could not be read). `None` when it answers like `ours` or says nothing: the failure is
/// what it said.
pub async fn other_than(
    host: &str,
    port: u16,
    budget: Duration,
    ours: &str,
) -> Option<&'static str> {
    what_answers(host, port, budget.min(AFTER_FAILURE))
        .await
        .filter(|what| *what != ours)
}

/// The longest [`other_than`] asks: both rounds of probes.
pub const AFTER_FAILURE: Duration = Duration::from_millis(1200);

/// An HTTP/1 server that did not say it is etcd.
const HTTP: &str = "an HTTP server";

/// Send `bytes` on a connection of its own and read what comes back within [`LISTEN`] (up
/// to [`ANSWER_BYTES`]; a server that closes or resets the connection at once has said
/// nothing).
async fn probe(host: &str, port: u16, bytes: &[u8]) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + LISTEN;
    let mut stream = tokio::time::timeout_at(deadline, TcpStream::connect((host, port)))
        .await
        .ok()?
        .ok()?;
    tokio::time::timeout_at(deadline, stream.write_all(bytes))
        .await
        .ok()?
        .ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    // Bounded: each read adds at least a byte, up to ANSWER_BYTES, until the deadline.
    while answer.len() < ANSWER_BYTES {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
        // An HTTP answer is read to its end (etcd names itself in the body); the others
        // tell by their first bytes.
        if !answer.starts_with(b"HTTP/") {
            break;
        }
    }
    (!answer.is_empty()).then_some(answer)
}

/// A server that speaks first, by its greeting.
fn greeting(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"SSH-") {
        return Some("an SSH server");
    }
    // A MySQL/MariaDB handshake packet: 3-byte length, sequence 0, protocol version 10.
    if bytes.len() > 4 && bytes[3] == 0 && bytes[4] == 10 {
        return Some("a MySQL server");
    }
    None
}

/// A server that waits for the client, by its answer to `PING\r\n`.
fn answer_to_ping(bytes: &[u8]) -> Option<&'static str> {
    let redis: [&[u8]; 4] = [b"+PONG", b"-NOAUTH", b"-ERR", b"-DENIED"];
    if redis.iter().any(|start| bytes.starts_with(start)) {
        return Some("a Redis server");
    }
    if bytes.starts_with(b"ERROR") || bytes.starts_with(b"CLIENT_ERROR") {
        return Some("a memcached server");
    }
    if bytes.starts_with(b"HTTP/") {
        return Some(HTTP);
    }
    postgres_error(bytes)
}

/// PostgreSQL answers its TLS request with one byte: `S` (go ahead) or `N` (no TLS here).
fn answer_to_ssl_request(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        b"S" | b"N" => Some("a PostgreSQL server"),
        _ => postgres_error(bytes),
    }
}

/// ZooKeeper answers its `srvr` command with its version, or, where the command is not
/// allowed (`4lw.commands.whitelist`), says so.
fn answer_to_srvr(bytes: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(bytes);
    (text.starts_with("Zookeeper version") || text.contains("is not in the whitelist"))
        .then_some("a ZooKeeper server")
}

/// etcd answers `GET /version` with its version in JSON; any other HTTP server is one.
fn answer_to_http(bytes: &[u8]) -> Option<&'static str> {
    if !bytes.starts_with(b"HTTP/") {
        return None;
    }
    let text = String::from_utf8_lossy(bytes);
    Some(if text.contains("\"etcdserver\"") {
        "an etcd server"
    } else {
        HTTP
    })
}

/// An ErrorResponse ('E', then a 4-byte length, then fields starting with 'S'), as
/// PostgreSQL sends to a startup packet it cannot read.
fn postgres_error(bytes: &[u8]) -> Option<&'static str> {
    (bytes.len() > 5 && bytes[0] == b'E' && bytes[5] == b'S').then_some("a PostgreSQL server")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_and_answers_name_the_server() {
        assert_eq!(greeting(b"SSH-2.0-OpenSSH_9.2"), Some("an SSH server"));
        assert_eq!(
            greeting(&[0x4a, 0, 0, 0, 10, b'8', b'.']),
            Some("a MySQL server")
        );
        assert_eq!(greeting(b""), None);
        assert_eq!(answer_to_ping(b"+PONG\r\n"), Some("a Redis server"));
        assert_eq!(
            answer_to_ping(b"-NOAUTH Authentication required.\r\n"),
            Some("a Redis server")
        );
        assert_eq!(answer_to_ping(b"ERROR\r\n"), Some("a memcached server"));
        assert_eq!(
            answer_to_ping(b"HTTP/1.1 400 Bad Request\r\n"),
            Some("an HTTP server")
        );
        assert_eq!(
            answer_to_ping(b"E\0\0\0\x5aSFATAL\0"),
            Some("a PostgreSQL server")
        );
        assert_eq!(answer_to_ping(b"\0\0\0\x10"), None);
        assert_eq!(answer_to_ssl_request(b"N"), Some("a PostgreSQL server"));
        assert_eq!(answer_to_ssl_request(b"NO"), None);
        assert_eq!(
            answer_to_srvr(b"Zookeeper version: 3.8.4-9316c2a7a97e1666d8f4593f34dd6fc36ecc436c"),
            Some("a ZooKeeper server")
        );
        assert_eq!(
            answer_to_srvr(b"srvr is not executed because it is not in the whitelist.\n"),
            Some("a ZooKeeper server")
        );
        assert_eq!(
            answer_to_http(
                b"HTTP/1.1 200 OK\r\n\r\n{\"etcdserver\":\"3.5.17\",\"etcdcluster\":\"3.5.0\"}"
            ),
            Some("an etcd server")
        );
        assert_eq!(
            answer_to_http(b"HTTP/1.1 404 Not Found\r\n\r\n"),
            Some("an HTTP server")
        );
    }

    /// Against a listener that answers like Redis, on a free loopback port.
    #[tokio::test]
    async fn a_redis_like_listener_is_named() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let server = tokio::spawn(async move {
            // One connection per probe; only the PING is answered.
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 16];
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    if &buf[..n] == b"PING\r\n" {
                        let _ = socket.write_all(b"+PONG\r\n").await;
                    }
                });
            }
        });
        let what = what_answers("127.0.0.1", port, Duration::from_secs(5)).await;
        assert_eq!(what, Some("a Redis server"));
        server.abort();
    }
}
