//! The keys of one lock. They all share the hash tag `{<encoded name>}`, so one lock lives in
//! one Cluster slot, and the encoding keeps distinct names from ever sharing a key (the layout
//! is in the module doc of [`super`]).
//!
//! Every key a script touches is one of these, declared in its KEYS: the per-holder data are
//! fields of the fixed `B:hold`, and a waiter's mailbox (`B:w:<tok>`), which only its owner
//! and whoever wakes it name, is built here, never inside a script.
//!
//! An owner token also says how its acquisition holds or waits: a shared run's starts with
//! [`SHARED_TOKEN`], so that every entry in the queue and among the holders carries its mode
//! and the scripts need no other key to know it (`scripts/modes.lua`).

use crate::lock::{LockName, Mode};

/// How a shared run's owner token starts (never a hex digit, which begins the others).
const SHARED_TOKEN: &str = "s:";

/// A new owner token (random per acquisition) for a run of `mode`.
pub(super) fn owner_token(mode: Mode) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    match mode {
        Mode::Shared => format!("{SHARED_TOKEN}{random}"),
        Mode::Exclusive => random,
    }
}

/// The mode an owner token stands for.
pub(super) fn mode_of(tok: &str) -> Mode {
    if tok.starts_with(SHARED_TOKEN) {
        Mode::Shared
    } else {
        Mode::Exclusive
    }
}

/// The keys of one lock (and of one owner token).
#[derive(Clone, Debug)]
pub(super) struct Keys {
    /// The owner token these keys were made for (random per acquisition).
    pub(super) tok: String,
    base: String,
    pub(super) fence: String,
    pub(super) owners: String,
    pub(super) hold: String,
    pub(super) queue: String,
    pub(super) qdl: String,
    pub(super) wake: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, name: &LockName, tok: &str) -> Keys {
        let base = format!("{prefix}:{{{}}}", name.encoded());
        Keys {
            tok: tok.to_owned(),
            fence: format!("{base}:fence"),
            owners: format!("{base}:owners"),
            hold: format!("{base}:hold"),
            queue: format!("{base}:queue"),
            qdl: format!("{base}:qdl"),
            wake: format!("{base}:w:{tok}"),
            base,
        }
    }

    /// The wake-up mailbox of the waiter with token `tok`.
    pub(super) fn mailbox(&self, tok: &str) -> String {
        format!("{}:w:{tok}", self.base)
    }
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
            let mailbox = keys.mailbox("other");
            let tags: std::collections::HashSet<&str> = [
                &keys.fence,
                &keys.owners,
                &keys.hold,
                &keys.queue,
                &keys.qdl,
                &keys.wake,
                &mailbox,
            ]
            .iter()
            .map(|k| k.split_once('{').unwrap().1.split_once('}').unwrap().0)
            .collect();
            assert_eq!(tags.len(), 1, "{keys:?}");
        }
        assert_ne!(a.fence, b.fence);
        let shared = owner_token(Mode::Shared);
        assert_eq!(mode_of(&shared), Mode::Shared);
        assert_eq!(mode_of(&owner_token(Mode::Exclusive)), Mode::Exclusive);
        assert_eq!(
            Keys::new("dlock", &LockName::new("a").unwrap(), &shared).tok,
            shared
        );
        assert_eq!(a.mailbox("t"), a.wake);
        assert_eq!(a.tok, "t");
    }
}
