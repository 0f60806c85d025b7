//! The waiting protocol of one acquisition: the `acquire.lua` calls (retried after a lost
//! reply, each bounded by `--wait` or `--no-wait`), the waiter's heartbeat and its `BLPOP` on
//! its own mailbox, why a lock was not ours (the message: [`reason`]), and leaving the queue.

mod reason;

use std::time::Duration;

use redis::Value;

use crate::budget::{Wait, WaitBudget};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::Keeper;
use crate::lock::{limit_mismatch, AcquireRequest, Cancel};
use crate::wording::not_acquired;

use super::conn::{Conn, Failure};
use super::keys::Keys;
use super::lease::{RedisLease, Renewer};
use super::scripts::{
    bad_data, fence_exhausted, int_of, millis, release_call, tokens_at, wake_call, Invocation,
    Released, Step, ACQUIRE,
};
use super::sentinel::watch::SwitchWatch;
use super::RedisBackend;
use crate::kit::owed::Owed;
use crate::kit::timeouts::OP_TIMEOUT;

/// Attempts of an acquire step after a lost reply or a dropped connection.
const ACQUIRE_ATTEMPTS: u32 = 3;
/// How long a waiter keeps its place in line after its last heartbeat: a waiter killed with
/// SIGKILL holds up a freed lock at most this long, whatever `--ttl` is.
pub(super) const WAITER_LEASE: Duration = Duration::from_secs(2);
/// How often a waiter heartbeats (and re-checks): a quarter of [`WAITER_LEASE`], so that three
/// heartbeats in a row can be late or lost (a busy machine, a dropped connection) before the
/// waiter loses its place; also how late a lost wake-up is noticed. With a short `--ttl` it is
/// `--ttl`/3 instead (see [`Waiter::start`]).
pub(super) const WAITER_HEARTBEAT: Duration = Duration::from_millis(500);
/// The pause between two acquire calls that met a settling cluster (each call already waited
/// out the cluster within its budget, pausing up to 200 ms at a time): the same spacing.
const SETTLE_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// With `--no-wait`, the server must have answered within this (connecting included).
const NO_WAIT_BOUND: Duration = OP_TIMEOUT;
/// What an acquisition may take past the server's time to answer (`--wait`, but at least
/// [`crate::budget::MIN_ANSWER`]; the `--no-wait` bound) to finish what it started: the last
/// check at the deadline, the details of the message, leaving the queue. The promise is that
/// time + 0.5 s from start to exit; the other 0.2 s are for the process's start and exit on a
/// busy machine. A step cut short by it costs nothing lasting: a place in line lapses within
/// [`WAITER_LEASE`], a grant whose reply was lost within `--ttl`.
pub(super) const OVERRUN: Duration = Duration::from_millis(300);
/// The least time the last check at a `--wait` deadline gets (within [`OVERRUN`]): a round
/// trip to a server that answers, on a busy machine.
const LAST_CALL: Duration = Duration::from_millis(200);
/// Bound for leaving the queue, connecting included (after a failure, a timeout or a cancel),
/// when no `--wait` bounds it (then [`OVERRUN`] does).
pub(super) const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// One acquisition: its owner token, its keys, and its bounds.
pub(super) struct Waiter<'a> {
    backend: &'a RedisBackend,
    request: &'a AcquireRequest,
    tok: String,
    keys: Keys,
    /// The request's budget, with [`NO_WAIT_BOUND`] for the server to answer a `--no-wait`
    /// look: its [`WaitBudget::answer_by`] bounds how long dlock waits for the server itself,
    /// connecting included (69), and everything ends [`OVERRUN`] after it, leaving the queue
    /// included. The lock's own wait (75) ends with the request's budget.
    answering: WaitBudget,
    mode: &'static str,
    meta: String,
    ttl_ms: String,
    heartbeat: Duration,
    /// Live holders and waiters ahead of us, as the last acquire reply said.
    last: std::cell::Cell<(i64, i64)>,
    /// What the server may hold for our token: given back if the lock does not become ours.
    pub(super) owed: Owed,
}

impl<'a> Waiter<'a> {
    /// Start an acquisition now, with a connection that connects on its first call (within
    /// that call's budget).
    pub(super) fn start(
        backend: &'a RedisBackend,
        request: &'a AcquireRequest,
    ) -> Result<(Waiter<'a>, Conn), Error> {
        let tok = super::keys::owner_token(request.mode);
        let keys = backend.keys(&request.name, &tok);
        let conn = Conn::new(&backend.target, &backend.display)?;
        let mode = if request.budget.is_no_wait() {
            "try"
        } else {
            "wait"
        };
        let meta =
            serde_json::to_string(&request.holder).map_err(|e| Error::Internal(e.to_string()))?;
        // Waiters heartbeat (and re-check) often, whatever the TTL: a killed waiter drops out
        // of the queue WAITER_LEASE after its last heartbeat. The 10 ms floor only matters for
        // a --ttl under 30 ms: a heartbeat more often than that would be all the waiter does.
        let heartbeat = (request.ttl / 3)
            .min(WAITER_HEARTBEAT)
            .max(Duration::from_millis(10));
        let waiter = Waiter {
            backend,
            request,
            tok,
            keys,
            answering: request.budget.answering_within(NO_WAIT_BOUND),
            mode,
            meta,
            ttl_ms: millis(request.ttl),
            heartbeat,
            last: std::cell::Cell::new((1, 0)),
            owed: Owed::new(),
        };
        Ok((waiter, conn))
    }

    /// The budget of the next call: up to [`OP_TIMEOUT`], not past the server's time to
    /// answer, but at least [`LAST_CALL`] (so the last check at a `--wait` deadline can still
    /// be answered), and never past it and [`OVERRUN`].
    fn budget(&self) -> Duration {
        self.answering
            .call_limit_past(OP_TIMEOUT, LAST_CALL, OVERRUN)
    }

    /// One step of `acquire.lua` (`ticket`: our place in line, 0 before we have one): its
    /// reply, and when the request that got it was sent.
    pub(super) async fn call(
        &self,
        conn: &mut Conn,
        ticket: i64,
        cancel: &mut Cancel,
    ) -> Result<(Vec<Value>, BootInstant), Error> {
        let invocation = self.acquire_invocation(ticket);
        let started = BootInstant::now();
        let mut attempt = 0;
        // Whether any attempt sent the script (one that never connected cannot have run).
        let mut sent_any = false;
        loop {
            attempt += 1;
            let call = conn.invoke::<Vec<Value>>(&invocation, self.budget());
            let result = tokio::select! {
                result = call => result,
                _ = cancel.cancelled() => {
                    // The script may have run.
                    self.owed.set(true);
                    return Err(Error::Cancelled);
                }
            };
            sent_any |= conn.last_send.is_some();
            match result {
                Ok(reply) => {
                    // The lease dates from the send that got this reply: a fresh grant was
                    // made after it, and a retry that finds its own hold (after a lost reply)
                    // is told the time that hold has left, counted from after it too.
                    let sent = conn.last_send.unwrap_or(started);
                    self.wake_moved_up(conn, &reply).await;
                    return Ok((reply, sent));
                }
                // A cluster that is moving the lock's slot answers "not now" for as long as
                // the move takes: ask again until --wait runs out (for ever without it), as
                // a waiter whose place in line is kept (a lapsed heartbeat rejoins with the
                // same ticket).
                Err(failure) if failure.is_settling() && !self.answering.answer_is_over() => {
                    tracing::debug!(
                        "the cluster is settling ({}); asking again",
                        failure.describe()
                    );
                    attempt = 0;
                    tokio::time::sleep(SETTLE_RETRY_PAUSE).await;
                }
                Err(failure) if self.may_retry(&failure, attempt, conn) => {
                    tracing::debug!(
                        "acquire attempt {attempt} failed: {}; retrying",
                        failure.describe()
                    );
                    // 50 ms, then 100 ms: a dropped connection is re-opened at once, and a
                    // server that is restarting gets a moment; --wait bounds it all.
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                }
                Err(failure) => {
                    let error = self.call_error(failure, conn, sent_any, ticket);
                    // The script may have run without us seeing the reply: whatever it
                    // created for our token (a place in line or a grant) is taken back.
                    self.owed
                        .set((failure_may_have_run(&error) && sent_any) || ticket != 0);
                    return Err(error);
                }
            }
        }
    }

    /// Wakes the waiters that a purge in `reply` let move up (not our own place in line).
    async fn wake_moved_up(&self, conn: &mut Conn, reply: &[Value]) {
        if reply.first().and_then(int_of) == Some(0) {
            let woken = tokens_at(reply, 5);
            wake_call(conn, &self.keys, &woken, self.budget()).await;
        }
    }

    /// The `acquire.lua` call for our token, keys and settings, at our place in line
    /// `ticket`.
    fn acquire_invocation(&self, ticket: i64) -> Invocation<'static> {
        let keys = &self.keys;
        let mut invocation = ACQUIRE.prepare_invoke();
        invocation
            .key(&keys.fence)
            .key(&keys.owners)
            .key(&keys.hold)
            .key(&keys.queue)
            .key(&keys.qdl)
            .key(&keys.wake)
            .arg(&self.tok)
            .arg(self.request.limit)
            .arg(&self.ttl_ms)
            .arg(millis(WAITER_LEASE))
            .arg(&self.meta)
            .arg(self.mode)
            .arg(ticket);
        invocation
    }

    /// Whether to ask again after `failure` on attempt `attempt`. The script is idempotent
    /// for our token: after a lost reply, ask again. A connection that got no answer at all
    /// within the call's time (a TLS handshake with a server that does not speak TLS) is
    /// not asked again: that is no lost reply, and another try would take as long.
    fn may_retry(&self, failure: &Failure, attempt: u32, conn: &Conn) -> bool {
        failure.is_transient()
            && attempt < ACQUIRE_ATTEMPTS
            && !self.answering.answer_is_over()
            && (conn.last_send.is_some() || !failure.is_timeout())
    }

    /// The error an acquire call that failed for good ends the acquisition with (`sent_any`:
    /// whether any attempt sent the script).
    fn call_error(&self, failure: Failure, conn: &Conn, sent_any: bool, ticket: i64) -> Error {
        if failure.is_timeout() && self.answering.answer_is_over() && ticket != 0 {
            // The server answered all along the wait: only the last check at the
            // deadline was late. Not acquired, for the reason it last gave.
            let (live, ahead) = self.last.get();
            not_acquired(
                &self.request.name,
                &self.reason(live, ahead, ""),
                self.request.budget.wait(),
            )
        } else if failure.is_timeout() && !sent_any && conn.setup.tls() {
            // A plain-text server waits for a command and never answers the
            // handshake: say so, whenever the wait ends.
            let plain = if self.backend.display.starts_with("rediss-sentinel:") {
                "use redis-sentinel:// for servers without TLS"
            } else {
                "use redis:// for a server without TLS"
            };
            Error::Unavailable(crate::wording::no_tls_handshake(
                &self.backend.display,
                super::failure::server_of(&self.backend.display),
                plain,
            ))
        } else if failure.is_timeout() && self.answering.answer_is_over() {
            // Only `--no-wait`'s bound and a `--wait` of some length pass.
            if self.request.budget.is_no_wait() {
                Error::Unavailable(crate::wording::no_answer_within(
                    &self.backend.display,
                    None,
                    Wait::No,
                    NO_WAIT_BOUND,
                ))
            } else {
                crate::wording::no_answer(&self.backend.display, None, &self.request.budget)
            }
        } else {
            failure.into_error(&self.backend.display)
        }
    }

    /// The lock is ours (`fence` and the lease the script granted, dating from `sent`):
    /// the keeper renews it on this connection from now on.
    pub(super) async fn granted(
        &self,
        mut conn: Conn,
        fence: &str,
        granted_ms: i64,
        sent: BootInstant,
        next: Option<String>,
    ) -> Result<RedisLease, Error> {
        let display = &self.backend.display;
        let token = match fence.parse::<u64>() {
            Ok(token) if token > 0 => token,
            _ => {
                return Err(bad_data(
                    display,
                    &self.keys.hold,
                    &format!("the fencing token \"{fence}\""),
                ));
            }
        };
        let granted = Duration::from_millis(granted_ms.max(0) as u64);
        let granted = if granted.is_zero() {
            self.request.ttl
        } else {
            granted
        };
        // Behind Sentinel with `?replicas=N`: not before N replicas have the hold.
        super::sentinel::replicas::acknowledged(&mut conn, granted).await?;
        let mut renewer = Renewer {
            conn,
            keys: self.keys.clone(),
            ttl_ms: self.ttl_ms.clone(),
            display: display.clone(),
        };
        let (since, granted) = match renewer
            .confirm_grant(sent, granted, self.request.kill_after)
            .await
        {
            Ok(confirmed) => confirmed,
            Err(why) => {
                return Err(Error::Unavailable(format!(
                    "'{}' was granted but could not be confirmed: {why}; the command was not \
                     started",
                    self.request.name
                )));
            }
        };
        let switch = SwitchWatch::start(&renewer.conn, &self.keys.owners, &self.tok);
        Ok(RedisLease {
            keeper: Keeper::start(renewer, since, granted, self.request.kill_after),
            target: self.backend.target.clone(),
            token,
            keys: self.keys.clone(),
            limit: self.request.limit,
            display: display.clone(),
            switch,
            next,
        })
    }

    /// The error for a reply that neither grants nor queues (`None`: one dlock cannot read).
    pub(super) fn refusal(&self, step: Option<Step>, reply: &[Value]) -> Error {
        let display = &self.backend.display;
        match step {
            Some(Step::OtherLimit(theirs)) => match u32::try_from(theirs) {
                Ok(theirs) => limit_mismatch(&self.request.name, theirs),
                // Only a hand-written entry holds a limit outside u32; it is named as it is.
                Err(_) => Error::Usage(format!(
                    "lock '{}' is held with --limit {theirs}; all holders must use the same --limit",
                    self.request.name,
                )),
            },
            Some(Step::BadData { key, what }) => bad_data(display, &key, &what),
            Some(Step::Exhausted { key }) => fence_exhausted(display, &key),
            Some(Step::Granted { .. } | Step::Waiting { .. }) | None => Error::Internal(format!(
                "unexpected reply from the acquire script: {reply:?}"
            )),
        }
    }

    /// Wait for our turn: until a wake-up, the next heartbeat, the holder's lease running out
    /// (`hint`, for the head of the queue) or the `--wait` deadline, whichever comes first.
    /// At the deadline, give up (the reason says what held us up: `live` holders, `ahead`
    /// waiters before us).
    pub(super) async fn wait_turn(
        &self,
        conn: &mut Conn,
        hint: i64,
        live: i64,
        ahead: i64,
        cancel: &mut Cancel,
    ) -> Result<(), Error> {
        let mut block = self.heartbeat;
        if hint >= 0 {
            // The head of the queue re-checks when a holder's lease would run out: 5 ms after
            // it, as the server counts in whole milliseconds and a re-check just before the
            // deadline would find the holder still live.
            block = block.min(Duration::from_millis(hint as u64 + 5));
        }
        let deadline = self.request.budget.deadline();
        if let Some(deadline) = deadline {
            let left = deadline.remaining();
            if left.is_zero() {
                let reason = self.busy_reason(conn, live, ahead).await;
                return Err(not_acquired(
                    &self.request.name,
                    &reason,
                    self.request.budget.wait(),
                ));
            }
            block = block.min(left);
        }
        // Redis before 7.0.8 rounds sub-millisecond timeouts to 0, which blocks for ever.
        let block = block.max(Duration::from_millis(10));
        // Redis times BLPOP out at its own granularity (up to 100 ms late at hz 10), so
        // the --wait deadline is also kept by our own clock.
        tokio::select! {
            woken = conn.blpop(&self.keys.wake, block) => {
                match woken {
                    Ok(true) => tracing::debug!(target: crate::logging::HANDOFF, "woken"),
                    Ok(false) => {}
                    Err(failure) => tracing::debug!("waiting for a wake-up failed: {}; re-checking", failure.describe()),
                }
            }
            _ = crate::clock::sleep_until(deadline.unwrap_or(BootInstant::now())), if deadline.is_some() => {}
            _ = cancel.cancelled() => {
                self.owed.set(true);
                return Err(Error::Cancelled);
            }
        }
        Ok(())
    }

    /// What the last acquire reply said: `live` holders, `ahead` waiters before us.
    pub(super) fn saw(&self, live: i64, ahead: i64) {
        self.last.set((live, ahead));
    }

    /// Leave the queue (and give back a grant whose reply we may have missed). Bounded by
    /// [`LEAVE_TIMEOUT`], and by [`OVERRUN`] past the server's time to answer: a failure only
    /// costs a waiter slot until its heartbeat deadline passes (a lost grant: until its lease
    /// runs out).
    pub(super) async fn leave(&self) {
        let (keys, request, display) = (&self.keys, self.request, &self.backend.display);
        let budget = self
            .answering
            .call_limit_past(LEAVE_TIMEOUT, LEAVE_TIMEOUT, OVERRUN);
        let attempt = async {
            let mut conn = Conn::new(&self.backend.target, display)?;
            match release_call(&mut conn, keys, request.limit, "holder", budget, None).await {
                Ok(Released::BadData { key, what }) => Err(bad_data(display, &key, &what)),
                Ok(Released::Done { .. }) => Ok(()),
                Err(f) => Err(f.into_error(display)),
            }
        };
        // The release and the wake-up it may send, together.
        let attempt = async {
            tokio::time::timeout(budget, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Unavailable(format!(
                        "{display} did not answer within {}",
                        humantime::format_duration(budget)
                    )))
                })
        };
        match attempt.await {
            Ok(()) => {}
            // The server is not answering: that is the error the caller reports anyway, and
            // what was left behind expires by itself.
            Err(e @ Error::Unavailable(_)) => tracing::info!(
                "could not withdraw from '{}' (a place in line expires within {}, a grant \
                 whose reply was lost within --ttl): {e}",
                request.name,
                humantime::format_duration(WAITER_LEASE)
            ),
            Err(e) => tracing::warn!("could not withdraw from '{}': {e}", request.name),
        }
    }
}

/// After a failed acquire call, could the script still have run on the server? Not when
/// authentication, permissions or the configuration refused us.
fn failure_may_have_run(error: &Error) -> bool {
    matches!(error, Error::Unavailable(_) | Error::Internal(_))
}
