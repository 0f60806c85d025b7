//! Servers dlock must refuse or read right: one that ignores conditional writes (78, never a
//! silent unconditional write), and what an uncontended run costs in requests on one that
//! honours them.

use super::fake::FakeS3;
use crate::support::*;

/// A server that takes every write: GET finds nothing, a listing is empty, every PUT succeeds
/// whatever its condition.
fn ignores_conditions(method: &str, path: &str) -> (u16, Vec<(String, String)>, String) {
    match method {
        "PUT" => (200, vec![("ETag".into(), "\"0123\"".into())], String::new()),
        "DELETE" => (204, Vec::new(), String::new()),
        _ if path.contains("list-type=2") => (
            200,
            Vec::new(),
            "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>".into(),
        ),
        _ => (
            404,
            vec![("Content-Type".into(), "application/xml".into())],
            "<Error><Code>NoSuchKey</Code></Error>".into(),
        ),
    }
}

#[test]
fn a_server_that_ignores_conditional_writes_is_refused_with_78() {
    let fake = FakeS3::start(ignores_conditions);
    let env = TestEnv::new(&fake);
    let out = env.run(["run", "--url", &fake.url(), &lock_name("c"), "touch", "ran"]);
    assert_fails(&out, 78, "the server ignores conditional writes");
    assert!(!env.path("ran").exists(), "the command ran");
    let out = env.run(["check", "--url", &fake.url()]);
    assert_fails(&out, 78, "the server ignores conditional writes");
}

/// A server that does not implement the condition headers says so with 501.
#[test]
fn a_server_without_conditional_writes_is_refused_with_78() {
    let fake = FakeS3::start(|method, _| match method {
        "PUT" => (
            501,
            Vec::new(),
            "<Error><Code>NotImplemented</Code></Error>".into(),
        ),
        _ => (404, Vec::new(), "<Error><Code>NoSuchKey</Code></Error>".into()),
    });
    let env = TestEnv::new(&fake);
    let out = env.run(["run", "--url", &fake.url(), &lock_name("c"), "touch", "ran"]);
    assert_fails(&out, 78, "NotImplemented (HTTP 501)");
    assert!(!env.path("ran").exists(), "the command ran");
}

/// The requests one run sends, as `-vv` logs them.
fn requests(out: &std::process::Output) -> Vec<String> {
    stderr_of(out)
        .lines()
        .filter_map(|l| l.split_once("s3 request: ").map(|(_, r)| r.to_owned()))
        .collect()
}

/// Uncontended, a run costs three requests: read, write, release. The run that creates a
/// lock's object adds the two writes that must fail on a server that honours conditions.
#[test]
fn an_uncontended_run_costs_three_requests() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("cost");
    let out = env.run(["-vv", "run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let first = requests(&out);
    assert_eq!(first.len(), 5, "{first:?}");
    assert!(first[2].ends_with("412") && first[3].ends_with("412"), "{first:?}");
    let out = env.run(["-vv", "run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let then = requests(&out);
    assert_eq!(then.len(), 3, "{then:?}");
    assert!(then[0].starts_with("GET ") && then[1].starts_with("PUT "), "{then:?}");
}

/// The secret key and the session token appear in no message, log line, report or status.
#[test]
fn secrets_never_appear_in_output() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("secret");
    let token = "session-token-never-shown-Zq9";
    let report = env.path("report.jsonl");
    let mut texts = Vec::new();
    for args in [
        vec!["-vv", "run", "--report", report.to_str().expect("utf-8"), &lock, "true"],
        vec!["-vv", "status", "--json", &lock],
        vec!["-vv", "list", "--json"],
        vec!["-vv", "check"],
        vec!["-vv", "release", "--force", &lock],
    ] {
        let out = output_within(
            {
                let mut c = env.dlock(&args);
                c.env("AWS_SESSION_TOKEN", token);
                c
            },
            PATIENCE,
        );
        // `status` of a free lock is 1.
        assert!(matches!(out.status.code(), Some(0 | 1)), "{args:?}: {}", describe(&out));
        texts.push(describe(&out));
    }
    texts.push(std::fs::read_to_string(&report).expect("the report"));
    for text in texts {
        for secret in [SECRET_ACCESS_KEY, token] {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
    }
    server.assert_nothing_stored_contains(SECRET_ACCESS_KEY);
}

/// A throttled request (503 SlowDown) is tried again with backoff, within the server's time
/// to answer, also under `--no-wait`: the run goes through.
#[test]
fn throttling_is_retried_within_the_wait() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let proxy = super::fake::SlowDown::start(server.port, 3);
    let url = server.url_via(proxy.port);
    let out = env.run(["-vv", "run", "--no-wait", "--url", &url, &lock_name("slow"), "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    let throttled = requests(&out).iter().filter(|r| r.ends_with("-> 503")).count();
    assert_eq!(throttled, 3, "{}", describe(&out));
}

/// A server that answers every write with 409 ConditionalRequestConflict (a lost race, read
/// again and retried) is given up when the wait is over, never tried in a tight loop for ever.
#[test]
fn conflicts_are_retried_with_backoff_within_the_wait() {
    let fake = FakeS3::start(|method, _| match method {
        "PUT" => (
            409,
            Vec::new(),
            "<Error><Code>ConditionalRequestConflict</Code></Error>".into(),
        ),
        _ => (404, Vec::new(), "<Error><Code>NoSuchKey</Code></Error>".into()),
    });
    let env = TestEnv::new(&fake);
    let started = std::time::Instant::now();
    let out = env.run(["-vv", "run", "--wait", "3s", "--url", &fake.url(), &lock_name("c"), "touch", "ran"]);
    assert_fails(&out, 69, "the lock object changed under");
    assert!(started.elapsed() < std::time::Duration::from_secs(3) + PAST_WAIT);
    let writes = requests(&out).iter().filter(|r| r.ends_with("-> 409")).count();
    assert!((6..200).contains(&writes), "{writes} writes: {}", describe(&out));
    assert!(!env.path("ran").exists());
}
