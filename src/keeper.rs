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
//! - renewals go out every `ttl/3`, each bounded by `ttl/6`; a failed one is retried quickly;
//! - if no renewal succeeded by `kill_by − grace`, the hold is declared lost with `kill_by`
//!   attached, so the supervisor can send SIGTERM now and SIGKILL no later than `kill_by`;
//! - a renewal that finds the hold gone (deleted key, expired session) is a loss at once.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::clock::{sleep_until, BootInstant};
use crate::lock::Lost;

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

    fn margin_for(ttl: Duration) -> Duration {
        (ttl / 10).max(Duration::from_millis(500))
    }

    pub fn margin(&self) -> Duration {
        Self::margin_for(self.ttl)
    }

    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    pub fn attempt_timeout(&self) -> Duration {
        (self.ttl / 6).max(Duration::from_millis(100))
    }

    /// The instant by which the command must be dead, for a renewal sent at `sent`.
    pub fn kill_by(&self, sent: BootInstant) -> BootInstant {
        (sent + self.ttl.mul_f64(0.99)).saturating_sub(self.margin())
    }

    /// When to give up renewing and start stopping the command.
    pub fn give_up_at(&self, sent: BootInstant) -> BootInstant {
        self.kill_by(sent).saturating_sub(self.grace)
    }
}

/// A running keep-alive task. Dropping it stops renewing (the lease then expires by itself).
pub struct Keeper<R> {
    lost: watch::Receiver<Option<Lost>>,
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
        let task = tokio::spawn(run(renewer, schedule, acquired_sent, lost_tx, stop_rx));
        Keeper {
            lost: lost_rx,
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
    lost: watch::Sender<Option<Lost>>,
    mut stop: oneshot::Receiver<()>,
) -> R {
    let mut last_ack = acquired_sent;
    let mut schedule = schedule;
    let mut next = acquired_sent + schedule.renew_every();
    loop {
        tokio::select! {
            _ = &mut stop => return renewer,
            _ = sleep_until(next) => {}
        }
        let give_up = schedule.give_up_at(last_ack);
        if BootInstant::now() >= give_up {
            lost.send_replace(Some(Lost {
                reason: format!(
                    "the lease could not be renewed for {}",
                    humantime::format_duration(round_ms(
                        BootInstant::now().saturating_since(last_ack)
                    ))
                ),
                kill_by: Some(schedule.kill_by(last_ack)),
            }));
            return renewer;
        }
        let sent = BootInstant::now();
        let budget = schedule
            .attempt_timeout()
            .min(give_up.saturating_since(sent));
        let attempt = tokio::time::timeout(budget, renewer.renew());
        let result = tokio::select! {
            _ = &mut stop => return renewer,
            result = attempt => result,
        };
        match result {
            Ok(Ok(granted)) => {
                last_ack = sent;
                if granted != schedule.ttl {
                    schedule = Schedule::new(granted, schedule.grace);
                }
                next = sent + schedule.renew_every();
            }
            Ok(Err(RenewError::Gone(reason))) => {
                lost.send_replace(Some(Lost {
                    reason,
                    kill_by: None,
                }));
                return renewer;
            }
            Ok(Err(RenewError::Failed(reason))) => {
                tracing::warn!("lease renewal failed: {reason}; retrying");
                next = retry_at(&schedule, give_up);
            }
            Err(_) => {
                tracing::warn!(
                    "lease renewal timed out after {}; retrying",
                    humantime::format_duration(budget)
                );
                next = retry_at(&schedule, give_up);
            }
        }
    }
}

/// After a failed renewal, try again soon, but never later than the give-up point.
fn retry_at(schedule: &Schedule, give_up: BootInstant) -> BootInstant {
    let backoff = (schedule.ttl / 20).clamp(Duration::from_millis(50), Duration::from_secs(1));
    (BootInstant::now() + backoff).min(give_up)
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    struct Scripted {
        calls: Arc<AtomicU32>,
        /// What the n-th call (0-based) returns; the last entry repeats.
        script: Vec<Result<Duration, RenewError>>,
    }

    impl Renew for Scripted {
        async fn renew(&mut self) -> Result<Duration, RenewError> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
            self.script[n.min(self.script.len() - 1)].clone()
        }
    }

    #[test]
    fn deadline_leaves_margin_before_server_expiry() {
        let schedule = Schedule::new(Duration::from_secs(30), Duration::from_secs(10));
        let t0 = BootInstant::now();
        let kill_by = schedule.kill_by(t0);
        assert_eq!(kill_by.saturating_since(t0), Duration::from_millis(26_700));
        // The grace is capped so one failed renewal never stops the command.
        assert_eq!(schedule.grace, Duration::from_secs(10));
        for ttl in [2, 3, 15, 60] {
            let s = Schedule::new(Duration::from_secs(ttl), Duration::from_secs(10));
            let give_up = s.give_up_at(t0).saturating_since(t0);
            assert!(
                give_up >= s.renew_every() + s.attempt_timeout(),
                "ttl {ttl}s: give up at {give_up:?}"
            );
            assert!(s.kill_by(t0) < t0 + Duration::from_secs(ttl));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn renews_until_stopped() {
        let calls = Arc::new(AtomicU32::new(0));
        let ttl = Duration::from_secs(2);
        let renewer = Scripted {
            calls: calls.clone(),
            script: vec![Ok(ttl)],
        };
        let mut keeper = Keeper::start(renewer, BootInstant::now(), ttl, Duration::from_secs(1));
        tokio::select! {
            lost = keeper.lost() => panic!("lost a healthy lease: {lost:?}"),
            _ = tokio::time::sleep(Duration::from_millis(1600)) => {}
        }
        assert!(
            calls.load(Ordering::SeqCst) >= 2,
            "renewed {} times",
            calls.load(Ordering::SeqCst)
        );
        assert!(keeper.stop().await.is_some());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn gone_is_lost_at_once_without_deadline() {
        let renewer = Scripted {
            calls: Arc::new(AtomicU32::new(0)),
            script: vec![Err(RenewError::Gone("key deleted".into()))],
        };
        let ttl = Duration::from_secs(2);
        let mut keeper = Keeper::start(renewer, BootInstant::now(), ttl, Duration::from_secs(1));
        let lost = keeper.lost().await;
        assert_eq!(lost.reason, "key deleted");
        assert_eq!(lost.kill_by, None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn failing_renewals_are_lost_before_the_server_could_expire() {
        let renewer = Scripted {
            calls: Arc::new(AtomicU32::new(0)),
            script: vec![Err(RenewError::Failed("connection refused".into()))],
        };
        let ttl = Duration::from_secs(2);
        let acquired = BootInstant::now();
        let mut keeper = Keeper::start(renewer, acquired, ttl, Duration::from_secs(5));
        let lost = keeper.lost().await;
        let declared = BootInstant::now();
        let kill_by = lost
            .kill_by
            .expect("a time-based loss carries its deadline");
        assert!(
            kill_by < acquired + ttl,
            "deadline must precede server expiry"
        );
        assert!(declared <= kill_by, "loss declared after the deadline");
    }
}
