//! The `GET_LOCK` names of a lock name: the contract with every other dlock version and with
//! SQL users (README: "MySQL and MariaDB").
//!
//! MySQL allows lock names of 64 characters and compares them case-insensitively; MariaDB
//! compares them as given. A name is therefore never used as it is: every key is `dlock:`
//! and 40 lowercase hex digits of `SHA-256("dlock\0mysql\0v1\0" ‖ prefix ‖ "\0" ‖ name ‖
//! suffix)`, 46 ASCII characters that no case folding can make equal for distinct names.

use sha2::{Digest, Sha256};

/// Length of every key (`dlock:` + 40 hex digits).
pub const KEY_LEN: usize = 46;

/// The `GET_LOCK` name of `name` in the namespace `prefix` (slot 0, and the name's row in
/// `dlock_locks`). Never change this function: holders of different dlock versions must
/// compute the same key.
pub fn key(prefix: &str, name: &str) -> String {
    key_with(prefix, name, b"")
}

fn key_with(prefix: &str, name: &str, suffix: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(b"dlock\0mysql\0v1\0");
    hash.update(prefix.as_bytes());
    hash.update(b"\0");
    hash.update(name.as_bytes());
    hash.update(suffix);
    let digest = hash.finalize();
    let mut key = String::with_capacity(KEY_LEN);
    key.push_str("dlock:");
    for byte in &digest[..20] {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

/// Slot `i` of a `--limit N` lock (slot 0 is the plain key).
pub fn slot_key(prefix: &str, name: &str, slot: u32) -> String {
    if slot == 0 {
        key(prefix, name)
    } else {
        key_with(prefix, name, format!("\0slot\0{slot}").as_bytes())
    }
}

/// The key `--limit N > 1` waiters queue on.
pub fn turnstile_key(prefix: &str, name: &str) -> String {
    key_with(prefix, name, b"\0queue")
}

/// A key that only the lock session of connection `id` holds while it holds a lock of
/// `name`: a watcher on a second connection waits for it, and is granted it the moment that
/// session ends (`lease`).
pub fn session_key(prefix: &str, name: &str, id: u64) -> String {
    key_with(prefix, name, format!("\0session\0{id}").as_bytes())
}

/// A key made of `dlock:` and hex digits is safe inside single quotes as it is.
pub fn quoted(key: &str) -> String {
    debug_assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b':'));
    format!("'{key}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These values are the contract with every other dlock version and with SQL users.
    #[test]
    fn keys_never_change_and_are_case_proof() {
        let probe = key("dlock", "probe");
        assert_eq!(probe.len(), KEY_LEN);
        assert_eq!(probe, "dlock:87d90682e257a43081567f265c32eb30d4aba25e");
        assert_eq!(probe, probe.to_ascii_lowercase());
        assert_ne!(key("dlock", "Probe"), probe);
        assert_ne!(key("dlock", "a/b"), key("dlock", "ab"));
        assert_ne!(key("x", "a"), key("dlock", "a"));
        assert_eq!(slot_key("dlock", "probe", 0), probe);
        assert_ne!(slot_key("dlock", "probe", 1), probe);
        assert_ne!(turnstile_key("dlock", "probe"), probe);
        assert_eq!(key(&"p".repeat(300), &"锁".repeat(80)).len(), KEY_LEN);
    }
}
