//! Waiting for an Azure lock: the service notifies nobody and keeps no queue, so a waiter
//! polls, asking for the lease again after a pause (one request per poll).
//!
//! The pauses are jittered and grow by half from [`FIRST`] to [`CAP`]: a release is noticed
//! within at most [`CAP`], and a waiter that has waited a while asks about twice a second
//! (between 60 and 120 lease requests a minute, billed as write operations;
//! docs/backends/azure.md). The host-local queue lets `--limit` + 8 processes of a host poll. Waiters are
//! not served in arrival order: the first poll after a release wins.
//!
//! A request that fails for a reason that may pass (no answer, the service busy: 408, 429,
//! 5xx) is asked again after a pause growing from [`RETRY_FIRST`] to [`RETRY_CAP`], until
//! `--wait` ends, once the service has answered this acquisition; before that, the failure
//! is the acquisition's (a wrong endpoint fails at once).

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::backoff::Backoff;
use crate::lock::{Cancel, Holder, Record};

use super::blob::Failure;
use super::{AzureBackend, Ctx};

/// The first polling interval: a lock held for a moment (a short command) is taken soon.
const FIRST: Duration = Duration::from_millis(50);
/// The longest polling interval: what a waiter costs in requests, and the longest a release
/// goes unnoticed.
const CAP: Duration = Duration::from_secs(1);
/// Pauses before asking again after a transient failure.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// Polling intervals: growing by half from [`FIRST`] to [`CAP`], jittered.
fn polling() -> Backoff {
    Backoff::polling(FIRST, CAP)
}

/// What one attempt at the lock found.
pub(super) enum Tried<T> {
    /// Ours.
    Won(T),
    /// Held by others.
    Held,
    /// The request failed.
    Failed(Failure),
    /// The holders cannot be joined (another `--limit`).
    Refused(Error),
}

impl AzureBackend {
    /// Ask for the lease until it is ours (returns when that request was sent), `--wait` is
    /// over, `cancel` fires, or the service fails.
    pub(super) async fn poll(&self, ctx: &Ctx<'_>, cancel: Cancel) -> Result<BootInstant, Error> {
        let attempt = async || match self.try_lease(ctx, &ctx.blob).await {
            Ok(Some(sent)) => Tried::Won(sent),
            Ok(None) => Tried::Held,
            Err(failure) => Tried::Failed(failure),
        };
        let holders = async || match ctx
            .blobs
            .get(&ctx.blob, super::request_limit(ctx.request))
            .await
        {
            Ok(answer) => serde_json::from_slice::<Record>(&answer.body)
                .map(|record| vec![record.holder])
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        poll_until(ctx, cancel, attempt, holders).await
    }
}

/// Try `attempt` until it wins, `--wait` is over, `cancel` fires, or the service fails;
/// `holders` says who holds the lock for the not-acquired message.
pub(super) async fn poll_until<T>(
    ctx: &Ctx<'_>,
    mut cancel: Cancel,
    mut attempt: impl AsyncFnMut() -> Tried<T>,
    mut holders: impl AsyncFnMut() -> Vec<Holder>,
) -> Result<T, Error> {
    let mut registration = None;
    let outcome = poll_registered(
        ctx,
        &mut cancel,
        &mut attempt,
        &mut holders,
        &mut registration,
    )
    .await;
    // Every way out leaves the waiter count.
    if let Some(registration) = registration {
        registration.leave(ctx).await;
    }
    outcome
}

/// [`poll_until`], counted as a waiter (`registration`) from the first poll that found the
/// lock held.
async fn poll_registered<T>(
    ctx: &Ctx<'_>,
    cancel: &mut Cancel,
    attempt: &mut impl AsyncFnMut() -> Tried<T>,
    holders: &mut impl AsyncFnMut() -> Vec<Holder>,
    registration: &mut Option<Registration>,
) -> Result<T, Error> {
    let budget = &ctx.request.budget;
    let mut polls = polling();
    let mut retries = Backoff::new(RETRY_FIRST, RETRY_CAP);
    let mut answered = false;
    let mut waited = false;
    loop {
        match attempt().await {
            Tried::Won(won) => {
                if waited {
                    // A poll found the lock free: the service tells a waiter nothing sooner.
                    tracing::debug!(target: crate::logging::HANDOFF, "woken");
                }
                return Ok(won);
            }
            Tried::Held => {
                answered = true;
                retries.reset();
            }
            Tried::Refused(err) => return Err(err),
            Tried::Failed(failure)
                if failure.is_transient()
                    && (answered || matches!(failure, Failure::Answer { .. }))
                    && !budget.is_over() =>
            {
                answered = true;
                tracing::warn!(
                    "{}: {}; asking again",
                    ctx.blobs.display,
                    failure.describe()
                );
                let pause = bounded(retries.next_delay(), budget.left());
                sleep_unless_cancelled(cancel, pause).await?;
                continue;
            }
            Tried::Failed(failure) => return Err(poll_error(failure, ctx).await),
        }
        let gave_up = if budget.is_no_wait() {
            Some("not waiting (--no-wait)".to_owned())
        } else if budget.left().is_some_and(|left| left.is_zero()) {
            Some(crate::wording::gave_up(budget.wait()))
        } else {
            None
        };
        if let Some(why_not) = gave_up {
            return Err(Error::Busy(format!(
                "lock '{}' {}; {why_not}",
                ctx.request.name,
                crate::kit::held::busy_reason(holders().await, 0)
            )));
        }
        Registration::keep(registration, ctx).await;
        if !waited {
            // Polling from now on: the next poll after a release wins.
            crate::lock::queued(ctx.request);
        }
        let pause = bounded(polls.next_delay(), budget.left());
        sleep_unless_cancelled(cancel, pause).await?;
        waited = true;
    }
}

/// A waiter's registration, for the count `status` shows: a blob `NAME~w-ID` of its own,
/// leased for [`REGISTRATION_TTL`] and renewed every [`REFRESH_EVERY`] while it waits, deleted
/// when it stops waiting. A killed waiter's lease runs out (it is no longer counted) and its
/// blob is deleted by the next waiter that registers. Best effort: a failure here only makes
/// the count wrong.
pub(super) struct Registration {
    blob: String,
    lease_id: String,
    renewed: BootInstant,
}

/// How long a waiter's registration lives without a renewal (the shortest lease).
const REGISTRATION_TTL: &str = "15";
/// How often a waiter renews its registration.
const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// The prefix of the waiter registrations of the lock whose blob is `base`.
pub(super) fn waiters_prefix(base: &str) -> String {
    format!("{base}~w-")
}

impl Registration {
    /// Register (the first time), or renew a registration that is due.
    async fn keep(registration: &mut Option<Registration>, ctx: &Ctx<'_>) {
        let limit = super::request_limit(ctx.request);
        match registration {
            Some(r) if BootInstant::now().saturating_since(r.renewed) < REFRESH_EVERY => {}
            Some(r) => {
                let headers = vec![("x-ms-lease-id".to_owned(), r.lease_id.clone())];
                let sent = BootInstant::now();
                if ctx
                    .blobs
                    .lease(&r.blob, "renew", headers, limit)
                    .await
                    .is_ok()
                {
                    r.renewed = sent;
                } else {
                    *registration = Registration::register(ctx, limit).await;
                }
            }
            None => {
                Registration::tidy(ctx, limit).await;
                *registration = Registration::register(ctx, limit).await;
            }
        }
    }

    async fn register(ctx: &Ctx<'_>, limit: Duration) -> Option<Registration> {
        let id = uuid::Uuid::new_v4().hyphenated().to_string();
        let blob = format!("{}{id}", waiters_prefix(&ctx.blob));
        ctx.blobs
            .put(&blob, Vec::new(), Vec::new(), limit)
            .await
            .ok()?;
        let headers = vec![
            (
                "x-ms-lease-duration".to_owned(),
                REGISTRATION_TTL.to_owned(),
            ),
            ("x-ms-proposed-lease-id".to_owned(), id.clone()),
        ];
        let sent = BootInstant::now();
        ctx.blobs
            .lease(&blob, "acquire", headers, limit)
            .await
            .ok()?;
        Some(Registration {
            blob,
            lease_id: id,
            renewed: sent,
        })
    }

    /// Delete the registrations of waiters that are gone (their lease ran out).
    async fn tidy(ctx: &Ctx<'_>, limit: Duration) {
        let Ok(all) = super::listing::listed(&ctx.blobs, &waiters_prefix(&ctx.blob), limit).await
        else {
            return;
        };
        for stale in all.iter().filter(|b| !b.leased).take(64) {
            let _ = ctx.blobs.delete(&stale.name, Vec::new(), limit).await;
        }
    }

    /// Stop being counted.
    async fn leave(self, ctx: &Ctx<'_>) {
        let headers = vec![("x-ms-lease-id".to_owned(), self.lease_id)];
        let _ = ctx
            .blobs
            .delete(
                &self.blob,
                headers,
                super::request_limit(ctx.request).max(Duration::from_millis(500)),
            )
            .await;
    }
}

/// `pause`, but not past the end of `--wait`.
fn bounded(pause: Duration, left: Option<Duration>) -> Duration {
    left.map_or(pause, |left| pause.min(left))
}

/// Sleeps for `pause`, or ends with [`Error::Cancelled`] when the run is cancelled first.
async fn sleep_unless_cancelled(cancel: &mut Cancel, pause: Duration) -> Result<(), Error> {
    tokio::select! {
        () = cancel.cancelled() => Err(Error::Cancelled),
        () = tokio::time::sleep(pause) => Ok(()),
    }
}

/// The error a poll ends with: a request that `--wait` cut short says so, and one that got
/// no HTTP answer says what answers instead, where it can tell.
async fn poll_error(failure: Failure, ctx: &Ctx<'_>) -> Error {
    let budget = &ctx.request.budget;
    match failure {
        Failure::Unknown(_) if budget.deadline().is_some() && budget.is_over() => {
            crate::wording::no_answer(&ctx.blobs.display, None, budget)
        }
        failure => {
            ctx.blobs
                .explain(failure, super::request_limit(ctx.request))
                .await
        }
    }
}
