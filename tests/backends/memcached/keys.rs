//! What dlock keeps on memcached and where: the slot and counter items, names too long for a
//! key, several servers (one per lock), the TTL in whole seconds, and waiting by polling.

use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn each_lock_lives_on_exactly_one_of_several_servers() {
    let (a, b) = (MemcachedServer::start(), MemcachedServer::start());
    let env = TestEnv::new(&a);
    let url = format!("memcached://127.0.0.1:{},127.0.0.1:{}", a.port, b.port);
    let mut on = [0, 0];
    for _ in 0..12 {
        let lock = lock_name("mc");
        let out = env.run(["run", "--url", &url, &lock, "true"]);
        assert!(out.status.success(), "{}", describe(&out));
        let fence = format!("mg dlock:{lock}:f v\r\n");
        let found: Vec<bool> = [&a, &b]
            .iter()
            .map(|s| s.request(&fence, "\r\n").starts_with("VA"))
            .collect();
        assert_eq!(
            found.iter().filter(|f| **f).count(),
            1,
            "{lock} on {found:?}"
        );
        on[usize::from(found[1])] += 1;
        // The same URL with the servers the other way round finds the same server.
        let reversed = format!("memcached://127.0.0.1:{},127.0.0.1:{}", b.port, a.port);
        let holder = env.hold(&lock, &["--url", &reversed]);
        let out = env.run(["run", "--no-wait", "--url", &url, &lock, "true"]);
        assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
        drop(holder);
    }
    assert!(on[0] > 0 && on[1] > 0, "all 12 locks on one server: {on:?}");
}

#[test]
fn a_name_too_long_for_a_key_still_locks_and_shows_its_name() {
    let server = MemcachedServer::shared();
    let env = TestEnv::new(&server);
    let lock = format!("{}{}", lock_name("mc"), "锁".repeat(70));
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let out = env.run(["status", "--json", &lock]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = env.run(["list", "--json"]);
    assert!(stdout_of(&out).contains(&lock), "{}", describe(&out));
}

#[test]
fn the_ttl_is_whole_seconds_of_at_least_three() {
    let server = MemcachedServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let out = env.run(["run", "--ttl", "2s", &lock, "true"]);
    assert_fails(&out, 64, "3s");
    let _holder = env.hold(&lock, &["--ttl", "4500ms"]);
    let out = env.run(["status", "--json", &lock]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let left = json["holders"][0]["ttl_left_ms"]
        .as_u64()
        .expect("ttl left");
    assert!((1000..=5000).contains(&left), "{json}");
    assert!(json["last_token"].as_u64().is_some(), "{json}");
}

#[test]
fn waiters_poll_and_hand_off_quickly() {
    let server = MemcachedServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let (ready, go) = (env.path("ready"), env.path("go"));
    // The holder's command ends by itself once `go` exists: a real release, not an expiry.
    let script = format!(
        "touch {ready}; i=0; while [ ! -e {go} ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done",
        ready = ready.display(),
        go = go.display()
    );
    let mut holder = env
        .dlock(["run", "--ttl", "30s", &lock, "sh", "-c", &script])
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || ready.exists());
    let entered = env.path("entered");
    let mut waiter = env
        .dlock(["run", &lock, "touch", entered.to_str().expect("utf-8")])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter counted", PATIENCE, || env.waiters(&lock) == 1);
    let released = Instant::now();
    std::fs::write(&go, b"").expect("touch go");
    wait_until("waiter entered", PATIENCE, || entered.exists());
    let took = released.elapsed();
    assert!(wait_within(&mut holder, PATIENCE).success());
    assert!(wait_within(&mut waiter, PATIENCE).success());
    // The TTL is 30 s: only a release noticed by polling hands over this fast (the bound
    // leaves room for a loaded machine; the polling interval is at most 25 ms).
    assert!(took < Duration::from_secs(3), "hand-off took {took:?}");
    assert_eq!(env.waiters(&lock), 0, "the waiter's registration stayed");
}

#[test]
fn a_unix_socket_url_locks_and_reports_its_scheme() {
    let server = MemcachedServer::start_unix();
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let out = env.run(["run", &lock, "sh", "-c", "echo $DLOCK_BACKEND"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "memcached+unix");
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn a_short_wait_still_takes_a_free_lock_over_a_slow_link() {
    crate::contract::a_short_wait_still_takes_a_free_lock_over_a_slow_link(
        &MemcachedServer::shared(),
    );
}

#[test]
fn list_says_when_the_server_cannot_enumerate_and_status_still_works() {
    let server = MemcachedServer::start_with(&["-o", "no_lru_crawler"]);
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["list"]);
    assert_fails(&out, 69, "lru_crawler");
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains("crawler"), "{}", describe(&out));
}

#[test]
fn every_spelling_and_order_of_the_servers_puts_a_lock_on_the_same_server() {
    let (a, b) = (MemcachedServer::start(), MemcachedServer::start());
    let env = TestEnv::new(&a);
    let spellings = [
        format!("memcached://127.0.0.1:{},127.0.0.1:{}", a.port, b.port),
        format!("memcached://LOCALHOST:{},localhost:{}", b.port, a.port),
        format!(
            "memcached://localhost:{},[::ffff:127.0.0.1]:{}",
            a.port, b.port
        ),
    ];
    for _ in 0..8 {
        let lock = lock_name("mc");
        let holder = env.hold(&lock, &["--url", &spellings[0]]);
        for url in &spellings[1..] {
            let out = env.run(["run", "--no-wait", "--url", url, &lock, "true"]);
            assert_eq!(out.status.code(), Some(75), "{url}: {}", describe(&out));
        }
        drop(holder);
        let fence = format!("mg dlock:{lock}:f v\r\n");
        let on: Vec<bool> = [&a, &b]
            .iter()
            .map(|s| s.request(&fence, "\r\n").starts_with("VA"))
            .collect();
        assert_eq!(on.iter().filter(|f| **f).count(), 1, "{lock} on {on:?}");
    }
}
