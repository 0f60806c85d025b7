//! The contract: signals forwarded, signals while waiting, escalation to SIGKILL, and what
//! happens to the command when the lock is lost or dlock is killed.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

pub fn each_forwarded_signal_reaches_the_command_once(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    for signal in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        let lock = lock_name("lock");
        let log = env.path(&format!("{signal}.log"));
        let ready = env.path(&format!("{signal}.ready"));
        let short = &signal.as_str()[3..];
        // The trap counts deliveries; the command exits on the first one with a known code.
        let script = format!(
            "trap 'echo {short} >> {log}; exit 7' {short}; echo $$ > {ready}; while :; do sleep 0.05; done",
            log = log.display(),
            ready = ready.display()
        );
        let mut dlock = env
            .dlock(["run", &lock, "sh", "-c", &script])
            .spawn()
            .expect("spawn");
        wait_until("command ready", PATIENCE, || ready.exists());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(dlock.id() as i32), signal)
            .expect("kill");
        let status = wait_within(&mut dlock, PATIENCE);
        assert_eq!(
            status.code(),
            Some(7),
            "{signal}: dlock should exit with the command's status"
        );
        let received = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(
            received,
            format!("{short}\n"),
            "{signal} delivered {:?}",
            received
        );
        assert!(env.is_free(&lock), "{signal}: lock not free right after");
    }
}

pub fn signal_while_waiting_exits_128_plus_n_without_running(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let _holder = env.hold(&lock, &[]);
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        let mut waiter = env
            .dlock(["run", &lock, "touch", "ran"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        wait_until("waiter queued", PATIENCE, || env.waiters(&lock) >= 1);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(waiter.id() as i32), signal)
            .expect("kill");
        let status = wait_within(&mut waiter, PATIENCE);
        assert_eq!(status.code(), Some(128 + signal as i32), "{signal}");
        assert!(!env.path("ran").exists(), "the command ran after {signal}");
        wait_until("waiter gone", PATIENCE, || env.waiters(&lock) == 0);
    }
}

pub fn second_terminating_signal_kills_at_once(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let ready = env.path("ready");
    let script = format!(
        "trap '' TERM INT; echo $$ > {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut dlock = env
        .dlock(["run", "--kill-after", "60s", &lock, "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    wait_until("command ready", PATIENCE, || ready.exists());
    let pid = nix::unistd::Pid::from_raw(dlock.id() as i32);
    nix::sys::signal::kill(pid, Signal::SIGTERM).expect("kill");
    let started = Instant::now();
    nix::sys::signal::kill(pid, Signal::SIGINT).expect("kill");
    let status = wait_within(&mut dlock, PATIENCE);
    assert_eq!(status.code(), Some(128 + 9));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "waited for --kill-after instead"
    );
    assert!(env.is_free(&lock));
}

pub fn kill_after_escalates_to_sigkill(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let ready = env.path("ready");
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut dlock = env
        .dlock(["run", "--kill-after", "500ms", &lock, "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    wait_until("command ready", PATIENCE, || ready.exists());
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dlock.id() as i32),
        Signal::SIGTERM,
    )
    .expect("kill");
    let status = wait_within(&mut dlock, PATIENCE);
    let took = started.elapsed();
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "the command ignores TERM, so it must die of KILL"
    );
    assert!(
        took >= Duration::from_millis(500),
        "killed before --kill-after: {took:?}"
    );
    assert!(env.is_free(&lock));
}

pub fn lock_loss_kills_the_whole_process_group_and_exits_124(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let pids = env.path("pids");
    let ready = env.path("ready");
    // Two grandchildren, one of which ignores SIGTERM and needs the SIGKILL escalation.
    let script = format!(
        "sleep 1000 & echo $! >> {pids}; (trap '' TERM; exec sleep 1000) & echo $! >> {pids}; \
         echo $$ >> {pids}; echo ok > {ready}; wait",
        pids = pids.display(),
        ready = ready.display()
    );
    let kill_after = Duration::from_secs(2);
    let mut dlock = env
        .dlock(["run", "--kill-after", "2s", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until("command ready", PATIENCE, || ready.exists());
    let pids: Vec<i32> = std::fs::read_to_string(&pids)
        .expect("pids")
        .lines()
        .map(|l| l.trim().parse().expect("pid"))
        .collect();
    assert_eq!(pids.len(), 3);
    let broken = Instant::now();
    server.break_hold(&env, &lock);
    let status = wait_within(&mut dlock, PATIENCE);
    assert_eq!(status.code(), Some(124));
    wait_until(
        "every descendant gone",
        kill_after + Duration::from_secs(1),
        || pids.iter().all(|&p| !is_alive(p)),
    );
    // A broken hold is noticed by the holder's next renewal, every TTL/3: within the second
    // allowed here at the test TTLs of most servers (3 s), later at longer ones (Azure Blob's
    // leases last 15 s at least, renewed every 5 s).
    let renewal = server
        .ttl()
        .and_then(|ttl| humantime::parse_duration(ttl).ok())
        .map_or(Duration::ZERO, |ttl| ttl / 3);
    let noticed = renewal.saturating_sub(Duration::from_secs(1));
    assert!(
        broken.elapsed() <= kill_after + noticed + Duration::from_secs(3),
        "stopped {:?} after the break",
        broken.elapsed()
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut dlock.stderr.take().expect("stderr"), &mut stderr).ok();
    assert!(stderr.contains("lost"), "no loss message: {stderr}");
}

pub fn on_lost_ignore_lets_the_command_finish(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let ready = env.path("ready");
    let go = env.path("go");
    let script = format!(
        "echo ok > {}; while [ ! -e {} ]; do sleep 0.02; done; exit 5",
        ready.display(),
        go.display()
    );
    let mut dlock = env
        .dlock(["run", "--on-lost", "ignore", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until("command ready", PATIENCE, || ready.exists());
    server.break_hold(&env, &lock);
    // The warning is printed when dlock notices; then let the command finish on its own.
    let mut stderr = dlock.stderr.take().expect("stderr");
    let mut seen = Vec::new();
    wait_until("loss warning", PATIENCE, || {
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut stderr, &mut buf).unwrap_or(0);
        seen.extend_from_slice(&buf[..n]);
        String::from_utf8_lossy(&seen).contains("without the lock") || n == 0
    });
    assert!(String::from_utf8_lossy(&seen).contains("without the lock"));
    std::fs::write(&go, b"").expect("go");
    let status = wait_within(&mut dlock, PATIENCE);
    assert_eq!(status.code(), Some(5), "ignore keeps the command's status");
}

pub fn sigkill_of_dlock_takes_the_command_down(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let mut holder = env.hold(&lock, &[]);
    let command = holder.command_pid();
    holder.signal(Signal::SIGKILL);
    holder.wait();
    wait_until("command dead", PATIENCE, || !is_alive(command));
}

/// A lock lost while the command ran is reported once: the release that follows, finding
/// the hold gone, adds no second warning about it.
pub fn a_lost_lock_is_reported_once(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let mut holding = env.hold(&lock, &["--kill-after", "2s"]);
    server.break_hold(&env, &lock);
    let status = holding.wait();
    assert_eq!(status.code(), Some(124));
    let stderr = holding.stderr();
    assert!(
        stderr.contains(&format!("lock '{lock}' was lost while the command ran")),
        "no loss message: {stderr}"
    );
    // One line, as the moment of the loss is: not a warning then and a summary at the end.
    assert_eq!(
        stderr.lines().filter(|l| l.contains("the command")).count(),
        1,
        "the loss is told in more than one line: {stderr}"
    );
    for repeated in [
        "already expired or been removed",
        "no longer ours",
        "no longer held",
        "already gone",
    ] {
        assert!(
            !stderr.contains(repeated),
            "the loss is reported twice: {stderr}"
        );
    }
}
