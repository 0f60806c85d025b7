//! The shared `--limit` key: every holder of a name records the `--limit` it holds with, so
//! that a run with another `--limit` is refused ([`crate::lock::limit_mismatch`]) instead of
//! counting slots differently.
//!
//! Whether a holder records another `--limit` is read from `pg_locks` ([`other_limit_sql`]),
//! whose planning costs a new session more than everything else it asks. Runs with
//! `--limit N > 1` also hold the name's [`others_key`] in shared mode, so a run with
//! `--limit 1` (the common case) first tries that key ([`must_look_sql`]): while nobody holds
//! it, no holder can record another `--limit`, and the scan is left out.

use tokio_postgres::Row;

use super::keys::{key, key_with, others_key, turnstile_key};

/// The key a holder of `name` with `--limit limit` holds in shared mode, so that others can
/// see which `--limit` the holders use: the key of `name ‖ "\0limit"` with its low 11 bits
/// replaced by the limit (at most [`MAX_LIMIT`](crate::lock::MAX_LIMIT) < 2048), so SQL can
/// read the limit back.
pub(super) fn limit_key(prefix: &str, name: &str, limit: u32) -> i64 {
    (key_with(prefix, name, b"\0limit") & !LIMIT_MASK) | i64::from(limit) & LIMIT_MASK
}

/// The low bits of a [`limit_key`] that hold the limit.
const LIMIT_MASK: i64 = 2047;

/// The `--limit` that `key` records if it is a [`limit_key`] (any key has these bits).
pub(super) fn recorded_limit(key: i64) -> i64 {
    key & LIMIT_MASK
}

/// A scalar subquery: the smallest `--limit` other than `limit` that another session holding
/// `name` records with its [`limit_key`], or NULL. A session holds `name` when it holds a
/// granted exclusive key other than the turnstile and the [`others_key`] (which a `--limit 1`
/// run takes for an instant when it tries it: one dlock session takes one lock), or the
/// name's key in share mode (`--shared`, which holds with `--limit 1`).
pub(super) fn other_limit_sql(prefix: &str, name: &str, limit: u32) -> String {
    let base = limit_key(prefix, name, 0) as u64;
    let high = base >> 32;
    let low = base & 0xffff_ffff;
    let turnstile = turnstile_key(prefix, name);
    let others = others_key(prefix, name);
    let shared = key(prefix, name);
    format!(
        "(SELECT min(m.objid::int8 & {LIMIT_MASK})::int4 FROM pg_locks m \
         WHERE m.locktype = 'advisory' AND m.objsubid = 1 AND m.granted AND m.mode = 'ShareLock' \
         AND m.pid <> pg_backend_pid() \
         AND m.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND m.classid = {high}::oid AND (m.objid::int8 & {}) = {low} \
         AND (m.objid::int8 & {LIMIT_MASK}) <> {limit} \
         AND EXISTS (SELECT 1 FROM pg_locks s WHERE s.pid = m.pid AND s.locktype = 'advisory' \
         AND s.objsubid = 1 AND s.granted AND (s.mode = 'ExclusiveLock' \
         AND ((s.classid::int8 << 32) | s.objid::int8) NOT IN ({turnstile}, {others}) \
         OR s.mode = 'ShareLock' AND ((s.classid::int8 << 32) | s.objid::int8) = {shared})))",
        0xffff_ffff_i64 & !LIMIT_MASK
    )
}

/// A boolean: must a `--limit 1` run of `name` look for holders with another `--limit`
/// ([`other_limit_sql`])? Not while nobody holds [`others_key`], which every run with
/// `--limit N > 1` holds in shared mode from before it can hold until its session ends: the
/// key is tried, exclusively, and given back at once, in this expression. An instant's hold
/// by another `--limit 1` run makes it look too, which costs only the scan.
pub(super) fn must_look_sql(prefix: &str, name: &str) -> String {
    let others = others_key(prefix, name);
    format!(
        "CASE WHEN pg_try_advisory_lock({others}) THEN NOT pg_advisory_unlock({others}) \
         ELSE true END"
    )
}

/// The `--limit` another holder records, read from `column` of a row that selected
/// [`other_limit_sql`] (NULL: none). The SQL masks it to 0..=2047, so it is never negative.
pub(super) fn other_limit(row: Option<&Row>, column: usize) -> Option<u32> {
    row.and_then(|r| r.try_get::<_, Option<i32>>(column).ok())
        .flatten()
        .map(i32::unsigned_abs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `limit_key("dlock", "probe", 2)`: a contract with every other dlock version.
    const PINNED_LIMIT_KEY: i64 = 565720361972807682;

    #[test]
    fn limit_keys_never_change_and_carry_the_limit() {
        assert_eq!(limit_key("dlock", "probe", 0) & LIMIT_MASK, 0);
        for limit in [1, 2, 1024] {
            let key = limit_key("dlock", "probe", limit);
            assert_eq!(key & LIMIT_MASK, i64::from(limit));
            assert_eq!(key & !LIMIT_MASK, limit_key("dlock", "probe", 0));
        }
        assert_eq!(limit_key("dlock", "probe", 2), PINNED_LIMIT_KEY);
        assert_ne!(limit_key("dlock", "probe", 1), key("dlock", "probe"));
    }
}
