//! Whose server session is it: the lock statement marks the session as ours (`dlock.owner`)
//! unless another dlock marked it first, which only happens behind a transaction-pooling
//! proxy that shares one server session between clients; such a session is refused, and
//! what an acquisition did on it is given back.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::keys::functions;
use super::{PgBackend, CANCEL_TIMEOUT};
use crate::error::Error;
use crate::lock::Mode;

/// Select-list items that mark the server session as ours (`dlock.owner`, a custom session
/// setting, set to the parameter `marker`) unless another client marked it first, and return
/// the previous mark. A direct connection always starts unmarked. Through a
/// transaction-pooling proxy, a server session still marked by another dlock is shared with
/// it: refused, so the lock is never taken twice on one session.
pub(super) fn claim_sql(marker: &str) -> String {
    format!(
        "coalesce(current_setting('dlock.owner', true), ''), \
         CASE WHEN coalesce(current_setting('dlock.owner', true), '') = '' \
         THEN set_config('dlock.owner', {marker}, false) END"
    )
}

/// The statement that claims the session (`$1`: our marker), sent ahead of a lock statement
/// that takes its lock only where it finds our mark ([`mine_sql`]): both run on one server
/// session, or the lock is not taken.
pub(super) fn claim_statement() -> String {
    format!("SELECT {}", claim_sql("$1"))
}

/// A boolean: is this server session marked as ours (`marker`: the parameter with our
/// marker)? Statements that a transaction-pooling proxy spreads over several server sessions
/// do not all see the mark.
pub(super) fn mine_sql(marker: &str) -> String {
    format!("coalesce(current_setting('dlock.owner', true), '') = {marker}")
}

/// Undo what an acquisition did on a session it must not keep: one unlock of `key` in
/// `mode` (a lock taken again on a shared session only raised its count) and our mark, if it
/// is ours.
pub(super) async fn give_back(client: &Client, key: i64, mode: Mode, marker: &str) {
    let sql = format!(
        "SELECT {}($1), CASE WHEN current_setting('dlock.owner', true) = $2 \
         THEN set_config('dlock.owner', '', false) END",
        functions(mode).unlock
    );
    let _ = tokio::time::timeout(
        CANCEL_TIMEOUT,
        client.query_typed(&sql, &[(&key, Type::INT8), (&marker, Type::TEXT)]),
    )
    .await;
}

impl PgBackend {
    /// Read the claim's answer (the first column of the lock statement): a server session
    /// another dlock marked is shared with it. `taken`: the key the statement took, and how.
    pub(super) async fn check_claim(
        &self,
        rows: &[tokio_postgres::Row],
        client: &Client,
        taken: Option<(i64, Mode)>,
        marker: &str,
    ) -> Result<(), Error> {
        let previous: String = rows
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or_default();
        if previous.is_empty() || previous == marker {
            return Ok(());
        }
        // Taken on a shared session, the lock only had its count raised: one unlock undoes it.
        if let Some((key, mode)) = taken {
            give_back(client, key, mode, marker).await;
        }
        Err(Error::Config(format!(
            "the server session behind {} is shared with another dlock client: the connection goes through a transaction-pooling proxy (pgbouncer pool_mode=transaction?); use a direct or session-pooled connection",
            self.display
        )))
    }
}
