//! Losing the PostgreSQL session: terminated, black-holed, a server crash, a stopped holder
//! or waiter; and the settings that keep a live one (idle timeouts, keepalives).

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

#[test]
fn terminated_session_stops_the_command_within_a_heartbeat() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let (mut holder, log) = env.stoppable_holder(&server.url(), &lock);
    let terminated = Instant::now();
    let ended = server.psql(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'dlock % t%') AS t",
    );
    assert_eq!(ended, "1", "exactly the holder's session is a dlock holder");
    let status = wait_within(&mut holder, PATIENCE);
    let took = terminated.elapsed();
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must report the lost lock"
    );
    // TTL 3s: one heartbeat interval is 1s; allow it plus 1s.
    assert!(took <= Duration::from_secs(2), "stopped after {took:?}");
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\n"
    );
    assert!(env.is_free(&lock));
}

#[test]
fn blackholed_holder_stops_its_command_within_the_heartbeat_bound() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let proxy = Proxy::start(server.port);
    let url = server.url_via(proxy.port);
    let (mut holder, log) = env.stoppable_holder(&url, &lock);
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
    let cut = Instant::now();
    proxy.blackhole();
    let status = wait_within(&mut holder, PATIENCE);
    let took = cut.elapsed();
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must report the lost lock"
    );
    // TTL 3s: the hold is given up before 0.99·TTL − 0.5s after the last heartbeat, and the
    // unlock that cannot get through is abandoned quickly.
    assert!(took <= Duration::from_secs(4), "stopped after {took:?}");
    // The proxy keeps the server's side of the connection open (and acknowledges its
    // keepalives), so the session lives on until the link really goes away.
    drop(proxy);
    assert!(wait_within(&mut contender, PATIENCE).success());
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\ncontender-started\n",
        "the contender got in before the holder stopped"
    );
}

#[test]
fn a_stopped_holder_loses_the_lock_within_the_ttl() {
    // A holder that sends nothing behind a live connection (here: dlock itself stopped; the
    // kernel still acknowledges keepalives) must not keep the lock for ever.
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let mut holder = env.hold(&lock, &["--ttl", "3s"]);
    holder.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let out = env.run(["run", "--wait", "30s", &lock, "touch", "second-ran"]);
    let took = stopped.elapsed();
    // Resume it before any assertion, so a failure does not leave a stopped process behind.
    holder.signal(Signal::SIGCONT);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("second-ran").exists());
    // TTL 3s: the server ends the silent session ~3s after its last heartbeat.
    assert!(
        took < Duration::from_secs(15),
        "the second run got the lock after {took:?}"
    );
    // Resumed, the old holder finds its hold gone and stops its command.
    let status = holder.wait();
    assert_eq!(
        status.code(),
        Some(124),
        "the resumed holder must report the lost lock: {}",
        holder.stderr()
    );
    assert!(
        !is_alive(holder.command_pid()),
        "the resumed holder's command still runs"
    );
}

#[test]
fn a_stopped_waiter_granted_while_stopped_frees_the_lock_and_never_runs() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let mut holder = env.hold(&lock, &["--ttl", "3s"]);
    let mut waiter = env
        .dlock(["run", "--ttl", "3s", &lock, "touch", "waiter-ran"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    let waiter_pid = nix::unistd::Pid::from_raw(waiter.id() as i32);
    nix::sys::signal::kill(waiter_pid, Signal::SIGSTOP).expect("stop waiter");
    holder.signal(Signal::SIGTERM);
    holder.wait();
    // Granted while stopped, its session goes idle: the server ends it after the TTL.
    let stopped = Instant::now();
    let mut freed = false;
    for _ in 0..1000 {
        if freed || stopped.elapsed() >= PATIENCE {
            break;
        }
        freed = env.is_free(&lock);
    }
    // Resume it before any assertion, so a failure does not leave a stopped process behind.
    nix::sys::signal::kill(waiter_pid, Signal::SIGCONT).expect("resume waiter");
    assert!(freed, "the stopped waiter kept the lock for {PATIENCE:?}");
    let status = wait_within(&mut waiter, PATIENCE);
    let stderr = stderr_left(&mut waiter);
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert!(!env.path("waiter-ran").exists(), "the waiter's command ran");
}

#[test]
fn server_idle_timeouts_do_not_end_a_live_holder() {
    // dlock's own session settings win over the server's (and the role's, and the
    // database's): a holder whose heartbeat interval exceeds them keeps its lock.
    let server = PgServer::start_with(&[
        "-c",
        "idle_session_timeout=500",
        "-c",
        "idle_in_transaction_session_timeout=500",
    ]);
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let out = env.run(["run", "--ttl", "3s", &lock, "sleep", "3"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.is_free(&lock));
}

#[test]
fn long_ttls_give_the_server_keepalives_it_accepts() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    for ttl in ["10m", "2days", "7days"] {
        let out = env.run(["run", "--ttl", ttl, &lock_name("p"), "true"]);
        assert!(out.status.success(), "--ttl {ttl}: {}", describe(&out));
    }
    // A keepalive setting out of the kernel's range is only logged by the server, which then
    // keeps the OS default (2 hours of silence).
    let log = server.log();
    assert!(!log.contains("setsockopt"), "{log}");
}
