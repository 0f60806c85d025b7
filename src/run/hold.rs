//! `dlock hold`: take a lock for the calling shell rather than for one command
//! (docs/guide.md: "Holding a lock across commands").
//!
//! The process the shell started forks before anything else runs (no runtime, no thread
//! yet): the child becomes the keeper, in a session of its own so that the shell's job
//! control never reaches it; the parent only waits for the keeper's first word and exits
//! with it, forwarding the signals it gets meanwhile (Ctrl-C while waiting cancels the wait
//! as in `dlock run`). The keeper acquires as `run` does (the same waiting, `--wait`, busy
//! status, reentrancy), prints the shell assignments on the output the shell reads, lets go
//! of that output and sends the status 0: the shell's `$(…)` ends and `eval` sets the
//! variables, while the keeper keeps the lease alive. A failure is the keeper's exit status,
//! which the parent takes over.
//!
//! The hold ends when the process it belongs to ends ([`owner`]: a pidfd, so kill -9
//! included and never a later process with the same pid), at `dlock release` ([`handle`]),
//! at `--max-hold`, or at a terminating signal to the keeper. A lost lease is told on the
//! owner's stderr and, as `--on-lost` says, by a signal to the owner; the keeper then stays
//! until the hold would have ended, to tell `dlock release` it was lost.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::Context;

use super::events::{Event, Observer};
use super::reentrant::{reenter, Reentry};
use super::{acquire, min_hold, record, reentry, release, request_for, Acquisition};
use crate::cli::{HoldArgs, OnLost};
use crate::clock::BootInstant;
use crate::config::FileConfig;
use crate::error::Error;
use crate::exit::{Code, Outcome};
use crate::lock::Lease;
use crate::settings;
use crate::settings::HoldSettings;
use crate::signals::{self, Signals};

mod handle;
mod owner;
mod parent;
pub(crate) mod releasing;

pub(crate) use handle::Handle;
use handle::{Answer, Listener};
use owner::Owner;

/// `dlock hold`, from its arguments to the exit status of the process the shell started.
pub(crate) fn start(args: HoldArgs, config: Result<FileConfig, Error>) -> u8 {
    let prepared = config
        .and_then(|config| Ok((settings::hold(args.clone(), &config)?, config)))
        .and_then(|(settings, _)| {
            let owner = if settings.until_released {
                None
            } else {
                Some(Owner::find()?)
            };
            Ok((settings, owner))
        });
    let (settings, owner) = match prepared {
        Ok(prepared) => prepared,
        Err(err) => {
            let err = anyhow::Error::new(err);
            record::refused(&args.run, &FileConfig::default(), &err);
            say!("{err:#}");
            return Outcome::Failed(crate::error::code_of(&err)).status();
        }
    };
    let (read, write) = match nix::unistd::pipe() {
        Ok(pipe) => pipe,
        Err(err) => {
            say!("cannot start the hold's keeper: {err}");
            return Outcome::Failed(Code::Internal).status();
        }
    };
    // SAFETY: no other thread exists yet (no runtime has been built), so the child may do
    // anything the parent could.
    match unsafe { nix::unistd::fork() } {
        Err(err) => {
            say!("cannot start the hold's keeper: {err}");
            Outcome::Failed(Code::Internal).status()
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(write);
            parent::wait_for_keeper(child, read)
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop(read);
            // Out of the shell's job control: its Ctrl-C reaches the parent, which forwards it.
            let _ = nix::unistd::setsid();
            keeper_main(settings, owner, write)
        }
    }
}

/// The keeper process: its own runtime, then [`keep`].
fn keeper_main(settings: HoldSettings, owner: Option<Owner>, ready: OwnedFd) -> u8 {
    crate::block_on(Box::pin(keep(settings, owner, ready)))
}

/// The keeper: acquire, tell the shell, keep the hold until it ends; then the outcome record.
async fn keep(
    settings: HoldSettings,
    owner: Option<Owner>,
    ready: OwnedFd,
) -> anyhow::Result<Outcome> {
    let sink = match &settings.run.report {
        Some(to) => Some(record::Sink::open(to)?),
        None => None,
    };
    let mut track = record::Track::new();
    let result = acquire_and_keep(settings.clone(), owner, ready, &mut track).await;
    if let Some(sink) = sink {
        sink.write_outcome(&track, &settings.run, &result);
    }
    result
}

async fn acquire_and_keep(
    mut settings: HoldSettings,
    owner: Option<Owner>,
    ready: OwnedFd,
    observer: &mut dyn Observer,
) -> anyhow::Result<Outcome> {
    if let Some(owner) = &owner {
        settings.run.command.display = ["hold", "for", "pid", &owner.pid.to_string()]
            .map(String::from)
            .to_vec();
    }
    let run = &settings.run;
    let backend = super::open(run);
    let mut signals = Signals::install().context("cannot install signal handlers")?;
    let identity = run.common.identity();
    let inherited = std::env::var("DLOCK_HELD").unwrap_or_default();
    if let Reentry::Held(_) = reenter(&backend, run, &inherited, &identity, observer).await? {
        // The shell is inside a hold of every name already (an enclosing run or hold): its
        // variables say so; nothing to keep. Marked, so that this hold's `dlock release`
        // leaves the enclosing one alone.
        observer.saw(Event::Acquired(None));
        let held = run.names().fold(inherited.clone(), |held, name| {
            let lock = reentry::lock_key(&identity, name);
            reentry::reentered_by_a_hold(&held, &lock).unwrap_or(held)
        });
        tell_the_shell(&[("DLOCK_HELD".into(), held)], ready, false)?;
        return Ok(Outcome::Done);
    }
    let request = request_for(run);
    let (lease, acquired_at) =
        match acquire(&backend, run, &request, &mut signals, observer).await? {
            Acquisition::Held(lease, at) => (lease, at),
            Acquisition::Ended(outcome) => return Ok(outcome),
        };
    let me = std::process::id();
    let handle = crate::process::start_ticks(me).map(|start| Handle { pid: me, start });
    let listener = match handle.map(Listener::bind) {
        Some(Ok(listener)) => listener,
        Some(Err(err)) => {
            release(lease, run).await;
            return Err(err).context("cannot keep the hold");
        }
        None => {
            release(lease, run).await;
            return Err(Error::Internal("cannot read this process's start time".into()).into());
        }
    };
    let handle = handle.unwrap_or(Handle { pid: me, start: 0 });
    let mut tokens = vec![(run.name.clone(), lease.token())];
    tokens.extend(lease.also_held());
    // An entry for every name, naming the shell and the keeper: nested runs of any of them
    // re-enter, and `dlock release` of any of them reaches the keeper.
    let entries: Vec<reentry::Entry> = tokens
        .iter()
        .map(|(name, token)| reentry::Entry {
            lock: reentry::lock_key(&identity, name),
            pid: owner.as_ref().map_or(0, |o| o.pid),
            start: owner.as_ref().map_or(0, |o| o.start),
            token: *token,
            keeper: Some(handle),
            reentered: false,
        })
        .collect();
    let held = entries.iter().fold(inherited.clone(), |held, entry| {
        reentry::with_entry(&held, entry)
    });
    let mut vars = super::environment::lock_variables(run);
    vars.extend(
        super::environment::token_variables(&tokens)
            .into_iter()
            .map(|(name, value)| {
                (
                    name.to_string_lossy().into_owned(),
                    value.to_string_lossy().into_owned(),
                )
            }),
    );
    vars.push(("DLOCK_HELD".into(), held));
    vars.push(("DLOCK_HOLD".into(), handle.to_string()));
    if let Err(err) = tell_the_shell(&vars, ready, owner.is_none()) {
        release(lease, run).await;
        return Err(err);
    }
    let held = Kept {
        lease,
        acquired_at,
        holder: request.holder,
        listener,
        locks: entries.into_iter().map(|entry| entry.lock).collect(),
    };
    held.keep(&settings, owner, &mut signals, observer).await
}

/// Print `vars` as shell assignments on stdout, let go of the shell's output and input (and of
/// its stderr for a hold that belongs to no process: nobody reads it), then send the status 0.
fn tell_the_shell(
    vars: &[(String, String)],
    ready: OwnedFd,
    stderr_too: bool,
) -> anyhow::Result<()> {
    let mut text = String::new();
    for (name, value) in vars {
        text.push_str(&format!("{name}={}; export {name}\n", shell_quoted(value)));
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write the hold's variables")?;
    drop(out);
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .context("cannot open /dev/null")?;
    // A stderr that is the output the shell reads (`$(dlock hold x 2>&1)`) would keep the
    // shell waiting for the end of it as long as the hold lasts.
    let stderr_too = stderr_too || same_file(1, 2);
    let fds: &[i32] = if stderr_too { &[0, 1, 2] } else { &[0, 1] };
    for &fd in fds {
        // SAFETY: dup2 onto the standard descriptors; `null` stays open until after.
        unsafe {
            libc::dup2(null.as_raw_fd(), fd);
        }
    }
    nix::unistd::write(&ready, &[0]).context("the shell's dlock hold is gone")?;
    Ok(())
}

/// Whether the descriptors `a` and `b` are the same open file or pipe.
fn same_file(a: i32, b: i32) -> bool {
    let stat = |fd| {
        // SAFETY: the descriptor is only looked at, for the duration of the call.
        nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
    };
    match (stat(a), stat(b)) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    }
}

/// `value` in single quotes, for any POSIX shell.
fn shell_quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// A hold the keeper keeps.
struct Kept<L> {
    lease: L,
    acquired_at: min_hold::Acquired,
    holder: crate::lock::Holder,
    listener: Listener,
    /// `BACKEND|NAME` of each name held, as release requests name them.
    locks: Vec<String>,
}

/// Why the keeper stops keeping.
enum End {
    /// The process the hold belongs to ended.
    OwnerEnded,
    /// `dlock release` asked; it gets the answer.
    Release(handle::Reply),
    MaxHold,
    Signal(i32),
}

impl<L: Lease> Kept<L> {
    async fn keep(
        mut self,
        settings: &HoldSettings,
        owner: Option<Owner>,
        signals: &mut Signals,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Outcome> {
        let run = &settings.run;
        let owner_watch = match &owner {
            Some(owner) => Some(owner.watch().context("cannot watch the hold's owner")?),
            None => None,
        };
        let max_hold = settings.max_hold.map(|d| self.acquired_at.at + d);
        let end = loop {
            tokio::select! {
                () = until_ended(owner_watch.as_ref()) => break End::OwnerEnded,
                lost = self.lease.lost() => {
                    observer.saw(Event::Lost(lost.reason.clone()));
                    let outcome = self
                        .lost(lost.reason, settings, owner, owner_watch, signals, max_hold)
                        .await;
                    return Ok(outcome);
                }
                (lock, reply) = self.listener.next() => {
                    if self.locks.contains(&lock) {
                        break End::Release(reply);
                    }
                    // The handle of another lock's hold: keep serving this one.
                    reply.send(&Answer::Other).await;
                }
                () = until_boot(max_hold) => break End::MaxHold,
                signal = signals.recv() => {
                    if signals::is_terminating(signal) {
                        break End::Signal(signal);
                    }
                    tracing::info!("got {}; the hold goes on", signals::name(signal));
                }
            }
        };
        observer.saw(Event::HoldEnded(match &end {
            End::OwnerEnded => "owner",
            End::Release(_) => "release",
            End::MaxHold => "max-hold",
            End::Signal(_) => "signal",
        }));
        let outcome = match end {
            End::OwnerEnded => {
                tracing::info!("the hold's owner has ended; releasing '{}'", run.name);
                Outcome::Done
            }
            End::Release(reply) => {
                match self.kept_until(run) {
                    Some(until) => reply.send(&Answer::Kept(until)).await,
                    None => {
                        release(self.lease, run).await;
                        reply.send(&Answer::Released).await;
                        return Ok(Outcome::Done);
                    }
                }
                Outcome::Done
            }
            End::MaxHold => {
                release(self.lease, run).await;
                say!(
                    "the hold of '{}' ended: --max-hold {} ran out; released",
                    run.name,
                    humantime::format_duration(settings.max_hold.unwrap_or_default())
                );
                return Ok(Outcome::Done);
            }
            End::Signal(signal) => {
                observer.saw(Event::StoppedBy(signal));
                release(self.lease, run).await;
                return Ok(Outcome::Signalled(signal));
            }
        };
        let kept = min_hold::keep(
            &mut self.lease,
            signals,
            run,
            &self.holder,
            &self.acquired_at,
            outcome,
        )
        .await;
        release(self.lease, run).await;
        Ok(kept)
    }

    /// Until when `--min-hold` keeps the lock after a release now (RFC 3339), if it does.
    fn kept_until(&self, run: &crate::settings::RunSettings) -> Option<String> {
        let min_hold = run.min_hold?;
        (BootInstant::now() < self.acquired_at.at + min_hold).then(|| {
            self.acquired_at
                .wall
                .checked_add(min_hold)
                .map(|wall| humantime::format_rfc3339_seconds(wall).to_string())
                .unwrap_or_default()
        })
    }

    /// The lease is lost: say so on the owner's stderr, signal the owner as `--on-lost` says,
    /// and stay until the hold would have ended, to tell `dlock release` it was lost.
    async fn lost(
        self,
        why: String,
        settings: &HoldSettings,
        owner: Option<Owner>,
        owner_watch: Option<owner::OwnerWatch>,
        signals: &mut Signals,
        max_hold: Option<BootInstant>,
    ) -> Outcome {
        let run = &settings.run;
        crate::lock::loss_reported();
        let told = match (&owner, run.on_lost) {
            (Some(owner), OnLost::Term) => {
                owner.signal(libc::SIGTERM);
                format!("sent SIGTERM to pid {}", owner.pid)
            }
            (Some(owner), OnLost::Kill) => {
                owner.signal(libc::SIGKILL);
                format!("sent SIGKILL to pid {}", owner.pid)
            }
            (Some(_), OnLost::Ignore) | (None, _) => "nothing was stopped".into(),
        };
        say!(
            "lock '{}' held by dlock hold was lost ({why}); {told}",
            run.name
        );
        let kill_at = match (&owner, run.on_lost) {
            (Some(_), OnLost::Term) => tokio::time::Instant::now().checked_add(run.kill_after),
            _ => None,
        };
        let Kept {
            listener, locks, ..
        } = self;
        let mut kill_at = kill_at;
        // Bounded: by the owner's end, a release, --max-hold (required without an owner) or
        // a signal.
        loop {
            tokio::select! {
                () = until_ended(owner_watch.as_ref()) => return Outcome::Lost,
                (asked, reply) = listener.next() => {
                    if locks.contains(&asked) {
                        reply.send(&Answer::Lost(why.clone())).await;
                        return Outcome::Lost;
                    }
                    reply.send(&Answer::Other).await;
                }
                () = super::sleep_until_some(kill_at) => {
                    if let Some(owner) = &owner {
                        owner.signal(libc::SIGKILL);
                    }
                    kill_at = None;
                }
                () = until_boot(max_hold) => return Outcome::Lost,
                signal = signals.recv() => {
                    tracing::debug!("got {} after the hold was lost", signals::name(signal));
                    return Outcome::Lost;
                }
            }
        }
    }
}

async fn until_ended(watch: Option<&owner::OwnerWatch>) {
    match watch {
        Some(watch) => watch.ended().await,
        None => std::future::pending().await,
    }
}

/// Until `deadline` on the boot clock (suspend counted), or for ever.
async fn until_boot(deadline: Option<BootInstant>) {
    match deadline {
        Some(deadline) => crate::clock::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
