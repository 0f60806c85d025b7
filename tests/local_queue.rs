//! Many waiters on one host: the host-local queue in front of a remote backend,
//! and capacity refusals waited out within `--wait` (docs/guide.md: "The host queue").

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use nix::sys::signal::Signal;

use crate::support::*;

/// `--limit` + this many processes of a host wait at the server (src: `local_queue::DEPTH`).
const DEPTH: u64 = 8;

/// Children killed (by pid) when the test ends, however it ends.
struct Reaped(Vec<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A holder and `DEPTH` waiters, each counted by `status` before the next starts, so that the
/// next run on this host waits in the local queue.
fn fill_the_server_queue(env: &TestEnv, lock: &str, log: &std::path::Path) -> (Holding, Reaped) {
    let holder = env.hold(lock, &[]);
    let waiters = (0..DEPTH)
        .map(|i| {
            let child = env
                .dlock([
                    "run",
                    lock,
                    "sh",
                    "-c",
                    &format!("echo {i} >> {}", log.display()),
                ])
                .spawn()
                .expect("spawn waiter");
            wait_until("waiter queued", PATIENCE, || env.waiters(lock) == i + 1);
            child
        })
        .collect();
    (holder, Reaped(waiters))
}

/// Three more runs after [`fill_the_server_queue`]: they wait in this host's queue, each
/// counted by `status` (which adds this host's queue) before the next starts.
fn queue_three_on_this_host(
    env: &TestEnv,
    lock: &str,
    log: &std::path::Path,
    waiters: &mut Reaped,
) {
    for i in DEPTH..DEPTH + 3 {
        waiters.0.push(
            env.dlock([
                "run",
                lock,
                "sh",
                "-c",
                &format!("echo {i} >> {}", log.display()),
            ])
            .spawn()
            .expect("spawn local waiter"),
        );
        wait_until("local waiter counted", PATIENCE, || {
            env.waiters(lock) == i + 1
        });
    }
}

#[test]
fn waiters_beyond_the_server_queue_wait_on_this_host_in_arrival_order_and_status_names_them() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("lq");
    let log = env.path("order");
    let (mut holder, mut waiters) = fill_the_server_queue(&env, &lock, &log);
    queue_three_on_this_host(&env, &lock, &log, &mut waiters);
    // `status` shows every waiter of this host in arrival order: the first DEPTH at the
    // server, the rest in this host's queue, each since when it waits.
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["status", "--json", &lock]).stdout).expect("json");
    let shown: Vec<(u64, String, String)> = json["waiting_here"]
        .as_array()
        .unwrap_or_else(|| panic!("no waiting_here: {json}"))
        .iter()
        .map(|w| {
            (
                w["pid"].as_u64().unwrap_or_default(),
                w["stage"].as_str().unwrap_or_default().to_owned(),
                w["since"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let pids: Vec<u64> = waiters.0.iter().map(|w| u64::from(w.id())).collect();
    assert_eq!(
        shown.iter().map(|(pid, _, _)| *pid).collect::<Vec<_>>(),
        pids,
        "{json}"
    );
    for (i, (_, stage, _)) in shown.iter().enumerate() {
        let expected = if (i as u64) < DEPTH {
            "server"
        } else {
            "host queue"
        };
        assert_eq!(stage, expected, "waiter {i}: {json}");
    }
    assert!(
        shown.windows(2).all(|pair| pair[0].2 <= pair[1].2),
        "not longest-waiting first: {json}"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
    for waiter in &mut waiters.0 {
        assert!(wait_within(waiter, PATIENCE).success());
    }
    let expected: String = (0..DEPTH + 3).map(|i| format!("{i}\n")).collect();
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        expected,
        "acquisition order differs from arrival order"
    );
    assert_eq!(env.waiters(&lock), 0);
}

/// Whether every thread of process `pid` is stopped (SIGSTOP took effect).
fn stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    })
}

/// Whether the server says `lock` is held.
fn held(env: &TestEnv, lock: &str) -> bool {
    let out = env.run(["status", "--json", lock]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    json["held"].as_bool().unwrap_or(true)
}

/// A holder, `DEPTH` waiters at the server and three in this host's queue; the first of those
/// three is stopped (as a process of a busy machine may not run for a while) before the holder
/// leaves, which admits it, and `then` is sent to it once the server's queue has been served
/// and the next two local waiters were admitted meanwhile. Returns the order of the commands'
/// runs and the waiters.
fn slow_first_local_waiter(then: Signal) -> (String, Reaped) {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("lq");
    let log = env.path("order");
    let (mut holder, mut waiters) = fill_the_server_queue(&env, &lock, &log);
    queue_three_on_this_host(&env, &lock, &log, &mut waiters);
    let slow = waiters.0[DEPTH as usize].id();
    let slow_pid = nix::unistd::Pid::from_raw(slow as i32);
    nix::sys::signal::kill(slow_pid, Signal::SIGSTOP).expect("stop");
    wait_until("slow waiter stopped", PATIENCE, || stopped(slow));
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let served = |count: usize| {
        std::fs::read_to_string(&log).map_or(0, |text| text.lines().count()) >= count
    };
    wait_until("the server's queue served", PATIENCE, || {
        served(DEPTH as usize) && !held(&env, &lock)
    });
    nix::sys::signal::kill(slow_pid, then).expect("signal the slow waiter");
    if then == Signal::SIGKILL {
        let _ = wait_within(&mut waiters.0[DEPTH as usize], PATIENCE);
        let _ = nix::sys::signal::kill(slow_pid, Signal::SIGCONT);
    }
    for (i, waiter) in waiters.0.iter_mut().enumerate() {
        let status = wait_within(waiter, PATIENCE);
        assert!(
            status.success() || i == DEPTH as usize,
            "waiter {i}: {status}"
        );
    }
    assert_eq!(env.waiters(&lock), 0);
    (std::fs::read_to_string(&log).expect("log"), waiters)
}

/// A run admitted to the server that is slow to get there is still served before the runs
/// with later tickets, which are admitted meanwhile as the runs ahead of them finish.
#[test]
fn a_slow_admitted_run_keeps_its_place_ahead_of_later_tickets() {
    let (order, _waiters) = slow_first_local_waiter(Signal::SIGCONT);
    let expected: String = (0..DEPTH + 3).map(|i| format!("{i}\n")).collect();
    assert_eq!(
        order, expected,
        "acquisition order differs from arrival order"
    );
}

/// The runs after one that dies before it reaches the server go on, in order.
#[test]
fn a_run_that_dies_before_reaching_the_server_holds_up_nobody() {
    let (order, _waiters) = slow_first_local_waiter(Signal::SIGKILL);
    let expected: String = (0..DEPTH)
        .chain(DEPTH + 1..DEPTH + 3)
        .map(|i| format!("{i}\n"))
        .collect();
    assert_eq!(order, expected);
}

/// A run admitted behind a slow run that has not reached the server yet waits for it within
/// its `--wait` (75, naming this host's queue) and a signal cancels that wait.
#[test]
fn the_wait_behind_a_slow_admitted_run_keeps_to_wait_and_signals() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("lq");
    let log = env.path("order");
    let (mut holder, mut waiters) = fill_the_server_queue(&env, &lock, &log);
    waiters.0.push(
        env.dlock(["run", &lock, "true"])
            .spawn()
            .expect("spawn local waiter"),
    );
    wait_until("local waiter counted", PATIENCE, || {
        env.waiters(&lock) == DEPTH + 1
    });
    let slow = waiters.0[DEPTH as usize].id();
    let slow_pid = nix::unistd::Pid::from_raw(slow as i32);
    nix::sys::signal::kill(slow_pid, Signal::SIGSTOP).expect("stop");
    wait_until("slow waiter stopped", PATIENCE, || stopped(slow));
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let served = || std::fs::read_to_string(&log).map_or(0, |text| text.lines().count());
    wait_until("the server's queue served", PATIENCE, || {
        served() >= DEPTH as usize && !held(&env, &lock)
    });
    // The lock is free, but the slow run is ahead.
    let out = env.run(["run", "--wait", "1s", &lock, "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("behind other runs on this host"),
        "{}",
        describe(&out)
    );
    let marker = env.path("ran");
    let mut queued = env
        .dlock(["run", &lock, "touch", &marker.display().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until("waiter behind the slow run counted", PATIENCE, || {
        env.waiters(&lock) == 1
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(queued.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal");
    assert_eq!(wait_within(&mut queued, PATIENCE).code(), Some(128 + 15));
    assert!(!marker.exists(), "the command ran");
    nix::sys::signal::kill(slow_pid, Signal::SIGCONT).expect("continue");
    for waiter in &mut waiters.0 {
        assert!(wait_within(waiter, PATIENCE).success());
    }
    assert_eq!(env.waiters(&lock), 0);
}

#[test]
fn wait_runs_out_in_the_local_queue_with_75_and_leaves_nothing_behind() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("lq");
    let (_holder, _waiters) = fill_the_server_queue(&env, &lock, &env.path("log"));
    let out = env.run(["run", "--wait", "1s", &lock, "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("behind other runs on this host"),
        "{}",
        describe(&out)
    );
    assert_eq!(env.waiters(&lock), DEPTH);
}

#[test]
fn a_signal_in_the_local_queue_cancels_the_wait() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("lq");
    let marker = env.path("ran");
    let (_holder, _waiters) = fill_the_server_queue(&env, &lock, &env.path("log"));
    let mut queued = env
        .dlock(["run", &lock, "touch", &marker.display().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until("local waiter counted", PATIENCE, || {
        env.waiters(&lock) == DEPTH + 1
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(queued.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal");
    assert_eq!(wait_within(&mut queued, PATIENCE).code(), Some(128 + 15));
    assert!(!marker.exists(), "the command ran");
    assert_eq!(env.waiters(&lock), DEPTH);
}

#[test]
fn local_queue_off_and_no_wait_go_to_the_server_at_once() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("lq");
    let (_holder, _waiters) = fill_the_server_queue(&env, &lock, &env.path("log"));
    // Not queued behind this host's waiters: --no-wait asks the server, which says held.
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        !stderr_of(&out).contains("on this host"),
        "{}",
        describe(&out)
    );
    // Turned off, a run waits at the server (its own entry in the server's queue).
    let mut direct = env
        .dlock(["run", "--local-queue", "off", &lock, "true"])
        .spawn()
        .expect("spawn");
    wait_until("direct waiter at the server", PATIENCE, || {
        env.waiters(&lock) == DEPTH + 1
    });
    let out = env.run(["run", "--wait", "1s", &lock, "true"]);
    assert!(
        stderr_of(&out).contains("on this host"),
        "a queued run still waits here: {}",
        describe(&out)
    );
    let _ = direct.kill();
    let _ = direct.wait();
}

/// Start `dlock -v run --wait 30s NAME true` and return once it reports a capacity refusal.
fn refused_waiter(env: &TestEnv, lock: &str, extra: &[&str]) -> Child {
    let mut args = vec!["-v", "run", "--wait", "30s"];
    args.extend_from_slice(extra);
    args.extend([lock, "true"]);
    let mut child = env
        .dlock(&args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let seen = std::thread::spawn(move || {
        lines.any(|line| line.is_ok_and(|l| l.contains("waiting for a free connection")))
    });
    wait_until("capacity refusal reported", PATIENCE, || seen.is_finished());
    assert!(seen.join().unwrap_or(false), "no capacity refusal reported");
    child
}

/// Hold `count` different locks, one server connection each.
fn hold_connections(env: &TestEnv, count: usize) -> Vec<Holding> {
    (0..count)
        .map(|_| env.hold(&lock_name("filler"), &[]))
        .collect()
}

#[test]
fn postgres_max_connections_is_waited_out_and_named_when_the_wait_runs_out() {
    let server = PgServer::start_with(&[
        "-c",
        "max_connections=4",
        "-c",
        "superuser_reserved_connections=0",
    ]);
    let env = TestEnv::new(&server);
    let lock = lock_name("cap");
    let mut fillers = hold_connections(&env, 4);
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_fails(&out, 69, "--no-wait");
    assert!(
        stderr_of(&out).contains("PostgreSQL max_connections"),
        "{}",
        describe(&out)
    );
    let out = env.run(["run", "--wait", "1s", &lock, "true"]);
    assert_fails(&out, 69, "PostgreSQL max_connections");
    assert!(stderr_of(&out).contains("--wait"), "{}", describe(&out));
    let mut waiter = refused_waiter(&env, &lock, &[]);
    drop(fillers.pop());
    assert!(wait_within(&mut waiter, PATIENCE).success());
}

#[test]
fn zookeeper_max_client_cnxns_is_waited_out_and_named() {
    let server = ZkServer::with_max_client_cnxns(Some(3));
    let env = TestEnv::new(&server);
    let lock = lock_name("cap");
    let mut fillers = hold_connections(&env, 3);
    let out = env.run(["run", "--wait", "1s", &lock, "true"]);
    assert_fails(&out, 69, "maxClientCnxns");
    let mut waiter = refused_waiter(&env, &lock, &[]);
    drop(fillers.pop());
    assert!(wait_within(&mut waiter, PATIENCE).success());
}

/// More shared runs of one host than `--limit` + DEPTH hold a shared lock at once: each
/// waits, holding, for a file from every other, which only all of them holding together can
/// reach (the host queue would admit them in waves of nine, and the tenth would wait for
/// ever behind nine that wait for it).
#[test]
fn shared_runs_of_one_host_hold_together_beyond_the_queue_depth() {
    let server = EtcdServer::shared();
    let env = TestEnv::new(&*server);
    let lock = lock_name("lq");
    let count = DEPTH as usize + 4;
    let barrier = format!(
        "n=0; while [ \"$(ls in-* 2>/dev/null | wc -l)\" -lt {count} ]; do \
         n=$((n+1)); [ $n -gt 3000 ] && exit 9; sleep 0.01; done"
    );
    let mut readers = Reaped(
        (0..count)
            .map(|i| {
                env.dlock([
                    "run",
                    "--shared",
                    &lock,
                    "sh",
                    "-c",
                    &format!("touch in-{i}; {barrier}"),
                ])
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn reader")
            })
            .collect(),
    );
    for (i, reader) in readers.0.iter_mut().enumerate() {
        let status = wait_within(reader, PATIENCE + PATIENCE);
        assert_eq!(
            status.code(),
            Some(0),
            "reader {i}: {}",
            stderr_left(reader)
        );
    }
}
