//! Redis Cluster: the whole contract through a URL with the three masters as seeds, plus what
//! only a cluster can do: locks on every master at once (`list` sees them all), a URL naming
//! one node, a held lock's slot migrated to another master (`failover`: and its master killed
//! with its replica promoted), and nodes that are no cluster or a cluster that cannot serve.
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod failover;
pub(super) mod server;
mod tls;

use std::path::PathBuf;
use std::process::{Child, Stdio};

use crate::support::*;

crate::contract_tests!(redis_cluster_contract, RedisCluster::shared());
crate::shared_contract_tests!(redis_cluster_shared_contract, RedisCluster::shared());
// One master serves every slot: a black hole in front of it cuts all of a holder's traffic.
crate::lease_contract_tests!(
    redis_cluster_lease_contract,
    RedisCluster::shared_one_master()
);
crate::shared_lease_contract_tests!(
    redis_cluster_shared_lease_contract,
    RedisCluster::shared_one_master()
);

/// Names (as `lock_name` makes them), one served by each master.
fn one_name_per_master(cluster: &RedisCluster) -> Vec<(String, u16)> {
    let mut found: Vec<(String, u16)> = Vec::new();
    for i in 0..300 {
        let name = lock_name(&format!("m{i}"));
        let master = cluster.master_of(&name);
        if !found.iter().any(|(_, m)| *m == master) {
            found.push((name, master));
        }
        if found.len() == 3 {
            return found;
        }
    }
    panic!("no names on three masters: {found:?}");
}

/// A holder of `name` whose command writes its token to the returned file, then runs until
/// the returned stop file exists (bounded: at most a minute).
fn holder(env: &TestEnv, name: &str, extra: &[&str]) -> (Child, PathBuf, PathBuf) {
    let tag = unique();
    let token = env.path(&format!("token-{tag}"));
    let stop = env.path(&format!("stop-{tag}"));
    let script = format!(
        "echo $DLOCK_FENCING_TOKEN > '{t}.tmp' && mv '{t}.tmp' '{t}'; i=0; \
         while [ ! -e '{s}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        t = token.display(),
        s = stop.display()
    );
    let mut args: Vec<&str> = vec!["run"];
    args.extend_from_slice(extra);
    args.extend([name, "sh", "-c", &script]);
    let child = env
        .dlock(&args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock");
    (child, token, stop)
}

fn read_token(path: &std::path::Path) -> u64 {
    wait_until("the command's token", PATIENCE, || path.exists());
    std::fs::read_to_string(path)
        .expect("token file")
        .trim()
        .parse()
        .expect("a numeric token")
}

#[test]
fn locks_on_every_master_are_held_at_once_and_listed() {
    let cluster = RedisCluster::shared().unprefixed();
    let env = TestEnv::new(&cluster);
    let names = one_name_per_master(&cluster);
    let holders: Vec<Holding> = names.iter().map(|(n, _)| env.hold(n, &[])).collect();
    let out = env.run(["list"]);
    assert!(out.status.success(), "{}", describe(&out));
    for (name, _) in &names {
        assert!(
            stdout_of(&out).contains(name.as_str()),
            "{name} not listed: {}",
            describe(&out)
        );
        let status = env.run(["status", name]);
        assert_eq!(status.status.code(), Some(0), "{}", describe(&status));
    }
    let (name, _) = &names[1];
    let out = env.run(["release", "--force", name]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["status", name]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    drop(holders);
}

#[test]
fn one_node_of_a_cluster_is_enough_in_the_url() {
    let cluster = RedisCluster::shared().unprefixed();
    let mut env = TestEnv::new(&cluster);
    let names = one_name_per_master(&cluster);
    env.url = format!("redis://127.0.0.1:{}", cluster.ports()[0]);
    // Two of the three names live on other masters: MOVED is followed.
    let mut last = 0;
    for (name, _) in &names {
        let token = env.token(name);
        assert!(
            token > last || last == 0,
            "tokens of different locks: {token}"
        );
        last = token;
        let out = env.run(["status", name]);
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    }
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(
        text.contains("3 masters") && text.contains("16384 of 16384 slots covered"),
        "{text}"
    );
}

#[test]
fn standalone_servers_given_as_several_hosts_are_refused() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let mut env = TestEnv::new(&a);
    env.url = format!("redis://127.0.0.1:{},127.0.0.1:{}", a.port, b.port);
    let out = env.run(["run", "x", "true"]);
    assert_fails(&out, 78, "not part of a Redis Cluster");
    // Nothing was taken on the standalone server.
    assert!(!a.command("KEYS *").starts_with("*1"));
}

#[test]
fn a_cluster_with_slots_nobody_serves_is_unavailable() {
    let cluster = RedisCluster::start();
    let env = TestEnv::new(&cluster);
    // Every node forgets slot 0 (DELSLOTS is not propagated).
    for port in cluster.ports() {
        let out = cluster.cli(port, &["CLUSTER", "DELSLOTS", "0"]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    wait_until("every node notices the uncovered slot", PATIENCE, || {
        cluster.ports().iter().all(|&p| {
            redis_resp(p, &["CLUSTER", "INFO"]).is_ok_and(|i| i.contains("cluster_state:fail"))
        })
    });
    let out = env.run(["check"]);
    assert_fails(&out, 69, "slots have no master");
    let out = env.run(["run", "--no-wait", &lock_name("down"), "true"]);
    assert_fails(&out, 69, "cannot serve this lock");
}

#[test]
fn a_password_protected_cluster_takes_the_password_as_a_standalone_server_does() {
    let cluster = RedisCluster::start_with_password("s3cret");
    let mut env = TestEnv::new(&cluster);
    let names = one_name_per_master(&cluster);
    let out = env.run(["run", &names[0].0, "true"]);
    assert_fails(
        &out,
        77,
        "wants a password for user 'default', and none was given",
    );
    env.url = env.url.replacen("redis://", "redis://:s3cret@", 1);
    for (name, _) in &names {
        let out = env.run(["run", name, "true"]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!stdout_of(&out).contains("s3cret"), "{}", describe(&out));
}

#[test]
fn a_url_mixing_a_cluster_node_with_another_server_is_refused_naming_it() {
    // Only the first host that answers used to be looked at: a standalone server or a
    // sentinel after a cluster node went unnoticed until it answered first.
    let cluster = RedisCluster::shared();
    let standalone = RedisServer::shared();
    let sentinel = LoneSentinel::start("m", free_port());
    let mut env = TestEnv::new(&cluster);
    let node = cluster.ports()[0];
    for odd in [standalone.port, sentinel.port] {
        env.url = format!("redis://127.0.0.1:{node},127.0.0.1:{odd}");
        let named = format!("127.0.0.1:{odd} is ");
        let out = env.run(["run", &lock_name("mixed"), "touch", "ran"]);
        assert_fails(&out, 78, &named);
        let out = env.run(["check"]);
        assert_fails(&out, 78, &named);
    }
    assert!(!env.path("ran").exists());
    // The cluster's own nodes, however many, are fine.
    env.url = format!("redis://127.0.0.1:{node},localhost:{}", cluster.ports()[1]);
    let out = env.run(["run", &lock_name("nodes"), "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// A host of the URL that accepts connections and never answers (a node cut off whose
/// packets are dropped, a stopped process), named first, does not keep a run from the nodes
/// after it: the others are tried beside it, not after its whole connect timeout, and the
/// run takes the lock within a `--wait` that a 5 s timeout on it would exceed.
#[test]
fn a_silent_first_host_of_the_url_does_not_keep_the_others_from_the_lock() {
    let cluster = RedisCluster::shared();
    let silent = SilentServer::start();
    let mut hosts = vec![format!("127.0.0.1:{}", silent.port)];
    hosts.extend(cluster.ports().iter().map(|p| format!("127.0.0.1:{p}")));
    let url = format!("redis://{}", hosts.join(","));
    let env = TestEnv::new(&*cluster);
    let lock = lock_name("silent");
    let out = env.run([
        "run", "--url", &url, "--wait", "4s", &lock, "sh", "-c", "echo ran",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "ran");
    assert!(silent.accepted() > 0, "the silent host was never tried");
}
