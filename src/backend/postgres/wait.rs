//! Giving up a wait: the messages of a wait that ended (busy, no answer, connection lost),
//! and abandoning a queued lock call so that no request stays on the server's queue.

use std::future::Future;
use std::time::Duration;

use tokio_postgres::types::Type;

use super::conn::{classify, Session};
use super::deadline::Deadline;
use super::keys::functions;
use super::{PgBackend, CANCEL_TIMEOUT};
use crate::error::Error;
use crate::lock::{AcquireRequest, Mode};
use crate::wording::not_acquired;

impl PgBackend {
    /// A statement did not answer by the `--wait` deadline (and a second more).
    pub(super) fn no_answer(&self, deadline: Option<Deadline>, what: &str) -> Error {
        let wait = deadline.map_or(Duration::ZERO, |d| d.wait);
        Error::Unavailable(format!(
            "no answer from {} ({what}) within --wait {}",
            self.display,
            humantime::format_duration(wait)
        ))
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
                not_acquired(&request.name, &state, request.wait)
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
