//! The statements of an acquisition, written so that one round trip does everything on the
//! uncontended path: the session settings (first time only), the `--limit` check, the
//! `GET_LOCK` call, and, only if it granted, the fencing token bump and the holder's row in
//! a transaction, then one `SELECT` that reports it all. The transaction's `COMMIT` is not
//! part of that round trip ([`grant_tail`]): it goes out with the session's next statement,
//! which the lease sends at once, while the command starts; no reply waits for InnoDB's
//! flush of the commit.
//!
//! The table, `dlock_locks`, has one row per lock name (its fencing counter, and the holder
//! of slot 0) and one per further slot of a `--limit N` lock. A row names its holder by
//! connection id; it is believed only while `IS_USED_LOCK(lock_key)` says that connection
//! holds the key, so rows of past holders are harmless and never need deleting.
//!
//! Texts go in as hex literals (`X'…'`), which no `sql_mode` can misread.

use std::time::Duration;

use super::keys::quoted;
use crate::lock::Holder;

/// The table's definition (created on first use, when the role may).
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_locks (\
     lock_key CHAR(46) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
     name_key CHAR(46) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
     token BIGINT UNSIGNED NOT NULL DEFAULT 0, \
     conn_id BIGINT UNSIGNED NOT NULL DEFAULT 0, \
     lim INT NOT NULL DEFAULT 0, \
     held_token BIGINT UNSIGNED NOT NULL DEFAULT 0, \
     holder TEXT CHARACTER SET utf8mb4, \
     KEY dlock_locks_name (name_key)) ENGINE=InnoDB";

/// Session settings, sent with the first statement: the server ends a session that sent
/// nothing for `ttl` (and so frees a silent holder's lock); whole seconds, at least 1.
pub fn settings_sql(ttl: Duration) -> String {
    let seconds = server_seconds(ttl);
    format!(
        "SET SESSION wait_timeout = {seconds}, interactive_timeout = {seconds}, autocommit = 1; "
    )
}

/// The TTL as the server keeps it (`wait_timeout` counts whole seconds): what the lease
/// arithmetic must use.
pub fn server_seconds(ttl: Duration) -> u64 {
    ttl.as_secs().clamp(1, 31_536_000)
}

/// `X'…'` as a utf8mb4 string.
pub fn text(value: &str) -> String {
    let mut hex = String::with_capacity(value.len() * 2 + 32);
    hex.push_str("CONVERT(X'");
    for byte in value.bytes() {
        hex.push_str(&format!("{byte:02X}"));
    }
    hex.push_str("' USING utf8mb4)");
    hex
}

/// A `SET` of `@dlock_other` to the smallest `--limit` other than `limit` that another live
/// holder of the name (`name_key`) records, or NULL.
pub fn other_limit_sql(name_key: &str, limit: u32) -> String {
    format!(
        "SET @dlock_other = (SELECT MIN(lim) FROM dlock_locks WHERE name_key = {nk} \
         AND lim <> {limit} AND lim > 0 AND conn_id <> CONNECTION_ID() \
         AND IS_USED_LOCK(lock_key) = conn_id); ",
        nk = quoted(name_key)
    )
}

/// The floor of every fencing token: the server's clock, in microseconds since the epoch
/// (UTC, so no time zone or daylight saving change moves it). `GET_LOCK` names are
/// server-wide but `dlock_locks` lives in one database: two databases on one server, or a
/// table that was emptied or recreated, would start their counters again at 1. And the
/// counter's latest bumps may not be on disk: the reply does not wait for the commit, and a
/// crash loses what was not flushed (so does any crash with `innodb_flush_log_at_trx_commit`
/// 0 or 2). With the floor, a grant's token exceeds every earlier grant's of the lock on
/// that server, whatever table counted it and whatever a crash lost, as long as the
/// server's clock does not step back by more than the time between two grants of the lock
/// (they are at least a round trip apart, and a crash's restart lies between the last
/// token before it and the first after).
pub const TOKEN_FLOOR: &str =
    "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS UNSIGNED)";

/// The server's time now, as [`Holder::since`] is written (RFC 3339 UTC, whole seconds).
const GRANTED_AT: &str = "DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%dT%H:%i:%sZ')";

/// The statements after the lock call, which has set `@dlock_granted` (1: ours now) and
/// `@dlock_slot` (the slot index): in one transaction, the name's counter is bumped with
/// `LAST_INSERT_ID(GREATEST(token + 1, floor))` (so `LAST_INSERT_ID()` returns it to this
/// session; the floor is [`TOKEN_FLOOR`]), and the
/// slot's row records us; nothing is written unless the lock was granted and the server is
/// writable. A granted session also takes its session key (`keys::session_key`, for the
/// lease's watcher). Then the report row (see [`Report`](super::acquire::Report)). The
/// transaction stays open: [`grant_tail`] ends it.
///
/// Every grant of a name bumps the name's counter row, so a grant's transaction waits for
/// the previous grant's commit before it writes: the report's `--limit` check (a plain
/// read, after our writes) sees every holder that was granted before us, committed; of two
/// holders that disagree, the later one sees the earlier.
pub fn grant_sql(
    name_key: &str,
    slots: &[String],
    limit: u32,
    holder: &Holder,
    session_key: &str,
) -> String {
    let nk = quoted(name_key);
    let sk = quoted(session_key);
    let slot_key = slot_expression(slots);
    let json = serde_json::to_string(holder).unwrap_or_default();
    // `since` is the grant's time on the server's clock, not when the run started waiting.
    let holder = format!("JSON_SET({}, '$.since', {GRANTED_AT})", text(&json));
    let when = "WHERE @dlock_granted = 1 AND @@global.read_only = 0";
    format!(
        "START TRANSACTION; \
         INSERT INTO dlock_locks (lock_key, name_key, token) SELECT {nk}, {nk}, LAST_INSERT_ID({TOKEN_FLOOR}) \
         FROM DUAL {when} ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, {TOKEN_FLOOR})); \
         INSERT INTO dlock_locks (lock_key, name_key, conn_id, lim, held_token, holder) \
         SELECT {slot_key}, {nk}, CONNECTION_ID(), {limit}, LAST_INSERT_ID(), {holder} FROM DUAL {when} \
         ON DUPLICATE KEY UPDATE conn_id = CONNECTION_ID(), lim = {limit}, \
         held_token = LAST_INSERT_ID(), holder = {holder}; \
         DO IF(@dlock_granted = 1, GET_LOCK({sk}, 0), 0); \
         SELECT @dlock_granted, IF(@dlock_granted = 1, LAST_INSERT_ID(), 0), @@global.read_only, \
         CONNECTION_ID(), @dlock_other, \
         (SELECT MIN(lim) FROM dlock_locks WHERE name_key = {nk} AND lim <> {limit} AND lim > 0 \
         AND conn_id <> CONNECTION_ID() AND IS_USED_LOCK(lock_key) = conn_id), @dlock_slot"
    )
}

/// What ends [`grant_sql`]'s transaction, sent before the session's next statement: the
/// `COMMIT`, then leaving the turnstile (`--limit N`; after the commit, so that a failed
/// transaction is retried from the head of the queue).
pub fn grant_tail(turnstile: Option<&str>) -> String {
    match turnstile {
        Some(t) => format!(
            "COMMIT; DO IF(@dlock_granted = 1, RELEASE_LOCK({}), 0); ",
            quoted(t)
        ),
        None => "COMMIT; ".into(),
    }
}

/// `--min-hold`'s finish: rewrite the holder's metadata in its slot's row (`lock_key`) only
/// while the row and the lock are still ours (our connection, our token, and `IS_USED_LOCK`
/// says our connection holds the key); then the number of rows written (0 or 1: the
/// metadata always changes, it gains `kept_until`).
pub fn finished_sql(lock_key: &str, token: u64, holder: &Holder) -> String {
    let json = serde_json::to_string(holder).unwrap_or_default();
    format!(
        "UPDATE dlock_locks SET holder = {} WHERE lock_key = {key} AND conn_id = CONNECTION_ID() \
         AND held_token = {token} AND IS_USED_LOCK({key}) = CONNECTION_ID(); SELECT ROW_COUNT()",
        text(&json),
        key = quoted(lock_key)
    )
}

/// `GET_LOCK` waits in the server for at most `wait` (fractional seconds: MariaDB honours
/// them; MySQL rounds down, and a 0 there only means one more short round).
pub fn lock_timeout(wait: Duration) -> String {
    format!("{:.3}", wait.as_secs_f64())
}

/// The lock call of `--limit 1`: `GET_LOCK(key, wait)` unless another `--limit` holds.
pub fn single_lock_sql(key: &str, wait: Duration) -> String {
    format!(
        "SET @dlock_slot = 0; SET @dlock_granted = IF(@dlock_other IS NULL, \
         GET_LOCK({}, {}), 0); ",
        quoted(key),
        lock_timeout(wait)
    )
}

/// The slot call of `--limit N`: the first free slot, in slot order (`CASE` stops at the
/// first true condition), unless another `--limit` holds.
pub fn slot_lock_sql(slots: &[String]) -> String {
    let mut case = String::from("CASE");
    for (i, slot) in slots.iter().enumerate() {
        case.push_str(&format!(" WHEN GET_LOCK({}, 0) = 1 THEN {i}", quoted(slot)));
    }
    case.push_str(" END");
    format!(
        "SET @dlock_slot = IF(@dlock_other IS NULL, {case}, NULL); \
         SET @dlock_granted = IF(@dlock_slot IS NULL, 0, 1); "
    )
}

/// The key of the slot `@dlock_slot` names.
fn slot_expression(slots: &[String]) -> String {
    if slots.len() == 1 {
        quoted(&slots[0])
    } else {
        let list: Vec<String> = slots.iter().map(|k| quoted(k)).collect();
        format!("ELT(@dlock_slot + 1, {})", list.join(", "))
    }
}

/// After a failed grant transaction: roll back and give back the slot it took (and only
/// that: the turnstile stays ours).
pub fn undo_slot_sql(slots: &[String]) -> String {
    format!(
        "ROLLBACK; DO IF(@dlock_granted = 1, RELEASE_LOCK({}), 0); SET @dlock_granted = 0",
        slot_expression(slots)
    )
}

/// The turnstile call of `--limit N`: queue for the head of the line.
pub fn turnstile_sql(turnstile: &str, wait: Duration) -> String {
    format!(
        "SET @dlock_turn = IF(@dlock_other IS NULL, GET_LOCK({}, {}), 0); \
         SELECT @dlock_turn, @dlock_other",
        quoted(turnstile),
        lock_timeout(wait)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_hex_and_settings_whole_seconds() {
        assert_eq!(text("a'b"), "CONVERT(X'612762' USING utf8mb4)");
        assert_eq!(server_seconds(Duration::from_millis(3500)), 3);
        assert!(settings_sql(Duration::from_secs(10)).contains("wait_timeout = 10,"));
        assert_eq!(lock_timeout(Duration::from_millis(300)), "0.300");
        let slots = slot_lock_sql(&["dlock:a".into(), "dlock:b".into()]);
        assert!(
            slots.contains("CASE WHEN GET_LOCK('dlock:a', 0) = 1 THEN 0 WHEN GET_LOCK('dlock:b', 0) = 1 THEN 1 END"),
            "{slots}"
        );
    }
}
