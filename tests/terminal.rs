//! dlock at an interactive terminal (a pseudo-terminal): Ctrl-C reaches the command exactly
//! once, and the command can read the terminal.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use crate::support::*;

/// Keep reading the terminal's output so the command never blocks on a full buffer.
fn drain(master: &OwnedFd) -> std::thread::JoinHandle<Vec<u8>> {
    let mut reader = std::fs::File::from(master.try_clone().expect("dup master"));
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        // EIO once the terminal's last user is gone ends the loop.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    })
}

#[test]
fn ctrl_c_at_a_terminal_reaches_the_command_once_and_it_can_read() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let log = env.path("log");
    let ready = env.path("ready");
    let script = format!(
        "trap 'echo INT >> {log}' INT; echo ok > {ready}; \
         while :; do if read line; then echo \"got:$line\" >> {log}; break; fi; done",
        log = log.display(),
        ready = ready.display()
    );
    let mut command = env.dlock(["run", "tty-lock", "sh", "-c", &script]);
    let slave = pty.slave.as_raw_fd();
    command
        .stdin(Stdio::from(pty.slave.try_clone().expect("dup")))
        .stdout(Stdio::from(pty.slave.try_clone().expect("dup")))
        .stderr(Stdio::from(pty.slave.try_clone().expect("dup")));
    // SAFETY: setsid and ioctl are async-signal-safe; this makes the pty dlock's controlling
    // terminal with dlock in its foreground process group, as a login shell would.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut dlock = command.spawn().expect("spawn dlock");
    // Our copies of the terminal's slave side must go, or the drain never sees the end.
    drop(command);
    drop(pty.slave);
    let output = drain(&pty.master);
    let mut master = std::fs::File::from(pty.master);

    wait_until("command ready", PATIENCE, || ready.exists());
    master.write_all(b"\x03").expect("type Ctrl-C");
    wait_until("trap ran", PATIENCE, || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("INT"))
    });
    master.write_all(b"hello\n").expect("type a line");
    let status = wait_within(&mut dlock, PATIENCE);
    drop(master);
    let _ = output.join();
    assert!(status.success(), "dlock exited {status}");
    let seen = std::fs::read_to_string(&log).expect("log");
    assert_eq!(
        seen, "INT\ngot:hello\n",
        "Ctrl-C must arrive exactly once and reading must work"
    );
}

/// Ctrl-Z at a terminal, on a lease backend, under a shell with job control: dlock warns that
/// the lease is not renewed while it is stopped, then stops with the command (as flock does).
#[test]
fn ctrl_z_on_a_lease_backend_warns_that_the_lease_will_lapse() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let ready = env.path("ready");
    // The command records dlock's pid ($PPID) so the test can end the stopped job.
    // (`\$`: expanded by the inner shell, whose parent is dlock, not by the outer one.)
    let job = format!("echo \\$PPID > '{}'; exec sleep 1000", ready.display());
    // The shell stays: a session leader that exits would SIGHUP and continue its stopped job.
    let line = format!("'{DLOCK}' run tty-z sh -c \"{job}\"; echo shell-went-on; exec sleep 1000");
    let mut command = std::process::Command::new("sh");
    command
        .args(["-m", "-c", &line])
        .current_dir(env.scratch.path());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DLOCK_") {
            command.env_remove(key);
        }
    }
    command
        .env("DLOCK_URL", &env.url)
        .env("DLOCK_TTL", env.ttl.unwrap_or("15s"))
        .env("XDG_CONFIG_HOME", env.path("no-config"))
        .env("XDG_RUNTIME_DIR", env.path("runtime"))
        .env("DLOCK_DIR", env.path("runtime").join("dlock"));
    let slave = pty.slave.as_raw_fd();
    command
        .stdin(Stdio::from(pty.slave.try_clone().expect("dup")))
        .stdout(Stdio::from(pty.slave.try_clone().expect("dup")))
        .stderr(Stdio::from(pty.slave.try_clone().expect("dup")));
    // SAFETY: setsid and ioctl are async-signal-safe; the shell gets the pty as its
    // controlling terminal, as a login shell would, and runs dlock as a job.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut shell = command.spawn().expect("spawn sh");
    drop(command);
    drop(pty.slave);
    let output = drain(&pty.master);
    let mut master = std::fs::File::from(pty.master);
    wait_until("command ready", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let dlock_pid = read_pid(&ready);
    assert_ne!(
        dlock_pid as u32,
        std::process::id(),
        "the pid must be dlock's"
    );
    master.write_all(b"\x1a").expect("type Ctrl-Z");
    // dlock stops with its command, and the shell goes on.
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{dlock_pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            == Some(true)
    };
    wait_until("dlock stopped", PATIENCE, stopped);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dlock_pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = shell.kill();
    let _ = shell.wait();
    drop(master);
    let seen = String::from_utf8_lossy(&output.join().expect("drain")).into_owned();
    assert!(
        seen.contains("the lease on 'tty-z' is not renewed while dlock is stopped"),
        "no warning: {seen:?}"
    );
}
