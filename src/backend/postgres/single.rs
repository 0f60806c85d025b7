//! `--limit 1`: the server's own FIFO lock queue. One pipelined round trip after connecting:
//! the statement that claims the session (marks it as ours), then the lock call, which takes
//! the lock only where it finds our mark (statements that a transaction-pooling proxy
//! spreads over several server sessions do not), records our `--limit` and, as the grant
//! comes, takes the token (`token::lock_with_token_sql`). Nothing is left to ask after the
//! grant.
//!
//! Whether a holder records another `--limit` is first asked cheaply, by trying the name's
//! others' key ([`super::limit::must_look_sql`]); only when somebody holds that key does the
//! run read `pg_locks`: before the lock call, by the lock statement that scans (a second
//! round trip), and after a grant, by a statement of its own.
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

use super::claim::{claim_statement, give_back, mine_sql};
use super::conn::classify;
use super::conn::Session;
use super::holders::holder_label;
use super::keys::functions;
use super::limit::{limit_key, must_look_sql, other_limit, other_limit_sql};
use super::token::{lock_column, lock_with_token_sql, Granted};
use super::wait::{backstop, lock_timeout_sql};
use super::PgBackend;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::lock::{limit_mismatch, AcquireRequest, Cancel};
use crate::logging::HANDOFF;
use crate::wording::not_acquired;

/// How a lock statement looks for a holder that records another `--limit` (see
/// [`super::limit`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Try the others' key: when it is held, take nothing and say so.
    Probe,
    /// Read `pg_locks`, before the lock call and after the grant (after a probe, which
    /// recorded our `--limit` already).
    Scan,
}

impl PgBackend {
    /// `--limit 1`: the server's lock queue. Returns the token and when its request was sent.
    pub(super) async fn acquire_single(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        key: i64,
        cancel: &mut Cancel,
    ) -> Result<Granted, Error> {
        let probed = self
            .lock_single(session, request, key, cancel, Look::Probe)
            .await?;
        if let Some(granted) = probed {
            return Ok(granted);
        }
        // Somebody holds the others' key (a run with another --limit, or a --limit 1 run
        // trying it at the same instant): the statement that reads pg_locks. Our host's next
        // waiter may already be on its way to the server; it is at least a connection behind.
        self.lock_single(session, request, key, cancel, Look::Scan)
            .await?
            .ok_or_else(|| Error::Internal("the lock statement that scans did not lock".into()))
    }

    /// One lock statement (after the claim of the session): the grant, or `None` when the
    /// probe said to look for another `--limit` first (nothing but our `--limit` was taken).
    async fn lock_single(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        key: i64,
        cancel: &mut Cancel,
        look: Look,
    ) -> Result<Option<Granted>, Error> {
        let client = session.client.clone();
        let claim_sql = claim_statement();
        let claim_params: [(&(dyn ToSql + Sync), Type); 1] = [(&session.marker, Type::TEXT)];
        let lock_sql = self.single_lock_sql(request, look);
        let (label, host) = holder_label(&request.holder);
        let lock_params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&key, Type::INT8),
            (&session.marker, Type::TEXT),
            (&label, Type::TEXT),
            (&host, Type::TEXT),
        ];
        let sent = BootInstant::now();
        // The lock call goes out at the first poll below: in the server's queue from then on.
        crate::lock::queued(request);
        // The grant is marked as it arrives (the hand-off events, `logging::HANDOFF`); the
        // wrapper puts its request on the wire at its first poll, as the bare call does.
        let claim = client.query_typed(&claim_sql, &claim_params);
        let lock = async {
            let answer = client.query_typed(&lock_sql, &lock_params).await;
            tracing::debug!(target: HANDOFF, "granted");
            answer
        };
        // Both requests go out at once, in the order `join` first polls them: the claim,
        // then the lock call, which finds the claim's mark on its session.
        let work = async { tokio::join!(claim, lock) };
        tokio::pin!(work);
        let backstop = backstop(&request.budget);
        tokio::pin!(backstop);
        let mut ended = session.ended.clone();
        // Biased, work first: its first poll puts the requests on the wire, so a cancel that
        // is already set finds something to cancel on the server.
        let (claim, lock) = tokio::select! {
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
        self.read_single(session, request, key, claim, lock, sent)
            .await
    }

    /// The lock statement, which looks for another `--limit` as `look` says.
    fn single_lock_sql(&self, request: &AcquireRequest, look: Look) -> String {
        let name = request.name.as_str();
        let functions = functions(request.mode);
        // The lock statement runs on the session the claim (sent just before) marked, or
        // takes nothing; the waiter's metadata rides along, so `status` can list the queue.
        // First (the subquery) it records our --limit and asks whether a holder records
        // another one, and only then, if none may, sets what is left of --wait as the
        // server's lock wait limit and takes (or queues for) the lock, in our mode.
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
        // The subquery `o`: whether the session carries our mark (the claim's), the other
        // --limit seen before the wait (int4), and whether to look for one first (boolean:
        // then nothing is locked). Nothing is taken on a session that is not ours.
        let mine = format!("SELECT {} AS mine", mine_sql("$2"));
        // `after`: the same two checks once the lock is ours.
        let (checks, after) = match look {
            Look::Probe => {
                let mark = limit_key(&self.prefix, name, request.limit);
                let probe = must_look_sql(&self.prefix, name);
                let checks = format!(
                    "SELECT p.mine, NULL::int4 AS other, \
                     CASE WHEN p.mine THEN {probe} ELSE false END AS look \
                     FROM (SELECT m.mine, CASE WHEN m.mine THEN pg_advisory_lock_shared({mark}) END \
                     FROM ({mine} OFFSET 0) m OFFSET 0) p"
                );
                (checks, ("NULL::int4".to_owned(), probe))
            }
            Look::Scan => {
                let other = other_limit_sql(&self.prefix, name, request.limit);
                let checks = format!(
                    "SELECT m.mine, {other} AS other, false AS look FROM ({mine} OFFSET 0) m"
                );
                (checks, (other, "false".to_owned()))
            }
        };
        let statement = format!(
            "SELECT o.mine, o.other, {}, \
             CASE WHEN o.mine AND o.other IS NULL AND NOT o.look THEN {lock} END AS locked, \
             o.look FROM ({checks} OFFSET 0) o",
            lock_timeout_sql(&request.budget),
        );
        lock_with_token_sql(&request.holder, &statement, granted, (&after.0, &after.1))
    }

    /// Read the answers of the claim and the lock call.
    async fn read_single(
        &self,
        session: &Session,
        request: &AcquireRequest,
        key: i64,
        claim: Result<Vec<Row>, tokio_postgres::Error>,
        lock: Result<Vec<Row>, tokio_postgres::Error>,
        sent: BootInstant,
    ) -> Result<Option<Granted>, Error> {
        let client = &session.client;
        let try_only = request.budget.is_no_wait();
        let rows = match lock {
            Ok(rows) => rows,
            Err(e) => return Err(self.busy_or(&e, request, session).await),
        };
        let row = rows.first();
        let mine = row
            .and_then(|r| r.try_get::<_, Option<bool>>(lock_column::MINE).ok())
            .flatten()
            .unwrap_or(false);
        let theirs = other_limit(row, lock_column::OTHER);
        // pg_advisory_lock(_shared) returns void (as '' here): an answer is a grant.
        let granted = if try_only {
            row.and_then(|r| r.try_get::<_, Option<bool>>(lock_column::LOCKED).ok())
                .flatten()
                .unwrap_or(false)
        } else {
            row.and_then(|r| r.try_get::<_, Option<String>>(lock_column::LOCKED).ok())
                .flatten()
                .is_some()
        };
        let taken = granted.then_some((key, request.mode));
        let claim = match claim {
            Ok(rows) => rows,
            Err(e) => {
                if granted {
                    give_back(client, key, request.mode, &session.marker).await;
                }
                return Err(classify(&e, &self.display));
            }
        };
        self.check_claim(&claim, client, taken, &session.marker)
            .await?;
        if !mine {
            // Claimed on one server session, asked to lock on another: nothing was taken.
            return Err(self.spread_over_sessions());
        }
        if let Some(theirs) = theirs {
            return Err(limit_mismatch(&request.name, theirs));
        }
        let look = row
            .and_then(|r| r.try_get::<_, Option<bool>>(lock_column::LOOK).ok())
            .flatten()
            .unwrap_or(false);
        if look {
            return Ok(None);
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
                client,
                (key, request.mode),
                &session.marker,
                &request.name,
            )
            .await?;
        Ok(Some(Granted { token, sent }))
    }
}
