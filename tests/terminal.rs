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
