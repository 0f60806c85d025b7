//! The contract of lease backends (a server that expires a silent holder's lease): a
//! black-holed holder stops before a contender starts, a killed holder's lock comes free.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

pub fn blackholed_holder_is_stopped_before_a_contender_gets_the_lock(server: &dyn LeaseServer) {
    let proxy = Proxy::start(server.port());
    let env = TestEnv::new(server.as_lock_server());
    let lock = lock_name("lock");
    // The holder talks to the server through the proxy; on SIGTERM it records that it stopped.
    let (mut holder, log) = env.stoppable_holder(&server.url_via(proxy.port), &lock);
    let mut contender = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo contender-started >> {}", log.display()),
        ])
        .spawn()
        .expect("spawn contender");
    wait_until("contender queued", PATIENCE, || env.waiters(&lock) == 1);
    proxy.blackhole();
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must report the lost lock"
    );
    assert!(wait_within(&mut contender, PATIENCE).success());
    let order = std::fs::read_to_string(&log).expect("log");
    assert_eq!(
        order, "holder-stopped\ncontender-started\n",
        "the contender got in before the holder stopped"
    );
}

pub fn killed_holder_frees_the_lock_within_ttl_plus_one_second(server: &dyn LeaseServer) {
    // TTL 3s.
    killed_holder_frees_the_lock_within(server.as_lock_server(), Duration::from_secs(3 + 1));
}

/// A SIGKILLed holder's lock reaches the queued waiter within `limit`.
pub fn killed_holder_frees_the_lock_within(server: &dyn LockServer, limit: Duration) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let mut holder = env.hold(&lock, &[]);
    let entered = env.path("entered");
    let mut waiter = env
        .dlock(["run", &lock, "touch", entered.to_str().expect("utf-8")])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let killed = Instant::now();
    holder.signal(Signal::SIGKILL);
    holder.wait();
    wait_until("waiter entered", PATIENCE, || entered.exists());
    let took = killed.elapsed();
    assert!(
        took <= limit,
        "next waiter got the lock after {took:?} (limit {limit:?})"
    );
    assert!(wait_within(&mut waiter, PATIENCE).success());
}

/// `--wait` bounds waiting, not a healthy server's answers: over a link that delays each
/// answer by 100 ms, `--wait 1ms` still takes a free lock (a server gets at least
/// `MIN_ANSWER`, 2 s, to answer; not in the macro's list, the backends that use it call it).
pub fn a_short_wait_still_takes_a_free_lock_over_a_slow_link(server: &dyn LeaseServer) {
    let env = TestEnv::new(server.as_lock_server());
    let proxy = Proxy::with_delay(server.port(), Duration::from_millis(50));
    let url = server.url_via(proxy.port);
    let out = env.run([
        "run",
        "--wait",
        "1ms",
        "--url",
        &url,
        &lock_name("slow"),
        "touch",
        "ran",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
}

/// A holder whose dlock is stopped (SIGSTOP, a frozen cgroup) until its lease ran out and
/// another run took the lock, and whose command ended meanwhile, does not report the run as
/// done: the command may have run on without the lock, so it exits 124 once continued.
pub fn a_command_that_ended_while_its_dlock_was_stopped_past_the_lease_counts_as_lost(
    server: &dyn LeaseServer,
) {
    let env = TestEnv::new(server.as_lock_server());
    let lock = lock_name("lock");
    let (started, go, done) = (env.path("started"), env.path("go"), env.path("done"));
    let script = format!(
        "touch '{started}'; n=0; while [ ! -e '{go}' ] && [ $n -lt 3000 ]; do \
         n=$((n+1)); sleep 0.01; done; touch '{done}'",
        started = started.display(),
        go = go.display(),
        done = done.display()
    );
    let mut holder = env.spawn(&["run", &lock, "sh", "-c", &script]);
    wait_until("the command runs", PATIENCE, || started.exists());
    let dlock = nix::unistd::Pid::from_raw(holder.id() as i32);
    nix::sys::signal::kill(dlock, Signal::SIGSTOP).expect("stop the holder's dlock");
    // The lease runs out while dlock is stopped: another run gets the lock.
    let next = env.run(["run", "--wait", "30s", &lock, "true"]);
    std::fs::write(&go, "").expect("let the command end");
    wait_until("the command ends", PATIENCE, || done.exists());
    nix::sys::signal::kill(dlock, Signal::SIGCONT).expect("continue the holder's dlock");
    let status = wait_within(&mut holder, PATIENCE);
    assert!(next.status.success(), "{}", describe(&next));
    assert_eq!(
        status.code(),
        Some(124),
        "the stopped holder's run: {}",
        stderr_left(&mut holder)
    );
}
