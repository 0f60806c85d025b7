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
