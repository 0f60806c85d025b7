//! What [`Round::agreed`] makes of the sentinels' answers: a master only when a majority of
//! the group names it (the group as the sentinels know it, never smaller than the URL's distinct
//! sentinels), and when none does, the exit class and the way out.

use super::round::{none_answered, Answer, Found, Round};
use crate::error::Error;

fn failed(reason: &str) -> Answer {
    Answer::Failed(reason.to_owned(), None)
}

fn names(port: u16, epoch: u64, others: usize) -> Answer {
    Answer::Master {
        addr: ("127.0.0.1".to_owned(), port),
        epoch,
        others,
        fields: Vec::new(),
        id: None,
        peers: Vec::new(),
    }
}

fn round(answers: Vec<Answer>, listed: usize) -> Round {
    Round {
        answers,
        listed,
        found: Vec::new(),
    }
}

#[test]
fn one_sentinel_of_three_is_not_enough() {
    let one = round(vec![names(6379, 1, 2), failed("s2: refused")], 2);
    let Err(Error::Unavailable(message)) = one.agreed("m", "redis-sentinel://h/0#m") else {
        panic!("one of three sentinels was enough");
    };
    assert!(message.contains("only 1 of the 3 sentinels"), "{message}");
    // The URL listing one sentinel of three: said so.
    let listed_one = round(vec![names(6379, 1, 2)], 1);
    let Err(Error::Unavailable(message)) = listed_one.agreed("m", "d") else {
        panic!("one listed sentinel of three was enough");
    };
    assert!(message.contains("lists only 1 of them"), "{message}");
}

#[test]
fn a_majority_naming_one_master_wins_over_a_stale_or_foreign_minority() {
    let answers = vec![names(6380, 2, 2), names(6379, 1, 2), names(6380, 2, 2)];
    assert_eq!(
        round(answers, 3).agreed("m", "d").ok(),
        Some((("127.0.0.1".to_owned(), 6380), 2))
    );
    // A lone sentinel that knows no others cannot outvote the URL's other two, silent.
    let lone = round(
        vec![names(7000, 9, 0), failed("s2: refused"), failed("s3")],
        3,
    );
    assert!(lone.agreed("m", "d").is_err());
    // Two of three agree, the third says another master: it is outvoted, whatever its epoch.
    let split = round(
        vec![names(6379, 1, 2), names(6379, 1, 2), names(6380, 5, 2)],
        3,
    );
    assert_eq!(split.agreed("m", "d").ok().map(|(a, _)| a.1), Some(6379));
    // One each: no majority, said so.
    let Err(Error::Unavailable(message)) =
        round(vec![names(6379, 1, 2), names(6380, 2, 2), failed("s3")], 3).agreed("m", "d")
    else {
        panic!("a split vote named a master");
    };
    assert!(message.contains("no majority"), "{message}");
}

#[test]
fn reset_plain_connections_suggest_rediss_sentinel() {
    let reset = [
        failed("127.0.0.1:26379: Connection reset by peer (os error 104)"),
        failed("127.0.0.1:26380: Connection refused (os error 111)"),
    ];
    let Error::Unavailable(message) = none_answered(&reset, "m", "redis-sentinel://h/0#m") else {
        panic!("not unavailable");
    };
    assert!(message.contains("use rediss-sentinel://"), "{message}");
    // Already TLS, or no reset: no such hint.
    let Error::Unavailable(message) = none_answered(&reset, "m", "rediss-sentinel://h/0#m") else {
        panic!("not unavailable");
    };
    assert!(!message.contains("use rediss-sentinel://"), "{message}");
    let refused = [failed("127.0.0.1:26380: Connection refused (os error 111)")];
    let Error::Unavailable(message) = none_answered(&refused, "m", "redis-sentinel://h/0#m") else {
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
    let answers = vec![tls(26379), failed("127.0.0.1:26380: no answer within 1s")];
    assert!(matches!(
        round(answers, 2).agreed("m", "rediss-sentinel://h/0#m"),
        Err(Error::Config(m)) if m.contains("TLS")
    ));
}

fn names_as(port: u16, id: &str) -> Answer {
    let Answer::Master {
        addr,
        epoch,
        others,
        fields,
        peers,
        ..
    } = names(port, 1, 2)
    else {
        unreachable!()
    };
    Answer::Master {
        addr,
        epoch,
        others,
        fields,
        id: Some(id.to_owned()),
        peers,
    }
}

#[test]
fn one_sentinel_answering_at_two_addresses_is_one_vote() {
    // Listed twice (127.0.0.1 and ::1): the same run id twice is one sentinel of three.
    let twice = round(vec![names_as(6379, "a"), names_as(6379, "a")], 2);
    let Err(Error::Unavailable(message)) = twice.agreed("m", "d") else {
        panic!("one sentinel answering twice was a majority");
    };
    assert!(message.contains("only 1 of the 3 sentinels"), "{message}");
    // Two sentinels of three: a majority.
    let two = round(vec![names_as(6379, "a"), names_as(6379, "b")], 2);
    assert_eq!(two.agreed("m", "d").ok().map(|(a, _)| a.1), Some(6379));
    // The URL's two entries count as one when they answer with one run id.
    let answers = vec![(0, names_as(6379, "a")), (1, names_as(6379, "a"))];
    assert_eq!(super::listed_count(2, 2, &answers), 1);
    // A sentinel found through them with that run id is not one of the URL's.
    let answers = vec![(0, names_as(6379, "a")), (2, names_as(6379, "a"))];
    assert_eq!(super::listed_count(2, 2, &answers), 2);
}

#[test]
fn found_sentinels_that_do_not_answer_are_named_with_the_way_out() {
    let mut cut_off = round(
        vec![
            names_as(6379, "a"),
            failed("127.0.0.1:26380 (found through 127.0.0.1:26379): no answer within 2s"),
        ],
        1,
    );
    cut_off.found = vec![
        Found {
            label: "127.0.0.1:26380".into(),
            through: "127.0.0.1:26379".into(),
            answered: false,
        },
        Found {
            label: "127.0.0.1:26381".into(),
            through: "127.0.0.1:26379".into(),
            answered: false,
        },
    ];
    let Err(Error::Unavailable(message)) = cut_off.agreed("m", "d") else {
        panic!("one of three was enough");
    };
    assert!(message.contains("only 1 of the 3 sentinels"), "{message}");
    assert!(
        message.contains("found through 127.0.0.1:26379"),
        "{message}"
    );
    assert!(message.contains("announce-ip"), "{message}");
    assert!(!message.contains("list at least"), "{message}");
}
