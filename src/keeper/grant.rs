//! Before the command starts: how long the check of a grant may take ([`GrantBudget`]), and
//! confirming a grant by a renewal ([`confirm`], [`confirm_if_old`]), on the keeper's rule
//! (the module doc of [`super`]): a command may only start while it can still be stopped
//! before the lease can expire.

use std::time::Duration;

use super::{round_ms, Renew, RenewError, Schedule};
use crate::clock::{sleep_until, BootInstant};

/// How long the check of a grant may take before the command starts.
///
/// The keeper's rule: a hold proved by a round trip sent at `since` (the acquisition request,
/// or a later round trip that confirmed the hold) is kept until [`Schedule::give_up_at`]
/// `(since)`; a command started later could not get its grace before the lease could expire.
/// So a backend that checks a grant before starting the command (a second statement, a
/// read-back, a move of its key) may take until [`GrantBudget::ends`], retrying within it,
/// and gives up only then, saying so with [`GrantBudget::ran_out`].
#[derive(Clone, Copy, Debug)]
pub struct GrantBudget {
    schedule: Schedule,
    since: BootInstant,
}

impl GrantBudget {
    /// The budget of a hold whose lease started no earlier than `since`, kept on `schedule`
    /// (the TTL the server granted, and the user's `--kill-after`).
    pub fn new(schedule: Schedule, since: BootInstant) -> GrantBudget {
        GrantBudget { schedule, since }
    }

    /// The last moment the command may start.
    pub fn ends(&self) -> BootInstant {
        self.schedule.give_up_at(self.since)
    }

    /// What is left of the budget (zero once it is spent).
    pub fn left(&self) -> Duration {
        self.ends().remaining()
    }

    pub fn is_spent(&self) -> bool {
        BootInstant::now() >= self.ends()
    }

    /// Which budget ran out, in words for the `could not be confirmed: …` line.
    pub fn ran_out(&self) -> String {
        format!(
            "no answer within {}, the most that leaves the command stoppable before its {} lease (--ttl) can expire",
            humantime::format_duration(round_ms(self.schedule.hold_for())),
            humantime::format_duration(round_ms(self.schedule.ttl)),
        )
    }
}

/// The most [`confirm`] takes on a lease of `ttl`: tries for one TTL, the last one bounded
/// by its [`GrantBudget`], which is less than the TTL (it is longest with no grace).
pub fn confirm_bound(ttl: Duration) -> Duration {
    ttl + Schedule::new(ttl, Duration::ZERO).hold_for()
}

/// Confirm a hold before the command starts, with the renewer's round trip.
///
/// An attempt sent at `t` counts if its answer comes within the [`GrantBudget`] of `t`: a
/// hold it proves is one the keeper would keep, and the keeper starts counting from `t`
/// (returned). A late answer, a timeout or a failed round trip is retried (a timed-out
/// request may still be answered; a later one proves the hold from its own send time), for
/// one TTL from the first attempt: a hold that no round trip could prove for a whole TTL is
/// one the keeper of a running command would have given up (at [`Schedule::give_up_at`],
/// within the TTL). A renewal that finds the hold gone ends it at once.
pub async fn confirm<R: Renew>(renewer: &mut R, schedule: Schedule) -> Result<BootInstant, String> {
    let start = BootInstant::now();
    let patience = start + schedule.ttl;
    let mut tries = 0u32;
    let mut last_failure = None;
    loop {
        let sent = BootInstant::now();
        if tries > 0 && sent >= patience {
            let why = last_failure
                .map(|f| format!("; the last try failed: {f}"))
                .unwrap_or_default();
            return Err(format!(
                "{} ({tries} tries over {}){why}",
                GrantBudget::new(schedule, sent).ran_out(),
                humantime::format_duration(round_ms(sent.saturating_since(start))),
            ));
        }
        tries += 1;
        let budget = GrantBudget::new(schedule, sent);
        match tokio::time::timeout(budget.left(), renewer.renew()).await {
            Ok(Ok(granted)) => {
                // The server may grant another TTL than asked: its own give-up point counts.
                let kept = Schedule::new(granted, schedule.grace);
                if !GrantBudget::new(kept, sent).is_spent() {
                    return Ok(sent);
                }
                tracing::debug!("a confirmation came back too late to start on; trying again");
                last_failure = None;
            }
            Ok(Err(RenewError::Gone(reason))) => return Err(reason),
            Ok(Err(RenewError::Failed(reason))) => {
                tracing::debug!("a confirmation failed ({reason}); trying again");
                last_failure = Some(reason);
                sleep_until((BootInstant::now() + schedule.retry_after()).min(patience)).await;
            }
            Err(_) => {
                tracing::debug!("a confirmation timed out; trying again");
                last_failure = None;
            }
        }
    }
}

/// Before a keeper starts counting from a grant whose request was sent at `granted_sent`: a
/// grant that took longer than a renewal attempt to arrive (a long wait, a slow server, a
/// stopped process) may be near the end of its lease, or past it, which the keeper would find
/// out only after the command started. Such a grant is confirmed by a renewal first, retried
/// within the keeper's rule ([`confirm`]): a busy machine or server delays the answer, not
/// the hold. Returns the send time the keeper counts from, or why the grant does not count.
pub async fn confirm_if_old<R: Renew>(
    renewer: &mut R,
    schedule: Schedule,
    granted_sent: BootInstant,
) -> Result<BootInstant, String> {
    if BootInstant::now().saturating_since(granted_sent) <= schedule.attempt_timeout() {
        return Ok(granted_sent);
    }
    let since = confirm(renewer, schedule).await?;
    tracing::debug!(target: crate::logging::HANDOFF, "confirmed");
    Ok(since)
}
