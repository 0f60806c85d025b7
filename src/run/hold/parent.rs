//! The process the shell started, once it has forked the keeper: it waits for the keeper's
//! first word (or its end), forwarding the signals it gets meanwhile, and exits with it.

use std::io::{IsTerminal, Write};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::exit::{Code, Outcome};

/// The keeper whose first word the parent waits for.
static KEEPER: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let keeper = KEEPER.load(Ordering::Relaxed);
    if keeper > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(keeper, signal);
        }
    }
}

/// The parent: the keeper's status byte once it holds the lock, or its exit status when it
/// ended without (busy, an error, a signal while waiting). A failure is also said on stdout
/// for `eval`, whose own status would otherwise be 0 for an empty text: `(exit 75)` makes
/// `eval "$(dlock hold x)" || exit` and `set -e` work.
pub(super) fn wait_for_keeper(keeper: nix::unistd::Pid, from: OwnedFd) -> u8 {
    let status = keeper_status(keeper, from);
    if status != 0 && !std::io::stdout().is_terminal() {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "(exit {status})").and_then(|()| out.flush());
    }
    status
}

fn keeper_status(keeper: nix::unistd::Pid, from: OwnedFd) -> u8 {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    KEEPER.store(keeper.as_raw(), Ordering::Relaxed);
    let action = SigAction::new(
        SigHandler::Handler(forward),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        // SAFETY: the handler only reads an atomic and calls kill.
        let _ = unsafe { sigaction(signal, &action) };
    }
    let mut status = [0u8; 1];
    loop {
        match nix::unistd::read(&from, &mut status) {
            Ok(1) => return status[0],
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    loop {
        match nix::sys::wait::waitpid(keeper, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => {
                return u8::try_from(code).unwrap_or(Outcome::Failed(Code::Internal).status());
            }
            Ok(nix::sys::wait::WaitStatus::Signaled(_, signal, _)) => {
                return Outcome::Signalled(signal as i32).status();
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => {
                say!("lost track of the hold's keeper: {err}");
                return Outcome::Failed(Code::Internal).status();
            }
        }
    }
}
