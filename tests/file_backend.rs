//! Promises specific to the file backend (design §1, issue: file backend).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// `file://` URL of a directory.
fn url_of(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// A directory with exactly `mode` (set after creation, so the umask does not interfere).
fn dir_with_mode(path: &Path, mode: u32) -> PathBuf {
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path.to_owned()
}

/// The uid of "nobody", standing in for another user (the tests run as root).
const OTHER_UID: u32 = 65534;

fn give_to_other_user(path: &Path) {
    nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(OTHER_UID)), None)
        .expect("chown (these tests run as root)");
}

/// Hold an exclusive flock on `path` from the test process itself, as someone else would; the
/// file is opened without blocking (it may be a FIFO).
fn flock_from_here(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .expect("open");
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0, "flock {}", path.display());
    file
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

#[test]
fn fifo_in_place_of_a_lock_file_is_refused_without_hanging() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let fifo = server.dir.path().join("x.lock");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).expect("mkfifo");
    let where_ = fifo.display().to_string();
    // First with nobody holding it, then with someone holding a flock on it.
    for held in [false, true] {
        let _flock = held.then(|| flock_from_here(&fifo));
        for args in [
            &["run", "--no-wait", "x", "touch", "ran"][..],
            &["run", "x", "touch", "ran"],
        ] {
            let out = env.run(args);
            assert_fails(&out, 73, &where_);
            assert!(stderr_of(&out).contains("FIFO"), "{}", describe(&out));
            assert!(!env.path("ran").exists());
        }
        let out = env.run(["status", "x"]);
        assert_fails(&out, 73, &where_);
    }
}

#[test]
fn list_skips_a_fifo_and_lists_the_other_locks() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let _holder = env.hold("y", &[]);
    let fifo = server.dir.path().join("x.lock");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).expect("mkfifo");
    let _flock = flock_from_here(&fifo);
    let out = env.run(["list"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains('y'), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains(&fifo.display().to_string()),
        "the bad entry is not reported: {}",
        describe(&out)
    );
}

#[test]
fn directory_or_socket_in_place_of_a_lock_file_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    std::fs::create_dir(server.dir.path().join("d.lock")).expect("mkdir");
    let _socket = std::os::unix::net::UnixListener::bind(server.dir.path().join("s.lock"))
        .expect("bind socket");
    for (name, kind) in [("d", "directory"), ("s", "socket")] {
        let out = env.run(["run", name, "touch", "ran"]);
        assert_fails(&out, 73, kind);
        assert!(!env.path("ran").exists());
        let out = env.run(["status", name]);
        assert_fails(&out, 73, kind);
    }
}

/// `run`, `status` and `list` of lock `x` with `flags` (the flags go before the name).
fn run_status_list(flags: &[&str]) -> [Vec<String>; 3] {
    let with = |sub: &str, rest: &[&str]| -> Vec<String> {
        std::iter::once(sub)
            .chain(flags.iter().copied())
            .chain(rest.iter().copied())
            .map(str::to_owned)
            .collect()
    };
    [
        with("run", &["x", "touch", "ran"]),
        with("status", &["x"]),
        with("list", &[]),
    ]
}

#[test]
fn prefix_directory_swapped_for_a_symlink_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    // The victim: a directory of root's with a file where the lock file would be.
    let victim_dir = dir_with_mode(&env.path("victim"), 0o755);
    let victim = victim_dir.join("x.lock");
    std::fs::write(&victim, b"root's data\n").expect("write victim");
    // A base directory others can write to, world-writable with and without the sticky bit,
    // where someone made team.d a symbolic link to the victim directory.
    for (mode, complaint) in [(0o777, "sticky bit"), (0o1777, "symbolic link")] {
        let base = dir_with_mode(&env.path(&format!("base-{mode:o}")), mode);
        let team = base.join("team.d");
        std::os::unix::fs::symlink(&victim_dir, &team).expect("symlink");
        let url = url_of(&base);
        for args in run_status_list(&["--url", &url, "--prefix", "team"]) {
            let out = env.run(&args);
            assert_fails(&out, 73, complaint);
            assert!(stderr_of(&out).contains(&base.display().to_string()));
            assert!(!env.path("ran").exists(), "{args:?} ran its command");
            assert_eq!(
                std::fs::read(&victim).expect("victim"),
                b"root's data\n",
                "{args:?} wrote through the symlink"
            );
        }
    }
}

#[test]
fn base_directory_owned_by_another_user_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("theirs"), 0o755);
    give_to_other_user(&base);
    let url = url_of(&base);
    for flags in [&["--url", &url][..], &["--url", &url, "--prefix", "team"]] {
        for args in run_status_list(flags) {
            let out = env.run(&args);
            assert_fails(&out, 73, &format!("owned by uid {OTHER_UID}"));
            assert!(stderr_of(&out).contains(&base.display().to_string()));
            assert!(!env.path("ran").exists(), "{args:?} ran its command");
        }
    }
    assert_eq!(
        std::fs::read_dir(&base).expect("read_dir").count(),
        0,
        "dlock created something in the other user's directory"
    );
    // The same for a symbolic link of theirs as the directory, even to a directory of ours.
    let ours = dir_with_mode(&env.path("ours"), 0o755);
    let link = env.path("their-link");
    std::os::unix::fs::symlink(&ours, &link).expect("symlink");
    std::os::unix::fs::lchown(&link, Some(OTHER_UID), None).expect("lchown");
    let url = url_of(&link);
    for args in run_status_list(&["--url", &url]) {
        let out = env.run(&args);
        assert_fails(&out, 73, "symbolic link");
        assert!(!env.path("ran").exists(), "{args:?} ran its command");
    }
    // And for a prefix directory of theirs in a directory of ours.
    give_to_other_user(&dir_with_mode(&ours.join("team.d"), 0o755));
    let url = url_of(&ours);
    for args in run_status_list(&["--url", &url, "--prefix", "team"]) {
        let out = env.run(&args);
        assert_fails(&out, 73, &format!("owned by uid {OTHER_UID}"));
        assert!(stderr_of(&out).contains("team.d"));
    }
}

#[test]
fn sticky_shared_directory_works_and_prefix_directories_are_private() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("shared"), 0o1777);
    let url = url_of(&base);
    let out = env.run(["run", "--url", &url, "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--url", &url, "--prefix", "team", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let team = std::fs::symlink_metadata(base.join("team.d")).expect("team.d");
    assert!(team.is_dir());
    assert_eq!(team.mode() & 0o7777, 0o700);
    assert!(base.join("team.d").join("x.lock").exists());
}

#[test]
fn lock_file_planted_in_a_shared_directory_is_not_trusted() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("shared"), 0o1777);
    let url = url_of(&base);
    // Another user's file, and a file of root's that anyone can write.
    let theirs = base.join("x.lock");
    std::fs::write(&theirs, format!("fence {:020}\n", 1)).expect("write");
    give_to_other_user(&theirs);
    let open = base.join("y.lock");
    std::fs::write(&open, format!("fence {:020}\n", 1)).expect("write");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    for (name, path) in [("x", &theirs), ("y", &open)] {
        let commands = [
            vec!["run", "--url", &url, name, "touch", "ran"],
            vec!["status", "--url", &url, name],
        ];
        for args in commands {
            let out = env.run(&args);
            assert_fails(&out, 73, &path.display().to_string());
            assert!(!env.path("ran").exists(), "ran on a planted lock file");
        }
    }
    assert_eq!(
        std::fs::read(&theirs).expect("read"),
        format!("fence {:020}\n", 1).as_bytes()
    );
}

#[test]
fn hard_link_in_a_shared_directory_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("shared"), 0o1777);
    let victim = env.path("victim");
    std::fs::write(&victim, b"root's data\n").expect("write victim");
    std::fs::hard_link(&victim, base.join("x.lock")).expect("link");
    let url = url_of(&base);
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(&out, 73, "link");
    assert!(!env.path("ran").exists());
    assert_eq!(std::fs::read(&victim).expect("victim"), b"root's data\n");
}
