//! A three-node JetStream cluster with a bucket of three replicas: a holder whose server is
//! killed reconnects to another and keeps its hold (its key is on a majority still), and
//! tokens keep increasing across the leader change.

use nix::sys::signal::Signal;

use crate::support::*;

// Out of the suite until it holds on a loaded machine: there the holder may not renew through
// another node within the 8 s its keeper allows at --ttl 15s, and is stopped (safely). Run it
// with --ignored; docs/backends/nats.md promises no more than that.
#[test]
#[ignore = "a holder's failover to another node is not yet within a 15 s lease on a loaded machine"]
fn a_holder_whose_server_is_killed_keeps_its_hold_on_the_other_two() {
    let mut cluster = NatsCluster::start();
    let env = TestEnv::new(&cluster);
    let lock = lock_name("cluster");
    let first = env.token(&lock);
    // The holder knows the first node only; the cluster tells it of the others.
    let only_first = format!("nats://127.0.0.1:{}?replicas=3", cluster.nodes[0].port);
    let mut holder = env.hold(&lock, &["--url", &only_first]);
    let granted = env.status_json(&lock)["holders"][0]["token"]
        .as_u64()
        .expect("a token");
    assert!(granted > first, "{granted} after {first}");
    cluster.nodes[0].stop();
    // Renewals (every 5 s at --ttl 15s) through another node: the stream's last revision
    // moves on twice, as the other two nodes see it.
    let second = cluster.nodes[1].port;
    let last_seq = || {
        js_api(second, "$JS.API.STREAM.INFO.KV_dlock", "")
            .and_then(|r| serde_json::from_str::<serde_json::Value>(&r).ok())
            .and_then(|v| v["state"]["last_seq"].as_u64())
            .unwrap_or(0)
    };
    let before = last_seq();
    wait_until("two renewals through the other nodes, or the holder's end", PATIENCE, || {
        last_seq() >= before + 2 || matches!(holder.child.try_wait(), Ok(Some(_)))
    });
    assert!(
        matches!(holder.child.try_wait(), Ok(None)),
        "the holder stopped: {}",
        holder.stderr()
    );
    let status = env.status_json(&lock);
    assert_eq!(status["holders"][0]["token"].as_u64(), Some(granted), "{status}");
    assert!(!env.is_free(&lock), "the lock is free while its holder runs");
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let after = env.token(&lock);
    assert!(after > granted, "{after} after {granted}");
}
