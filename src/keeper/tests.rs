//! The keeper's rule, its budgets and its confirmations, against scripted renewers.

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

/// Every TTL a backend accepts (the shortest of each, the default, long ones) with
/// `--kill-after` from none to more than the TTL allows.
fn accepted_schedules() -> Vec<Schedule> {
    // Each kind's shortest lease, and lengths around and far above them.
    let shortest = crate::backend::KINDS
        .iter()
        .filter(|kind| kind.capabilities.lease)
        .map(|kind| kind.minimum_ttl);
    let ttls = shortest.chain([
        crate::backend::MIN_LEASE_TTL,
        Duration::from_millis(2500),
        Duration::from_secs(3),
        Duration::from_secs(4),
        Duration::from_secs(5),
        Duration::from_secs(10),
        crate::settings::DEFAULT_TTL,
        Duration::from_secs(30),
        Duration::from_secs(60),
        Duration::from_secs(3600),
        Duration::from_secs(7 * 24 * 3600),
    ]);
    let kill_afters = [
        Duration::ZERO,
        Duration::from_millis(100),
        Duration::from_secs(1),
        crate::settings::DEFAULT_KILL_AFTER,
        Duration::from_secs(7 * 24 * 3600),
    ];
    ttls.flat_map(|ttl| kill_afters.iter().map(move |&k| Schedule::new(ttl, k)))
        .collect()
}

#[test]
fn two_renewal_attempts_fit_before_the_hold_is_given_up_at_every_accepted_ttl() {
    for s in accepted_schedules() {
        let attempts = s.hold_for().saturating_sub(s.renew_every());
        assert!(
            attempts >= s.attempt_timeout() * 2,
            "{s:?}: renews after {:?}, {attempts:?} left for attempts of {:?}",
            s.renew_every(),
            s.attempt_timeout()
        );
        // Both attempts are cut off at their own timeout, not one at the give-up point.
        assert_eq!(s.attempt_budget(attempts), s.attempt_timeout(), "{s:?}");
        // Never later than ttl/3 (what the docs promise a loss is noticed within), never
        // more often than six times per TTL.
        assert!(s.renew_every() <= s.ttl / 3, "{s:?}");
        assert!(s.renew_every() >= s.ttl / 6, "{s:?}");
    }
    // Long leases keep their traffic: a renewal every third of the TTL.
    let s = Schedule::new(Duration::from_secs(60), crate::settings::DEFAULT_KILL_AFTER);
    assert_eq!(s.renew_every(), Duration::from_secs(20));
    // The 3 s lease of the tests: 1.5 s from an ack to giving up, a renewal after 0.5 s,
    // two attempts of 0.5 s.
    let s = Schedule::new(Duration::from_secs(3), crate::settings::DEFAULT_KILL_AFTER);
    assert_eq!(s.renew_every(), Duration::from_millis(500));
    assert_eq!(s.attempt_timeout(), Duration::from_millis(500));
}

#[test]
fn the_last_attempt_before_the_give_up_point_is_not_cut_off_early() {
    let s = Schedule::new(Duration::from_secs(15), Duration::ZERO);
    let attempt = s.attempt_timeout();
    assert_eq!(s.attempt_budget(attempt * 3), attempt);
    assert_eq!(s.attempt_budget(attempt + attempt / 2), attempt);
    // What a cut-off would leave the next attempt is less than half an attempt.
    let left = attempt + attempt / 3;
    assert_eq!(s.attempt_budget(left), left);
    assert_eq!(s.attempt_budget(attempt / 2), attempt / 2);
    assert_eq!(s.attempt_budget(Duration::ZERO), Duration::ZERO);
}

/// Answers the n-th call (0-based) after `delays[n]` (the last entry repeats) with
/// `answer`.
struct Slow {
    calls: Arc<AtomicU32>,
    delays: Vec<Duration>,
    answer: Result<Duration, RenewError>,
}

impl Renew for Slow {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
        tokio::time::sleep(self.delays[n.min(self.delays.len() - 1)]).await;
        self.answer.clone()
    }
}

#[test]
fn a_grant_may_be_checked_until_the_keeper_would_give_the_hold_up() {
    let t0 = BootInstant::now();
    for ttl in [2, 3, 15, 60] {
        let s = Schedule::new(Duration::from_secs(ttl), Duration::from_secs(10));
        let budget = GrantBudget::new(s, t0);
        assert_eq!(budget.ends(), s.give_up_at(t0));
        assert_eq!(budget.ends().saturating_since(t0), s.hold_for());
        // More than one renewal attempt of a running command is given.
        assert!(s.hold_for() > s.attempt_timeout(), "ttl {ttl}s");
    }
    // 3 s lease: 2.97 s − 0.5 s margin − 0.97 s grace.
    let s = Schedule::new(Duration::from_secs(3), Duration::from_secs(10));
    assert_eq!(s.hold_for(), Duration::from_millis(1500));
    let words = GrantBudget::new(s, t0).ran_out();
    assert!(
        words.contains("1s 500ms") && words.contains("3s lease (--ttl)"),
        "{words}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_confirmation_within_the_budget_counts() {
    let ttl = Duration::from_secs(3);
    let schedule = Schedule::new(ttl, Duration::from_secs(10));
    let calls = Arc::new(AtomicU32::new(0));
    // Slower than a renewal attempt of a running command (ttl/6), within the budget.
    let mut renewer = Slow {
        calls: calls.clone(),
        delays: vec![Duration::from_millis(900)],
        answer: Ok(ttl),
    };
    let start = BootInstant::now();
    let since = confirm(&mut renewer, schedule).await.expect("confirmed");
    assert!(since >= start && since < start + Duration::from_millis(300));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_confirmation_too_late_to_start_on_is_tried_again() {
    let ttl = Duration::from_secs(2);
    let schedule = Schedule::new(ttl, Duration::from_secs(10));
    let calls = Arc::new(AtomicU32::new(0));
    let mut renewer = Slow {
        calls: calls.clone(),
        delays: vec![
            schedule.hold_for() + Duration::from_millis(300),
            Duration::ZERO,
        ],
        answer: Ok(ttl),
    };
    let start = BootInstant::now();
    let since = confirm(&mut renewer, schedule).await.expect("confirmed");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // The keeper counts from the try that was answered in time.
    assert!(since >= start + schedule.hold_for(), "since {since:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn confirming_gives_up_after_a_ttl_and_says_which_budget_ran_out() {
    let ttl = Duration::from_secs(2);
    let schedule = Schedule::new(ttl, Duration::from_secs(10));
    let mut renewer = Slow {
        calls: Arc::new(AtomicU32::new(0)),
        delays: vec![Duration::ZERO],
        answer: Err(RenewError::Failed("connection refused".into())),
    };
    let start = BootInstant::now();
    let why = confirm(&mut renewer, schedule)
        .await
        .expect_err("never confirmed");
    let took = BootInstant::now().saturating_since(start);
    assert!(took >= ttl && took < ttl * 2, "gave up after {took:?}");
    assert!(took <= confirm_bound(ttl), "gave up after {took:?}");
    assert!(why.contains("2s lease (--ttl)"), "{why}");
    assert!(why.contains("connection refused"), "{why}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_hold_found_gone_is_not_confirmed_again() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut renewer = Slow {
        calls: calls.clone(),
        delays: vec![Duration::ZERO],
        answer: Err(RenewError::Gone("key deleted".into())),
    };
    let schedule = Schedule::new(Duration::from_secs(2), Duration::from_secs(1));
    let why = confirm(&mut renewer, schedule).await.expect_err("gone");
    assert_eq!(why, "key deleted");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn an_old_grant_is_confirmed_before_the_keeper_counts_from_it() {
    let ttl = Duration::from_secs(3);
    let schedule = Schedule::new(ttl, crate::settings::DEFAULT_KILL_AFTER);
    let calls = Arc::new(AtomicU32::new(0));
    let mut renewer = Scripted {
        calls: calls.clone(),
        script: vec![Ok(ttl)],
    };
    // Answered within a renewal attempt: the keeper counts from the grant, no round trip.
    let fresh = BootInstant::now();
    let since = confirm_if_old(&mut renewer, schedule, fresh).await;
    assert_eq!(since, Ok(fresh));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Older than that: one renewal proves the hold, and the keeper counts from its send.
    let old = BootInstant::now().saturating_sub(schedule.attempt_timeout() * 2);
    let start = BootInstant::now();
    let since = confirm_if_old(&mut renewer, schedule, old)
        .await
        .expect("confirmed");
    assert!(since >= start, "counts from {since:?}, not the old grant");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn an_old_grant_found_gone_does_not_count() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut renewer = Scripted {
        calls: calls.clone(),
        script: vec![Err(RenewError::Gone("key deleted".into()))],
    };
    let schedule = Schedule::new(Duration::from_secs(3), Duration::from_secs(1));
    let old = BootInstant::now().saturating_sub(Duration::from_secs(2));
    let why = confirm_if_old(&mut renewer, schedule, old).await;
    assert_eq!(why, Err("key deleted".to_owned()));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_broken_connection_is_lost_by_the_deadline_of_the_last_acknowledged_send() {
    let schedule = Schedule::new(Duration::from_secs(30), Duration::from_secs(10));
    let last_ack = BootInstant::now().saturating_sub(Duration::from_secs(4));
    let lost = schedule.lost_after("the connection broke".into(), last_ack);
    assert_eq!(lost.reason, "the connection broke");
    assert_eq!(lost.kill_by, Some(schedule.kill_by(last_ack)));
    assert_eq!(
        schedule.kill_by(last_ack).saturating_since(last_ack),
        Duration::from_millis(26_700)
    );
    // A hold already gone has no later moment to protect.
    assert_eq!(Lost::gone("key deleted").kill_by, None);
}

#[test]
fn a_proof_gives_the_keepers_deadline_of_its_latest_acknowledged_send() {
    let schedule = Schedule::new(Duration::from_secs(2), Duration::ZERO);
    let t0 = BootInstant::now();
    let mut proof = Proof::new(schedule, t0);
    assert_eq!(proof.kill_by(), schedule.kill_by(t0));
    // 2 s lease: 1.98 s − 0.5 s margin.
    assert_eq!(
        proof.kill_by().saturating_since(t0),
        Duration::from_millis(1480)
    );
    let room = Duration::from_millis(300);
    assert_eq!(
        proof.give_up_at(room),
        schedule.kill_by(t0).saturating_sub(room)
    );
    assert!(proof.leaves(room));
    assert!(!proof.leaves(Duration::from_secs(2)));
    // An answer to an older request proves nothing new.
    proof.acked(t0.saturating_sub(Duration::from_secs(1)));
    assert_eq!(proof, Proof::new(schedule, t0));
    let later = t0 + Duration::from_millis(500);
    proof.acked(later);
    assert_eq!(proof.kill_by(), schedule.kill_by(later));
    let lost = proof.lost("not moved in time".into());
    assert_eq!(lost.kill_by, Some(schedule.kill_by(later)));
}

#[tokio::test(flavor = "current_thread")]
async fn renews_until_stopped() {
    let calls = Arc::new(AtomicU32::new(0));
    // Real time: at 3 s the keeper renews every 0.5 s and gives a silent lease up after
    // 1.5 s, so only a test thread starved for that long could see a loss (at 2 s, 1 s of
    // starvation did, on a machine with a load of 10 to 12).
    let ttl = Duration::from_secs(3);
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

/// At the 3 s lease of the tests, a first renewal that gets no answer (a server or a
/// machine too busy to answer in time) is followed by a second, slow but within its
/// attempt, and the hold is kept.
#[tokio::test(flavor = "current_thread")]
async fn a_renewal_that_times_out_is_followed_by_one_that_keeps_the_hold() {
    let ttl = Duration::from_secs(3);
    let calls = Arc::new(AtomicU32::new(0));
    let renewer = Slow {
        calls: calls.clone(),
        delays: vec![
            Duration::from_secs(60),
            Duration::from_millis(300),
            Duration::ZERO,
        ],
        answer: Ok(ttl),
    };
    let acquired = BootInstant::now();
    let schedule = Schedule::new(ttl, crate::settings::DEFAULT_KILL_AFTER);
    let mut keeper = Keeper::start(renewer, acquired, ttl, schedule.grace);
    // Well past the give-up point of the acquisition itself (1.5 s after it).
    let watch = schedule.hold_for() + Duration::from_secs(1);
    tokio::select! {
        lost = keeper.lost() => panic!(
            "lost after {:?} and {} calls: {lost:?}",
            BootInstant::now().saturating_since(acquired),
            calls.load(Ordering::SeqCst)
        ),
        _ = tokio::time::sleep(watch) => {}
    }
    assert!(calls.load(Ordering::SeqCst) >= 2);
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
