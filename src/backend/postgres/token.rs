//! The fencing token, and the checks of the statement that reads it: the token is the
//! server's clock in microseconds, times 1000, plus the transaction id the grant's
//! statement runs in (see [`TOKEN`]); the same statement refuses a standby, a pooler that
//! dropped our session settings or spread our statements over several server sessions, and
//! a holder with another `--limit`.

use tokio_postgres::Client;

use super::claim::give_back;
use super::conn::classify;
use super::holders::metadata_comment;
use super::limit::other_limit;
use super::{PgBackend, MAX_APPLICATION_NAME};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::lock::{limit_mismatch, Holder, LockName, Mode};

/// A grant: the token, and when the request that took it was sent (the server ran the token
/// statement after that, and ends the session no sooner than `ttl` after it went idle).
pub(super) struct Granted {
    pub(super) token: u64,
    pub(super) sent: BootInstant,
}

/// The fencing token, in SQL: the server's clock in microseconds since the epoch, times
/// 1000, plus the transaction id (`txid_current()`, 64 bits with the epoch, which only
/// grows while the server runs).
///
/// Nothing of it waits for the disk: the transaction writes no WAL of its own, so its commit
/// is not flushed before the reply (and the session runs with `synchronous_commit=off`). A
/// crash can therefore lose the last transaction ids, which the server then hands out again;
/// the clock keeps the tokens increasing all the same. Of two grants of one lock, the later
/// one's statement runs after the earlier one's has ended, so it reads a later (or equal)
/// clock and a larger transaction id; across a crash, the restart takes far longer than the
/// microseconds that the lost ids could be worth (a server hands out nowhere near 1000
/// transaction ids per microsecond). What this rests on: the server's clock never steps back
/// by more than the time between two grants of one lock (a crash and restart included).
/// Until the year 2262 the token fits in 63 bits.
pub(super) const TOKEN: &str =
    "floor(extract(epoch FROM clock_timestamp()) * 1000000)::int8 * 1000 + txid_current()";

/// The statement run right after a grant: standby?, fencing token ([`TOKEN`]), is it still
/// our session (the mark set by the lock statement: statements that a pooler spreads over
/// several server sessions do not all see it), the session's label (`application_name`),
/// and `other_limit` (a holder that records another `--limit`; see
/// [`other_limit_sql`](super::limit::other_limit_sql)). The holder's metadata rides along as
/// a comment, first, so `status` can read it from
/// `pg_stat_activity.query` where the role may see it (the server keeps only the first
/// `track_activity_query_size` bytes, 1024 by default).
pub(super) fn token_sql(holder: &Holder, other_limit: &str) -> String {
    // The token is computed once (the subquery), for the answer and the label alike.
    format!(
        "{} SELECT pg_is_in_recovery(), t.token, \
         coalesce(current_setting('dlock.owner', true), '') = $3, \
         coalesce(current_setting('dlock.session', true), '') = 'on', \
         set_config('application_name', \
         left($1 || coalesce(t.token::text, '0') || $2, {MAX_APPLICATION_NAME}), false), \
         {other_limit} \
         FROM (SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE {TOKEN} END AS token OFFSET 0) t",
        metadata_comment(holder)
    )
}

impl PgBackend {
    /// Read the token statement's answer: a standby or a pooler is refused (and `key`, held
    /// in `mode`, given back).
    pub(super) async fn check_token(
        &self,
        token: Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
        client: &Client,
        (key, mode): (i64, Mode),
        marker: &str,
        name: &LockName,
    ) -> Result<u64, Error> {
        let rows = match token {
            Ok(rows) => rows,
            Err(e) => {
                // Granted but unusable (the statement failed).
                give_back(client, key, mode, marker).await;
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
            give_back(client, key, mode, marker).await;
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
        if let Some(theirs) = other_limit(Some(row), 5) {
            give_back(client, key, mode, marker).await;
            return Err(limit_mismatch(name, theirs));
        }
        let token: Option<i64> = row.try_get(1).unwrap_or(None);
        token
            .and_then(|t| u64::try_from(t).ok())
            .ok_or_else(|| Error::Internal("the server gave no transaction id".into()))
    }
}
