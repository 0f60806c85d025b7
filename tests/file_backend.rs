//! Promises specific to the file backend (design §1, issue: file backend).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use crate::common::*;

crate::contract_tests!(file_contract, FileServer::start());

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
fn lock_files_are_never_deleted_and_keep_the_counter() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let first = env.token("x");
    let path = server.dir.path().join("x.lock");
    let inode = std::fs::metadata(&path).expect("lock file").ino();
    let second = env.token("x");
    assert!(second > first);
    assert_eq!(
        std::fs::metadata(&path).expect("lock file").ino(),
        inode,
        "lock file was recreated"
    );
    // A crash that lost the counter (file emptied) must not make tokens go backwards.
    std::fs::write(&path, b"").expect("truncate");
    let third = env.token("x");
    assert!(third > second, "token went backwards: {third} <= {second}");
}

#[test]
fn prefix_is_a_separate_namespace() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let _holder = env.hold("x", &[]);
    let out = env.run(["run", "--no-wait", "--prefix", "other", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// Write the fencing counter of `name` (its slot-0 header) by hand.
fn set_counter(server: &FileServer, name: &str, header: &[u8]) -> PathBuf {
    let path = server.dir.path().join(format!("{name}.lock"));
    std::fs::write(&path, header).expect("write lock file");
    path
}

#[test]
fn fencing_tokens_never_repeat_at_the_top_of_the_range() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let path = set_counter(&server, "x", format!("fence {:020}\n", u64::MAX - 1).as_bytes());
    assert_eq!(env.token("x"), u64::MAX);
    for _ in 0..2 {
        let out = env.run(["run", "x", "touch", "ran"]);
        assert_fails(&out, 73, &path.display().to_string());
        assert!(stderr_of(&out).contains("fencing"), "{}", describe(&out));
        assert!(!env.path("ran").exists(), "ran with a repeated token");
    }
    let path = set_counter(&server, "y", format!("fence {}\n", u64::MAX).as_bytes());
    let out = env.run(["run", "y", "touch", "ran"]);
    assert_fails(&out, 73, &path.display().to_string());
    assert!(!env.path("ran").exists(), "ran with a repeated token");
}

#[test]
fn unreadable_fencing_counter_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let headers: [&[u8]; 4] = [
        b"fence garbage-garbage-garb\n",
        &[0u8; 27],
        b"fence 99999999999999999999\n", // beyond u64
        b"fen",
    ];
    for header in headers {
        let path = set_counter(&server, "x", header);
        let out = env.run(["run", "x", "touch", "ran"]);
        assert_fails(&out, 73, &path.display().to_string());
        assert!(stderr_of(&out).contains("fencing counter"), "{}", describe(&out));
        assert!(!env.path("ran").exists(), "ran with an unknown counter");
        assert_eq!(std::fs::read(&path).expect("read"), header, "counter rewritten");
    }
    // An empty file is a fresh counter, not garbage.
    set_counter(&server, "x", b"");
    assert!(env.token("x") > 0);
}
