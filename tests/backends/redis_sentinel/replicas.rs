//! `?replicas=N` with a replica that stops answering: the `WAIT` for it never outlasts the
//! lease, so a command never starts after its lease could have run out and another client
//! got the lock.

use nix::sys::signal::Signal;

use crate::support::*;

/// A command that records that it started, fails with 99 if another one is inside, and
/// stays until `go` exists (at most 30 s).
fn exclusive(env: &TestEnv, started: &str, go: &str) -> String {
    format!(
        "touch {s}; mkdir {m} || exit 99; trap 'rmdir {m}; exit 143' TERM; i=0; \
         while [ ! -e {g} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; rmdir {m}",
        s = env.path(started).display(),
        m = env.path("inside").display(),
        g = env.path(go).display(),
    )
}

#[test]
fn a_stopped_replica_never_lets_a_command_start_after_its_lease_ran_out() {
    let server = SentinelServer::start();
    let env = TestEnv::new(&server);
    let replica = server.nodes[1].port;
    assert_ne!(server.master_port(), replica);
    // Asks for up to 5 s of waiting for the replica, with a 2 s lease.
    let url = server
        .url()
        .replace("/0#", "/0?replicas=1&replicas-timeout=5s#");
    let replica_pid = server.node_pid(replica);
    signal_pid(replica_pid, Signal::SIGSTOP);
    let mut first = env
        .dlock([
            "run",
            "--ttl",
            "2s",
            "--url",
            &url,
            "r",
            "sh",
            "-c",
            &exclusive(&env, "started1", "go"),
        ])
        .spawn()
        .expect("spawn dlock");
    wait_until("the first run is granted", PATIENCE, || !env.is_free("r"));
    // The next client, without replicas: it gets the lock when the first one's lease ran
    // out or it gave the lock back.
    let mut second = env
        .dlock([
            "run",
            "--ttl",
            "2s",
            "r",
            "sh",
            "-c",
            &exclusive(&env, "started2", "go"),
        ])
        .spawn()
        .expect("spawn dlock");
    wait_until("the second run starts its command", PATIENCE, || {
        env.path("started2").exists()
    });
    // Only now does the replica come back and acknowledge the first run's hold.
    signal_pid(replica_pid, Signal::SIGCONT);
    let status = wait_within(&mut first, PATIENCE);
    assert!(
        !env.path("started1").exists(),
        "the first command started after its lease could have run out ({status:?})"
    );
    assert_eq!(status.code(), Some(69), "{status:?}");
    std::fs::write(env.path("go"), b"").expect("go");
    let status = wait_within(&mut second, PATIENCE);
    assert!(status.success(), "two commands at once: {status:?}");
}
