//! Job control: the terminal's foreground group, handed to the command and taken back, and a
//! command stopped at the terminal (Ctrl-Z) mirrored by a stopped dlock, so the shell sees
//! the job stopped and `fg` continues it.

use std::os::fd::{AsFd, OwnedFd};

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{getpgrp, Pid};

use super::{Child, Policy};

/// The controlling terminal, when dlock is its foreground job.
pub struct Terminal {
    pub(super) tty: OwnedFd,
    own_group: Pid,
}

impl Terminal {
    /// The controlling terminal if dlock is in its foreground process group.
    pub fn foreground() -> Option<Terminal> {
        let tty = nix::fcntl::open(
            "/dev/tty",
            nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NOCTTY,
            nix::sys::stat::Mode::empty(),
        )
        .ok()?;
        let own_group = getpgrp();
        (nix::unistd::tcgetpgrp(&tty).ok()? == own_group).then_some(Terminal { tty, own_group })
    }

    /// Make `group` the foreground group. Works from the background too: SIGTTOU is blocked
    /// for the call (blocked, not ignored, so the command does not inherit it).
    pub(super) fn give_to(&self, group: Pid) {
        with_sigttou_blocked(|| {
            let _ = nix::unistd::tcsetpgrp(&self.tty, group);
        });
    }

    pub(super) fn take_back(&self) {
        self.give_to(self.own_group);
    }
}

fn with_sigttou_blocked(f: impl FnOnce()) {
    let mut block = SigSet::empty();
    block.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    let blocked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&block), Some(&mut old)).is_ok();
    f();
    if blocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
}
/// The command stopped (Ctrl-Z, SIGTTIN, …). At a terminal, mirror it so the shell's job
/// control works: take the terminal back, stop dlock; once continued, hand the terminal back
/// and continue the command. Elsewhere (no job control) there is nothing to mirror.
///
/// On a lease backend a stopped dlock renews nothing, so the lease lapses after its TTL and
/// another process may take the lock; dlock says so before it stops (and lets it stop, as
/// `flock` and a shell user expect: refusing would break `bg`). After `fg`, the lost lease is
/// handled as any lost lock (`--on-lost`).
pub(super) fn suspend_with_child(
    child: &Child,
    terminal: Option<&Terminal>,
    sig: Signal,
    policy: &Policy,
) {
    let Some(terminal) = terminal else {
        return;
    };
    if !matches!(sig, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU) {
        return;
    }
    terminal.take_back();
    if has_job_control() {
        if let Some((name, ttl)) = &policy.lease {
            say!(
                "stopped: the lease on '{name}' is not renewed while dlock is stopped; after \
                 {} another process may take the lock, and on 'fg' the command is handled as \
                 having lost it (--on-lost)",
                humantime::format_duration(*ttl)
            );
        }
        // Stops every thread of dlock until the shell sends SIGCONT (`fg` / `bg`).
        let _ = nix::sys::signal::kill(Pid::from_raw(0), Signal::SIGSTOP);
    }
    if nix::unistd::tcgetpgrp(terminal.tty.as_fd()).ok() == Some(terminal.own_group) {
        terminal.give_to(child.group());
    }
    child.signal_group(libc::SIGCONT);
}

/// Whether a parent in our session (a shell) can continue a stopped dlock: our process group
/// is not orphaned.
fn has_job_control() -> bool {
    let parent = nix::unistd::getppid();
    let same_session = nix::unistd::getsid(Some(parent)).ok() == nix::unistd::getsid(None).ok();
    let other_group = nix::unistd::getpgid(Some(parent)).ok() != Some(getpgrp());
    same_session && other_group
}
