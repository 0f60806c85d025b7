//! A majority of the sentinel group must name the master, for a grant and for every renewal:
//! one sentinel listed under three spellings is one sentinel; one sentinel of three reachable
//! is not enough to start a command; a sentinel that missed a failover cannot send a run to
//! the old master while another client holds the lock on the new one; a holder whose majority goes
//! away is stopped before its lease can run out.

use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;

use crate::support::*;

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Sentinel `i`'s port under three spellings of the same address.
fn three_spellings(server: &SentinelServer, i: usize) -> Vec<String> {
    let port = server.sentinel_ports[i];
    vec![
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
    ]
}

/// A command that touches `started`, and stays until `go` exists (at most 30 s), recording
/// in `stopped` when SIGTERM ended it.
fn holding(env: &TestEnv, started: &str, stopped: &str, go: &str) -> String {
    format!(
        "touch {s}; trap 'date +%s.%N > {t}; exit 143' TERM; i=0; \
         while [ ! -e {g} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
        s = env.path(started).display(),
        t = env.path(stopped).display(),
        g = env.path(go).display(),
    )
}

fn spawn(env: &TestEnv, args: &[&str]) -> Child {
    env.dlock(args).spawn().expect("spawn dlock")
}

#[test]
fn one_sentinel_listed_three_ways_is_not_a_majority() {
    let mut server = SentinelServer::start();
    let env = TestEnv::new(&server);
    let url = server.url_of(&three_spellings(&server, 0));
    // The other two sentinels are gone: the one left is one of three, however it is spelled.
    server.signal_sentinel(1, Signal::SIGKILL);
    server.signal_sentinel(2, Signal::SIGKILL);
    let out = env.run(["run", "--url", &url, "spelled", "touch", "ran"]);
    assert_fails(&out, 69, "only 1 of the 3 sentinels");
    assert!(!env.path("ran").exists(), "the command ran");
    server.stop_sentinels();
}

#[test]
fn with_one_of_three_sentinels_answering_run_does_not_start_the_command() {
    let server = SentinelServer::start();
    let env = TestEnv::new(&server);
    // Two sentinels stop answering (their ports still accept connections): with --wait, a
    // run gives up within --wait (and `PAST_WAIT` for a loaded machine).
    server.signal_sentinel(1, Signal::SIGSTOP);
    server.signal_sentinel(2, Signal::SIGSTOP);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "2s", "one", "touch", "ran"]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    assert!(!env.path("ran").exists(), "the command ran");
    eprintln!("--wait 2s with 1 of 3 sentinels answering gave up after {took:?}");
    assert!(took < Duration::from_secs(2) + PAST_WAIT, "took {took:?}");
    // Two sentinels gone (their ports refuse connections): the one left is not enough.
    server.signal_sentinel(1, Signal::SIGKILL);
    server.signal_sentinel(2, Signal::SIGKILL);
    let out = env.run(["run", "one", "touch", "ran"]);
    assert_fails(&out, 69, "a majority (2)");
    assert!(!env.path("ran").exists(), "the command ran");
}

/// The lines of a RESP reply that are values (not `*N` / `$N` headers).
fn values(reply: &str) -> Vec<&str> {
    reply
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with(['*', '$', ':']))
        .collect()
}

#[test]
fn a_sentinel_that_missed_the_failover_cannot_send_a_run_to_the_old_master() {
    let mut server = SentinelServer::start();
    let env = TestEnv::new(&server);
    let url = server.url();
    let old = server.master_port();
    let replica = server
        .nodes
        .iter()
        .find(|n| n.port != old)
        .expect("a replica")
        .port;
    // The third sentinel is down while the other two fail the master over to the replica.
    server.signal_sentinel(2, Signal::SIGKILL);
    server.failover();
    wait_until("the second sentinel names the new master", PATIENCE, || {
        server
            .ask(
                server.sentinel_ports[1],
                &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
            )
            .contains(&replica.to_string())
    });
    // A holder on the new master.
    let mut holder = spawn(
        &env,
        &[
            "run",
            "--ttl",
            "30s",
            "--url",
            &url,
            "split",
            "sh",
            "-c",
            &holding(&env, "started", "stopped", "go"),
        ],
    );
    wait_until("the holder runs", PATIENCE, || env.path("started").exists());
    // A partition: the two that know go silent, and the third comes back on the other side
    // with what it knew (the old master, which is not yet turned into a replica and still
    // takes writes as a master). Nothing tells it of the failover.
    server.signal_sentinel(0, Signal::SIGSTOP);
    server.signal_sentinel(1, Signal::SIGSTOP);
    server.restart_sentinel(2);
    let stale = server.ask(
        server.sentinel_ports[2],
        &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
    );
    assert!(
        values(&stale).contains(&old.to_string().as_str()),
        "the third sentinel heard of the failover after all: {stale:?}"
    );
    assert!(
        server.node_text(old, &["ROLE"]).contains("master"),
        "the old master was turned into a replica already"
    );
    // A run that lists that sentinel alone must not get the lock: it knows of two others,
    // which dlock asks too, and they are silent.
    let alone = server.url_of(&[format!("127.0.0.1:{}", server.sentinel_ports[2])]);
    let out = env.run(["run", "--no-wait", "--url", &alone, "split", "touch", "ran"]);
    assert!(!env.path("ran").exists(), "two holders: {}", describe(&out));
    assert_fails(&out, 69, "only 1 of the 3 sentinels");
    // Nor one that reaches only that sentinel of the three it lists.
    let out = env.run(["run", "--no-wait", "--url", &url, "split", "touch", "ran"]);
    assert!(!env.path("ran").exists(), "two holders: {}", describe(&out));
    assert_fails(&out, 69, "a majority (2)");
    assert!(
        holder.try_wait().expect("holder").is_none(),
        "the holder ended before the runs were tried"
    );
    server.signal_sentinel(0, Signal::SIGCONT);
    server.signal_sentinel(1, Signal::SIGCONT);
    std::fs::write(env.path("go"), b"").expect("go");
    let _ = wait_within(&mut holder, PATIENCE);
}

#[test]
fn a_holder_whose_majority_goes_away_is_stopped_before_its_lease_can_run_out() {
    let server = SentinelServer::start();
    let env = TestEnv::new(&server); // TTL 3 s
                                     // The first sentinel three times, then the other two: five entries, three sentinels.
    let mut hosts = three_spellings(&server, 0);
    hosts.extend(
        server.sentinel_ports[1..]
            .iter()
            .map(|p| format!("127.0.0.1:{p}")),
    );
    let url = server.url_of(&hosts);
    let mut holder = spawn(
        &env,
        &[
            "run",
            "--url",
            &url,
            "gone",
            "sh",
            "-c",
            &holding(&env, "started", "stopped", "go"),
        ],
    );
    wait_until("the holder runs", PATIENCE, || env.path("started").exists());
    // The last renewal that can have succeeded was sent before this: the lease runs out by
    // this + TTL at the latest.
    let majority_gone = now_secs();
    server.signal_sentinel(1, Signal::SIGKILL);
    server.signal_sentinel(2, Signal::SIGKILL);
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(status.code(), Some(124), "the holder must be stopped");
    let stopped: f64 = std::fs::read_to_string(env.path("stopped"))
        .expect("the command got SIGTERM")
        .trim()
        .parse()
        .expect("a time");
    let after = stopped - majority_gone;
    eprintln!("the command was stopped {after:.3} s after the majority went away");
    assert!(after < 3.0, "stopped {after:.2} s after, the lease is 3 s");
}
