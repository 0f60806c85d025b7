//! The contract of design.md, once, for every backend.
//!
//! Each function checks one promise against a [`LockServer`]. [`contract_tests!`] turns the
//! whole list into `#[test]`s for one backend: `contract_tests!(file, FileServer::start());`.
//! A backend adds a launcher and its own special cases, never a copy of this suite.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::common::*;

#[macro_export]
macro_rules! contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@tests $start;
                command_exit_status_passes_through,
                command_killed_by_signal_exits_128_plus_signal,
                held_lock_with_no_wait_exits_75,
                conflict_exit_code_changes_the_not_acquired_status,
                wait_gives_up_after_the_duration_and_leaves_nothing_behind,
                lock_is_free_at_once_after_the_command_exits,
                each_forwarded_signal_reaches_the_command_once,
                signal_while_waiting_exits_128_plus_n_without_running,
                second_terminating_signal_kills_at_once,
                kill_after_escalates_to_sigkill,
                lock_loss_kills_the_whole_process_group_and_exits_124,
                on_lost_ignore_lets_the_command_finish,
                sigkill_of_dlock_takes_the_command_down,
                mutual_exclusion_under_contention_with_increasing_tokens,
                limit_allows_exactly_n_holders,
                all_holders_must_agree_on_the_limit,
                names_are_opaque_and_isolated,
                command_sees_lock_variables_and_no_credentials,
                nested_run_of_a_held_lock_is_reentrant,
                a_copied_held_environment_is_not_reentrant,
                an_orphan_of_a_past_holder_acquires_normally,
                holder_metadata_reaches_terminals_escaped,
                passwords_in_the_holders_command_line_are_not_stored,
                stdin_and_stdout_pass_through_untouched,
                status_reports_holder_and_exits_0_held_1_free,
                list_shows_held_locks,
                check_reports_ok,
            );
        }
    };
    (@lease $start:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                let server = $start;
                $crate::contract::$test(&server);
            }
        )*
    };
    (@tests $start:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                let server = $start;
                $crate::contract::$test(&server);
            }
        )*
    };
}

fn name() -> String {
    format!("lock-{}", unique())
}

pub fn command_exit_status_passes_through(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    for code in [0, 3, 255] {
        let out = env.run(["run", &name(), "sh", "-c", &format!("exit {code}")]);
        assert_eq!(out.status.code(), Some(code), "{}", describe(&out));
        assert!(
            stderr_of(&out).is_empty(),
            "dlock wrote to stderr: {}",
            describe(&out)
        );
    }
}

pub fn command_killed_by_signal_exits_128_plus_signal(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let out = env.run(["run", &name(), "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", describe(&out));
}

pub fn held_lock_with_no_wait_exits_75(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held");
    assert!(
        stderr_of(&out).contains(&holder.pid().to_string()),
        "holder pid not named: {}",
        describe(&out)
    );
    assert!(
        !env.path("ran").exists(),
        "the command ran without the lock"
    );
}

pub fn conflict_exit_code_changes_the_not_acquired_status(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "-n", "-E", "0", &lock, "touch", "ran"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(!env.path("ran").exists());
    let out = env.run(["run", "-E", "9", "--wait", "100ms", &lock, "touch", "ran"]);
    assert_eq!(out.status.code(), Some(9), "{}", describe(&out));
}

pub fn wait_gives_up_after_the_duration_and_leaves_nothing_behind(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "300ms", &lock, "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 75, "300ms");
    assert!(
        took >= Duration::from_millis(300),
        "gave up early, after {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "gave up late, after {took:?}"
    );
    assert!(!env.path("ran").exists());
    let status = env.run(["status", "--json", &lock]);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(json["holders"].as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(
        json["waiters"].as_u64().unwrap_or(0),
        0,
        "a waiter was left behind: {json}"
    );
}

pub fn lock_is_free_at_once_after_the_command_exits(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let out = env.run(["run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.is_free(&lock));
    // Also while another waiter is queued: it gets the lock when the holder exits.
    let mut holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock(["run", &lock, "touch", "waited"])
        .spawn()
        .expect("spawn waiter");
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let status = wait_within(&mut waiter, PATIENCE);
    assert!(status.success());
    assert!(env.path("waited").exists());
}

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
        let lock = name();
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
    let lock = name();
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

/// Number of waiters `status` reports (0 when unknown).
pub fn second_terminating_signal_kills_at_once(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
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
    let lock = name();
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
    let lock = name();
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
    assert!(broken.elapsed() <= kill_after + Duration::from_secs(3));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut dlock.stderr.take().expect("stderr"), &mut stderr).ok();
    assert!(stderr.contains("lost"), "no loss message: {stderr}");
}

pub fn on_lost_ignore_lets_the_command_finish(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
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
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    let command = holder.command_pid();
    holder.signal(Signal::SIGKILL);
    holder.wait();
    wait_until("command dead", PATIENCE, || !is_alive(command));
}

pub fn mutual_exclusion_under_contention_with_increasing_tokens(server: &dyn LockServer) {
    let env = Arc::new(TestEnv::new(server));
    let lock = name();
    let sentinel = env.path("inside");
    let log = env.path("tokens");
    // mkdir fails if someone else is inside; tokens are appended in entry order.
    let script = format!(
        "mkdir {s} || echo OVERLAP >> {l}; echo $DLOCK_FENCING_TOKEN >> {l}; rmdir {s}",
        s = sentinel.display(),
        l = log.display()
    );
    let (clients, runs) = (16, 20);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let env = env.clone();
            let lock = lock.clone();
            let script = script.clone();
            std::thread::spawn(move || {
                for _ in 0..runs {
                    let out = env.run(["run", &lock, "sh", "-c", &script]);
                    assert!(out.status.success(), "{}", describe(&out));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("client thread");
    }
    let text = std::fs::read_to_string(&log).expect("token log");
    assert!(!text.contains("OVERLAP"), "two holders were inside at once");
    let tokens: Vec<u64> = text.lines().map(|l| l.parse().expect("token")).collect();
    assert_eq!(tokens.len(), clients * runs);
    for pair in tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "tokens not strictly increasing: {} then {}",
            pair[0],
            pair[1]
        );
    }
}

pub fn limit_allows_exactly_n_holders(server: &dyn LockServer) {
    let env = Arc::new(TestEnv::new(server));
    let lock = name();
    let dir = env.path("inside");
    std::fs::create_dir(&dir).expect("mkdir");
    let log = env.path("counts");
    // Each holder registers itself, records how many are inside, lingers, and leaves.
    let script = format!(
        "touch {d}/$$; ls {d} | wc -l >> {l}; sleep 0.2; rm {d}/$$",
        d = dir.display(),
        l = log.display()
    );
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let env = env.clone();
            let lock = lock.clone();
            let script = script.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let out = env.run(["run", "--limit", "3", &lock, "sh", "-c", &script]);
                    assert!(out.status.success(), "{}", describe(&out));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("client thread");
    }
    let counts: Vec<u32> = std::fs::read_to_string(&log)
        .expect("counts")
        .lines()
        .map(|l| l.trim().parse().expect("count"))
        .collect();
    assert_eq!(counts.len(), 24);
    assert!(
        counts.iter().all(|&c| c <= 3),
        "more than 3 holders at once: {counts:?}"
    );
    assert!(
        counts.contains(&3),
        "3 concurrent holders were never reached: {counts:?}"
    );
}

/// A run whose `--limit` differs from the current holders' is a usage error (64) on every
/// backend, before it waits, and its command does not run.
pub fn all_holders_must_agree_on_the_limit(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let _holder = env.hold(&lock, &["--limit", "2"]);
    for limit in ["3", "1"] {
        let out = env.run(["run", "--no-wait", "--limit", limit, &lock, "touch", "ran"]);
        assert_fails(&out, 64, "--limit 2");
        let out = env.run([
            "run", "--wait", "30s", "--limit", limit, &lock, "touch", "ran",
        ]);
        assert_fails(&out, 64, "--limit 2");
    }
    assert!(
        !env.path("ran").exists(),
        "a run with another --limit ran its command"
    );
    // The same limit is accepted beside the holder.
    let out = env.run(["run", "--no-wait", "--limit", "2", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

pub fn names_are_opaque_and_isolated(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let base = name();
    let names = [
        base.clone(),
        format!("{base}/b"),
        format!("{base}b"),
        format!("{base}:fence"),
        format!("../{base}"),
        ".".to_owned(),
        "..".to_owned(),
        format!("锁-{base}"),
        format!("{base} with spaces"),
        format!("{base}%2Fb"),
    ];
    // Hold every one of them at once: none may block another.
    let holders: Vec<Holding> = names.iter().map(|n| env.hold(n, &["--no-wait"])).collect();
    for n in &names {
        let out = env.run(["status", "--json", n]);
        assert_eq!(out.status.code(), Some(0), "{n}: {}", describe(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(json["name"], n.as_str());
        assert_eq!(
            json["holders"].as_array().map(Vec::len),
            Some(1),
            "{n}: {json}"
        );
    }
    drop(holders);
}

pub fn command_sees_lock_variables_and_no_credentials(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let out = output_within(
        {
            let mut c = env.dlock(["run", &lock, "env"]);
            // Credential-looking variables dlock does not consume are scrubbed too.
            c.env("DLOCK_OTHER_PASSWORD", "hunter2")
                .env("DLOCK_REDIS_PASSWORD", "hunter3");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let seen = stdout_of(&out);
    assert!(seen.contains(&format!("DLOCK_NAME={lock}\n")), "{seen}");
    assert!(
        seen.contains(&format!("DLOCK_BACKEND={}\n", server.scheme())),
        "{seen}"
    );
    assert!(seen.contains("DLOCK_HELD="), "{seen}");
    let token = seen
        .lines()
        .find_map(|l| l.strip_prefix("DLOCK_FENCING_TOKEN="))
        .expect("token variable");
    assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "token {token:?}");
    assert!(
        !seen.contains("hunter2") && !seen.contains("hunter3"),
        "a credential reached the command"
    );
}

pub fn nested_run_of_a_held_lock_is_reentrant(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let other = name();
    let dlock = DLOCK;
    let script = format!(
        "{dlock} run --no-wait {lock} sh -c 'echo inner:$DLOCK_FENCING_TOKEN' && \
         {dlock} run --no-wait {other} sh -c 'echo other:$DLOCK_NAME'; echo outer:$DLOCK_FENCING_TOKEN"
    );
    let out = env.run(["run", &lock, "sh", "-c", &script]);
    assert!(
        out.status.success(),
        "nested run blocked on its own lock: {}",
        describe(&out)
    );
    let text = stdout_of(&out);
    let token = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_owned)
    };
    assert_eq!(token("inner:"), token("outer:"), "{text}");
    assert_eq!(token("other:").as_deref(), Some(other.as_str()), "{text}");
}

/// Reentrancy needs proof, not an environment: a process that copies a holder's DLOCK_HELD
/// (it is no descendant of the holder) acquires normally, so it finds the lock held.
pub fn a_copied_held_environment_is_not_reentrant(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let copied = env.path("held");
    let ready = env.path("ready");
    let script = format!(
        "printf %s \"$DLOCK_HELD\" > {held}; echo $$ > {ready}; exec sleep 1000",
        held = copied.display(),
        ready = ready.display()
    );
    let mut holder = env
        .dlock(["run", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let held = std::fs::read_to_string(&copied).expect("the holder's DLOCK_HELD");
    assert!(!held.is_empty(), "the holder's command saw no DLOCK_HELD");
    let out = output_within(
        {
            let mut command = env.dlock(["run", "--no-wait", &lock, "touch", "ran"]);
            command.env("DLOCK_HELD", &held);
            command
        },
        PATIENCE,
    );
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        !env.path("ran").exists(),
        "the copied environment ran under the lock"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

/// A background process left behind by a holder's command, run after that holder is gone
/// and someone else holds the lock, acquires normally (and so finds the lock held).
pub fn an_orphan_of_a_past_holder_acquires_normally(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let go = env.path("go");
    let result = env.path("result");
    let dlock = DLOCK;
    // The orphan waits (bounded) for the go file, then tries the lock without waiting.
    let script = format!(
        "( i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; \
           {dlock} run --no-wait {lock} touch {ran}; echo $? > {result}.tmp; mv {result}.tmp {result} ) \
           </dev/null >/dev/null 2>&1 &",
        go = go.display(),
        ran = env.path("ran").display(),
        result = result.display(),
    );
    let out = env.run(["run", &lock, "sh", "-c", &script]);
    assert!(out.status.success(), "{}", describe(&out));
    let _next = env.hold(&lock, &[]);
    std::fs::write(&go, "").expect("go file");
    wait_until("the orphan's attempt", PATIENCE, || result.exists());
    let status = std::fs::read_to_string(&result).expect("result");
    assert_eq!(
        status.trim(),
        "75",
        "the orphan ran under someone else's lock"
    );
    assert!(!env.path("ran").exists());
}

/// A user name or command line with terminal escape sequences is shown escaped by `status`,
/// `list` and the conflict message.
pub fn holder_metadata_reaches_terminals_escaped(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let ready = env.path("ready");
    let script = format!(
        ": '\u{1b}[2J'; echo $$ > {}; exec sleep 1000",
        ready.display()
    );
    let mut holder = env
        .dlock(["run", &lock, "sh", "-c", &script])
        .env("USER", "evil\u{1b}]0;pwned\u{7}\u{9b}31m")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let status = env.run(["status", &lock]);
    let list = env.run(["list"]);
    let busy = env.run(["run", "--no-wait", &lock, "true"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(status.status.code(), Some(0), "{}", describe(&status));
    assert!(stdout_of(&status).contains("evil"), "{}", describe(&status));
    assert_eq!(busy.status.code(), Some(75), "{}", describe(&busy));
    for (what, out) in [
        ("status", &status),
        ("list", &list),
        ("run --no-wait", &busy),
    ] {
        for byte in [0x1b_u8, 0x07] {
            assert!(
                !out.stdout.contains(&byte) && !out.stderr.contains(&byte),
                "{what} printed a raw control character {byte:#x}: {}",
                describe(out)
            );
        }
        let text = format!("{}{}", stdout_of(out), stderr_of(out));
        assert!(!text.contains('\u{9b}'), "{what} printed a raw CSI: {text}");
    }
}

/// A nested `dlock run --url …://user:password@…` in a holder's command line is recorded
/// with the password masked: the metadata is stored on the backend and shown by `status`.
pub fn passwords_in_the_holders_command_line_are_not_stored(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let ready = env.path("ready");
    let script = format!(
        ": dlock run --url redis://:Hunter2Secret@h x -- y; echo $$ > {}; exec sleep 1000",
        ready.display()
    );
    let mut holder = env
        .dlock(["run", &lock, "sh", "-c", &script])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let status = env.run(["status", "--json", &lock]);
    let list = env.run(["list", "--json"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(status.status.code(), Some(0), "{}", describe(&status));
    assert!(
        stdout_of(&status).contains("redis://:***@h"),
        "{}",
        describe(&status)
    );
    for out in [&status, &list] {
        assert!(
            !stdout_of(out).contains("Hunter2Secret"),
            "{}",
            describe(out)
        );
    }
    server.assert_nothing_stored_contains("Hunter2Secret");
}

pub fn stdin_and_stdout_pass_through_untouched(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let mut child = env
        .dlock(["run", &name(), "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let payload: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = {
        let payload = payload.clone();
        std::thread::spawn(move || stdin.write_all(&payload))
    };
    let mut echoed = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().expect("stdout"), &mut echoed)
        .expect("read");
    writer.join().expect("writer").expect("write");
    assert!(wait_within(&mut child, PATIENCE).success());
    assert!(echoed == payload, "stdout differs from stdin");
}

pub fn status_reports_holder_and_exits_0_held_1_free(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = name();
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(1), "free lock: {}", describe(&out));
    let holder = env.hold(&lock, &[]);
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains(&holder.pid().to_string()), "{text}");
    assert!(
        text.contains("sleep 1000") || text.contains("sh -c"),
        "command missing: {text}"
    );
    let quiet = env.run(["status", "-q", &lock]);
    assert_eq!(quiet.status.code(), Some(0));
    assert!(
        quiet.stdout.is_empty(),
        "status -q printed {}",
        describe(&quiet)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["status", "--json", &lock]).stdout).expect("json");
    let h = &json["holders"][0];
    assert_eq!(h["pid"].as_u64(), Some(u64::from(holder.pid() as u32)));
    assert!(h["token"].as_u64().is_some_and(|t| t > 0), "{json}");
    assert!(!h["host"].as_str().unwrap_or("").is_empty(), "{json}");
    assert!(!h["since"].as_str().unwrap_or("").is_empty(), "{json}");
}

pub fn list_shows_held_locks(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let (a, b) = (name(), name());
    let _ha = env.hold(&a, &[]);
    let _hb = env.hold(&b, &[]);
    let out = env.run(["list", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: HashSet<&str> = json
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert!(
        names.contains(a.as_str()) && names.contains(b.as_str()),
        "{json}"
    );
    let text = stdout_of(&env.run(["list"]));
    assert!(text.contains(&a) && text.contains(&b), "{text}");
}

pub fn check_reports_ok(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(
        text.contains("round trip") && text.contains(server.scheme()),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["check", "--json"]).stdout).expect("json");
    assert_eq!(json["backend"], server.scheme());
}

// ---- Lease backends (a server that expires a silent holder's lease) ----------------------

/// Expand the lease-backend promises into `#[test]`s for one backend.
#[macro_export]
macro_rules! lease_contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@lease $start;
                blackholed_holder_is_stopped_before_a_contender_gets_the_lock,
                killed_holder_frees_the_lock_within_ttl_plus_one_second,
            );
        }
    };
}

pub fn blackholed_holder_is_stopped_before_a_contender_gets_the_lock(server: &dyn LeaseServer) {
    let proxy = Proxy::start(server.port());
    let env = TestEnv::new(server.as_lock_server());
    let lock = name();
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
    let lock = name();
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
    let lock = name();
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
