//! The fencing token, and the checks of the statement that reads it: the token is the
//! server's clock in microseconds, times 1000, plus the transaction id the grant's
//! statement runs in (see [`TOKEN`]); the same statement refuses a standby, a pooler that
//! dropped our session settings or spread our statements over several server sessions, and
//! a holder with another `--limit`.

use tokio_postgres::Client;

use super::claim::give_back;
use super::conn::classify;
use super::holders::metadata_comment;
use super::limit::{other_limit, other_limit_sql};
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

/// The label's start of the hold: the grant's time on the server's clock, in whole seconds
/// since the epoch (the label is written as the lock is granted, whatever the wait before).
const GRANTED_AT: &str = "floor(extract(epoch FROM clock_timestamp()))::int8::text";

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
         left($1 || {GRANTED_AT} || ' t' || coalesce(t.token::text, '0') || $2, {MAX_APPLICATION_NAME}), false), \
         {other_limit} \
         FROM (SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE {TOKEN} END AS token OFFSET 0) t",
        metadata_comment(holder)
    )
}

/// The lock statement of `--limit 1`, wrapped so that the token statement's work is done as
/// the grant comes, in the same statement (see [`token_sql`] for what each item checks):
/// `lock_statement` selects whether the session is ours, the other `--limit` seen before the
/// wait, the lock timeout, the lock call as `locked` and whether it must look for another
/// `--limit` before locking (`look`); `granted` says, of its row `g`, whether the lock was
/// taken. `other_limit` and `look` are the same two checks after the grant (an int4 and a
/// boolean: see [`super::limit`]). The server plans all of it before the wait, and after the
/// grant it only evaluates the outer items, so no statement has to be parsed and planned
/// between the grant and the answer, and none follows it: that our statements run on one
/// server session was checked before the lock call (see [`super::single`]).
/// `holder`'s metadata comes first; `$3` and `$4` are the label's parts ([`super::holders::holder_label`]).
pub(super) fn lock_with_token_sql(
    holder: &Holder,
    lock_statement: &str,
    granted: &str,
    (other_limit, look): (&str, &str),
) -> String {
    // Each level is fenced (OFFSET 0), so the lock call has returned before the token (t)
    // is computed, once, for the answer and the label alike. The holder's metadata comes
    // first, as in every statement `status` reads it from.
    format!(
        "{} SELECT t.*, \
         CASE WHEN t.granted THEN coalesce(current_setting('dlock.session', true), '') = 'on' END, \
         CASE WHEN t.granted THEN set_config('application_name', \
         left($3 || {GRANTED_AT} || ' t' || coalesce(t.token::text, '0') || $4, {MAX_APPLICATION_NAME}), false) END, \
         CASE WHEN t.granted THEN {other_limit} END, \
         CASE WHEN t.granted THEN {look} END \
         FROM (SELECT g.*, {granted} AS granted, \
         CASE WHEN {granted} THEN pg_is_in_recovery() END AS standby, \
         CASE WHEN {granted} AND NOT pg_is_in_recovery() THEN {TOKEN} END AS token \
         FROM ({lock_statement} OFFSET 0) g OFFSET 0) t",
        metadata_comment(holder)
    )
}

/// The columns the lock statement given to [`lock_with_token_sql`] selects, in this order;
/// the wrapper's own columns follow them.
pub(super) mod lock_column {
    /// Whether the session carries our mark (boolean).
    pub(in crate::backend::postgres) const MINE: usize = 0;
    /// The other `--limit` seen before the wait (int4, NULL: none).
    pub(in crate::backend::postgres) const OTHER: usize = 1;
    /// The lock call: '' (blocking) or true (trying) when taken, NULL otherwise. Column 2,
    /// between it and `OTHER`, sets the lock timeout.
    pub(in crate::backend::postgres) const LOCKED: usize = 3;
    /// Whether to look for another `--limit` first (boolean; then nothing was locked).
    pub(in crate::backend::postgres) const LOOK: usize = 4;
    /// How many there are.
    pub(super) const COUNT: usize = 5;
}

/// The columns of [`lock_with_token_sql`]'s row after the lock statement's own: `granted`,
/// `standby`, `token`, the settings check, the label, `other_limit`, `look`.
pub(super) const AFTER_LOCK: TokenColumns = TokenColumns {
    standby: lock_column::COUNT + 1,
    token: lock_column::COUNT + 2,
    settings_arrived: lock_column::COUNT + 3,
    other_limit: lock_column::COUNT + 5,
    look: Some(lock_column::COUNT + 6),
};

/// The columns of [`token_sql`]'s row.
const TOKEN_STATEMENT: TokenColumns = TokenColumns {
    standby: 0,
    token: 1,
    settings_arrived: 3,
    other_limit: 5,
    look: None,
};

/// Where a row keeps what the checks of a grant read.
pub(super) struct TokenColumns {
    standby: usize,
    token: usize,
    settings_arrived: usize,
    other_limit: usize,
    /// Whether the other `--limit` is still to be looked for (NULL or absent: no).
    look: Option<usize>,
}

/// What the checks of a grant read: the row with the token, and whether a statement after
/// the lock statement still ran on our session.
struct Read {
    standby: bool,
    settings_arrived: bool,
    mine: bool,
    other_limit: Option<u32>,
    look: bool,
    token: Option<i64>,
}

impl Read {
    fn of(row: &tokio_postgres::Row, columns: &TokenColumns, mine: bool) -> Read {
        Read {
            standby: row.try_get(columns.standby).unwrap_or(false),
            settings_arrived: row.try_get(columns.settings_arrived).unwrap_or(false),
            mine,
            other_limit: other_limit(Some(row), columns.other_limit),
            look: columns
                .look
                .and_then(|column| row.try_get::<_, Option<bool>>(column).ok())
                .flatten()
                .unwrap_or(false),
            token: row.try_get(columns.token).unwrap_or(None),
        }
    }
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
        let mine: bool = row.try_get(2).unwrap_or(false);
        let read = Read::of(row, &TOKEN_STATEMENT, mine);
        self.check_grant(read, client, (key, mode), marker, name)
            .await
    }

    /// Read the token from the row of [`lock_with_token_sql`] that granted `key` in `mode`
    /// (on our own session: the lock statement checked): a standby or a pooler is refused
    /// (and the key given back).
    pub(super) async fn check_token_after_lock(
        &self,
        row: &tokio_postgres::Row,
        client: &Client,
        (key, mode): (i64, Mode),
        marker: &str,
        name: &LockName,
    ) -> Result<u64, Error> {
        let read = Read::of(row, &AFTER_LOCK, true);
        self.check_grant(read, client, (key, mode), marker, name)
            .await
    }

    /// The checks of a grant, in order: a standby, a pooler that dropped our settings or
    /// spreads our statements, a holder with another `--limit`; then the token.
    async fn check_grant(
        &self,
        read: Read,
        client: &Client,
        (key, mode): (i64, Mode),
        marker: &str,
        name: &LockName,
    ) -> Result<u64, Error> {
        let refuse = |message: String| async move {
            give_back(client, key, mode, marker).await;
            Err(Error::Config(message))
        };
        if read.standby {
            return refuse(format!(
                "{} is a hot standby (pg_is_in_recovery() is true); locks must be taken on the primary",
                self.display
            ))
            .await;
        }
        if !read.settings_arrived {
            return refuse(format!(
                "dlock's session settings (keepalives, timeouts) did not reach the server behind {}: a connection pooler that drops start-up options (pgbouncer ignore_startup_parameters = options?); use a direct connection",
                self.display
            ))
            .await;
        }
        if !read.mine {
            give_back(client, key, mode, marker).await;
            return Err(self.spread_over_sessions());
        }
        // Read after our own --limit was recorded and the lock granted: of two holders that
        // disagree, at least one sees the other. The others' key was held: look.
        let other_limit = if read.look {
            match self.other_limit_now(client, name).await {
                Ok(theirs) => theirs,
                Err(error) => {
                    give_back(client, key, mode, marker).await;
                    return Err(error);
                }
            }
        } else {
            read.other_limit
        };
        if let Some(theirs) = other_limit {
            give_back(client, key, mode, marker).await;
            return Err(limit_mismatch(name, theirs));
        }
        read.token
            .and_then(|t| u64::try_from(t).ok())
            .ok_or_else(|| Error::Internal("the server gave no transaction id".into()))
    }

    /// The error for statements that ran on different server sessions.
    pub(super) fn spread_over_sessions(&self) -> Error {
        Error::Config(format!(
            "dlock's statements to {} ran on different server sessions: the connection goes through a transaction-pooling proxy (pgbouncer pool_mode=transaction?); use a direct or session-pooled connection",
            self.display
        ))
    }

    /// The other `--limit` a holder of `name` records, read now, by a `--limit 1` run
    /// ([`other_limit_sql`]).
    async fn other_limit_now(
        &self,
        client: &Client,
        name: &LockName,
    ) -> Result<Option<u32>, Error> {
        let sql = format!("SELECT {}", other_limit_sql(&self.prefix, name.as_str(), 1));
        let rows = client
            .query_typed(&sql, &[])
            .await
            .map_err(|e| classify(&e, &self.display))?;
        Ok(other_limit(rows.first(), 0))
    }
}
