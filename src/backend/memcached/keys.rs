//! The keys of one lock and what its items hold (the layout is in the module doc of
//! [`super`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::lock::{LockName, Record};

/// Bases longer than this are replaced by a hash of the name, so that every key of the lock
/// (base plus a suffix of at most 10 bytes) stays within memcached's 250 bytes.
const MAX_BASE: usize = 240;

/// How many waiters `status` can count (each registers in one of this many items).
pub(super) const WAITER_SLOTS: usize = 64;

/// The keys of one lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Keys {
    /// `<prefix>:<encoded name>` (or `<prefix>:#<sha-256 of the name>` for long names).
    pub(super) base: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, name: &LockName) -> Keys {
        let base = format!("{prefix}:{}", name.encoded());
        if base.len() <= MAX_BASE {
            return Keys { base };
        }
        let digest = Sha256::digest(name.as_str().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        Keys {
            base: format!("{prefix}:#{hex}"),
        }
    }

    /// The lock's base from the key of its fencing counter or of a holder slot, as
    /// `lru_crawler metadump` lists it (`None` for any other key).
    pub(super) fn from_listed_key(prefix: &str, key: &str) -> Option<Keys> {
        let (base, suffix) = key.rsplit_once(':')?;
        if suffix != "f" && (suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_digit())) {
            return None;
        }
        let rest = base.strip_prefix(prefix)?.strip_prefix(':')?;
        // The part after the prefix is an encoded name or `#hash`: never a `:`.
        if rest.is_empty() || rest.contains(':') {
            return None;
        }
        Some(Keys {
            base: base.to_owned(),
        })
    }

    /// The name, where the base spells it (not for hashed long names).
    pub(super) fn name(&self) -> Option<LockName> {
        let (_, encoded) = self.base.rsplit_once(':')?;
        if encoded.starts_with('#') {
            return None;
        }
        crate::lock::decode_component(encoded).and_then(|n| LockName::new(&n).ok())
    }

    /// Holder slot `i` of `0..limit`.
    pub(super) fn slot(&self, i: u32) -> String {
        format!("{}:{i}", self.base)
    }

    /// The fencing counter (and the `--limit` of its last taker).
    pub(super) fn fence(&self) -> String {
        format!("{}:f", self.base)
    }

    /// Waiter registration `i` of `0..WAITER_SLOTS`.
    pub(super) fn waiter(&self, i: usize) -> String {
        format!("{}:w{i}", self.base)
    }
}

/// What a holder slot holds: the owner (random per acquisition: "is it still ours?") and the
/// holder's record (metadata, token, `--limit`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Stored {
    pub(super) owner: String,
    #[serde(flatten)]
    pub(super) record: Record,
}

impl Stored {
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// `None` for a value dlock did not write.
    pub(super) fn parse(value: &[u8]) -> Option<Stored> {
        serde_json::from_slice(value).ok()
    }
}

/// The fencing counter's value: `<last token> <limit of its taker>`.
pub(super) fn fence_value(token: u64, limit: u32) -> Vec<u8> {
    format!("{token} {limit}").into_bytes()
}

/// Parse [`fence_value`]; `None` for a value dlock did not write.
pub(super) fn parse_fence(value: &[u8]) -> Option<(u64, u32)> {
    let text = std::str::from_utf8(value).ok()?;
    let (token, limit) = text.split_once(' ').unwrap_or((text, "1"));
    Some((token.parse().ok()?, limit.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_short_and_distinct() {
        let short = Keys::new("dlock", &LockName::new("a/b").unwrap());
        assert_eq!(short.base, "dlock:a%2Fb");
        assert_eq!(short.name().unwrap().as_str(), "a/b");
        assert_eq!(
            Keys::from_listed_key("dlock", &short.fence()),
            Some(short.clone())
        );
        assert_eq!(
            Keys::from_listed_key("dlock", &short.slot(7)),
            Some(short.clone())
        );
        assert_eq!(Keys::from_listed_key("dlock", &short.waiter(0)), None);
        assert_eq!(Keys::from_listed_key("other", &short.fence()), None);
        let long = Keys::new("dlock", &LockName::new(&"锁".repeat(85)).unwrap());
        assert!(long.waiter(WAITER_SLOTS - 1).len() <= 250);
        assert!(long.base.starts_with("dlock:#"));
        assert_eq!(long.name(), None);
        let other = Keys::new("dlock", &LockName::new(&"锁".repeat(84)).unwrap());
        assert_ne!(long.base, other.base);
    }

    #[test]
    fn fence_values_round_trip() {
        assert_eq!(parse_fence(&fence_value(17, 3)), Some((17, 3)));
        assert_eq!(parse_fence(b"17"), Some((17, 1)));
        assert_eq!(parse_fence(b"x 1"), None);
    }
}
