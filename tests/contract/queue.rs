//! For backends with a queue: waiters get the lock in arrival order. The helpers are also
//! used by backends that check more about their queue.

use std::path::Path;
use std::process::Child;

use nix::sys::signal::Signal;

use crate::support::*;

/// Five waiters queued behind a holder of `lock`, each in the queue before the next arrives;
/// each appends its number to `log` when it gets the lock.
pub fn queue_five_waiters(env: &TestEnv, lock: &str, log: &Path) -> (Holding, Vec<Child>) {
    let holder = env.hold(lock, &[]);
    let mut started = Vec::new();
    for i in 0..5 {
        started.push(
            env.dlock([
                "run",
                lock,
                "sh",
                "-c",
                &format!("echo {i} >> {}", log.display()),
            ])
            .spawn()
            .expect("spawn waiter"),
        );
        wait_until("waiter queued", PATIENCE, || env.waiters(lock) == i + 1);
    }
    (holder, started)
}

/// Stop the holder and check that the waiters of [`queue_five_waiters`] got the lock in
/// arrival order.
pub fn release_and_expect_arrival_order(mut holder: Holding, started: Vec<Child>, log: &Path) {
    holder.signal(Signal::SIGTERM);
    holder.wait();
    for mut waiter in started {
        assert!(wait_within(&mut waiter, PATIENCE).success());
    }
    assert_eq!(
        std::fs::read_to_string(log).expect("log"),
        "0\n1\n2\n3\n4\n",
        "acquisition order differs from arrival order"
    );
}

/// For backends with a queue: waiters get the lock in arrival order, and `status` lists them
/// in that order.
pub fn waiters_acquire_in_arrival_order(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let log = env.path("order");
    let (holder, started) = queue_five_waiters(&env, &lock, &log);
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["status", "--json", &lock]).stdout).expect("json");
    let queue: Vec<String> = json["queue"]
        .as_array()
        .expect("queue")
        .iter()
        .map(|w| w["command"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(queue.len(), 5, "{json}");
    for (i, command) in queue.iter().enumerate() {
        assert!(
            command.contains(&format!("echo {i} ")),
            "queue out of order: {queue:?}"
        );
    }
    release_and_expect_arrival_order(holder, started, &log);
}

/// How many runs of one host wait at the server besides `--limit`'s holders before the others
/// line up in the host's own queue (src: `kit::local_queue::DEPTH`).
const HOST_QUEUE_DEPTH: u64 = 8;

/// Runs of one host beyond the host queue's depth wait in this host's queue, not at the
/// server, on every backend whose registry entry says it has one (`host_queue`); on the file
/// backend, whose waiters are all in this host's kernel, every waiter waits in the backend.
pub fn a_host_queues_its_waiters_as_the_registry_says(server: &dyn LockServer) {
    let host_queue = crate::contract::capabilities(server).host_queue;
    let env = TestEnv::new(server);
    let lock = lock_name("hq");
    let mut holder = env.hold(&lock, &[]);
    let mut waiters = Vec::new();
    for i in 0..=HOST_QUEUE_DEPTH {
        waiters.push(
            env.dlock(["run", &lock, "true"])
                .spawn()
                .expect("spawn waiter"),
        );
        wait_until("waiter counted", PATIENCE, || env.waiters(&lock) == i + 1);
    }
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["status", "--json", &lock]).stdout).expect("json");
    let stages: Vec<&str> = json["waiting_here"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|w| w["stage"].as_str().unwrap_or(""))
                .collect()
        })
        .unwrap_or_default();
    let in_host_queue = stages.iter().filter(|s| **s == "host queue").count();
    holder.signal(Signal::SIGTERM);
    holder.wait();
    for mut waiter in waiters {
        assert!(wait_within(&mut waiter, PATIENCE).success());
    }
    assert_eq!(
        in_host_queue,
        usize::from(host_queue),
        "{} waiters of one host, the registry's host_queue {host_queue}: {json}",
        HOST_QUEUE_DEPTH + 1
    );
}
