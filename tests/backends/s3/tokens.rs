//! The token counter lives in the lock object, which dlock never deletes: tokens strictly
//! increase across releases, `release --force` and expiries, and every write makes a body
//! (and so an ETag) no earlier write made.

use crate::support::*;

/// The lock object of `lock` under the test's prefix, parsed.
fn object(server: &Shared<S3Server>, lock: &str) -> serde_json::Value {
    let prefix = server.prefix().expect("a shared server's prefix");
    let key = format!("{prefix}/{lock}");
    let body = server.object(&key).unwrap_or_else(|| panic!("no object {key}"));
    serde_json::from_slice(&body).expect("a JSON body")
}

#[test]
fn tokens_increase_across_release_force_and_expiry_and_the_object_stays() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("tokens");
    let first = env.token(&lock);
    let released = object(&server, &lock);
    assert_eq!(released["holders"].as_array().map(Vec::len), Some(0), "{released}");
    assert_eq!(released["token"].as_u64(), Some(first), "{released}");
    let second = env.token(&lock);
    assert!(second > first, "{second} after {first}");

    // release --force keeps the counter.
    let holder = env.hold(&lock, &[]);
    let held = env.status_json(&lock)["holders"][0]["token"].as_u64().expect("a token");
    assert!(held > second);
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    drop(holder);
    let forced = object(&server, &lock);
    assert_eq!(forced["token"].as_u64(), Some(held), "{forced}");
    let third = env.token(&lock);
    assert!(third > held, "{third} after {held}");

    // A killed holder's entry expires on the server's clock; the next token is still higher.
    let mut killed = env.hold(&lock, &[]);
    let dead = env.status_json(&lock)["holders"][0]["token"].as_u64().expect("a token");
    killed.signal(nix::sys::signal::Signal::SIGKILL);
    killed.wait();
    let out = env.run([
        "run", "--wait", "30s", &lock, "sh", "-c", "echo $DLOCK_FENCING_TOKEN",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let after: u64 = stdout_of(&out).trim().parse().expect("a token");
    assert!(after > dead, "{after} after the expired {dead}");
}

/// Every write carries a fresh nonce: the same holder taking the same lock again, with the
/// same metadata, never writes a body (an ETag) that an earlier write wrote.
#[test]
fn no_two_writes_make_the_same_body() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("bodies");
    let mut seen = std::collections::HashSet::new();
    let mut saw = |body: serde_json::Value| {
        assert!(body["nonce"].as_str().is_some_and(|n| n.len() >= 32), "{body}");
        assert!(seen.insert(body.to_string()), "a body came back: {body}");
    };
    for _ in 0..3 {
        env.token(&lock);
        saw(object(&server, &lock));
        let holder = env.hold(&lock, &[]);
        saw(object(&server, &lock));
        let out = env.run(["release", "--force", &lock]);
        assert!(out.status.success(), "{}", describe(&out));
        saw(object(&server, &lock));
        drop(holder);
    }
}
