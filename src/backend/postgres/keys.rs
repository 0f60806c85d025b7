//! The advisory-lock keys of a lock name: the contract with every other dlock version and
//! with SQL users (see the module doc of [`super`]), the NOTIFY channel of its slots, and the
//! functions that take and give back a key in a [`Mode`].

use sha2::{Digest, Sha256};

use crate::lock::Mode;

/// The advisory-lock key of `name` in the namespace `prefix`. Never change this function:
/// holders running different dlock versions must compute the same key.
pub fn key(prefix: &str, name: &str) -> i64 {
    key_with(prefix, name, b"")
}

pub(super) fn key_with(prefix: &str, name: &str, suffix: &[u8]) -> i64 {
    let mut hash = Sha256::new();
    hash.update(b"dlock\0v1\0");
    hash.update(prefix.as_bytes());
    hash.update(b"\0");
    hash.update(name.as_bytes());
    hash.update(suffix);
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Slot `i` of a `--limit N` lock (slot 0 is the plain key).
pub(super) fn slot_key(prefix: &str, name: &str, slot: u32) -> i64 {
    if slot == 0 {
        key(prefix, name)
    } else {
        key_with(prefix, name, format!("\0slot\0{slot}").as_bytes())
    }
}

/// The key `--limit N > 1` waiters queue on.
pub(super) fn turnstile_key(prefix: &str, name: &str) -> i64 {
    key_with(prefix, name, b"\0queue")
}

/// The key every run with `--limit N > 1` holds in shared mode (beside its recorded
/// `--limit`) until its session ends: see [`super::limit::must_look_sql`].
pub(super) fn others_key(prefix: &str, name: &str) -> i64 {
    key_with(prefix, name, b"\0others")
}

/// The NOTIFY channel a released slot wakes (`dlock_` and the slot-0 key in hex).
pub(super) fn channel(prefix: &str, name: &str) -> String {
    format!("dlock_{:016x}", key(prefix, name))
}

/// The server functions that take, try and give back a key in `mode`: a shared hold is
/// `pg_advisory_lock_shared` on the same key, so any number of them coexist and an exclusive
/// one (dlock's or SQL's `pg_advisory_lock`) excludes them all.
pub(super) struct Functions {
    pub(super) lock: &'static str,
    pub(super) try_lock: &'static str,
    pub(super) unlock: &'static str,
}

pub(super) fn functions(mode: Mode) -> &'static Functions {
    const EXCLUSIVE: Functions = Functions {
        lock: "pg_advisory_lock",
        try_lock: "pg_try_advisory_lock",
        unlock: "pg_advisory_unlock",
    };
    const SHARED: Functions = Functions {
        lock: "pg_advisory_lock_shared",
        try_lock: "pg_try_advisory_lock_shared",
        unlock: "pg_advisory_unlock_shared",
    };
    match mode {
        Mode::Exclusive => &EXCLUSIVE,
        Mode::Shared => &SHARED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These values are the contract with every other dlock version and with SQL users.
    #[test]
    fn keys_never_change() {
        assert_eq!(key("dlock", "probe"), -707979539756708059);
        assert_eq!(key("dlock", "probe") as u64, 0xf62cc05c108e8f25);
        assert_ne!(key("dlock", "a/b"), key("dlock", "ab"));
        assert_ne!(key("x", "a"), key("dlock", "a"));
        assert_eq!(slot_key("dlock", "probe", 0), key("dlock", "probe"));
        assert_ne!(slot_key("dlock", "probe", 1), key("dlock", "probe"));
    }
}
