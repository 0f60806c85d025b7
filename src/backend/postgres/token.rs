//! The fencing token, and the checks of the statement that reads it: the token is the
//! transaction id the grant's statement runs in (`txid_current()`, which only grows), made
//! durable before the reply; the same statement refuses a standby, a pooler that dropped our
//! session settings or spread our statements over several server sessions, and a holder
//! with another `--limit`.

use tokio_postgres::Client;

use super::claim::give_back;
use super::conn::classify;
use super::holders::metadata_comment;
use super::limit::other_limit;
use super::{PgBackend, MAX_APPLICATION_NAME};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::lock::{limit_mismatch, Holder, LockName};

/// A grant: the token, and when the request that took it was sent (the server ran the token
/// statement after that, and ends the session no sooner than `ttl` after it went idle).
pub(super) struct Granted {
    pub(super) token: u64,
    pub(super) sent: BootInstant,
}

/// The statement run right after a grant: standby?, fencing token, is it still our session
/// (the mark set by the lock statement: statements that a pooler spreads over several server
/// sessions do not all see it), the session's label (`application_name`), and `other_limit`
/// (a holder that records another `--limit`; see
/// [`other_limit_sql`](super::limit::other_limit_sql)). The holder's metadata rides along as
/// a comment, first, so `status` can read it from
/// `pg_stat_activity.query` where the role may see it (the server keeps only the first
/// `track_activity_query_size` bytes, 1024 by default).
///
/// The token is the transaction's XID, and it must survive a crash: PostgreSQL flushes a
/// commit at once only when the transaction wrote WAL, and an XID whose commit never reached
/// the disk is handed out again after a crash. A (transactional, empty) logical message is
/// the cheapest WAL record any role may write, so with `synchronous_commit=on` the reply
/// comes only after the XID is on disk.
pub(super) fn token_sql(holder: &Holder, other_limit: &str) -> String {
    format!(
        "{} SELECT pg_is_in_recovery(), \
         CASE WHEN pg_is_in_recovery() THEN NULL ELSE txid_current() END, \
         coalesce(current_setting('dlock.owner', true), '') = $3, \
         coalesce(current_setting('dlock.session', true), '') = 'on', \
         set_config('application_name', \
         left($1 || coalesce(txid_current_if_assigned()::text, '0') || $2, {MAX_APPLICATION_NAME}), false), \
         CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_logical_emit_message(true, 'dlock', '') END, \
         {other_limit}",
        metadata_comment(holder)
    )
}

impl PgBackend {
    /// Read the token statement's answer: a standby or a pooler is refused.
    pub(super) async fn check_token(
        &self,
        token: Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
        client: &Client,
        key: i64,
        marker: &str,
        name: &LockName,
    ) -> Result<u64, Error> {
        let rows = match token {
            Ok(rows) => rows,
            Err(e) => {
                // Granted but unusable (e.g. the role may not write the token's WAL record).
                give_back(client, key, marker).await;
                return Err(classify(&e, &self.display));
            }
        };
        let row = rows
            .first()
            .ok_or_else(|| Error::Internal("the token statement returned no row".into()))?;
        let standby: bool = row.try_get(0).unwrap_or(false);
        let mine: bool = row.try_get(2).unwrap_or(false);
        let settings_arrived: bool = row.try_get(3).unwrap_or(false);
        let refuse = |message: String| async move {
            give_back(client, key, marker).await;
            Err(Error::Config(message))
        };
        if standby {
            return refuse(format!(
                "{} is a hot standby (pg_is_in_recovery() is true); locks must be taken on the primary",
                self.display
            ))
            .await;
        }
        if !settings_arrived {
            return refuse(format!(
                "dlock's session settings (keepalives, timeouts) did not reach the server behind {}: a connection pooler that drops start-up options (pgbouncer ignore_startup_parameters = options?); use a direct connection",
                self.display
            ))
            .await;
        }
        if !mine {
            return refuse(format!(
                "the lock taken on {} does not show up for our own session: the connection goes through a transaction-pooling proxy (pgbouncer pool_mode=transaction?); use a direct or session-pooled connection",
                self.display
            ))
            .await;
        }
        // Read after our own --limit was recorded and the lock granted: of two holders that
        // disagree, at least one sees the other.
        if let Some(theirs) = other_limit(Some(row), 6) {
            give_back(client, key, marker).await;
            return Err(limit_mismatch(name, theirs));
        }
        let token: Option<i64> = row.try_get(1).unwrap_or(None);
        token
            .and_then(|t| u64::try_from(t).ok())
            .ok_or_else(|| Error::Internal("the server gave no transaction id".into()))
    }
}
