//! The bucket: created with the settings a lock needs when it is missing; one that cannot
//! give a lease (no per-key TTLs, no markers of expired keys) refused with 78 naming the
//! setting; credentials never shown.

use crate::support::*;

#[test]
fn a_missing_bucket_is_created_with_per_key_ttls_markers_and_history_one() {
    let server = NatsServer::start();
    let env = TestEnv::new(&server);
    let url = format!("{}/made_by_dlock", server.url());
    let out = env.run(["run", "--url", &url, &lock_name("b"), "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let info = server.stream_info("made_by_dlock");
    let config = &info["config"];
    assert_eq!(config["allow_msg_ttl"], true, "{info}");
    assert!(config["subject_delete_marker_ttl"].as_u64().unwrap_or(0) > 0, "{info}");
    assert_eq!(config["max_msgs_per_subject"], 1, "{info}");
    assert_eq!(config["num_replicas"], 1, "{info}");
}

#[test]
fn a_bucket_without_per_key_ttls_is_refused_with_78_naming_the_setting() {
    let server = NatsServer::start();
    let env = TestEnv::new(&server);
    server.create_stream(
        "plain",
        r#"{"name":"KV_plain","subjects":["$KV.plain.>"],"max_msgs_per_subject":1,"allow_rollup_hdrs":true,"deny_delete":true,"allow_direct":true,"discard":"new","storage":"file","num_replicas":1}"#,
    );
    let url = format!("{}/plain", server.url());
    let out = env.run(["run", "--url", &url, &lock_name("b"), "touch", "ran"]);
    assert_fails(&out, 78, "allow_msg_ttl");
    assert!(!env.path("ran").exists(), "the command ran");
    let out = env.run(["check", "--url", &url]);
    assert_fails(&out, 78, "allow_msg_ttl");
}

/// Without markers of expired keys a waiter would not see a dead holder's key go: a run that
/// has to wait is refused (78, naming the setting), and so is `check`. (A run that finds the
/// lock free takes it in one write: its key has its TTL all the same.)
#[test]
fn a_bucket_without_expiry_markers_is_refused_to_waiters_with_78_naming_the_setting() {
    let server = NatsServer::start();
    let env = TestEnv::new(&server);
    server.create_stream(
        "nomarkers",
        r#"{"name":"KV_nomarkers","subjects":["$KV.nomarkers.>"],"max_msgs_per_subject":1,"allow_rollup_hdrs":true,"deny_delete":true,"allow_direct":true,"discard":"new","storage":"file","num_replicas":1,"allow_msg_ttl":true}"#,
    );
    let url = format!("{}/nomarkers", server.url());
    let lock = lock_name("b");
    let _holder = env.hold(&lock, &["--url", &url]);
    let out = env.run(["run", "--url", &url, "--wait", "30s", &lock, "touch", "ran"]);
    assert_fails(&out, 78, "subject_delete_marker_ttl");
    assert!(!env.path("ran").exists(), "the command ran");
    let out = env.run(["check", "--url", &url]);
    assert_fails(&out, 78, "subject_delete_marker_ttl");
}

/// A server that checks a user and password: a wrong password is 77, and no password is
/// ever shown (not the URL's, not in the command's environment).
#[test]
fn refused_credentials_are_77_and_no_password_is_ever_shown() {
    let server = NatsServer::start_with(&["--user", "locker", "--pass", "s3cr3t-nats-Qx7"]);
    let env = TestEnv::new(&server);
    let good = format!("nats://locker:s3cr3t-nats-Qx7@127.0.0.1:{}", server.port);
    let bad = format!("nats://locker:wrong-nats-Zq9@127.0.0.1:{}", server.port);
    let out = env.run(["run", "--url", &bad, &lock_name("c"), "touch", "ran"]);
    assert_fails(&out, 77, "refused the credentials");
    assert!(!stderr_of(&out).contains("wrong-nats-Zq9"), "{}", describe(&out));
    assert!(!env.path("ran").exists(), "the command ran");
    let out = env.run([
        "run", "-v", "--url", &good, &lock_name("c"), "sh", "-c", "env; echo $DLOCK_URL",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let all = format!("{}{}", stdout_of(&out), stderr_of(&out));
    assert!(!all.contains("s3cr3t-nats-Qx7"), "{all}");
    for args in [vec!["check"], vec!["list"], vec!["status", "x"]] {
        let mut full = args.clone();
        full.extend(["--url", &good]);
        let out = env.run(&full);
        let all = format!("{}{}", stdout_of(&out), stderr_of(&out));
        assert!(!all.contains("s3cr3t-nats-Qx7"), "{args:?}: {all}");
    }
}

/// A killed waiter's key expires with its short TTL: the waiters ahead of the next run
/// count it no longer within seconds, and the lock goes to the next waiter in line.
#[test]
fn a_killed_waiter_leaves_the_line_within_its_ttl() {
    let server = NatsServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("line");
    let holder = env.hold(&lock, &[]);
    let mut waiter = env.spawn(&["run", "--local-queue", "off", &lock, "true"]);
    wait_until("the waiter is in line", PATIENCE, || env.waiters(&lock) == 1);
    waiter.kill().expect("kill the waiter");
    let _ = waiter.wait();
    let killed = std::time::Instant::now();
    wait_until("the killed waiter's key expires", PATIENCE, || env.waiters(&lock) == 0);
    assert!(
        killed.elapsed() < std::time::Duration::from_secs(10),
        "the killed waiter stayed in line for {:?}",
        killed.elapsed()
    );
    drop(holder);
}

/// What a run removes (its waiter's key, its slot's key at release) leaves a marker that
/// expires within a second: a bucket of many runs does not keep one per run, which every new
/// waiter's watch would read.
#[test]
fn the_keys_of_finished_runs_leave_the_bucket_within_seconds() {
    let server = NatsServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("markers");
    let holder = env.hold(&lock, &[]);
    let mut waiter = env.spawn(&["run", "--local-queue", "off", &lock, "true"]);
    wait_until("the waiter is in line", PATIENCE, || env.waiters(&lock) == 1);
    drop(holder);
    let status = waiter.wait().expect("the waiter's end");
    assert!(status.success(), "{}", stderr_left(&mut waiter));
    let messages = || server.stream_info("dlock")["state"]["messages"].as_u64();
    wait_until("the bucket is empty", PATIENCE, || messages() == Some(0));
}
