//! The wait of an acquisition: attempt, and while every slot is held, pause (jittered, within
//! `--wait`, cancellable), keep the waiter counted, and wait out a server restart by
//! reconnecting with backoff; the attempt itself and the taking of a won slot are the
//! backend's (`mod.rs`).

use std::time::Duration;

use super::client::{Conn, Failure};
use super::keys::Stored;
use super::wait::{self, Registration};
use super::{
    exchange_limit, keys, Attempt, Ctx, Failed, MemcachedBackend, Won, RELINK_CAP, RELINK_FIRST,
};
use crate::error::Error;
use crate::kit::backoff::Backoff;
use crate::kit::{held, limit};
use crate::lock::{AcquireRequest, Cancel, Holder};

impl MemcachedBackend {
    /// Try for a free slot until one is won (with whether this run waited), `--wait` is over,
    /// `cancel` fires or the server fails; registered in the waiter count while it waits.
    pub(super) async fn poll(
        &self,
        conn: &mut Conn,
        ctx: &Ctx<'_>,
        registration: &mut Option<Registration>,
        cancel: &mut Cancel,
    ) -> Result<(Won, bool), Error> {
        let budget = &ctx.request.budget;
        let value = ctx.stored.to_bytes();
        let mut backoff = wait::polling();
        let mut relink = Backoff::new(RELINK_FIRST, RELINK_CAP);
        // The connection whose server settings were read (0: none yet). A reconnected
        // waiter may reach a server restarted with other options: read them again.
        let mut settled = 0;
        // The server has answered that the lock is held: from then on a lost connection is
        // a restart to wait out, not a wrong URL to report.
        let mut answered = false;
        let mut waited = false;
        loop {
            let step = exchange_limit(budget);
            let attempt = match self.settle(conn, &mut settled, &ctx.display, step).await {
                Ok(()) => self.attempt(conn, ctx, &value, &mut backoff, step).await,
                Err(failed) => Err(failed),
            };
            let holders = match attempt {
                Ok(Attempt::Won(won)) => {
                    if waited {
                        // A poll found the lock free: memcached tells a waiter nothing sooner.
                        tracing::debug!(target: crate::logging::HANDOFF, "woken");
                    }
                    return Ok((won, waited));
                }
                Ok(Attempt::Held(holders)) => {
                    answered = true;
                    relink.reset();
                    holders
                }
                Err(Failed::Link(failure)) if answered && !budget.is_over() => {
                    // Waiting on through a server restart (or a broken link), reconnecting
                    // with backoff; `--wait` still ends the wait.
                    wait_out_lost_link(ctx, &failure, &mut relink, cancel).await?;
                    continue;
                }
                Err(failed) => return Err(poll_error(failed, ctx)),
            };
            let pause = pause_before_next_poll(ctx.request, &holders, &mut backoff)?;
            keep_registered(conn, ctx, registration, &mut backoff).await;
            if !waited {
                // Polling from now on: the next free poll after a release wins.
                crate::lock::queued(ctx.request);
            }
            sleep_unless_cancelled(cancel, pause).await?;
            waited = true;
        }
    }
}

/// Sleeps for `pause`, or ends with [`Error::Cancelled`] when the run is cancelled first.
async fn sleep_unless_cancelled(cancel: &mut Cancel, pause: Duration) -> Result<(), Error> {
    tokio::select! {
        () = cancel.cancelled() => Err(Error::Cancelled),
        () = tokio::time::sleep(pause) => Ok(()),
    }
}

/// Warns of a waiter's lost link and pauses before reconnecting: `relink`'s next pause (from
/// the upper half of a step doubling from [`RELINK_FIRST`] up to [`RELINK_CAP`]), no later
/// than `--wait`'s end.
async fn wait_out_lost_link(
    ctx: &Ctx<'_>,
    failure: &Failure,
    relink: &mut Backoff,
    cancel: &mut Cancel,
) -> Result<(), Error> {
    let why = failure.describe();
    let server = ctx.display.as_str();
    tracing::warn!("{server}: {why}; reconnecting and waiting on");
    let mut pause = relink.next_delay();
    if let Some(left) = ctx.request.budget.left() {
        pause = pause.min(left);
    }
    sleep_unless_cancelled(cancel, pause).await
}

/// The error a poll ends with: an exchange that `--wait` cut short says so.
fn poll_error(failed: Failed, ctx: &Ctx<'_>) -> Error {
    let display = ctx.display.as_str();
    match failed {
        Failed::Link(Failure::Timeout(_)) if ctx.request.budget.deadline().is_some() => {
            crate::wording::no_answer(display, None, &ctx.request.budget)
        }
        failed => failed.into_error(display),
    }
}

/// Refuses a held lock this run cannot wait for (another `--limit`, `--no-wait`, `--wait`
/// over); else the pause before the next poll, no later than `--wait`'s end.
fn pause_before_next_poll(
    request: &AcquireRequest,
    holders: &[Stored],
    backoff: &mut Backoff,
) -> Result<Duration, Error> {
    for holder in holders {
        limit::agrees(&request.name, request.limit, holder.record.limit)?;
    }
    let holders: Vec<Holder> = holders.iter().map(|s| s.record.holder.clone()).collect();
    held::pause_before_next_poll(request, &holders, backoff)
}

/// Registers the waiter, or keeps its registration alive. Registering is for the waiter
/// count only; a failure here shows on the next attempt.
async fn keep_registered(
    conn: &mut Conn,
    ctx: &Ctx<'_>,
    registration: &mut Option<Registration>,
    backoff: &mut Backoff,
) {
    let owner = ctx.stored.owner.as_str();
    let step = exchange_limit(&ctx.request.budget);
    *registration = match registration.take() {
        None => {
            let start = backoff.random(keys::WAITER_SLOTS as u64) as usize;
            wait::register(conn, &ctx.keys, owner, start, step)
                .await
                .unwrap_or(None)
        }
        Some(r) => r
            .refresh(conn, &ctx.keys, owner, step)
            .await
            .unwrap_or(None),
    };
}
