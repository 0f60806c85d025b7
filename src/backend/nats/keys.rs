//! The keys of a lock in the bucket and what they hold.
//!
//! A lock `NAME` under `--prefix P` is the keys `P.NAME.h.I` (the holder of slot `I`, one slot
//! per `--limit`) and `P.NAME.w.ID` (a waiter). KV keys are `[-/_=.a-zA-Z0-9]` and `.`
//! separates a key's tokens, so the prefix and the name are each encoded into one token:
//! `[A-Za-z0-9_-]` stay, every other byte is `=XX` (`=` itself included), which is
//! reversible and never holds a `.`; `NAME.h.0` and a lock named `NAME.h.0` stay apart.

use serde::{Deserialize, Serialize};

use crate::lock::{Holder, LockName};

/// One token of a key: `[A-Za-z0-9_-]` as they are, every other byte `=XX`.
pub(super) fn token(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("={byte:02X}"));
        }
    }
    out
}

/// Undo [`token`]; `None` for anything it could not have produced.
pub(super) fn untoken(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let hex = encoded.get(i + 1..i + 3)?;
            if hex.bytes().any(|b| b.is_ascii_lowercase()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let text = String::from_utf8(out).ok()?;
    (token(&text) == encoded).then_some(text)
}

/// The keys of the locks under one prefix.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    prefix: String,
}

/// What a key of a lock is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Slot(u32),
    Waiter(String),
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Keys {
        Keys {
            prefix: token(prefix),
        }
    }

    /// Every key of the lock (a watch's filter).
    pub(super) fn of_lock(&self, name: &LockName) -> String {
        format!("{}.{}.>", self.prefix, token(name.as_str()))
    }

    /// Every key under the prefix.
    pub(super) fn all(&self) -> String {
        format!("{}.>", self.prefix)
    }

    pub(super) fn slot(&self, name: &LockName, slot: u32) -> String {
        format!("{}.{}.h.{slot}", self.prefix, token(name.as_str()))
    }

    pub(super) fn waiter(&self, name: &LockName, id: &str) -> String {
        format!("{}.{}.w.{id}", self.prefix, token(name.as_str()))
    }

    /// The key `check` writes and deletes (`!` encodes to `=21`, a name of its own).
    pub(super) fn probe(&self, id: &str) -> String {
        format!("{}.=21check.w.{id}", self.prefix)
    }

    /// The lock and role of a key under the prefix; `None` for a key dlock did not write.
    pub(super) fn parse(&self, key: &str) -> Option<(LockName, Role)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('.')?;
        let mut parts = rest.split('.');
        let name = LockName::new(&untoken(parts.next()?)?).ok()?;
        let role = match (parts.next()?, parts.next()?) {
            ("h", slot) => Role::Slot(slot.parse().ok()?),
            ("w", id) => Role::Waiter(id.to_owned()),
            _ => return None,
        };
        parts.next().is_none().then_some((name, role))
    }
}

/// What a slot or a waiter's key holds: the holder (its `limit` the `--limit` it holds or
/// waits with), the acquisition's id (a write whose answer was lost is recognised by it),
/// and a waiter's place in line (the revision of its first write; 0 in that write itself).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Stored {
    #[serde(flatten)]
    pub(super) holder: Holder,
    #[serde(default)]
    pub(super) id: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) arrival: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Stored {
    pub(super) fn to_bytes(&self) -> bytes::Bytes {
        serde_json::to_vec(self).unwrap_or_default().into()
    }

    pub(super) fn parse(bytes: &[u8]) -> Option<Stored> {
        serde_json::from_slice(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_one_reversible_key_token() {
        let names = ["a", "a.h.0", "a=2E", "a b", "锁", "../x", "a/b", "A-b_c"];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let t = token(name);
            assert!(!t.contains('.'), "{t}");
            assert!(
                t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'=')),
                "{t}"
            );
            assert_eq!(untoken(&t).as_deref(), Some(name));
            assert!(seen.insert(t));
        }
        assert_eq!(untoken("a=2e"), None);
        assert_eq!(untoken("a=2"), None);
    }

    #[test]
    fn a_key_tells_its_lock_and_role() {
        let keys = Keys::new("dlock");
        let name = LockName::new("job.h.0").unwrap();
        assert_eq!(
            keys.parse(&keys.slot(&name, 3)),
            Some((name.clone(), Role::Slot(3)))
        );
        assert_eq!(
            keys.parse(&keys.waiter(&name, "ab12")),
            Some((name, Role::Waiter("ab12".into())))
        );
        assert_eq!(keys.parse("dlock.x.h.0.y"), None);
        assert_eq!(keys.parse("other.x.h.0"), None);
    }
}
