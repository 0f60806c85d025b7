//! A three-member etcd cluster: the hold survives one member down and stops at quorum loss.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn a_three_member_cluster_keeps_the_hold_through_one_failure_and_stops_at_quorum_loss() {
    let mut cluster = EtcdServer::cluster(
        3,
        &["--heartbeat-interval", "50", "--election-timeout", "500"],
    );
    let env = TestEnv::new(&cluster);
    let lock = lock_name("e");
    let ready = env.path("ready");
    let mut holder = env
        .dlock([
            "run",
            "--ttl",
            "6s",
            "--kill-after",
            "1s",
            &lock,
            "sh",
            "-c",
            &format!("touch {}; while :; do sleep 0.05; done", ready.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || ready.exists());
    // One member down — the leader, the harder case (an election): the hold survives several
    // renewal periods.
    let leader = cluster.leader();
    cluster.members[leader].stop();
    let survived_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < survived_until {
        assert!(
            holder.try_wait().expect("try_wait").is_none(),
            "the hold broke with one member down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A second member down: no quorum, no renewals: the command is stopped (124) before the
    // lease could have expired on the server.
    let stopped = Instant::now();
    let second = (leader + 1) % 3;
    cluster.members[second].stop();
    assert_eq!(wait_within(&mut holder, PATIENCE).code(), Some(124));
    assert!(
        stopped.elapsed() < Duration::from_secs(6),
        "stopped only after {:?} (TTL 6s)",
        stopped.elapsed()
    );
}
