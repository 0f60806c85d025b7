//! Shared locks on the file backend beyond the contract (`tests/contract/shared.rs`): where
//! the setting comes from, and `flock -s`/`flock -x` interop on the same lock file.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::*;

/// The setting comes from DLOCK_SHARED and the config file too; `DLOCK_SHARED=0` beats the
/// config file, and `--exclusive` beats both; `--shared` with `--exclusive` is a usage error.
#[test]
fn shared_is_read_from_the_environment_and_the_config_file() {
    let (_server, env) = file_env();
    let config = env.path("config.toml");
    std::fs::write(&config, "shared = true\n").expect("config");
    let config = config.display().to_string();
    let show = ["sh", "-c", "echo \"$DLOCK_MODE\""];
    let mut from_env = env.dlock(["run", "data"].iter().chain(&show));
    from_env.env("DLOCK_SHARED", "1");
    let out = output_within(from_env, PATIENCE);
    assert_eq!(stdout_of(&out).trim(), "shared", "{}", describe(&out));
    let out = env.run(["--config", &config, "run", "data"].iter().chain(&show));
    assert_eq!(stdout_of(&out).trim(), "shared", "{}", describe(&out));
    let mut off = env.dlock(["--config", &config, "run", "data"].iter().chain(&show));
    off.env("DLOCK_SHARED", "0");
    let out = output_within(off, PATIENCE);
    assert_eq!(stdout_of(&out).trim(), "exclusive", "{}", describe(&out));
    let mut exclusive = env.dlock(
        ["--config", &config, "run", "--exclusive", "data"]
            .iter()
            .chain(&show),
    );
    exclusive.env("DLOCK_SHARED", "1");
    let out = output_within(exclusive, PATIENCE);
    assert_eq!(stdout_of(&out).trim(), "exclusive", "{}", describe(&out));
    let out = env.run(["run", "-s", "-x", "data"].iter().chain(&show));
    assert_fails(&out, 64, "--exclusive");
}

/// `flock -s` on the lock file shares with `dlock run --shared`; `flock -x` excludes both,
/// and dlock's exclusive run excludes `flock -s`.
#[test]
fn flock_s_shares_and_flock_x_excludes() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    env.token("data");
    let file = server.dir.path().join("data.lock");
    let file = file.to_str().expect("utf-8 path");
    let ready = env.path("flock-ready");
    // One process that holds the lock itself, so that killing it (by pid) frees the lock.
    let mut flock_s = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec 9<>'{file}'; flock -s 9; touch '{}'; exec sleep 1000",
            ready.display()
        ))
        .spawn()
        .expect("flock");
    wait_until("flock -s holds", PATIENCE, || ready.exists());
    let out = env.run(["run", "--shared", "--no-wait", "data", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--no-wait", "data", "true"]);
    assert_fails(&out, 75, "is held");
    // /proc/locks names the flock(1) that took the lock (it has exited; its shell holds it).
    let status = env.status_json("data");
    assert_eq!(
        status["holders"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
    assert_eq!(status["holders"][0]["mode"], "shared", "{status}");
    let _ = flock_s.kill();
    let _ = flock_s.wait();

    let reader = env.hold("data", &["--shared"]);
    let probe = |mode: &str| {
        let out = output_within(
            {
                let mut c = Command::new("flock");
                c.args(["-n", mode, file, "true"]);
                c
            },
            PATIENCE,
        );
        out.status.code()
    };
    assert_eq!(probe("-s"), Some(0), "flock -s beside dlock --shared");
    assert_eq!(probe("-x"), Some(1), "flock -x beside dlock --shared");
    drop(reader);
    let writer = env.hold("data", &[]);
    assert_eq!(probe("-s"), Some(1), "flock -s beside an exclusive dlock");
    drop(writer);
}

/// A shared holder killed with SIGKILL leaves its record file (`NAME.PID.reader`) behind;
/// the next shared holder to release removes it, and leaves a live holder's record alone.
#[test]
fn a_killed_readers_record_is_removed_by_the_next_reader_to_leave() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let record = |pid: i32| server.dir.path().join(format!("data.{pid}.reader"));
    let mut killed = env.hold("data", &["--shared"]);
    let live = env.hold("data", &["--shared"]);
    let killed_pid = killed.pid();
    assert!(record(killed_pid).exists(), "no record for the reader");
    killed.signal(nix::sys::signal::Signal::SIGKILL);
    killed.wait();
    assert!(record(killed_pid).exists(), "nothing else removes it");
    let out = env.run(["run", "--shared", "data", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        !record(killed_pid).exists(),
        "the dead reader's record is left"
    );
    assert!(
        record(live.pid()).exists(),
        "a live reader's record was removed"
    );
    let status = env.status_json("data");
    assert_eq!(status["holders"][0]["pid"], live.pid(), "{status}");
}

/// The pids `status` lists as waiting for `name` on this host.
fn waiting_pids(env: &TestEnv, name: &str) -> Vec<u64> {
    env.status_json(name)["waiting_here"]
        .as_array()
        .map(|waiters| waiters.iter().filter_map(|w| w["pid"].as_u64()).collect())
        .unwrap_or_default()
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

/// `child` stopped with SIGSTOP; continued (SIGCONT) and reaped when dropped, however the
/// test ends.
struct Stopped(std::process::Child);

impl Stopped {
    fn new(child: std::process::Child) -> Stopped {
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
        let stopped_child = Stopped(child);
        wait_until("the waiter is stopped", PATIENCE, || {
            stopped(stopped_child.0.id())
        });
        stopped_child
    }

    /// Let it run again and wait (bounded) for it to end.
    fn resume(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, Signal::SIGCONT).expect("SIGCONT");
        wait_within(&mut self.0, PATIENCE)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
            let _ = self.0.wait();
        }
    }
}

/// An exclusive run stopped (SIGSTOP, Ctrl-Z, a frozen cgroup) while it waits behind shared
/// holders does not keep shared runs from the lock once it is free: `status` shows the lock
/// free with the stopped run waiting, a run that gives up says the lock is free, and a
/// shared run gets it within a few seconds. The stopped run takes it when it goes on.
#[test]
fn a_stopped_exclusive_waiter_does_not_keep_shared_runs_from_a_free_lock() {
    let (_server, env) = file_env();
    let reader = env.hold("data", &["--shared"]);
    let writer = env.spawn(&["run", "data", "touch", "writer-ran"]);
    let writer_pid = writer.id();
    wait_until("the exclusive run waits", PATIENCE, || {
        waiting_pids(&env, "data").contains(&u64::from(writer_pid))
    });
    let writer = Stopped::new(writer);
    drop(reader);

    let status = env.status_json("data");
    assert_eq!(status["held"], false, "{status}");
    assert_eq!(
        status["waiters"], 1,
        "the stopped run is not shown: {status}"
    );
    assert!(
        waiting_pids(&env, "data").contains(&u64::from(writer_pid)),
        "{status}"
    );
    // Too short a wait to pass the stopped run: the lock is free, not held.
    let out = env.run(["run", "--shared", "--wait", "200ms", "data", "true"]);
    assert_fails(&out, 75, "is free");
    assert!(!stderr_of(&out).contains("held"), "{}", describe(&out));

    let started = std::time::Instant::now();
    let out = env.run([
        "run",
        "--shared",
        "--wait",
        "15s",
        "data",
        "touch",
        "reader-ran",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the shared run took {:?}",
        started.elapsed()
    );
    assert!(env.path("reader-ran").exists());
    assert!(writer.resume().success());
    assert!(env.path("writer-ran").exists());
}

/// A shared run stopped while it waits behind an exclusive holder does not keep a later
/// exclusive run from the lock once it is free.
#[test]
fn a_stopped_shared_waiter_does_not_keep_exclusive_runs_from_a_free_lock() {
    let (_server, env) = file_env();
    let holder = env.hold("data", &[]);
    let reader = env.spawn(&["run", "--shared", "data", "touch", "reader-ran"]);
    let reader_pid = reader.id();
    wait_until("the shared run waits", PATIENCE, || {
        waiting_pids(&env, "data").contains(&u64::from(reader_pid))
    });
    let reader = Stopped::new(reader);
    let mut writer = env.spawn(&["run", "--wait", "15s", "data", "touch", "writer-ran"]);
    let writer_pid = writer.id();
    wait_until("the exclusive run waits", PATIENCE, || {
        waiting_pids(&env, "data").contains(&u64::from(writer_pid))
    });
    let started = std::time::Instant::now();
    drop(holder);
    let status = wait_within(&mut writer, PATIENCE);
    assert!(status.success(), "{status}: {}", stderr_left(&mut writer));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the exclusive run took {:?}",
        started.elapsed()
    );
    assert!(env.path("writer-ran").exists());
    assert!(reader.resume().success());
    assert!(env.path("reader-ran").exists());
}
