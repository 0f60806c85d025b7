//! `--limit 1`: the server's own FIFO lock queue. One pipelined round trip after connecting:
//! the lock call (which also claims the session, records our `--limit` and, as the grant
//! comes, takes the token: `token::lock_with_token_sql`), then the check that a second
//! statement runs on our session too, which the server runs right after the grant.
//!
//! `--shared` is the same call in share mode on the same key (`pg_advisory_lock_shared`).
//! The server's lock manager grants a request only if it conflicts neither with the granted
//! locks nor with any request already waiting (`LockAcquireExtended` checks the lock's
//! `waitMask` first), so a shared request that arrives while an exclusive one waits queues
//! behind it instead of joining the shared holders: writers are not starved. A release wakes
//! the waiters in queue order, each one that conflicts with nothing granted or ahead of it:
//! the run of shared requests at the head is granted together.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::claim::claim_sql;
use super::conn::Session;
use super::holders::holder_label;
use super::keys::functions;
use super::limit::{limit_key, other_limit, other_limit_sql};
use super::token::{lock_with_token_sql, mine_sql, Granted};
use super::wait::{backstop, lock_timeout_sql};
use super::PgBackend;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::lock::{limit_mismatch, AcquireRequest, Cancel};
use crate::logging::HANDOFF;
use crate::wording::not_acquired;

impl PgBackend {
    /// `--limit 1`: the server's lock queue. Returns the token and when its request was sent.
    pub(super) async fn acquire_single(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        key: i64,
        cancel: &mut Cancel,
    ) -> Result<Granted, Error> {
        let client = session.client.clone();
        let other = other_limit_sql(&self.prefix, request.name.as_str(), request.limit);
        let lock_sql = self.single_lock_sql(request, &other);
        let (label, host) = holder_label(&request.holder);
        let lock_params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&key, Type::INT8),
            (&session.marker, Type::TEXT),
            (&label, Type::TEXT),
            (&host, Type::TEXT),
        ];
        let mine_sql = mine_sql(&request.holder);
        let mine_params: [(&(dyn ToSql + Sync), Type); 1] = [(&session.marker, Type::TEXT)];
        let sent = BootInstant::now();
        // The lock call goes out at the first poll below: in the server's queue from then on.
        crate::lock::queued(request);
        // Each answer is marked as it arrives (the hand-off events, `logging::HANDOFF`); the
        // wrappers put their request on the wire at their first poll, as the bare calls do.
        let lock = async {
            let answer = client.query_typed(&lock_sql, &lock_params).await;
            tracing::debug!(target: HANDOFF, "granted");
            answer
        };
        let token = async {
            let answer = client.query_typed(&mine_sql, &mine_params).await;
            tracing::debug!(target: HANDOFF, "token-written");
            answer
        };
        // Both requests go out at once, in the order `join` first polls them: the lock call,
        // which takes the token as the lock is granted, then the check that a second
        // statement runs on our session too, which the server runs right after.
        let work = async { tokio::join!(lock, token) };
        tokio::pin!(work);
        let backstop = backstop(&request.budget);
        tokio::pin!(backstop);
        let mut ended = session.ended.clone();
        // Biased, work first: its first poll puts the requests on the wire, so a cancel that
        // is already set finds something to cancel on the server.
        let (lock, token) = tokio::select! {
            biased;
            done = &mut work => done,
            () = cancel.cancelled() => {
                return Err(self.abandon(session, work.as_mut(), (key, request.mode), Error::Cancelled).await);
            }
            () = &mut backstop => {
                let busy = not_acquired(&request.name, "is held", request.budget.wait());
                return Err(self.abandon(session, work.as_mut(), (key, request.mode), busy).await);
            }
            _ = ended.wait_for(Option::is_some) => {
                return Err(self.lost_while_waiting(session));
            }
        };
        self.read_single(session, request, key, lock, token, sent)
            .await
    }

    /// The lock statement.
    fn single_lock_sql(&self, request: &AcquireRequest, other: &str) -> String {
        let name = request.name.as_str();
        let functions = functions(request.mode);
        // One statement claims the session and takes the lock, so both happen on the same
        // server session; the waiter's metadata rides along, so `status` can list the queue.
        // First (the subquery) it records our --limit and looks for holders with another one,
        // and only then, if there are none, sets what is left of --wait as the server's lock
        // wait limit and takes (or queues for) the lock, in our mode.
        // Once it has the lock, the outer query takes the token ([`lock_with_token_sql`]).
        let (lock, granted) = if request.budget.is_no_wait() {
            (
                format!("{}($1)", functions.try_lock),
                "coalesce(g.locked, false)",
            )
        } else {
            (
                format!("{}($1)::text", functions.lock),
                "g.locked IS NOT NULL",
            )
        };
        let statement = format!(
            "SELECT {}, o.other, {}, CASE WHEN o.other IS NULL THEN {lock} END AS locked \
             FROM (SELECT {other} AS other, pg_advisory_lock_shared({})::text AS mark OFFSET 0) o",
            claim_sql("$2"),
            lock_timeout_sql(&request.budget),
            limit_key(&self.prefix, name, request.limit),
        );
        lock_with_token_sql(&request.holder, &statement, granted, other)
    }

    /// Read the answers of the lock call and the token statement.
    async fn read_single(
        &self,
        session: &Session,
        request: &AcquireRequest,
        key: i64,
        lock: Result<Vec<Row>, tokio_postgres::Error>,
        token: Result<Vec<Row>, tokio_postgres::Error>,
        sent: BootInstant,
    ) -> Result<Granted, Error> {
        let client = &session.client;
        let try_only = request.budget.is_no_wait();
        let rows = match lock {
            Ok(rows) => rows,
            Err(e) => return Err(self.busy_or(&e, request, session).await),
        };
        let row = rows.first();
        let theirs = other_limit(row, 2);
        // pg_advisory_lock(_shared) returns void (as '' here): an answer is a grant.
        let granted = theirs.is_none()
            && if try_only {
                row.and_then(|r| r.try_get::<_, Option<bool>>(4).ok())
                    .flatten()
                    .unwrap_or(false)
            } else {
                row.and_then(|r| r.try_get::<_, Option<String>>(4).ok())
                    .flatten()
                    .is_some()
            };
        let taken = granted.then_some((key, request.mode));
        self.check_claim(&rows, client, taken, &session.marker)
            .await?;
        if let Some(theirs) = theirs {
            return Err(limit_mismatch(&request.name, theirs));
        }
        if !granted {
            let state = self.describe_holders(session, &request.name).await;
            return Err(not_acquired(&request.name, &state, request.budget.wait()));
        }
        let Some(row) = row else {
            return Err(Error::Internal("the lock statement returned no row".into()));
        };
        let token = self
            .check_token_after_lock(
                row,
                token,
                client,
                (key, request.mode),
                &session.marker,
                &request.name,
            )
            .await?;
        Ok(Granted { token, sent })
    }
}
