//! Promises specific to the file backend (docs/backends/file.md): the lock
//! directory, names, `--limit`; the fencing counter (`tokens`), what else may stand where a
//! lock file should be (`special_files`), shared directories (`shared_dirs`), and `flock -s`
//! interop of shared locks (`shared`). Its test server is `server` (a private directory).

mod busy_lock_table;
mod default_dir;
pub(super) mod server;
mod shared;
mod shared_dirs;
mod special_files;
mod tokens;

use std::os::unix::fs::PermissionsExt;

use crate::support::*;

crate::contract_tests!(file_contract, FileServer::start());
crate::shared_contract_tests!(file_shared_contract, FileServer::start());
crate::scale_test!("file", FileServer::start());
crate::handoff_test!("file", FileServer::start());

#[test]
fn default_directory_is_created_private() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let out = output_within(
        {
            let mut c = env.dlock(["run", "x", "true"]);
            c.env_remove("DLOCK_URL");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let dir = env.path("runtime").join("dlock");
    let meta = std::fs::metadata(&dir).expect("default lock directory");
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert!(dir.join("x.lock").exists());
}

/// Without `--url` (and without `DLOCK_DIR`), a run from cron (no `XDG_RUNTIME_DIR`) and
/// one from a login session use the same directory, so they exclude each other.
#[test]
fn cron_and_a_login_session_share_the_default_directory() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("cron");
    let session = |c: &mut std::process::Command| {
        c.env_remove("DLOCK_URL").env_remove("DLOCK_DIR");
    };
    let ready = env.path("ready");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let mut login = env.dlock(["run", &lock, "sh", "-c", &script]);
    session(&mut login);
    let child = login
        .env("XDG_RUNTIME_DIR", env.path("login-session"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the login session's run");
    let holding = Holding { child, ready };
    wait_until("the login session's run holds", PATIENCE, || {
        std::fs::read_to_string(&holding.ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let out = output_within(
        {
            let mut cron = env.dlock(["run", "--no-wait", &lock, "touch", "ran"]);
            session(&mut cron);
            cron.env_remove("XDG_RUNTIME_DIR");
            cron
        },
        PATIENCE,
    );
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        !env.path("ran").exists(),
        "cron's run ran beside the login session's"
    );
    drop(holding);
    // The runs used the machine's real default directory: leave nothing of this test there.
    let uid = nix::unistd::getuid();
    for dir in [
        "/run/dlock".to_owned(),
        "/var/lib/dlock".to_owned(),
        format!("/run/lock/dlock-{uid}"),
        format!("/tmp/dlock-{uid}"),
    ] {
        let _ = std::fs::remove_file(std::path::Path::new(&dir).join(format!("{lock}.lock")));
    }
}

#[test]
fn default_directory_writable_by_others_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let dir = env.path("runtime").join("dlock");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = output_within(
        {
            let mut c = env.dlock(["run", "x", "touch", "ran"]);
            c.env_remove("DLOCK_URL");
            c
        },
        PATIENCE,
    );
    assert_fails(&out, 73, "refusing to use lock directory");
    assert!(!env.path("ran").exists());
}

#[test]
fn uncreatable_lock_directory_is_73() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let out = env.run([
        "run",
        "--url",
        "file:///proc/dlock-test/locks",
        "x",
        "touch",
        "ran",
    ]);
    assert_fails(&out, 73, "/proc/dlock-test/locks");
    assert!(!env.path("ran").exists());
}

#[test]
fn symlink_at_lock_path_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let target = env.path("elsewhere");
    std::os::unix::fs::symlink(&target, server.dir.path().join("x.lock")).expect("symlink");
    let out = env.run(["run", "x", "touch", "ran"]);
    assert_fails(&out, 73, "symbolic link");
    assert!(!target.exists(), "dlock followed the symlink");
}

#[test]
fn release_force_refuses_and_names_the_holder_pid() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let holder = env.hold("x", &[]);
    let out = env.run(["release", "--force", "x"]);
    assert_fails(&out, 77, &holder.pid().to_string());
    assert!(!env.is_free("x"), "the holder lost its lock");
    let out = env.run(["release", "--force", "not-held"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stderr_of(&out).contains("not held"));
}

#[test]
fn names_never_leave_the_lock_directory() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let names = ["../escape", "a/b", "/abs", ".", "..", "-dash", "x/../../y"];
    for name in names {
        let out = env.run(["run", "--", name, "true"]);
        assert!(out.status.success(), "{name}: {}", describe(&out));
    }
    let parent = server.dir.path().parent().expect("parent");
    assert!(!parent.join("escape.lock").exists());
    let entries: Vec<_> = std::fs::read_dir(server.dir.path())
        .expect("read_dir")
        .map(|e| e.expect("entry"))
        .collect();
    assert_eq!(
        entries.len(),
        names.len(),
        "one lock file per name, no sub-directories"
    );
    for entry in entries {
        assert!(
            entry.file_type().expect("type").is_file(),
            "{:?}",
            entry.path()
        );
    }
}

#[test]
fn longest_names_work_and_stay_distinct() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let a = "é".repeat(127); // 254 bytes
    let b = format!("{}x", "é".repeat(127)); // 255 bytes
    let _ha = env.hold(&a, &["--no-wait"]);
    let _hb = env.hold(&b, &["--no-wait"]);
    assert_eq!(env.run(["status", &a]).status.code(), Some(0));
}

#[test]
fn prefix_is_a_separate_namespace() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let _holder = env.hold("x", &[]);
    let out = env.run(["run", "--no-wait", "--prefix", "other", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn holders_must_agree_on_the_limit() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let _semaphore = env.hold("x", &["--limit", "2"]);
    for limit in ["3", "1"] {
        let out = env.run(["run", "--no-wait", "--limit", limit, "x", "touch", "ran"]);
        assert_fails(&out, 64, "--limit 2");
        assert!(
            stderr_of(&out).contains("same --limit"),
            "{}",
            describe(&out)
        );
        assert!(!env.path("ran").exists(), "ran beside a --limit 2 holder");
    }
    // A waiting run is refused too, at once rather than after the wait.
    let out = env.run(["run", "--limit", "1", "x", "touch", "ran"]);
    assert_fails(&out, 64, "--limit 2");
    assert!(!env.path("ran").exists());
    // The same limit is fine: a second holder of the semaphore.
    let out = env.run(["run", "--no-wait", "--limit", "2", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));

    // A plain lock (--limit 1) does not let a --limit 2 run in beside it.
    let _mutex = env.hold("y", &[]);
    let out = env.run(["run", "--no-wait", "--limit", "2", "y", "touch", "ran"]);
    assert_fails(&out, 64, "--limit 1");
    assert!(!env.path("ran").exists(), "ran beside a --limit 1 holder");
}

#[test]
fn holders_with_different_limits_never_overlap() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let log = env.path("log");
    // Started together, so that some reach the lock at the same moment.
    let children: Vec<_> = (0..8)
        .map(|i| {
            let limit = if i % 2 == 0 { "1" } else { "2" };
            let script = format!(
                "echo start {limit} >> '{log}'; sleep 0.1; echo end {limit} >> '{log}'",
                log = log.display()
            );
            env.dlock([
                "run", "--wait", "20s", "--limit", limit, "x", "sh", "-c", &script,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn dlock")
        })
        .collect();
    for mut child in children {
        let status = wait_within(&mut child, PATIENCE);
        assert!(matches!(status.code(), Some(0 | 64)), "{status}");
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut running: Vec<&str> = Vec::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("start", limit)) => {
                assert!(
                    running.iter().all(|r| *r == limit),
                    "--limit {limit} ran beside --limit {running:?}:\n{text}"
                );
                running.push(limit);
                let most: usize = limit.parse().expect("limit");
                assert!(running.len() <= most, "too many holders:\n{text}");
            }
            Some(("end", limit)) => {
                let at = running.iter().position(|r| *r == limit).expect("started");
                running.remove(at);
            }
            _ => panic!("bad log line {line:?}"),
        }
    }
}

/// A holder whose record in the lock file was written by hand, each field longer than dlock
/// writes it (as long as the file backend reads a record), is shown cut and escaped.
#[test]
fn oversized_holder_metadata_is_cut_and_escaped() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("oversized");
    let _holder = env.hold(&lock, &[]);
    let path = server.dir.path().join(format!("{lock}.lock"));
    let contents = std::fs::read_to_string(&path).expect("read the lock file");
    // The header (`fence ` and 20 digits and a newline), then the record.
    let (header, record) = contents.split_at(27);
    let mut record: serde_json::Value = serde_json::from_str(record.trim()).expect("a record");
    let long = |c: &str| c.repeat(12_000);
    record["command"] = format!("{}{}", crate::contract::INVISIBLE, long("x")).into();
    record["host"] = long("h").into();
    record["user"] = long("u").into();
    record["version"] = long("v").into();
    let forged = format!("{header}{record}\n");
    assert!(forged.len() < 64 * 1024, "more than the backend reads");
    std::fs::write(&path, forged).expect("write the lock file");
    crate::contract::oversized_holder_metadata_is_cut_and_escaped(&env, &lock);
}
