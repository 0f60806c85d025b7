//! A URL may list one sentinel: dlock finds the rest of the group through it
//! (`SENTINEL SENTINELS`) and still needs a majority of the whole group to name the master,
//! for a grant and for every renewal, each sentinel counted once however many addresses
//! reach it.

use nix::sys::signal::Signal;

use crate::support::*;

/// A URL naming sentinel `i` alone, at `host` (`127.0.0.1` or `[::1]`).
fn one_sentinel(server: &SentinelServer, i: usize, host: &str) -> String {
    server.url_of(&[format!("{host}:{}", server.sentinel_ports[i])])
}

#[test]
fn one_listed_sentinel_finds_its_group_for_runs_contention_status_and_check() {
    let server = SentinelServer::shared();
    let mut env = TestEnv::new(&server);
    env.url = one_sentinel(&server, 0, "127.0.0.1");
    let lock = lock_name("one-listed");
    let out = env.run(["run", &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists(), "the command did not run");
    let holder = env.hold(&lock, &[]);
    assert!(!env.is_free(&lock), "a second run got the held lock");
    let json = env.status_json(&lock);
    assert_eq!(
        json["holders"][0]["pid"].as_u64(),
        Some(u64::from(holder.pid() as u32)),
        "{json}"
    );
    drop(holder);
    // `check` names the sentinels it found through the listed one, which all answered.
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains("1 of 1 answered"), "{text}");
    for port in &server.sentinel_ports[1..] {
        assert!(
            text.contains(&format!("127.0.0.1:{port} answered")),
            "{text}"
        );
    }
    assert!(text.contains("a majority (2)"), "{text}");
}

#[test]
fn one_listed_sentinel_cut_off_from_its_majority_cannot_name_a_master_alone() {
    let server = SentinelServer::start();
    let env = TestEnv::new(&server);
    let url = one_sentinel(&server, 0, "127.0.0.1");
    // The other two stop answering (a partition): the listed one knows the group has three.
    server.signal_sentinel(1, Signal::SIGSTOP);
    server.signal_sentinel(2, Signal::SIGSTOP);
    let out = env.run(["run", "--url", &url, "cut-off", "touch", "ran"]);
    assert!(!env.path("ran").exists(), "the command ran");
    assert_fails(&out, 69, "only 1 of the 3 sentinels");
    // The silent ones are named: they were found and asked.
    for port in &server.sentinel_ports[1..] {
        assert_fails(&out, 69, &format!("127.0.0.1:{port}"));
    }
    server.signal_sentinel(1, Signal::SIGCONT);
    server.signal_sentinel(2, Signal::SIGCONT);
    let out = env.run(["run", "--url", &url, "cut-off", "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn the_one_listed_sentinel_down_is_69_naming_it() {
    let mut server = SentinelServer::start();
    let env = TestEnv::new(&server);
    let url = one_sentinel(&server, 0, "127.0.0.1");
    server.stop_sentinels();
    let out = env.run(["run", "--url", &url, "down", "touch", "ran"]);
    assert!(!env.path("ran").exists(), "the command ran");
    assert_fails(&out, 69, &format!("127.0.0.1:{}", server.sentinel_ports[0]));
}

#[test]
fn one_sentinel_listed_at_ipv4_and_ipv6_loopback_counts_once() {
    let mut server = SentinelServer::start();
    let env = TestEnv::new(&server);
    let port = server.sentinel_ports[0];
    let url = server.url_of(&[format!("127.0.0.1:{port}"), format!("[::1]:{port}")]);
    assert!(
        std::net::TcpStream::connect(("::1", port)).is_ok(),
        "the sentinel does not listen on ::1"
    );
    let out = env.run(["run", "--url", &url, "twice", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    // The other two gone: the one left answers at both addresses, and is one of three.
    server.signal_sentinel(1, Signal::SIGKILL);
    server.signal_sentinel(2, Signal::SIGKILL);
    let out = env.run(["run", "--url", &url, "twice", "touch", "ran"]);
    assert!(
        !env.path("ran").exists(),
        "two addresses of one sentinel were two votes"
    );
    assert_fails(&out, 69, "only 1 of the 3 sentinels");
    server.stop_sentinels();
}

#[test]
fn a_holder_through_one_listed_sentinel_is_stopped_when_the_found_majority_goes_away() {
    let server = SentinelServer::start();
    let mut env = TestEnv::new(&server); // TTL 3 s
    env.url = one_sentinel(&server, 0, "127.0.0.1");
    let lock = lock_name("found-gone");
    let (mut holder, log) = env.stoppable_holder(&env.url, &lock);
    // Its renewals ask the two sentinels found through the listed one: both gone, the one
    // left is one of three.
    server.signal_sentinel(1, Signal::SIGKILL);
    server.signal_sentinel(2, Signal::SIGKILL);
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(status.code(), Some(124), "{}", stderr_left(&mut holder));
    let order = std::fs::read_to_string(&log).expect("log");
    assert_eq!(order, "holder-stopped\n", "the command was not stopped");
}
