//! dlock's own directory (no `--url`, no `DLOCK_DIR`) on this machine's real paths: where
//! root's is, and what another user's directory in the place of a user's does. What these
//! tests create there is under a uid nobody uses, and removed when they end.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

/// A uid no account on the test machine has, standing in for a user whose default directory
/// another user took.
const VICTIM_UID: u32 = 424_242;
/// The uid of "nobody", standing in for the other user.
const SQUATTER_UID: u32 = 65534;

/// `dlock ARGS` as `env.dlock` builds it, without `--url` or `DLOCK_DIR`: the default
/// directory.
fn without_a_directory(env: &TestEnv, args: &[&str]) -> Command {
    let mut command = env.dlock(args);
    command.env_remove("DLOCK_URL").env_remove("DLOCK_DIR");
    command
}

/// Root's default directory is under no directory that anyone but root can write to: nobody
/// can make it before root does, or swap it.
#[test]
fn roots_default_directory_is_under_no_directory_others_can_write_to() {
    assert!(
        nix::unistd::getuid().is_root(),
        "this test checks root's default directory"
    );
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    // `check` says where the directory is, and creates nothing.
    let out = output_within(without_a_directory(&env, &["check", "--json"]), PATIENCE);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let dir = PathBuf::from(json["location"].as_str().expect("a location"));
    for ancestor in dir.ancestors().skip(1) {
        let meta = std::fs::metadata(ancestor).expect("an existing ancestor");
        assert!(
            meta.uid() == 0 && meta.mode() & 0o022 == 0,
            "root's default directory {} is under {} (owner uid {}, mode {:04o}), where others \
             can create it first",
            dir.display(),
            ancestor.display(),
            meta.uid(),
            meta.mode() & 0o7777
        );
    }
}

/// Where a non-root user's default directory is: the same choice as dlock's.
fn default_dir_of(uid: u32) -> PathBuf {
    let run_lock = std::fs::symlink_metadata("/run/lock");
    if run_lock.is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.mode() & 0o1777 == 0o1777) {
        PathBuf::from(format!("/run/lock/dlock-{uid}"))
    } else {
        PathBuf::from(format!("/tmp/dlock-{uid}"))
    }
}

/// Removes a directory tree when the test ends, however it ends.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `command`, run as `VICTIM_UID` (the tests run as root).
fn as_victim(mut command: Command) -> Command {
    command
        .uid(VICTIM_UID)
        .gid(VICTIM_UID)
        .current_dir("/")
        .env("HOME", "/");
    command
}

/// Another user who made a user's default directory first (an `@reboot` job wins that race
/// after every boot) cannot make the user's runs use it: they are refused with 73, and the
/// message names who made it and what to do; the way out it names (`DLOCK_DIR`, set alike
/// for cron and the login shell) works.
#[test]
fn a_default_directory_another_user_made_is_refused_naming_them_and_the_way_out() {
    assert!(
        nix::unistd::getuid().is_root(),
        "this test needs root to act as two users"
    );
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let squatted = default_dir_of(VICTIM_UID);
    let _ = std::fs::remove_dir_all(&squatted);
    std::fs::create_dir(&squatted).expect("mkdir");
    let _removed = Removed(squatted.clone());
    std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    nix::unistd::chown(
        &squatted,
        Some(nix::unistd::Uid::from_raw(SQUATTER_UID)),
        None,
    )
    .expect("chown");

    let run = as_victim(without_a_directory(&env, &["run", "x", "true"]));
    let out = output_within(run, PATIENCE);
    assert_fails(&out, 73, &squatted.display().to_string());
    let text = stderr_of(&out);
    assert!(
        text.contains(&format!("uid {SQUATTER_UID}")) && text.contains("DLOCK_DIR"),
        "the message names neither who made the directory nor the way out: {text}"
    );
    assert_eq!(
        std::fs::read_dir(&squatted).expect("read_dir").count(),
        0,
        "dlock used the other user's directory"
    );

    // The way out: a directory of the user's own, named by DLOCK_DIR in cron's environment
    // and in the login shell's alike; a run from each excludes the other.
    let own = env.path("own");
    std::fs::create_dir(&own).expect("mkdir");
    std::os::unix::fs::chown(&own, Some(VICTIM_UID), Some(VICTIM_UID)).expect("chown");
    std::fs::set_permissions(env.scratch.path(), std::fs::Permissions::from_mode(0o711))
        .expect("chmod");
    let dlock_dir = own.join("dlock");
    let ready = own.join("ready");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let mut login = as_victim(without_a_directory(
        &env,
        &["run", "x", "sh", "-c", &script],
    ));
    login
        .env("DLOCK_DIR", &dlock_dir)
        .env("XDG_RUNTIME_DIR", env.path("login-session"))
        .stderr(std::process::Stdio::piped());
    let child = login.spawn().expect("spawn the login session's run");
    let holding = Holding {
        child,
        ready: ready.clone(),
    };
    wait_until("the login session's run holds", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let mut cron = as_victim(without_a_directory(
        &env,
        &["run", "--no-wait", "x", "true"],
    ));
    cron.env("DLOCK_DIR", &dlock_dir)
        .env_remove("XDG_RUNTIME_DIR");
    let out = output_within(cron, PATIENCE);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    drop(holding);
    assert!(Path::new(&dlock_dir).join("x.lock").exists());
}

/// The default directory is each user's own: `status` says whose locks the directory it
/// looked in holds, so a lock another user holds does not read as simply free; with a
/// directory named, it says which.
#[test]
fn status_says_whose_locks_the_default_directory_holds() {
    assert!(
        nix::unistd::getuid().is_root(),
        "this test needs root to act as another user"
    );
    // A uid of its own: the other tests here make VICTIM_UID's directory.
    const ASKER_UID: u32 = 424_245;
    let as_asker = |mut command: Command| {
        command
            .uid(ASKER_UID)
            .gid(ASKER_UID)
            .current_dir("/")
            .env("HOME", "/");
        command
    };
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("whose");
    let out = output_within(
        as_asker(without_a_directory(&env, &["status", &lock])),
        PATIENCE,
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let wanted = format!(
        "free (locks of uid {ASKER_UID} in {})",
        default_dir_of(ASKER_UID).display()
    );
    assert!(stdout_of(&out).contains(&wanted), "{}", describe(&out));
    let out = output_within(
        as_asker(without_a_directory(&env, &["status", "--json", &lock])),
        PATIENCE,
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        json["location"].as_str(),
        Some(&wanted["free (".len()..wanted.len() - 1]),
        "{json}"
    );
    let out = env.run(["status", &lock]);
    assert!(
        stdout_of(&out).contains(&format!("free (in {}", server.dir.path().display())),
        "{}",
        describe(&out)
    );
}
