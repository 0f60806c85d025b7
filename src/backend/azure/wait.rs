//! Waiting for an Azure lock: the service notifies nobody and keeps no queue, so a waiter
//! polls, asking for the lease again after a pause (one request per poll).
//!
//! The pauses are jittered and grow by half from [`FIRST`] to [`CAP`]: a release is noticed
//! within at most [`CAP`], and a waiter that has waited a while asks about twice a second
//! (between 60 and 120 lease requests a minute, billed as write operations;
//! docs/backends/azure.md). The host-local queue lets one waiter per host poll. Waiters are
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
use crate::lock::{Cancel, Record};

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
    Backoff::new(FIRST, CAP).growing_by(3, 2)
}

impl AzureBackend {
    /// Ask for the lease until it is ours (returns when that request was sent), `--wait` is
    /// over, `cancel` fires, or the service fails.
    pub(super) async fn poll(
        &self,
        ctx: &Ctx<'_>,
        mut cancel: Cancel,
    ) -> Result<BootInstant, Error> {
        let budget = &ctx.request.budget;
        let mut polls = polling();
        let mut retries = Backoff::new(RETRY_FIRST, RETRY_CAP);
        let mut answered = false;
        let mut waited = false;
        loop {
            match self.try_lease(ctx).await {
                Ok(Some(sent)) => {
                    if waited {
                        // A poll found the lock free: the service tells a waiter nothing sooner.
                        tracing::debug!(target: crate::logging::HANDOFF, "woken");
                    }
                    return Ok(sent);
                }
                Ok(None) => {
                    answered = true;
                    retries.reset();
                }
                Err(failure)
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
                    sleep_unless_cancelled(&mut cancel, pause).await?;
                    continue;
                }
                Err(failure) => return Err(poll_error(failure, ctx)),
            }
            if budget.is_no_wait() {
                return Err(self.busy(ctx, "not waiting (--no-wait)".into()).await);
            }
            if budget.left().is_some_and(|left| left.is_zero()) {
                let why = crate::wording::gave_up(budget.wait());
                return Err(self.busy(ctx, why).await);
            }
            if !waited {
                // Polling from now on: the next poll after a release wins.
                crate::lock::queued(ctx.request);
            }
            let pause = bounded(polls.next_delay(), budget.left());
            sleep_unless_cancelled(&mut cancel, pause).await?;
            waited = true;
        }
    }

    /// The not-acquired error: who holds the lock, as its blob says (read once, best effort).
    async fn busy(&self, ctx: &Ctx<'_>, why_not: String) -> Error {
        let holders = match ctx
            .blobs
            .get(&ctx.blob, super::request_limit(ctx.request))
            .await
        {
            Ok(answer) => serde_json::from_slice::<Record>(&answer.body)
                .map(|record| vec![record.holder])
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        Error::Busy(format!(
            "lock '{}' {}; {why_not}",
            ctx.request.name,
            crate::kit::held::busy_reason(holders, 0)
        ))
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

/// The error a poll ends with: a request that `--wait` cut short says so.
fn poll_error(failure: Failure, ctx: &Ctx<'_>) -> Error {
    match failure {
        Failure::Unknown(_) if ctx.request.budget.deadline().is_some() => {
            crate::wording::no_answer(&ctx.blobs.display, None, &ctx.request.budget)
        }
        failure => failure.into_error(&ctx.blobs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter that has waited a while asks at most twice a second and at least once.
    #[test]
    fn intervals_grow_to_the_cap_with_jitter() {
        let mut backoff = polling();
        let delays: Vec<Duration> = (0..40).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] >= FIRST / 2 && delays[0] <= FIRST, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= CAP), "{delays:?}");
        assert!(delays[30..].iter().all(|d| *d >= CAP / 2), "{delays:?}");
    }
}
