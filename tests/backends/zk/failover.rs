//! A three-member ZooKeeper ensemble: the hold survives one member down and stops at quorum
//! loss.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

#[test]
fn a_three_member_ensemble_keeps_the_hold_through_one_failure_and_stops_at_quorum_loss() {
    // tickTime 500 ms: sessions up to 10 s; --ttl 8s leaves about 4 s for a leader election
    // and the reconnection before the keeper would give up.
    let mut server = ZkServer::ensemble(3, 500);
    let mut env = TestEnv::new(&server);
    env.ttl = Some("8s");
    let lock = lock_name("z");
    let ready = env.path("ready");
    let mut holder = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 1000", ready.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || ready.exists());
    let leader = server.leader();
    server.members[leader].stop();
    wait_until("a new leader", Duration::from_secs(60), || {
        server
            .members
            .iter()
            .filter(|m| m.is_running())
            .any(|m| m.mode().as_deref() == Some("leader"))
    });
    let survivors: Vec<String> = server
        .members
        .iter()
        .filter(|m| m.is_running())
        .map(|m| format!("127.0.0.1:{}", m.client_port))
        .collect();
    let out = env.run([
        "run",
        "--url",
        &format!("zk://{}", survivors.join(",")),
        "--no-wait",
        &lock,
        "true",
    ]);
    assert_fails(&out, 75, "is held");
    assert!(
        holder.try_wait().expect("try_wait").is_none(),
        "the hold broke when one member of three stopped"
    );
    // Without a quorum the session cannot be kept: the command is stopped.
    let second = (0..3)
        .find(|&i| server.members[i].is_running())
        .expect("running member");
    server.members[second].stop();
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(status.code(), Some(124));
}
