//! Where a lock's objects are in the bucket: `[URL PREFIX/]--prefix/NAME` for the lock
//! object (the name as [`LockName::encoded`], or `#` and its SHA-256 where the key would pass
//! S3's 1024 bytes), `…/NAME/w/ID` for the registration of a waiter, and
//! `--prefix/#check/ID` for `check`'s probe. A lock object is the only object directly
//! under the prefix (encoded names have no `/`), and no encoded name has a `#`.

use sha2::{Digest, Sha256};

use crate::lock::{encode_component, LockName};

/// A lock object's key stays below S3's 1024 bytes with room for a waiter's suffix.
const MAX_KEY: usize = 900;

#[derive(Clone, Debug)]
pub struct Keys {
    /// `[URL PREFIX/]--prefix/`.
    pub base: String,
}

impl Keys {
    pub fn new(url_prefix: &str, prefix: &str) -> Keys {
        let prefix = encode_component(prefix);
        let base = if url_prefix.is_empty() {
            format!("{prefix}/")
        } else {
            format!("{url_prefix}/{prefix}/")
        };
        Keys { base }
    }

    /// The lock object of `name`.
    pub fn lock(&self, name: &LockName) -> String {
        let key = format!("{}{}", self.base, name.encoded());
        if key.len() <= MAX_KEY {
            return key;
        }
        let digest = Sha256::digest(name.as_str().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}#{hex}", self.base)
    }

    /// Where the waiters of `name` register (a prefix).
    pub fn waiters(&self, name: &LockName) -> String {
        format!("{}/w/", self.lock(name))
    }

    /// `check`'s probe object.
    pub fn probe(&self) -> String {
        format!("{}#check/{}", self.base, uuid::Uuid::new_v4().simple())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_apart_and_short() {
        let keys = Keys::new("ci", "dlock");
        let a = keys.lock(&LockName::new("a/b").unwrap());
        assert_eq!(a, "ci/dlock/a%2Fb");
        assert_eq!(
            keys.waiters(&LockName::new("a/b").unwrap()),
            "ci/dlock/a%2Fb/w/"
        );
        let deep = Keys::new(&"p".repeat(200), "dlock");
        let long = deep.lock(&LockName::new(&"锁".repeat(85)).unwrap());
        assert!(long.len() < 300 && long.contains("/dlock/#"), "{long}");
        let other = deep.lock(&LockName::new(&"锁".repeat(84)).unwrap());
        assert!(other.len() <= MAX_KEY && other != long);
        assert_eq!(Keys::new("", "dlock").base, "dlock/");
        assert!(keys.probe().starts_with("ci/dlock/#check/"));
    }
}
