//! Running the command while the lock is held.
//!
//! # Theory of operation
//!
//! The command is started in a process group of its own, so that dlock can signal it and
//! everything it started (`killpg`) without signalling itself. When dlock is the foreground
//! job of a terminal, that group is made the terminal's foreground group: Ctrl-C and Ctrl-Z
//! then go from the terminal straight to the command, once, and an interactive command can
//! read the terminal. When the command stops (Ctrl-Z), dlock takes the terminal back and stops
//! itself, so the shell sees the job stopped; on `fg` it hands the terminal back and continues
//! the command.
//!
//! In the child, before `exec`: `setpgid(0, 0)`, the terminal hand-over, and
//! `PR_SET_PDEATHSIG(SIGKILL)`, so that if dlock is killed with SIGKILL the command dies too
//! (`spawn.rs` starts it without copying dlock's memory).
//! (The death signal follows the thread that started the child; dlock starts it from its only
//! runtime thread.)
//!
//! Then one loop waits for whichever comes first:
//!
//! - **the command ends** → return its status (detected with `waitid(WNOWAIT)` so the process
//!   group cannot disappear while dlock still decides whether to signal it);
//! - **a signal to dlock** (TERM, INT, HUP, QUIT, USR1, USR2) → forwarded once to the
//!   command's group. After a terminating one (TERM, INT, HUP, QUIT) the command gets
//!   `--kill-after` before SIGKILL, and a second terminating signal sends SIGKILL at once;
//! - **the lock is lost** → per `--on-lost`: `term` sends SIGTERM to the group and SIGKILL after
//!   `--kill-after` or at the lease's `kill_by` deadline, whichever is first; `kill` sends
//!   SIGKILL at once; `ignore` only warns. After a loss, when the command itself exits, anything
//!   left in its group is killed, so nothing keeps running unprotected. A command seen to have
//!   ended only after the lease stopped being proven ([`Lease::proven_until`]: dlock was
//!   stopped or starved past its keeper's deadline) counts as having lost the lock too: it
//!   may have run on after the lock was gone, and nothing can tell.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::cli::OnLost;
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::lock::{Lease, Lost};
use crate::settings::CommandSpec;
use crate::signals::{self, Signals};

mod terminal;

use self::terminal::suspend_with_child;
pub use self::terminal::Terminal;

/// How to treat the command.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The lock's name, for the line that tells of its loss.
    pub name: String,
    pub on_lost: OnLost,
    pub kill_after: Duration,
    /// The lock's name and TTL when its hold is a lease that dlock must keep renewing (not
    /// the file backend's kernel lock): a Ctrl-Z that stops dlock warns that it will lapse.
    pub lease: Option<(crate::lock::LockName, Duration)>,
}

/// How the command ended.
#[derive(Debug)]
pub struct Ending {
    pub status: ExitStatus,
    /// Set when the lock was lost while the command ran.
    pub lost: Option<Lost>,
    /// The loss was found only once the command had ended on its own (dlock did not stop it).
    pub lost_after_end: bool,
    /// The first terminating signal (TERM, INT, HUP, QUIT) forwarded to the command: dlock
    /// was asked to stop, so `--min-hold` does not keep the lock after it.
    pub stopped_by: Option<i32>,
}

/// A started command.
pub struct Child {
    pid: Pid,
}

/// Start the command in its own process group with `env` changes applied (`None` removes).
/// Returns once the command has been exec'd (see `spawn.rs`); a command that cannot be
/// started is the error the user reads (`command not found: …`, 127; `cannot execute …`, 126).
pub fn spawn(
    spec: &CommandSpec,
    env: &[(OsString, Option<OsString>)],
    terminal: Option<&Terminal>,
    inherit: Option<std::os::fd::RawFd>,
) -> Result<Child, Error> {
    start(spec, env, terminal, inherit).map_err(|err| not_started(spec, &err))
}

/// Why `spec` could not be started, as dlock says it.
fn not_started(spec: &CommandSpec, err: &io::Error) -> Error {
    let shown = spec.arg0.to_string_lossy();
    match err.raw_os_error() {
        Some(libc::ENOENT) => match crate::settings::command::bad_interpreter(&spec.program) {
            Some(why) => Error::NotFound(format!("cannot run {shown}: {why}")),
            None => Error::NotFound(format!("command not found: {shown}")),
        },
        Some(
            libc::EACCES
            | libc::ENOEXEC
            | libc::EISDIR
            | libc::ENOTDIR
            | libc::ETXTBSY
            | libc::EPERM,
        ) => Error::NotExecutable(format!("cannot execute {shown}: {err}")),
        _ => Error::Internal(format!("cannot start {shown}: {err}")),
    }
}

fn start(
    spec: &CommandSpec,
    env: &[(OsString, Option<OsString>)],
    terminal: Option<&Terminal>,
    inherit: Option<std::os::fd::RawFd>,
) -> io::Result<Child> {
    let argv: Vec<&OsStr> = std::iter::once(spec.arg0.as_os_str())
        .chain(spec.args.iter().map(OsString::as_os_str))
        .collect();
    let tty = terminal.map(|t| t.tty.as_raw_fd());
    let pid = crate::spawn::spawn(&spec.program, &argv, env, tty, inherit)?;
    // The child made its own group (and took the terminal) before exec, and the parent
    // resumes only after that exec: the group exists before dlock could signal it.
    Ok(Child {
        pid: Pid::from_raw(pid),
    })
}

impl Child {
    fn group(&self) -> Pid {
        self.pid
    }

    fn signal_group(&self, signal: i32) {
        if let Ok(sig) = Signal::try_from(signal) {
            if let Err(err) = killpg(self.group(), sig) {
                tracing::debug!("killpg({}, {sig}) failed: {err}", self.group());
            }
        }
    }

    /// Non-blocking look at the child: exited (not yet reaped), stopped, or still running.
    fn peek(&self) -> io::Result<Peek> {
        let flags = WaitPidFlag::WEXITED
            | WaitPidFlag::WSTOPPED
            | WaitPidFlag::WNOHANG
            | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(self.pid), flags) {
            Ok(WaitStatus::Exited(_, code)) => {
                Ok(Peek::Ended(ExitStatus::from_raw((code & 0xff) << 8)))
            }
            Ok(WaitStatus::Signaled(_, sig, core)) => Ok(Peek::Ended(ExitStatus::from_raw(
                sig as i32 | if core { 0x80 } else { 0 },
            ))),
            Ok(WaitStatus::Stopped(_, sig)) => {
                // Consume the stop report so it is not seen again.
                let _ = waitid(
                    Id::Pid(self.pid),
                    WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG,
                );
                Ok(Peek::Stopped(sig))
            }
            Ok(_) => Ok(Peek::Running),
            Err(nix::errno::Errno::EINTR) => Ok(Peek::Running),
            Err(err) => Err(err.into()),
        }
    }

    /// Reap the ended child (after [`Child::peek`] reported it ended).
    fn reap(&self) {
        let _ = waitid(
            Id::Pid(self.pid),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG,
        );
    }
}

enum Peek {
    Running,
    Stopped(Signal),
    Ended(ExitStatus),
}

/// Wait for the command, forwarding signals and acting on lock loss. See the module docs.
pub async fn supervise<L: Lease>(
    child: Child,
    lease: &mut L,
    signals: &mut Signals,
    policy: Policy,
    terminal: Option<&Terminal>,
    mut sigchld: tokio::signal::unix::Signal,
) -> io::Result<Ending> {
    let mut lost: Option<Lost> = None;
    let mut kill_at: Option<BootInstant> = None;
    let mut stopped_by: Option<i32> = None;
    loop {
        // Look first: the child may have ended before the SIGCHLD listener saw it.
        match child.peek()? {
            Peek::Ended(status) => {
                // Seen to have ended only after the hold stopped being proven (dlock was
                // stopped or starved past its keeper's deadline): the command may have run on
                // without the lock, and the run counts as having lost it.
                let lost_after_end = lost.is_none()
                    && lease
                        .proven_until()
                        .is_some_and(|t| BootInstant::now() >= t);
                if lost_after_end {
                    crate::lock::loss_reported();
                    lost = Some(Lost {
                        reason: "dlock was stopped or starved past the lease's deadline, and \
                                 the command ended meanwhile, maybe after the lock was gone"
                            .into(),
                        kill_by: None,
                    });
                }
                if lost.is_some() && policy.on_lost != OnLost::Ignore {
                    // Nothing the command started may run on without the lock.
                    child.signal_group(libc::SIGKILL);
                }
                child.reap();
                tracing::debug!(target: crate::logging::HANDOFF, "exited");
                if let Some(terminal) = terminal {
                    terminal.take_back();
                }
                return Ok(Ending {
                    status,
                    lost,
                    lost_after_end,
                    stopped_by,
                });
            }
            Peek::Stopped(sig) => suspend_with_child(&child, terminal, sig, &policy),
            Peek::Running => {}
        }
        tokio::select! {
            _ = sigchld.recv() => {}
            signal = signals.recv() => {
                if signals::is_terminating(signal) && stopped_by.is_some() {
                    tracing::warn!("second {}: killing the command", signals::name(signal));
                    child.signal_group(libc::SIGKILL);
                } else {
                    tracing::info!("forwarding {} to the command", signals::name(signal));
                    child.signal_group(signal);
                    if signals::is_terminating(signal) {
                        stopped_by = Some(signal);
                        kill_at = earliest(kill_at, BootInstant::now() + policy.kill_after);
                    }
                }
            }
            gone = lease.lost(), if lost.is_none() => {
                crate::lock::loss_reported();
                // The one line that tells of the loss, when it happens.
                let was_lost = format!(
                    "lock '{}' was lost while the command ran ({})",
                    policy.name, gone.reason
                );
                match policy.on_lost {
                    OnLost::Term => {
                        say!("{was_lost}; stopping the command (SIGTERM)");
                        child.signal_group(libc::SIGTERM);
                        let mut deadline = BootInstant::now() + policy.kill_after;
                        if let Some(kill_by) = gone.kill_by {
                            deadline = deadline.min(kill_by);
                        }
                        kill_at = earliest(kill_at, deadline);
                    }
                    OnLost::Kill => {
                        say!("{was_lost}; killing the command (SIGKILL)");
                        child.signal_group(libc::SIGKILL);
                    }
                    OnLost::Ignore => {
                        say!("{was_lost}; the command keeps running without the lock (--on-lost ignore)");
                    }
                }
                lost = Some(gone);
            }
            _ = sleep_until(kill_at.unwrap_or(BootInstant::now())), if kill_at.is_some() => {
                tracing::warn!("the command did not exit in time: SIGKILL");
                child.signal_group(libc::SIGKILL);
                kill_at = None;
            }
        }
    }
}

fn earliest(current: Option<BootInstant>, candidate: BootInstant) -> Option<BootInstant> {
    Some(current.map_or(candidate, |c| c.min(candidate)))
}

/// The SIGCHLD listener; install it before spawning so no exit can be missed.
pub fn child_listener() -> io::Result<tokio::signal::unix::Signal> {
    crate::signals::listen(libc::SIGCHLD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::CommandSpec;
    use std::os::unix::process::ExitStatusExt;
    use std::time::Duration;

    /// A lease that is lost as soon as the command is ready, with a server-side deadline.
    struct LostLease {
        kill_by: Option<BootInstant>,
        ready: std::path::PathBuf,
    }

    impl Lease for LostLease {
        fn token(&self) -> u64 {
            1
        }

        async fn lost(&mut self) -> Lost {
            // Bounded: the command writes the file at once.
            for _ in 0..2000 {
                if self.ready.exists() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Lost {
                reason: "test".into(),
                kill_by: self.kill_by,
            }
        }

        async fn release(self) -> Result<(), crate::error::Error> {
            Ok(())
        }
    }

    fn shell(script: &str) -> CommandSpec {
        CommandSpec {
            program: "/bin/sh".into(),
            arg0: "sh".into(),
            args: vec!["-c".into(), script.into()],
            display: vec![],
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn lease_deadline_overrides_a_longer_kill_after() {
        let mut signals = Signals::install().expect("signals");
        let sigchld = child_listener().expect("sigchld");
        // The command ignores SIGTERM, so only the SIGKILL at the lease deadline ends it.
        let dir = tempfile::tempdir().expect("temp dir");
        let ready = dir.path().join("ready");
        let script = format!(
            "trap '' TERM; touch {}; while :; do sleep 1; done",
            ready.display()
        );
        let child = spawn(&shell(&script), &[], None, None).expect("spawn");
        let started = BootInstant::now();
        let mut lease = LostLease {
            kill_by: Some(started + Duration::from_millis(300)),
            ready,
        };
        let policy = Policy {
            name: "x".into(),
            on_lost: OnLost::Term,
            kill_after: Duration::from_secs(60),
            lease: None,
        };
        let ending = supervise(child, &mut lease, &mut signals, policy, None, sigchld)
            .await
            .expect("supervise");
        let took = BootInstant::now().saturating_since(started);
        assert_eq!(ending.status.signal(), Some(libc::SIGKILL));
        assert!(ending.lost.is_some());
        assert!(
            took >= Duration::from_millis(300),
            "killed before the deadline: {took:?}"
        );
        assert!(
            took < Duration::from_secs(30),
            "waited for --kill-after instead of the lease deadline"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn on_lost_kill_does_not_wait() {
        let mut signals = Signals::install().expect("signals");
        let sigchld = child_listener().expect("sigchld");
        let dir = tempfile::tempdir().expect("temp dir");
        let ready = dir.path().join("ready");
        let script = format!(
            "trap '' TERM; touch {}; while :; do sleep 1; done",
            ready.display()
        );
        let child = spawn(&shell(&script), &[], None, None).expect("spawn");
        let mut lease = LostLease {
            kill_by: None,
            ready,
        };
        let policy = Policy {
            name: "x".into(),
            on_lost: OnLost::Kill,
            kill_after: Duration::from_secs(60),
            lease: None,
        };
        let started = BootInstant::now();
        let ending = supervise(child, &mut lease, &mut signals, policy, None, sigchld)
            .await
            .expect("supervise");
        assert_eq!(ending.status.signal(), Some(libc::SIGKILL));
        assert!(BootInstant::now().saturating_since(started) < Duration::from_secs(30));
    }
}
