//! `dlock run`: validate, acquire (cancellable, bounded by `--wait`), start the command under
//! [`crate::supervise`], release, and exit with the command's status (ARCHITECTURE.md: "The data path of one `dlock run`").
//!
//! The path of one run: signal listeners first (a signal while waiting must cancel the wait,
//! never kill dlock with a waiter left behind); then reentrancy ([`reentry`]: an
//! ancestor that provably holds the lock lets the command run at once); then `acquire`,
//! raced against signals and the `--wait` backstop; then the command, with the lease's loss
//! and forwarded signals watched by the supervisor; then release, bounded in time.
//!
//! Each step tells what happened to an [`events::Observer`] as it happens; the outcome record
//! (`--report`, [`record`]) is the observer here, and no step knows of it.

use std::time::Duration;

use anyhow::Context;

use crate::budget::{Wait, WaitBudget};
use crate::error::Error;
use crate::exit::Outcome;
use crate::kind::DynBackend;
use crate::lock::{self, AcquireRequest, Backend, Holder, Lease, LockName};
use crate::settings::RunSettings;
use crate::signals::{self, Signals};
use crate::{clock, logging, supervise};

mod command;
mod environment;
mod events;
pub(crate) mod hold;
mod min_hold;
mod record;
mod reentrant;
pub(crate) mod reentry;

use self::command::supervise_command;
use self::environment::{child_environment, hold_variables, token_variables, ChildEnv};
use self::events::{Event, Observer};
pub(crate) use self::record::refused;
use self::reentrant::{reenter, Reentrant, Reentry};
mod waiting;

/// How long after a backend's own deadline ([`crate::budget::overrun`]) the `--wait`
/// backstop fires. It does not decide whether a run fails: a backend that keeps its deadline
/// has ended the acquisition by then; this only orders the backstop after that deadline, with
/// room for a busy machine to deliver the backend's own outcome (a grant, 75, or its message
/// naming what did not answer) before `run` cancels it.
const WAIT_BACKSTOP_SLACK: Duration = Duration::from_secs(1);
/// How long a backend that missed the backstop gets to clean up after the cancel (withdraw
/// from the queue, give back a grant that arrives meanwhile). Safety does not depend on it:
/// an acquisition dropped unfinished leaves a place in line or a grant that nobody uses, which
/// the server expires with its lease; it only bounds how long the user waits for tidiness.
/// Backends bound their own leaving by as much or less (Redis `LEAVE_TIMEOUT` 2 s, ZooKeeper
/// closes a session within 1 s, etcd revokes within 1 s).
const WAIT_BACKSTOP_CLEANUP: Duration = Duration::from_secs(2);
/// How long a cancelled acquisition gets to withdraw after a signal (SIGINT, SIGTERM) while
/// waiting, and to let a grant that won the race be given back. As with the backstop's
/// cleanup, safety does not depend on it (what is left expires with its lease); it is longer
/// because the backend has not misbehaved: a healthy server on a busy machine gets the time
/// to take the waiter out, so the next run does not find it in line.
const SIGNAL_CLEANUP: Duration = Duration::from_secs(10);

/// When the `--wait` backstop fires, counted from the start of the acquisition: after the
/// wait, the backend's own overrun (the server's time to answer, which may be longer than a
/// short `--wait`; the round trip in flight; a grant's check), and the slack. So it never
/// fires before a backend's honest deadline, however short `--wait` is.
fn wait_backstop<B: Backend>(backend: &B, request: &AcquireRequest, wait: Duration) -> Duration {
    wait.saturating_add(crate::budget::overrun(backend.finish_after_answer(request)))
        .saturating_add(WAIT_BACKSTOP_SLACK)
}

async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The backstop ended an acquisition: `no answer from URL within --wait 5s; the command did
/// not run` (the backstop only runs with a `--wait` of some length).
fn no_answer_within(settings: &RunSettings, request: &AcquireRequest) -> Error {
    Error::Unavailable(format!(
        "{}; {}",
        crate::wording::no_answer_within(
            &settings.common.display_url,
            None,
            request.budget.wait(),
            Duration::ZERO
        ),
        nothing_ran(settings)
    ))
}

/// What did not happen when a run ended before its command: for a hold, nothing is held.
fn nothing_ran(settings: &RunSettings) -> &'static str {
    if settings.command.is_hold() {
        "nothing is held"
    } else {
        "the command did not run"
    }
}

/// The backend of a run: the target's, holding every name of the run as one lock when there
/// are several (`--also`, [`lock::Several`]); a run of one name meets no wrapper.
pub(crate) fn open(settings: &RunSettings) -> Box<dyn DynBackend> {
    let backend = settings.common.target.open(&settings.common);
    if settings.also.is_empty() {
        return backend;
    }
    Box::new(lock::Several::new(backend, settings.also.clone()))
}

/// `dlock run`: acquire, supervise, release; then append the outcome record (`--report`).
///
/// `inherited_held` is the `DLOCK_HELD` this process was started with.
pub async fn run<B: Backend>(
    backend: B,
    settings: RunSettings,
    inherited_held: &str,
) -> anyhow::Result<Outcome> {
    // Opened before anything else, so that a path that cannot be written fails at once.
    let sink = match &settings.report {
        Some(to) => Some(record::Sink::open(to)?),
        None => None,
    };
    let mut track = record::Track::new();
    let result = acquire_and_run(&backend, &settings, inherited_held, &mut track).await;
    // Who holds the lock this run did not get: asked only for the record.
    if let (Some(_), Ok(Outcome::NotAcquired(_))) = (&sink, &result) {
        if let Some(holder) = holder_now(&backend, settings.names()).await {
            track.saw(Event::HeldBy(holder));
        }
    }
    // Done with the backend (its connections closed) before the record is written.
    drop(backend);
    if let Some(sink) = sink {
        sink.write_outcome(&track, &settings, &result);
    }
    result
}

/// The steps of one run: re-enter an ancestor's hold, or acquire; then run the command
/// holding the lock, keep it for `--min-hold`, release. What happens is told to `observer`.
async fn acquire_and_run<B: Backend>(
    backend: &B,
    settings: &RunSettings,
    inherited_held: &str,
    observer: &mut dyn Observer,
) -> anyhow::Result<Outcome> {
    let mut signals = Signals::install().context("cannot install signal handlers")?;
    // Installed before acquiring, so that the hand-off does not wait for it.
    let sigchld = supervise::child_listener().context("cannot watch for the command's exit")?;
    let identity = settings.common.identity();
    let sigchld = match reenter(backend, settings, inherited_held, &identity, observer).await? {
        Reentry::Held(tokens) => {
            let mut env = child_environment(settings);
            env.vars.extend(
                token_variables(&tokens)
                    .into_iter()
                    .map(|(key, value)| (key, Some(value))),
            );
            observer.saw(Event::Acquired(None));
            return supervise_command(settings, &mut signals, sigchld, &mut Reentrant, env)
                .await
                .map(|ran| {
                    ran.tell(observer);
                    ran.status
                });
        }
        Reentry::Acquire => sigchld,
    };
    // Made before acquiring (the credentials' hand-off included), so that the command starts
    // as soon as the lock is granted.
    let env = child_environment(settings);
    // Last before acquiring: `--wait` counts from here.
    let request = request_for(settings);
    let (lease, acquired_at) =
        match acquire(backend, settings, &request, &mut signals, observer).await? {
            Acquisition::Held(lease, at) => (lease, at),
            Acquisition::Ended(outcome) => return Ok(outcome),
        };
    run_holding(
        Held {
            lease,
            acquired_at,
            env,
        },
        settings,
        &request,
        &mut signals,
        sigchld,
        (inherited_held, &identity),
        observer,
    )
    .await
}

/// What this run asks the backend for, with the metadata it records; its `--wait` budget
/// starts now.
fn request_for(settings: &RunSettings) -> AcquireRequest {
    let holder = Holder {
        min_hold_ms: settings
            .min_hold
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        mode: settings.mode,
        limit: settings.limit,
        ..Holder::for_this_process(
            &settings.name,
            if settings.record_command {
                &settings.command.display
            } else {
                &[]
            },
            settings.common.ttl,
        )
    };
    AcquireRequest {
        name: settings.name.clone(),
        limit: settings.limit,
        mode: settings.mode,
        ttl: settings.common.ttl,
        budget: WaitBudget::start(settings.wait),
        kill_after: settings.kill_after,
        likely_held: false,
        on_queued: Default::default(),
        holder,
    }
}

/// How acquiring ended: with the lock, or with the run's outcome (busy, signalled).
enum Acquisition<L> {
    /// The lease, and when it was granted (`--min-hold` counts from then).
    Held(L, min_hold::Acquired),
    Ended(Outcome),
}

/// Acquire, raced against signals and the `--wait` backstop, with the waiting line shown
/// meanwhile. A signal while waiting, or one that arrived while the grant was on its way,
/// ends the run without the command; so does a lock held elsewhere (the conflict status).
async fn acquire<B: Backend>(
    backend: &B,
    settings: &RunSettings,
    request: &AcquireRequest,
    signals: &mut Signals,
    observer: &mut dyn Observer,
) -> anyhow::Result<Acquisition<B::Lease>> {
    let started = clock::BootInstant::now();
    let (canceller, cancel) = lock::cancellation();
    tracing::debug!(target: logging::HANDOFF, "acquiring");
    let acquire = backend.acquire(request, cancel);
    tokio::pin!(acquire);
    // `--wait` bounds everything before the command starts, connecting included. Backends
    // honour the deadline themselves; this backstop catches a server that accepted the
    // connection and then never answered, should a backend not end that itself.
    let backstop = match request.budget.wait() {
        // No backstop for a wait too long for the clock: it is as good as forever.
        Wait::For(wait) => {
            tokio::time::Instant::now().checked_add(wait_backstop(backend, request, wait))
        }
        Wait::No | Wait::Forever => None,
    };
    let waiting = waiting::Waiting::new(&request.budget);
    let acquired = tokio::select! {
        result = &mut acquire => result,
        () = waiting.report(backend, settings.names()) => Err(Error::Internal("the waiting line ended".into())),
        () = sleep_until_some(backstop) => {
            canceller.cancel();
            match tokio::time::timeout(WAIT_BACKSTOP_CLEANUP, &mut acquire).await {
                Ok(Ok(lease)) => {
                    release(lease, settings).await;
                    Err(no_answer_within(settings, request))
                }
                Ok(Err(Error::Cancelled)) | Err(_) => Err(no_answer_within(settings, request)),
                Ok(Err(err)) => Err(err),
            }
        }
        signal = signals.recv() => {
            waiting.finish(&settings.name, false);
            canceller.cancel();
            // Let the backend remove its waiter; if it won the race, give the lock back.
            observer.saw(Event::SignalledWhileWaiting(signal));
            if let Ok(Ok(lease)) = tokio::time::timeout(SIGNAL_CLEANUP, &mut acquire).await {
                release(lease, settings).await;
            }
            say!(
                "got {} while waiting for lock '{}'; {}",
                signals::name(signal),
                settings.name,
                nothing_ran(settings)
            );
            return Ok(Acquisition::Ended(Outcome::Signalled(signal)));
        }
    };
    let said_acquired = waiting.finish(&settings.name, acquired.is_ok());
    let lease = match acquired {
        Ok(lease) => {
            tracing::debug!(target: logging::HANDOFF, "acquired");
            lease
        }
        Err(Error::Busy(message)) => {
            observer.saw(Event::Busy);
            // `-q` silences this one: `dlock run -q -n job -- …` in cron mails nothing when an
            // earlier run still holds the lock.
            if !logging::quiet() {
                say!("{message}");
            }
            return Ok(Acquisition::Ended(Outcome::NotAcquired(
                settings.conflict_exit_code,
            )));
        }
        Err(err) => {
            observer.saw(Event::GaveUp);
            return Err(anyhow::Error::new(err))
                .with_context(|| format!("cannot acquire '{}'", settings.name));
        }
    };
    observer.saw(Event::Acquired(Some(lease.token())));
    let acquired_at = min_hold::Acquired::now();
    // One "acquired" line per acquisition: the waiting line's, or this one.
    if !said_acquired {
        tracing::info!(
            "acquired '{}' (token {}) in {}",
            settings.name,
            lease.token(),
            logging::elapsed(clock::BootInstant::now().saturating_since(started))
        );
    }
    // A signal that arrived while acquiring counts as "while waiting": nothing runs.
    if let Some(signal) = signals.try_recv() {
        observer.saw(Event::SignalledWhileWaiting(signal));
        release(lease, settings).await;
        say!(
            "got {} while acquiring lock '{}'; {}",
            signals::name(signal),
            settings.name,
            nothing_ran(settings)
        );
        return Ok(Acquisition::Ended(Outcome::Signalled(signal)));
    }
    Ok(Acquisition::Held(lease, acquired_at))
}

/// A granted lock, when it was granted, and the command's environment made before.
struct Held<L> {
    lease: L,
    acquired_at: min_hold::Acquired,
    env: ChildEnv,
}

/// With the lock held: run the command (its environment naming the token and, for nested
/// runs, this hold), keep the lock for `--min-hold` after a clean end, release.
/// `(inherited_held, identity)`: the `DLOCK_HELD` this process got and its backend identity.
async fn run_holding<L: Lease>(
    held: Held<L>,
    settings: &RunSettings,
    request: &AcquireRequest,
    signals: &mut Signals,
    sigchld: tokio::signal::unix::Signal,
    (inherited_held, identity): (&str, &str),
    observer: &mut dyn Observer,
) -> anyhow::Result<Outcome> {
    let Held {
        mut lease,
        acquired_at,
        mut env,
    } = held;
    let mut tokens = vec![(settings.name.clone(), lease.token())];
    tokens.extend(lease.also_held());
    env.vars.extend(
        hold_variables(&tokens, inherited_held, identity)
            .into_iter()
            .map(|(key, value)| (key, Some(value))),
    );
    let supervised = supervise_command(settings, signals, sigchld, &mut lease, env).await;
    if let Ok(ran) = &supervised {
        ran.tell(observer);
    }
    let outcome = match supervised {
        Ok(ran) if ran.lost.is_none() && ran.stopped_by.is_none() => {
            let kept = min_hold::keep(
                &mut lease,
                signals,
                settings,
                &request.holder,
                &acquired_at,
                ran.status,
            )
            .await;
            if let Outcome::Signalled(signal) = kept {
                observer.saw(Event::SignalledWhileKept(signal));
            }
            Ok(kept)
        }
        other => other.map(|ran| ran.status),
    };
    release(lease, settings).await;
    outcome
}

async fn release<L: Lease>(lease: L, settings: &RunSettings) {
    let budget = settings.common.ttl.min(Duration::from_secs(10));
    tracing::debug!(target: logging::HANDOFF, "release-sent");
    let released = tokio::time::timeout(budget, lease.release()).await;
    tracing::debug!(target: logging::HANDOFF, "released");
    match released {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!("could not release '{}': {err}", settings.name),
        Err(_) => tracing::warn!(
            "releasing '{}' timed out; the lease expires by itself within {}",
            settings.name,
            humantime::format_duration(settings.common.ttl)
        ),
    }
}

/// Who holds the first of `names` that is held now, for the record of a run that did not get
/// them (`None` when the backend cannot say within a moment, or they were freed since).
async fn holder_now<'a, B: Backend>(
    backend: &B,
    names: impl Iterator<Item = &'a LockName>,
) -> Option<Holder> {
    for name in names {
        if let Ok(Ok(status)) =
            tokio::time::timeout(Duration::from_secs(2), backend.status(name)).await
        {
            if let Some(holder) = status.holders.into_iter().next() {
                return Some(holder.holder);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
