//! Statements on an open session: one or more at a time, each exchange bounded in time, the
//! rows of the last result set that had any, and a session whose earlier statement was
//! abandoned refused as out of step.

use std::time::Duration;

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Conn, Row};

use super::{Failure, Session};
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;

impl Session {
    /// Run `sql` (one or more statements) and return the rows of the last result set that
    /// had any, bounded by `limit`.
    pub(in crate::backend::mysql) async fn rows(
        &mut self,
        sql: &str,
        limit: Duration,
    ) -> Result<Vec<Row>, Failure> {
        self.rows_marked(sql, limit, &[]).await
    }

    /// [`Session::rows`], with a hand-off event (`logging::HANDOFF`) as the result of each
    /// statement that `marks` names arrives: `(i, event)` for the `i`-th statement of `sql`
    /// (from 0). The server may send several results in one packet; the events then show it.
    pub(in crate::backend::mysql) async fn rows_marked(
        &mut self,
        sql: &str,
        limit: Duration,
        marks: &[(usize, &'static str)],
    ) -> Result<Vec<Row>, Failure> {
        if self.in_flight {
            return Err(Failure::OutOfStep);
        }
        let (sql, marks) = match self.tail.take() {
            Some(tail) => {
                // The tail's statements come first: the marks move past them.
                let before = tail.matches(';').count();
                let marks: Vec<(usize, &'static str)> = marks
                    .iter()
                    .map(|&(at, event)| (at + before, event))
                    .collect();
                (format!("{tail}{sql}"), marks)
            }
            None => (sql.to_owned(), marks.to_vec()),
        };
        tracing::trace!("statement: {sql}");
        self.in_flight = true;
        match tokio::time::timeout(limit, last_rows(&mut self.conn, &sql, &marks)).await {
            Ok(result) => {
                self.in_flight = false;
                result.map_err(Failure::Driver)
            }
            Err(_) => Err(Failure::Timeout(limit)),
        }
    }

    /// Run the [`tail`](Session::tail), if any, bounded by `limit`.
    pub(in crate::backend::mysql) async fn finish(
        &mut self,
        limit: Duration,
    ) -> Result<(), Failure> {
        match self.tail.take() {
            Some(tail) => self.rows(&tail, limit).await.map(drop),
            None => Ok(()),
        }
    }

    /// One statement outside the keeper, bounded by [`OP_TIMEOUT`], as an [`Error`].
    pub(in crate::backend::mysql) async fn query(
        &mut self,
        sql: &str,
        display: &str,
    ) -> Result<Vec<Row>, Error> {
        self.rows(sql, OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(display))
    }
}

/// The rows of the last result set of `sql` that returned any.
async fn last_rows(
    conn: &mut Conn,
    sql: &str,
    marks: &[(usize, &'static str)],
) -> Result<Vec<Row>, mysql_async::Error> {
    let mut result = conn.query_iter(sql).await?;
    let mut last = Vec::new();
    // Bounded: one round per statement of `sql`.
    for statement in 0..64 {
        let rows: Vec<Row> = result.collect().await?;
        if let Some((_, event)) = marks.iter().find(|(at, _)| *at == statement) {
            tracing::debug!(target: crate::logging::HANDOFF, "{event}");
        }
        if !rows.is_empty() {
            last = rows;
        }
        if result.is_empty() {
            break;
        }
    }
    // A statement after the first that failed leaves its error pending, where `is_empty`
    // does not see it: one more read raises it.
    let tail: Vec<Row> = result.collect().await?;
    if !tail.is_empty() {
        last = tail;
    }
    Ok(last)
}

/// Column `i` of `row`, `None` for NULL or a value of another type.
pub(in crate::backend::mysql) fn cell<T: FromValue>(row: &Row, i: usize) -> Option<T> {
    row.get_opt::<Option<T>, usize>(i)
        .and_then(Result::ok)
        .flatten()
}
