//! Taking the lock: `--limit 1` waits in `GET_LOCK` itself; `--limit N` queues on the
//! turnstile key (`GET_LOCK` too) and its head takes the first free slot, looking again every
//! quarter second at most (MySQL has no notification a released slot could send).
//!
//! A waiter makes one lock call for its whole wait (what is left of `--wait`, or a year at a
//! time without one), so it keeps its place in the server's queue, which grants in arrival
//! order. A signal ends the call at once with `KILL QUERY` from a second connection; a
//! waiter that dies without it leaves the queue within a second (the server checks a
//! user-lock waiter's connection every second, MySQL 5.7+ and MariaDB 10.1+). A connection
//! that closes while waiting (a server restart) is opened again with backoff, and the wait
//! goes on within `--wait`. The `--limit` of the holders is checked before the wait and
//! again right after the grant. What a run that does not get the lock is told, and why a grant
//! is given back, is in `refusals`.

use std::time::Duration;

use super::conn::{cell, Failure, Session};
use super::keys::{key, session_key, slot_key, turnstile_key};
use super::sql::{
    grant_sql, grant_tail, other_limit_sql, settings_sql, single_lock_sql, slot_lock_sql,
    turnstile_sql, undo_slot_sql,
};
use super::{MysqlBackend, CANCEL_TIMEOUT};
use crate::budget::WaitBudget;
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::lock::{limit_mismatch, AcquireRequest, Cancel};

mod refusals;

use self::refusals::transient;

/// The longest one lock call waits in the server without `--wait`: a year, in whole seconds
/// that MySQL and MariaDB both accept (a negative timeout means "for ever" only on MySQL).
pub(super) const UNBOUNDED: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long past its own wait a lock call may take to answer before the server counts as
/// not answering. The server itself ends the call at the end of `--wait` (`GET_LOCK`'s
/// timeout), so this only bounds a server that is stuck, where a few seconds are right and
/// a deadline from the lease would not be (no lease exists yet); with `--wait`, `run.rs`'s
/// backstop ends the run a second after the wait anyway.
const SLACK: Duration = Duration::from_secs(3);
/// The first pause before connecting again after the connection closed while waiting, and
/// the longest (doubling in between): a restarting server is tried often at first, a server
/// that stays down is not hammered.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The connection closed under a waiter (why, in words): it holds nothing on the server any
/// more, and may connect again and queue anew.
pub(super) struct Closed(String);
/// How often the head of a `--limit N` queue looks for a free slot: a period, not a
/// deadline (nothing fails when a look takes longer). It trades a hand-off's delay (an
/// eighth of a second on average) against one cheap statement per look from the one waiter
/// at the head of the queue; no lease exists yet to derive it from.
const SLOT_LOOK: Duration = Duration::from_millis(250);

/// A grant: the token, the key we hold, and when the request that took it was sent.
pub(super) struct Granted {
    pub(super) token: u64,
    pub(super) key: String,
    /// The key only our session holds with the lock (`keys::session_key`).
    pub(super) session_key: String,
    pub(super) sent: BootInstant,
}

/// The report row of [`grant_sql`].
pub(super) struct Report {
    granted: bool,
    token: u64,
    read_only: bool,
    connection_id: u64,
    other_before: Option<u32>,
    other_after: Option<u32>,
    slot: Option<u32>,
}

impl Report {
    fn read(rows: &[mysql_async::Row]) -> Result<Report, Error> {
        let row = rows
            .first()
            .ok_or_else(|| Error::Internal("the lock statement returned no row".into()))?;
        Ok(Report {
            granted: cell::<i64>(row, 0) == Some(1),
            token: cell::<u64>(row, 1).unwrap_or(0),
            read_only: cell::<i64>(row, 2).unwrap_or(0) != 0,
            connection_id: cell::<u64>(row, 3).unwrap_or(0),
            other_before: cell::<u32>(row, 4),
            other_after: cell::<u32>(row, 5),
            slot: cell::<u32>(row, 6),
        })
    }
}

impl MysqlBackend {
    /// Take the lock on `session` as `request` says, within its `--wait`; a waiter whose
    /// connection closes connects again (with backoff) and waits on.
    pub(super) async fn take(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        cancel: &mut Cancel,
    ) -> Result<Granted, Error> {
        let mut pause = RECONNECT_FIRST;
        // Bounded: each round ends in a grant, an error, or a reconnection that waits longer.
        for _ in 0..u32::MAX {
            let Closed(why) = match self.take_on(session, request, cancel).await? {
                Ok(granted) => return Ok(granted),
                Err(closed) => closed,
            };
            if request.budget.is_no_wait() {
                return Err(Error::Unavailable(format!(
                    "the connection to {} closed: {why}",
                    self.display
                )));
            }
            tracing::info!(
                "the connection to {} closed while waiting ({why}); connecting again",
                self.display
            );
            *session = self.reconnect(&request.budget, &mut pause, cancel).await?;
        }
        Err(Error::Internal("the lock wait loop ended".into()))
    }

    /// Connect again after a pause (doubling from [`RECONNECT_FIRST`] to [`RECONNECT_MAX`]),
    /// until it works or `--wait` is over. Only a server that cannot be reached is tried
    /// again; a refusal (password, privileges, TLS) is final.
    async fn reconnect(
        &self,
        budget: &WaitBudget,
        pause: &mut Duration,
        cancel: &mut Cancel,
    ) -> Result<Session, Error> {
        // Bounded: each try waits longer, up to RECONNECT_MAX, and --wait ends it.
        for _ in 0..u32::MAX {
            let next = BootInstant::now() + *pause;
            let wake = budget.deadline().map_or(next, |d| d.min(next));
            tokio::select! {
                () = sleep_until(wake) => {}
                () = cancel.cancelled() => return Err(Error::Cancelled),
            }
            *pause = pause.saturating_mul(2).min(RECONNECT_MAX);
            let connected = tokio::select! {
                connected = self.connect(budget.left()) => connected,
                () = cancel.cancelled() => return Err(Error::Cancelled),
            };
            match connected {
                Ok(session) => return Ok(session),
                Err(e @ (Error::Unavailable(_) | Error::Capacity(_))) => {
                    if budget.is_over() {
                        return Err(e);
                    }
                    tracing::debug!("connecting again: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Internal("the reconnect loop ended".into()))
    }

    /// One try on `session`: a grant, a final error, or the connection closed under us.
    async fn take_on(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        cancel: &mut Cancel,
    ) -> Result<Result<Granted, Closed>, Error> {
        let name = request.name.as_str();
        let name_key = key(&self.prefix, name);
        let slots: Vec<String> = (0..request.limit.max(1))
            .map(|i| slot_key(&self.prefix, name, i))
            .collect();
        let queue = request.limit > 1 && !request.budget.is_no_wait();
        if queue {
            if let Err(closed) = self.queue(session, request, &name_key, cancel).await? {
                return Ok(Err(closed));
            }
        }
        let turnstile = turnstile_key(&self.prefix, name);
        let grant = grant_sql(
            &name_key,
            &slots,
            request.limit,
            &request.holder,
            &session_key(&self.prefix, name, session.id),
        );
        let tail = grant_tail(queue.then_some(turnstile.as_str()));
        let mut created = false;
        for _ in 0..u32::MAX {
            let (sql, wait) = self.lock_statement(session, request, &name_key, &slots, &grant);
            let marks = handoff_marks(&sql);
            let sent = BootInstant::now();
            // The GET_LOCK call waits in the server's queue from now on.
            crate::lock::queued(request);
            let rows = match self.call(session, &sql, wait, &marks, cancel).await? {
                Ok(rows) => rows,
                Err(f) if f.closed() => return Ok(Err(Closed(f.describe()))),
                Err(f) => {
                    self.prepare_retry(session, &slots, f, &mut created).await?;
                    continue;
                }
            };
            session.configured = true;
            // The grant's transaction is still open: it ends with the next statement.
            session.tail = Some(tail.clone());
            if let Some(granted) = self.grant_in(&rows, session, request, &slots, sent).await? {
                return Ok(Ok(granted));
            }
            if request.budget.is_final() {
                let head = queue.then_some(turnstile.as_str());
                return Err(self.give_up(session, request, head).await);
            }
            if request.limit > 1 {
                self.pause(&request.budget, cancel).await?;
            }
        }
        Err(Error::Internal("the lock wait loop ended".into()))
    }

    /// One attempt's statement and how long its lock call may wait in the server: the
    /// session settings (first statement only), the check of the holders' `--limit`, the
    /// lock call (all that is left of the wait), then `grant`.
    fn lock_statement(
        &self,
        session: &Session,
        request: &AcquireRequest,
        name_key: &str,
        slots: &[String],
        grant: &str,
    ) -> (String, Duration) {
        let wait = whole_wait(&request.budget);
        let lock = if request.limit > 1 {
            slot_lock_sql(slots)
        } else {
            single_lock_sql(&slots[0], wait)
        };
        let sql = format!(
            "{}{}{lock}{grant}",
            self.settings(session, request),
            other_limit_sql(name_key, request.limit)
        );
        (sql, wait)
    }

    /// Readies the next try after a lock statement failed with `f`, or refuses: a missing
    /// table is created (once), and a statement that InnoDB rolled back has what it took
    /// given back; any other failure ends the acquisition.
    async fn prepare_retry(
        &self,
        session: &mut Session,
        slots: &[String],
        f: Failure,
        created: &mut bool,
    ) -> Result<(), Error> {
        if f.server_code() == Some(1146) && !*created {
            *created = true;
            return self.create_table(session).await;
        }
        // Slot holders writing their rows at once (or beside a first-use CREATE TABLE) can
        // deadlock in InnoDB, which rolls one back: give back what the statement took and
        // try again.
        if !transient(&f) {
            return Err(self.refused(session, f).await);
        }
        tracing::debug!("retrying the grant: {}", f.describe());
        session.configured = true;
        let undo = undo_slot_sql(slots);
        if let Err(f) = session.rows(&undo, CANCEL_TIMEOUT).await {
            return Err(self.refused(session, f).await);
        }
        Ok(())
    }

    /// The lock stayed held to the end of the wait: leave the head of the `--limit N` queue
    /// (`turnstile`, when we queued) and say who holds it.
    async fn give_up(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        turnstile: Option<&str>,
    ) -> Error {
        if let Some(turnstile) = turnstile {
            self.leave(session, turnstile).await;
        }
        self.busy(session, request).await
    }

    /// The grant the report `rows` of a lock statement tells of (none while the lock is
    /// held), once [`Self::check_grant`] accepts it: its token, the slot key it took (the
    /// first when the report names none) and when it was `sent`. Holders with another
    /// `--limit` are refused.
    async fn grant_in(
        &self,
        rows: &[mysql_async::Row],
        session: &mut Session,
        request: &AcquireRequest,
        slots: &[String],
        sent: BootInstant,
    ) -> Result<Option<Granted>, Error> {
        let report = Report::read(rows)?;
        if let Some(theirs) = report.other_before {
            return Err(limit_mismatch(&request.name, theirs));
        }
        if !report.granted {
            return Ok(None);
        }
        let key = match report.slot.and_then(|s| slots.get(s as usize)) {
            Some(key) => key.clone(),
            None => slots[0].clone(),
        };
        let token = self.check_grant(session, request, &report).await?;
        Ok(Some(Granted {
            token,
            key,
            session_key: session_key(&self.prefix, request.name.as_str(), session.id),
            sent,
        }))
    }

    /// `--limit N`: wait on the turnstile until we head the queue.
    async fn queue(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        name_key: &str,
        cancel: &mut Cancel,
    ) -> Result<Result<(), Closed>, Error> {
        let turnstile = turnstile_key(&self.prefix, request.name.as_str());
        let mut created = false;
        for _ in 0..u32::MAX {
            let wait = whole_wait(&request.budget);
            let sql = format!(
                "{}{}{}",
                self.settings(session, request),
                other_limit_sql(name_key, request.limit),
                turnstile_sql(&turnstile, wait)
            );
            let rows = match self.call(session, &sql, wait, &[], cancel).await? {
                Ok(rows) => rows,
                Err(f) if f.closed() => return Ok(Err(Closed(f.describe()))),
                Err(f) if f.server_code() == Some(1146) && !created => {
                    created = true;
                    self.create_table(session).await?;
                    continue;
                }
                // A deadlock victim took nothing: its round is simply tried again.
                Err(f) if transient(&f) => {
                    tracing::debug!("retrying the queue call: {}", f.describe());
                    session.configured = true;
                    continue;
                }
                Err(f) => return Err(self.refused(session, f).await),
            };
            session.configured = true;
            let row = rows.first();
            if let Some(theirs) = row.and_then(|r| cell::<u32>(r, 1)) {
                return Err(limit_mismatch(&request.name, theirs));
            }
            if row.and_then(|r| cell::<i64>(r, 0)) == Some(1) {
                return Ok(Ok(()));
            }
            if request.budget.is_over() {
                return Err(self.busy(session, request).await);
            }
        }
        Err(Error::Internal("the queue wait loop ended".into()))
    }

    /// The session settings, with the first statement only.
    fn settings(&self, session: &Session, request: &AcquireRequest) -> String {
        if session.configured {
            String::new()
        } else {
            settings_sql(request.ttl)
        }
    }

    /// Run a lock statement that waits up to `wait` in the server, unless cancelled: then
    /// the wait is ended on the server (`KILL QUERY`) before we return.
    async fn call(
        &self,
        session: &mut Session,
        sql: &str,
        wait: Duration,
        marks: &[(usize, &'static str)],
        cancel: &mut Cancel,
    ) -> Result<Result<Vec<mysql_async::Row>, Failure>, Error> {
        let id = session.id;
        let work = session.rows_marked(sql, wait + SLACK, marks);
        tokio::select! {
            biased;
            done = work => Ok(done),
            () = cancel.cancelled() => {
                self.kill_query(id).await;
                Err(Error::Cancelled)
            }
        }
    }

    /// End the statement of connection `id` from a connection of its own (best effort,
    /// bounded): a cancelled waiter must not stay in the server's queue.
    async fn kill_query(&self, id: u64) {
        let kill = async {
            let mut other = self.connect(Some(CANCEL_TIMEOUT)).await.ok()?;
            other
                .rows(&format!("KILL QUERY {id}"), CANCEL_TIMEOUT)
                .await
                .ok()
        };
        if tokio::time::timeout(CANCEL_TIMEOUT, kill).await.is_err() {
            tracing::debug!(
                "could not end the waiting lock call; the server ends it within a second of the connection closing"
            );
        }
    }

    /// Between looks for a free slot (`--limit N`), unless cancelled or past `--wait`.
    async fn pause(&self, budget: &WaitBudget, cancel: &mut Cancel) -> Result<(), Error> {
        let next = BootInstant::now() + SLOT_LOOK;
        let wake = budget.deadline().map_or(next, |d| d.min(next));
        tokio::select! {
            () = sleep_until(wake) => Ok(()),
            () = cancel.cancelled() => Err(Error::Cancelled),
        }
    }

    /// Give up our place at the head of a `--limit N` queue (the session ends anyway).
    async fn leave(&self, session: &mut Session, turnstile: &str) {
        let sql = format!("DO RELEASE_LOCK('{turnstile}')");
        let _ = session.rows(&sql, CANCEL_TIMEOUT).await;
    }
}

/// The hand-off events (`logging::HANDOFF`) of a lock statement `sql`: `granted` when the
/// result of the statement with the `GET_LOCK` call arrives, `token-written` when the
/// report with the token does (statements counted by their `;`: the texts in them are hex
/// literals). Nothing when the events are not printed.
fn handoff_marks(sql: &str) -> Vec<(usize, &'static str)> {
    if !tracing::enabled!(target: crate::logging::HANDOFF, tracing::Level::DEBUG) {
        return Vec::new();
    }
    let statement_at = |needle: &str| sql.find(needle).map(|at| sql[..at].matches(';').count());
    [
        ("GET_LOCK(", "granted"),
        ("SELECT @dlock_granted", "token-written"),
    ]
    .into_iter()
    .filter_map(|(needle, event)| Some((statement_at(needle)?, event)))
    .collect()
}

/// How long the next lock call may wait in the server: all that is left of the wait.
fn whole_wait(budget: &WaitBudget) -> Duration {
    budget.left_within(UNBOUNDED)
}

/// Undo whatever a failed or refused acquisition took on this session (best effort: the
/// session ends with dlock anyway, which frees everything).
pub(super) async fn give_back(session: &mut Session) {
    // What the grant's transaction wrote is rolled back, not committed.
    session.tail = None;
    let _ = session
        .rows("ROLLBACK; DO RELEASE_ALL_LOCKS()", CANCEL_TIMEOUT)
        .await;
}
