//! What may stand where a lock file should be: a FIFO, a directory, a socket. dlock refuses
//! them without hanging, and `list` goes on past them.

use std::path::Path;

use crate::support::*;

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
