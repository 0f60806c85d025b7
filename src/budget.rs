//! The `--wait` budget of one acquisition, made once when it starts and carried in its
//! [`AcquireRequest`](crate::lock::AcquireRequest): when the lock's wait ends (a lock still
//! held then is 75), until when a server may still answer at all (at least [`MIN_ANSWER`]
//! from the start, so that a short `--wait` still reaches a healthy server; no answer by
//! then is 69), and the share of that time each server call gets.
//!
//! Backends ask it; they never compute a deadline from `--wait` themselves. The words of a
//! wait that ran out are [`crate::wording`]'s: `no_answer` ("no answer from … within --wait
//! 5s", "… within 2s (--wait 1ms)") and `gave_up` ("gave up after waiting 5s (--wait)").

use std::future::Future;
use std::time::Duration;

use crate::clock::{sleep_until, BootInstant};

/// The least time a server gets to answer an acquisition, however short `--wait` is: a
/// floor, not a bound. It only lengthens a `--wait` shorter than itself, so that on a busy
/// machine (or over a slow link) a short `--wait` still reaches a healthy server and takes a
/// free lock (or hears that it is held: 75, not 69); the lock's own wait still ends with
/// `--wait`. The backends that bound connecting and the server's first answers by
/// [`WaitBudget::answer_by`] (etcd, ZooKeeper, PostgreSQL) give the server until then, and
/// `run`'s `--wait` backstop counts it in ([`overrun`]).
///
/// Two seconds because a busy machine is the normal case: on 2 cores at a load average
/// around 20, opening a ZooKeeper session and queueing over a link with a 100 ms round trip
/// took longer than 1 s in 4 runs of 5, and less than 2 s in 5 of 5. It only costs time
/// when no server answers at all, and then only when `--wait` is shorter.
pub const MIN_ANSWER: Duration = Duration::from_secs(2);

/// How long past the end of `--wait` (counted from its start) an acquisition may take by a
/// backend's own rules: the server's time to answer ([`MIN_ANSWER`], however short `--wait`
/// is) and what the backend does after it (`finish_after_answer`: the round trip in flight,
/// checking a grant, giving back one that did not count).
pub fn overrun(finish_after_answer: Duration) -> Duration {
    MIN_ANSWER.saturating_add(finish_after_answer)
}

/// How long `acquire` may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Give up at once if the lock is held.
    No,
    /// Give up when this long has passed.
    For(Duration),
    Forever,
}

impl Wait {
    /// When a wait that starts now gives up (`None`: at once or never; see the variant).
    pub fn deadline(self) -> Option<BootInstant> {
        match self {
            Wait::For(wait) => Some(BootInstant::now() + wait),
            Wait::No | Wait::Forever => None,
        }
    }

    /// How long it waits, for messages: `5s`, `0s` for no wait, `forever`.
    pub fn describe(self) -> String {
        match self {
            Wait::For(wait) => humantime::format_duration(wait).to_string(),
            Wait::No => "0s".to_owned(),
            Wait::Forever => "forever".to_owned(),
        }
    }
}

/// The `--wait` of one acquisition, from the moment it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitBudget {
    wait: Wait,
    /// The end of `--wait` (none for `--no-wait` and for no limit).
    deadline: Option<BootInstant>,
    /// The end of `--wait`, but at least [`MIN_ANSWER`] from the start.
    answer_by: Option<BootInstant>,
}

impl WaitBudget {
    /// The budget of an acquisition that starts now and waits as `wait` says.
    pub fn start(wait: Wait) -> WaitBudget {
        let (deadline, answer_by) = match wait {
            Wait::For(length) => {
                let now = BootInstant::now();
                let deadline = now + length;
                (Some(deadline), Some(deadline.max(now + MIN_ANSWER)))
            }
            // No clock read: nothing ends by a deadline.
            Wait::No | Wait::Forever => (None, None),
        };
        WaitBudget {
            wait,
            deadline,
            answer_by,
        }
    }

    /// What the user asked for (for messages, and for what a backend does differently
    /// without a wait).
    pub fn wait(&self) -> Wait {
        self.wait
    }

    /// `--no-wait`: one look, no waiting.
    pub fn is_no_wait(&self) -> bool {
        self.wait == Wait::No
    }

    /// The end of `--wait`: a lock still held then is given up (none: `--no-wait`, or no
    /// limit).
    pub fn deadline(&self) -> Option<BootInstant> {
        self.deadline
    }

    /// Until when a server may answer at all, connecting included: the end of `--wait`, but
    /// at least [`MIN_ANSWER`] from the start (none without a `--wait` of some length, unless
    /// [`Self::answering_within`] gave `--no-wait` one).
    pub fn answer_by(&self) -> Option<BootInstant> {
        self.answer_by
    }

    /// Whether the server's time to answer ([`Self::answer_by`]) has passed (never without
    /// one).
    pub fn answer_is_over(&self) -> bool {
        self.answer_by.is_some_and(|by| BootInstant::now() >= by)
    }

    /// This budget, and with `--no-wait` one whose server has `no_wait` from now to answer:
    /// for a backend that bounds its one look as a whole (connecting, calls asked again after
    /// a lost reply) rather than each call by itself. The lock's own wait is unchanged.
    pub fn answering_within(&self, no_wait: Duration) -> WaitBudget {
        match self.wait {
            Wait::No => WaitBudget {
                answer_by: Some(BootInstant::now() + no_wait),
                ..*self
            },
            Wait::For(_) | Wait::Forever => *self,
        }
    }

    /// Whether the end of `--wait` has passed (never without one).
    pub fn is_over(&self) -> bool {
        self.deadline.is_some_and(|at| BootInstant::now() >= at)
    }

    /// What is left of `--wait` (none without one).
    pub fn left(&self) -> Option<Duration> {
        self.deadline.map(BootInstant::remaining)
    }

    /// What is left of the wait, for a server call that waits in the server itself (a lock
    /// call with a timeout): nothing with `--no-wait`, `max` without a limit, else what is
    /// left of `--wait`, at most `max`.
    pub fn left_within(&self, max: Duration) -> Duration {
        match self.wait {
            Wait::No => Duration::ZERO,
            Wait::For(_) | Wait::Forever => self.left().map_or(max, |left| left.min(max)),
        }
    }

    /// Whether a lock found held now stays unacquired for good: `--wait` is over, or
    /// `--no-wait` has had its one look.
    pub fn is_final(&self) -> bool {
        self.is_over() || self.is_no_wait()
    }

    /// The wait that is left, as a [`Wait`]: what is left of `--wait`, or the same kind of
    /// wait without one.
    pub fn rest(&self) -> Wait {
        match (self.wait, self.deadline) {
            (Wait::For(_), Some(at)) => Wait::For(at.remaining()),
            (wait, _) => wait,
        }
    }

    /// A budget that starts now with what is left of this one (in whole milliseconds, at
    /// least one, so that a step started at the very end still gets its look), for a step
    /// that runs after another has used part of the wait.
    pub fn rest_from_now(&self) -> WaitBudget {
        WaitBudget::start(match self.rest() {
            Wait::For(left) => Wait::For(
                Duration::from_millis(left.as_millis() as u64).max(Duration::from_millis(1)),
            ),
            other => other,
        })
    }

    /// The time one exchange with a server may take: `op_timeout`, and with a `--wait`
    /// at most what is left of it plus `grace` (so an exchange started at any time ends by
    /// `--wait` + `grace`).
    pub fn share(&self, op_timeout: Duration, grace: Duration) -> Duration {
        self.left().map_or(op_timeout, |left| {
            left.saturating_add(grace).min(op_timeout)
        })
    }

    /// The time one server call may take: `op_timeout`, but not past [`Self::answer_by`].
    pub fn call_limit(&self, op_timeout: Duration) -> Duration {
        self.answer_by
            .map_or(op_timeout, |by| by.remaining().min(op_timeout))
    }

    /// The time one server call may take when the acquisition may still finish what it
    /// started after the server's time to answer: [`Self::call_limit`], but at least `least`
    /// (the last check at the end of the wait still gets a round trip), and never more than
    /// `overrun` past [`Self::answer_by`] (everything has ended by then).
    pub fn call_limit_past(
        &self,
        op_timeout: Duration,
        least: Duration,
        overrun: Duration,
    ) -> Duration {
        self.answer_by.map_or(op_timeout, |by| {
            self.call_limit(op_timeout)
                .max(least.min(op_timeout))
                .min((by + overrun).remaining())
        })
    }

    /// `step`, unless `--wait` runs out first (`None`).
    pub async fn bounded<F: Future>(&self, step: F) -> Option<F::Output> {
        until(self.deadline, step).await
    }

    /// `step`, whose answer is needed before there is anything to wait for, unless the
    /// server's time to answer ([`Self::answer_by`]) runs out first (`None`).
    pub async fn answer<F: Future>(&self, step: F) -> Option<F::Output> {
        until(self.answer_by, step).await
    }
}

/// `step`, unless `end` passes first (`None`); never ends it without an `end`.
async fn until<F: Future>(end: Option<BootInstant>, step: F) -> Option<F::Output> {
    let over = async {
        match end {
            Some(at) => sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        output = step => Some(output),
        () = over => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(future)
    }

    #[test]
    fn a_short_wait_still_gives_the_server_time_to_answer() {
        let start = BootInstant::now();
        let budget = WaitBudget::start(Wait::For(Duration::from_millis(1)));
        let deadline = budget.deadline().expect("a deadline");
        assert!(deadline < start + Duration::from_millis(100));
        assert!(budget.answer_by().expect("a time to answer") >= start + MIN_ANSWER);
        let budget = WaitBudget::start(Wait::For(Duration::from_secs(5)));
        assert_eq!(budget.answer_by(), budget.deadline());
    }

    #[test]
    fn no_wait_and_no_limit_have_no_deadline() {
        for wait in [Wait::No, Wait::Forever] {
            let budget = WaitBudget::start(wait);
            assert_eq!((budget.deadline(), budget.answer_by()), (None, None));
            assert!(!budget.is_over());
            assert_eq!(budget.left(), None);
            assert_eq!(
                budget.call_limit(Duration::from_secs(5)),
                Duration::from_secs(5)
            );
            assert_eq!(budget.is_no_wait(), wait == Wait::No);
        }
    }

    #[test]
    fn a_call_gets_its_timeout_but_not_past_the_time_to_answer() {
        let op = Duration::from_secs(5);
        let budget = WaitBudget::start(Wait::For(Duration::from_secs(60)));
        assert_eq!(budget.call_limit(op), op);
        let budget = WaitBudget::start(Wait::For(Duration::from_millis(1)));
        let limit = budget.call_limit(op);
        assert!(limit <= MIN_ANSWER && limit > MIN_ANSWER / 2, "{limit:?}");
        assert!(budget.call_limit(Duration::from_millis(10)) <= Duration::from_millis(10));
    }

    #[test]
    fn the_wait_runs_out_before_the_time_to_answer() {
        let budget = WaitBudget::start(Wait::For(Duration::from_millis(20)));
        assert!(!budget.is_over());
        block_on(async {
            let slow = tokio::time::sleep(Duration::from_secs(60));
            assert!(budget.bounded(slow).await.is_none());
            assert!(budget.is_over());
            assert_eq!(budget.left(), Some(Duration::ZERO));
            // The server still has until `answer_by` to answer.
            assert_eq!(budget.answer(async { 7 }).await, Some(7));
        });
    }

    #[test]
    fn a_backend_that_bounds_its_acquisition_as_a_whole_gets_the_same_time_to_answer() {
        // Redis's bounds (its time to answer, each call's, leaving the queue) are these
        // operations of the request's budget: a short --wait gets `MIN_ANSWER` there too.
        let (op, least, overrun) = (
            Duration::from_secs(5),
            Duration::from_millis(200),
            Duration::from_millis(300),
        );
        let start = BootInstant::now();
        let short = WaitBudget::start(Wait::For(Duration::from_millis(1)));
        let answering = short.answering_within(op);
        assert_eq!(answering, short);
        assert!(answering.answer_by().expect("a time to answer") >= start + MIN_ANSWER);
        assert!(!answering.answer_is_over());
        let limit = answering.call_limit_past(op, least, overrun);
        assert!(limit <= MIN_ANSWER && limit > MIN_ANSWER / 2, "{limit:?}");
        assert_eq!(answering.call_limit_past(least, least, overrun), least);
        let forever = WaitBudget::start(Wait::Forever);
        assert_eq!(forever.answering_within(op), forever);
        assert_eq!(forever.call_limit_past(op, least, overrun), op);
        assert!(!forever.answer_is_over());

        // --no-wait: the lock's wait is still one look; the server gets the bound given.
        let no_wait = WaitBudget::start(Wait::No);
        let answering = no_wait.answering_within(op);
        assert_eq!((answering.wait(), answering.deadline()), (Wait::No, None));
        assert!(answering.is_no_wait() && !answering.is_over());
        let limit = answering.call_limit_past(op, least, overrun);
        assert!(limit <= op && limit > op / 2, "{limit:?}");
        // Past the time to answer a call still gets `least`, within `overrun`, then nothing.
        let passed = no_wait.answering_within(Duration::ZERO);
        assert!(passed.answer_is_over());
        let limit = passed.call_limit_past(op, least, overrun);
        assert!(limit <= least && limit > least / 2, "{limit:?}");
        assert_eq!(
            passed.call_limit_past(op, least, Duration::ZERO),
            Duration::ZERO
        );
    }

    #[test]
    fn what_is_left_is_shared_out_the_same_way_for_every_backend() {
        let second = Duration::from_secs(1);
        let (op, grace) = (Duration::from_secs(5), Duration::from_millis(500));
        let no_wait = WaitBudget::start(Wait::No);
        assert_eq!(no_wait.left_within(second), Duration::ZERO);
        assert!(no_wait.is_final());
        assert_eq!(no_wait.rest(), Wait::No);
        assert_eq!(no_wait.share(op, grace), op);

        let forever = WaitBudget::start(Wait::Forever);
        assert_eq!(forever.left_within(second), second);
        assert!(!forever.is_final());
        assert_eq!(forever.rest_from_now().wait(), Wait::Forever);
        assert_eq!(forever.share(op, grace), op);

        let long = WaitBudget::start(Wait::For(Duration::from_secs(60)));
        assert_eq!(long.left_within(second), second);
        assert_eq!(long.share(op, grace), op);
        assert!(!long.is_final());
        let short = WaitBudget::start(Wait::For(Duration::from_millis(300)));
        assert!(short.left_within(second) <= Duration::from_millis(300));
        assert!(short.share(op, grace) <= Duration::from_millis(800));
        assert!(short.share(op, grace) > grace);
        match short.rest_from_now().wait() {
            Wait::For(left) => assert!(left <= Duration::from_millis(300) && !left.is_zero()),
            other => panic!("{other:?}"),
        }

        let over = WaitBudget::start(Wait::For(Duration::ZERO));
        assert!(over.is_final());
        assert_eq!(over.left_within(second), Duration::ZERO);
        assert_eq!(over.share(op, grace), grace);
        // A step started at the very end still gets a look.
        assert_eq!(
            over.rest_from_now().wait(),
            Wait::For(Duration::from_millis(1))
        );
    }
}
