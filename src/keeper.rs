//! Keeping a lease alive, and knowing when it can no longer be trusted.
//!
//! A remote backend only implements [`Renew`]: one round trip that either confirms the hold
//! with a granted TTL, reports it gone, or fails. [`Keeper`] runs the schedule and owns the
//! arithmetic (ARCHITECTURE.md, "The seam"), so every backend gets it right the same way:
//!
//! - the server starts a lease period no earlier than the moment our request left, so after an
//!   acknowledged renewal sent at `t_send` the server cannot expire it before
//!   `t_send + ttl`, measured on its clock;
//! - allowing for clock-rate drift (1 %) and a fixed safety margin `ε = max(500 ms, ttl/10)`
//!   (scheduling delay, SIGKILL delivery), our own deadline is
//!   `kill_by = t_send + 0.99·ttl − ε`, on `CLOCK_BOOTTIME`;
//! - a renewal goes out `ttl/3` after the last acknowledged one's send time, or earlier where
//!   that would leave room for fewer than two attempts before the give-up point below (short
//!   TTLs; a third of the TTL taken as grace), so one renewal that times out is always
//!   followed by another with time of its own; each attempt is bounded by `ttl/6`, the last
//!   one before the give-up point by that point (a late answer still proves the hold from
//!   its send time); a failed one is retried quickly;
//! - if no renewal succeeded by `kill_by − grace`, the hold is declared lost with `kill_by`
//!   attached, so the supervisor can send SIGTERM now and SIGKILL no later than `kill_by`;
//! - a renewal that finds the hold gone (deleted key, expired session) is a loss at once.
//!
//! The same rule bounds what happens before the command starts: a command may only start
//! while it can still be stopped before the lease can expire, so a check of a grant may take
//! until the keeper's own give-up point for the round trip that proves the hold
//! ([`GrantBudget`]), and [`confirm`] retries a proving round trip within that rule. No
//! fixed sub-second bound decides whether a granted run starts: on a busy machine (or a slow
//! link) an answer that is late by a fixed constant but well within the lease still counts.
//! A grant older than one renewal attempt when it arrives is confirmed that way before the
//! keeper counts from it ([`confirm_if_old`]).
//!
//! Every deadline a hold ends with is computed here too, also where a backend notices the end
//! itself: a backend reports what it saw (a hold found gone: [`Lost::gone`]; a broken link,
//! with the send time of the last acknowledged round trip: [`Schedule::lost_after`]; a lease
//! it keeps alive by a loop of its own: [`Proof`]), never a `kill_by` of its own.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::clock::{sleep_until, BootInstant};
use crate::lock::Lost;

mod grant;

pub use self::grant::{confirm, confirm_bound, confirm_if_old, GrantBudget};

/// The outcome of a renewal that did not confirm the hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewError {
    /// The server says the hold is gone: someone else may hold the lock already.
    Gone(String),
    /// The round trip failed (timeout, connection error); the hold may still be ours.
    Failed(String),
}

/// One renewal round trip of a backend.
pub trait Renew: Send + 'static {
    /// Renew the hold; on success return the TTL the server granted.
    fn renew(&mut self) -> impl Future<Output = Result<Duration, RenewError>> + Send;
}

/// The timing of a lease, derived from its TTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub ttl: Duration,
    /// Time the command gets between SIGTERM and the deadline.
    pub grace: Duration,
}

impl Schedule {
    /// `kill_after` is the user's grace. It is capped at a third of the TTL, and so that the
    /// give-up point leaves room for one renewal plus one retry (`0.49·ttl − ε`): a single
    /// failed renewal never stops the command.
    pub fn new(ttl: Duration, kill_after: Duration) -> Schedule {
        let margin = Self::margin_for(ttl);
        let room = ttl.mul_f64(0.49).saturating_sub(margin);
        Schedule {
            ttl,
            grace: kill_after.min(ttl / 3).min(room),
        }
    }

    /// ε: room for what happens after the deadline is computed (scheduling delay, SIGKILL
    /// delivery). The 500 ms floor is deliberate: it only moves dlock's own deadline earlier
    /// (safer), it never makes an answer count as late.
    fn margin_for(ttl: Duration) -> Duration {
        (ttl / 10).max(Duration::from_millis(500))
    }

    pub fn margin(&self) -> Duration {
        Self::margin_for(self.ttl)
    }

    /// How long after an acknowledged round trip's send time the next renewal goes out:
    /// `ttl/3`, or earlier where that would leave room for fewer than two attempts before
    /// [`Schedule::give_up_at`] (short leases, and a long `--kill-after` that takes a third
    /// of the TTL as grace). A renewal that times out is then followed by another with a
    /// whole attempt's time before the hold is given up. Never earlier than `ttl/6`, so a
    /// lease is renewed at most six times per TTL; for every TTL a backend accepts that floor
    /// still leaves the two attempts their room, since the hold is then at least `ttl/2` (the
    /// grace is capped at `0.49·ttl − ε` by [`Schedule::new`]).
    pub fn renew_every(&self) -> Duration {
        (self.ttl / 3)
            .min(self.hold_for().saturating_sub(self.attempt_timeout() * 2))
            .max(self.ttl / 6)
    }

    /// How long one renewal attempt may take before another is sent (the last one before
    /// the give-up point may take until then, see [`Schedule::attempt_budget`]).
    pub fn attempt_timeout(&self) -> Duration {
        (self.ttl / 6).max(Duration::from_millis(100))
    }

    /// The time a renewal sent with `left` to go before the give-up point gets: an attempt's
    /// timeout, or all of `left` when cutting it off there would leave less than half an
    /// attempt for the next one. A slow answer still proves the hold from its send time;
    /// cutting it off only pays when a next attempt has time of its own to be answered.
    pub fn attempt_budget(&self, left: Duration) -> Duration {
        let attempt = self.attempt_timeout();
        if left.saturating_sub(attempt) < attempt / 2 {
            left
        } else {
            attempt
        }
    }

    /// How long after a round trip's send time the keeper still keeps the hold it proved
    /// (`give_up_at(sent) − sent`).
    pub fn hold_for(&self) -> Duration {
        self.ttl
            .mul_f64(0.99)
            .saturating_sub(self.margin())
            .saturating_sub(self.grace)
    }

    /// The instant by which the command must be dead, for a renewal sent at `sent`.
    pub fn kill_by(&self, sent: BootInstant) -> BootInstant {
        (sent + self.ttl.mul_f64(0.99)).saturating_sub(self.margin())
    }

    /// The hold is lost, but may still be the server's until its lease runs out (a broken
    /// connection, renewals that went unanswered): the command must be dead by the deadline of
    /// the last acknowledged round trip, sent at `last_ack`.
    pub fn lost_after(&self, reason: String, last_ack: BootInstant) -> Lost {
        Lost {
            reason,
            kill_by: Some(self.kill_by(last_ack)),
        }
    }

    /// When to give up renewing and start stopping the command.
    pub fn give_up_at(&self, sent: BootInstant) -> BootInstant {
        self.kill_by(sent).saturating_sub(self.grace)
    }

    /// Backoff after a failed round trip: soon, in proportion to the lease. The floor keeps a
    /// connection that fails at once from being hammered; the ceiling keeps a long lease from
    /// waiting long between tries.
    fn retry_after(&self) -> Duration {
        (self.ttl / 20).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

impl Lost {
    /// The hold is gone already (deleted, expired, ended by the server): there is no later
    /// moment to protect, the command is stopped now.
    pub fn gone(reason: impl Into<String>) -> Lost {
        Lost {
            reason: reason.into(),
            kill_by: None,
        }
    }
}

/// What acknowledged round trips have proved of a hold so far: the send time of the latest,
/// read with the keeper's rule. For a lease that a backend keeps alive by a loop of its own
/// (etcd's waiter lease), so that the deadlines it relies on are the keeper's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proof {
    schedule: Schedule,
    last_ack: BootInstant,
}

impl Proof {
    /// The proof of a grant whose request was sent at `sent`, kept on `schedule`.
    pub fn new(schedule: Schedule, sent: BootInstant) -> Proof {
        Proof {
            schedule,
            last_ack: sent,
        }
    }

    /// A round trip sent at `sent` was acknowledged: the latest send time counts.
    pub fn acked(&mut self, sent: BootInstant) {
        self.last_ack = self.last_ack.max(sent);
    }

    /// The instant by which a command started on the hold must be dead ([`Schedule::kill_by`]).
    pub fn kill_by(&self) -> BootInstant {
        self.schedule.kill_by(self.last_ack)
    }

    /// Whether more than `room` is left before [`Proof::kill_by`].
    pub fn leaves(&self, room: Duration) -> bool {
        BootInstant::now() + room < self.kill_by()
    }

    /// The last moment to give the hold up and still leave the command `room` before
    /// [`Proof::kill_by`].
    pub fn give_up_at(&self, room: Duration) -> BootInstant {
        self.kill_by().saturating_sub(room)
    }

    /// The hold is lost with this proof's deadline ([`Schedule::lost_after`]).
    pub fn lost(&self, reason: String) -> Lost {
        self.schedule.lost_after(reason, self.last_ack)
    }
}

/// A running keep-alive task. Dropping it stops renewing (the lease then expires by itself).
pub struct Keeper<R> {
    lost: watch::Receiver<Option<Lost>>,
    /// When the keeper gives the hold up unless a renewal is acknowledged first.
    proven: watch::Receiver<BootInstant>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<R>,
}

impl<R: Renew> Keeper<R> {
    /// Start renewing a hold whose acquisition request was sent at `acquired_sent` and granted
    /// `granted_ttl`.
    pub fn start(
        renewer: R,
        acquired_sent: BootInstant,
        granted_ttl: Duration,
        kill_after: Duration,
    ) -> Keeper<R> {
        let (lost_tx, lost_rx) = watch::channel(None);
        let (stop_tx, stop_rx) = oneshot::channel();
        let schedule = Schedule::new(granted_ttl, kill_after);
        let (proven_tx, proven_rx) = watch::channel(schedule.give_up_at(acquired_sent));
        let task = tokio::spawn(run(
            renewer,
            schedule,
            acquired_sent,
            (lost_tx, proven_tx),
            stop_rx,
        ));
        Keeper {
            lost: lost_rx,
            proven: proven_rx,
            stop: Some(stop_tx),
            task,
        }
    }

    /// Resolves when the hold is lost. Cancel-safe.
    pub async fn lost(&mut self) -> Lost {
        match self.lost.wait_for(Option::is_some).await {
            Ok(lost) => lost.clone().unwrap_or_else(unreachable_lost),
            Err(_) => unreachable_lost(),
        }
    }

    /// Until when the hold is proven: the keeper gives it up then unless a renewal is
    /// acknowledged first ([`Schedule::give_up_at`] of the last acknowledged send).
    pub fn proven_until(&self) -> BootInstant {
        *self.proven.borrow()
    }

    /// Stop renewing and hand the renewer back (to release with it).
    pub async fn stop(mut self) -> Option<R> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.ok()
    }
}

impl<R> Drop for Keeper<R> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn unreachable_lost() -> Lost {
    Lost {
        reason: "the lease keeper stopped unexpectedly".into(),
        kill_by: Some(BootInstant::now()),
    }
}

async fn run<R: Renew>(
    mut renewer: R,
    schedule: Schedule,
    acquired_sent: BootInstant,
    (lost, proven): (watch::Sender<Option<Lost>>, watch::Sender<BootInstant>),
    mut stop: oneshot::Receiver<()>,
) -> R {
    let mut last_ack = acquired_sent;
    let mut schedule = schedule;
    let mut next = acquired_sent + schedule.renew_every();
    // The failures since the last renewal: the first is said, the retries are not (the
    // lost-lock line, or nothing when a retry gets through, says the rest).
    let mut failing = 0u32;
    loop {
        tokio::select! {
            _ = &mut stop => return renewer,
            _ = sleep_until(next) => {}
        }
        let give_up = schedule.give_up_at(last_ack);
        if BootInstant::now() >= give_up {
            let reason = format!(
                "the lease could not be renewed for {}",
                humantime::format_duration(round_ms(BootInstant::now().saturating_since(last_ack)))
            );
            lost.send_replace(Some(schedule.lost_after(reason, last_ack)));
            return renewer;
        }
        let sent = BootInstant::now();
        let budget = schedule.attempt_budget(give_up.saturating_since(sent));
        let attempt = tokio::time::timeout(budget, renewer.renew());
        let result = tokio::select! {
            _ = &mut stop => return renewer,
            result = attempt => result,
        };
        match result {
            Ok(Ok(granted)) => {
                if failing > 0 {
                    tracing::info!("lease renewed after {failing} failed attempt(s)");
                }
                failing = 0;
                last_ack = sent;
                if granted != schedule.ttl {
                    schedule = Schedule::new(granted, schedule.grace);
                }
                proven.send_replace(schedule.give_up_at(sent));
                next = sent + schedule.renew_every();
            }
            Ok(Err(RenewError::Gone(reason))) => {
                lost.send_replace(Some(Lost::gone(reason)));
                return renewer;
            }
            Ok(Err(RenewError::Failed(reason))) => {
                let why = format!("lease renewal failed: {reason}");
                failure(&mut failing, &why, give_up);
                next = retry_at(&schedule, sent, give_up);
            }
            Err(_) => {
                let why = format!(
                    "lease renewal timed out after {}",
                    humantime::format_duration(round_ms(budget))
                );
                failure(&mut failing, &why, give_up);
                next = retry_at(&schedule, sent, give_up);
            }
        }
    }
}

/// Say the first failed renewal of a run of them as a warning, with how long the retries go
/// on; the retries only under -v.
fn failure(failing: &mut u32, why: &str, give_up: BootInstant) {
    *failing += 1;
    if *failing == 1 {
        tracing::warn!(
            "{why}; retrying for up to {}",
            humantime::format_duration(round_ms(give_up.saturating_since(BootInstant::now())))
        );
    } else {
        tracing::debug!("{why}; retrying");
    }
}

/// After a renewal sent at `sent` failed, try again soon, but never later than the give-up
/// point. The backoff counts from the send: it keeps a round trip that fails at once from
/// being repeated at once, while one that failed slowly (or timed out) has waited already,
/// and the next attempt gets all the time that is left.
fn retry_at(schedule: &Schedule, sent: BootInstant, give_up: BootInstant) -> BootInstant {
    (sent + schedule.retry_after())
        .max(BootInstant::now())
        .min(give_up)
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
