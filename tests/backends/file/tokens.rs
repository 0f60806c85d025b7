//! The file backend's fencing counter, kept in the lock file: never deleted, never repeated,
//! never guessed when unreadable.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::support::*;

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
    let path = set_counter(
        &server,
        "x",
        format!("fence {:020}\n", u64::MAX - 1).as_bytes(),
    );
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
        assert!(
            stderr_of(&out).contains("fencing counter"),
            "{}",
            describe(&out)
        );
        assert!(!env.path("ran").exists(), "ran with an unknown counter");
        assert_eq!(
            std::fs::read(&path).expect("read"),
            header,
            "counter rewritten"
        );
    }
    // An empty file is a fresh counter, not garbage.
    set_counter(&server, "x", b"");
    assert!(env.token("x") > 0);
}
