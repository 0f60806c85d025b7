//! The keys of one lock. They all share the hash tag `{<encoded name>}`, so one lock lives in
//! one Cluster slot, and the encoding keeps distinct names from ever sharing a key (the layout
//! is in the module doc of [`super`]).

use crate::lock::LockName;

/// The keys of one lock (and of one owner token).
#[derive(Clone, Debug)]
pub(super) struct Keys {
    pub(super) fence: String,
    pub(super) holders: String,
    pub(super) queue: String,
    pub(super) qdl: String,
    pub(super) hold: String,
    pub(super) wake: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, name: &LockName, tok: &str) -> Keys {
        let base = format!("{prefix}:{{{}}}", name.encoded());
        Keys {
            fence: format!("{base}:fence"),
            holders: format!("{base}:holders"),
            queue: format!("{base}:queue"),
            qdl: format!("{base}:qdl"),
            hold: format!("{base}:h:{tok}"),
            wake: format!("{base}:w:{tok}"),
        }
    }
}

/// The owner token is the last component of the hold key.
pub(super) fn owner_token(keys: &Keys) -> &str {
    keys.hold.rsplit(':').next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_and_names_never_collide() {
        let a = Keys::new("dlock", &LockName::new("a").unwrap(), "t");
        let b = Keys::new("dlock", &LockName::new("a:fence").unwrap(), "t");
        let c = Keys::new("dlock", &LockName::new("a}x{").unwrap(), "t");
        for keys in [&a, &b, &c] {
            let tags: std::collections::HashSet<&str> = [
                &keys.fence,
                &keys.holders,
                &keys.queue,
                &keys.qdl,
                &keys.hold,
                &keys.wake,
            ]
            .iter()
            .map(|k| k.split_once('{').unwrap().1.split_once('}').unwrap().0)
            .collect();
            assert_eq!(tags.len(), 1, "{keys:?}");
        }
        assert_ne!(a.fence, b.fence);
        assert_eq!(owner_token(&a), "t");
    }
}
