//! Shared locks on the file backend beyond the contract (`tests/contract/shared.rs`): where
//! the setting comes from, and `flock -s`/`flock -x` interop on the same lock file.

use std::process::Command;

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
