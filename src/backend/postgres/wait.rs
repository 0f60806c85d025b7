//! Bounding and giving up a wait: what is left of `--wait` as the server's `lock_timeout`,
//! the client's own limit on a lock call a second after the server's time to answer, the
//! messages of a wait that ended (busy, no answer, connection lost), and abandoning a queued
//! lock call so that no request stays on the server's queue.

use std::future::Future;
use std::time::Duration;

use tokio_postgres::types::Type;

use super::conn::{classify, Session};
use super::keys::functions;
use super::{PgBackend, CANCEL_TIMEOUT};
use crate::budget::WaitBudget;
use crate::clock::sleep_until;
use crate::error::Error;
use crate::lock::{AcquireRequest, Mode};
use crate::wording::not_acquired;

/// How long after the server's time to answer ([`WaitBudget::answer_by`]) the client ends a
/// lock call itself, should the server's `lock_timeout` not end it: a round trip to a server
/// that answers, on a busy machine.
pub(super) const CLIENT_LIMIT: Duration = Duration::from_secs(1);

/// `set_config` of `lock_timeout` to what is left of `--wait` (at least 1 ms: 0 would mean
/// none); without a `--wait`, nothing.
pub(super) fn lock_timeout_sql(budget: &WaitBudget) -> String {
    match budget.left() {
        Some(left) => format!(
            "set_config('lock_timeout', '{}', false)",
            left.as_millis().clamp(1, i32::MAX as u128)
        ),
        None => "NULL::text".into(),
    }
}

/// Ends [`CLIENT_LIMIT`] after the server's time to answer (never without a `--wait`): the
/// client's own limit on a lock call, should the server's `lock_timeout` not end it.
pub(super) async fn backstop(budget: &WaitBudget) {
    match budget.answer_by() {
        Some(by) => sleep_until(by + CLIENT_LIMIT).await,
        None => std::future::pending().await,
    }
}

/// `work`, ended [`CLIENT_LIMIT`] after the server's time to answer if it has not answered
/// by then.
pub(super) async fn within<F: Future>(budget: &WaitBudget, work: F) -> Result<F::Output, ()> {
    match budget.answer_by() {
        Some(by) => {
            let limit = (by + CLIENT_LIMIT).remaining();
            tokio::time::timeout(limit, work).await.map_err(|_| ())
        }
        None => Ok(work.await),
    }
}

impl PgBackend {
    /// A statement (`what`) did not answer by the server's time to answer (and a second
    /// more).
    pub(super) fn no_answer(&self, budget: &WaitBudget, what: &str) -> Error {
        crate::wording::no_answer(&self.display, Some(what), budget)
    }

    /// The connection ended while we waited.
    pub(super) fn lost_while_waiting(&self, session: &Session) -> Error {
        Error::Unavailable(format!(
            "lost the connection to {} while waiting: {}",
            self.display,
            session.end_reason()
        ))
    }

    /// A lock statement failed: 55P03 is the `--wait` deadline (lock_timeout); the rest is
    /// classified.
    pub(super) async fn busy_or(
        &self,
        e: &tokio_postgres::Error,
        request: &AcquireRequest,
        session: &Session,
    ) -> Error {
        match e.code().map(|c| c.code()) {
            Some("55P03") => {
                let state = self.describe_holders(session, &request.name).await;
                not_acquired(&request.name, &state, request.budget.wait())
            }
            _ => classify(e, &self.display),
        }
    }

    /// Give up a waiting lock call (on `key`, in `mode`): cancel it on the server and wait for
    /// the answer, so no lock request stays queued; a grant that won the race is given back.
    pub(super) async fn abandon<F>(
        &self,
        session: &Session,
        lock: std::pin::Pin<&mut F>,
        (key, mode): (i64, Mode),
        outcome: Error,
    ) -> Error
    where
        F: Future,
    {
        let cancelled = tokio::time::timeout(
            CANCEL_TIMEOUT,
            session.cancel.cancel_query(session.tls.clone()),
        )
        .await;
        if !matches!(cancelled, Ok(Ok(()))) {
            tracing::warn!("could not cancel the waiting lock request; closing the connection instead (a server ≥ 14 drops the request within a second)");
            return outcome;
        }
        if tokio::time::timeout(CANCEL_TIMEOUT, lock).await.is_err() {
            tracing::warn!("the cancelled lock request did not answer; closing the connection");
            return outcome;
        }
        // Granted before the cancel arrived (or cancelled): unlocking is harmless either way.
        let unlock = format!("SELECT {}($1)", functions(mode).unlock);
        let _ = tokio::time::timeout(
            CANCEL_TIMEOUT,
            session.client.query_typed(&unlock, &[(&key, Type::INT8)]),
        )
        .await;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Wait;

    #[test]
    fn what_is_left_of_the_wait_is_the_servers_lock_timeout() {
        let budget = WaitBudget::start(Wait::For(Duration::from_secs(60)));
        let sql = lock_timeout_sql(&budget);
        let millis: u64 = sql
            .strip_prefix("set_config('lock_timeout', '")
            .and_then(|rest| rest.strip_suffix("', false)"))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{sql}"));
        assert!(millis > 50_000 && millis <= 60_000, "{sql}");
        // A wait that is over still sets a limit: 0 would mean none.
        let over = WaitBudget::start(Wait::For(Duration::ZERO));
        assert_eq!(
            lock_timeout_sql(&over),
            "set_config('lock_timeout', '1', false)"
        );
        for wait in [Wait::No, Wait::Forever] {
            assert_eq!(lock_timeout_sql(&WaitBudget::start(wait)), "NULL::text");
        }
    }
}
