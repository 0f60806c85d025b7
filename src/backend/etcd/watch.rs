//! What a waiter watches and what each event means (module docs of `etcd`): with
//! `--limit 1` its predecessor, the key before that and its own key, in one watch; with
//! `--limit N > 1` its predecessor, or any deletion under the prefix at the head of the
//! queue. Pure: the waiting itself is in `queue`.

use etcd_client::{WatchFilterType, WatchOptions, WatchResponse, WatchStream};

/// Why a waiter stopped waiting.
pub(super) enum Wake {
    /// Something before us changed: re-check.
    Changed,
    /// Already re-checked (keys before ours, revision read at): nothing to wait for on this
    /// watch any more.
    Rechecked(Vec<Vec<u8>>, i64),
    /// The holder's key was deleted (at this revision) while ours still existed: the lock is
    /// ours. The watch, which covers our own key, goes on with the lease.
    Head(Box<WatchStream>, i64),
    /// `--wait` ran out.
    TimedOut,
}

/// What the waiter waits for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// `--limit 1`: the key just before ours, and the one before that (`ahead`) unless `pred`
    /// is the holder's (a reader: the nearest older writer's key, and a key before it
    /// unless that writer is the holder; `readers`). Watched for deletion together with our own key, in one watch; see
    /// [`Target::watch`] for why that lets the waiter start without a re-check.
    Line {
        pred: Vec<u8>,
        ahead: Option<Vec<u8>>,
    },
    /// `--limit > 1`: the key just before ours (its deletion or rewrite).
    Key(Vec<u8>),
    /// `--limit > 1`, head of the queue: any deletion under the lock's prefix.
    AnyDeletion,
}

/// What an event on `key` (a deletion; with `Target::Key` also a rewrite) means to a waiter.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// Our own key: our lease died while we waited.
    Own,
    /// The holder's key, ours still there: the lock is ours.
    Holder,
    /// A key we wait on, but not known to be the holder's: re-check.
    Watched,
    /// Another key that happens to be in the watched range.
    Other,
}

impl Target {
    /// For a waiter with `older` (newest first, at most limit+1) before it.
    pub(super) fn for_waiter(older: &[Vec<u8>], limit: usize) -> Target {
        match older.first() {
            Some(pred) if limit == 1 => Target::Line {
                pred: pred.clone(),
                ahead: older.get(1).cloned(),
            },
            Some(key) if older.len() > limit => Target::Key(key.clone()),
            _ => Target::AnyDeletion,
        }
    }

    /// Whether a watch set up for `self` also serves `next`, read later.
    pub(super) fn covers(&self, next: &Target) -> bool {
        match (self, next) {
            (
                Target::Line { pred, ahead },
                Target::Line {
                    pred: next_pred,
                    ahead: next_ahead,
                },
            ) => pred == next_pred && (next_ahead.is_none() || next_ahead == ahead),
            _ => self == next,
        }
    }

    /// The key range to watch and the options, for a waiter whose key is `own`.
    ///
    /// A `Line` waiter watches one range, from the smallest to the largest of its own key,
    /// `pred` and `ahead`. etcd delivers the events of one watch in revision order and drops
    /// none, so when `pred`'s deletion arrives without our own key's before it or in the same
    /// response (see [`Target::first_event`] and `Acquisition::wait_for`), our key existed at that revision; if `pred`
    /// was the holder (nothing else before us when we last read, and no key can be created
    /// before ours later), the lock became ours right then, with no further read. Keys are
    /// named by lease id, and etcd gives out lease ids in increasing order, so neighbours in
    /// the queue are usually neighbours in the range too; other keys that fall in it are
    /// ignored. `ahead`'s deletion usually means `pred` just took the lock: the waiter
    /// re-checks then, while `pred` runs its command, so that the re-check is off the
    /// hand-off path.
    pub(super) fn watch(&self, own: &[u8], pfx: &str) -> (Vec<u8>, WatchOptions) {
        let deletions = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        match self {
            Target::Line { pred, ahead } => {
                let keys = [Some(own), Some(pred.as_slice()), ahead.as_deref()];
                let first = keys.iter().flatten().min().copied().unwrap_or(own);
                let last = keys.iter().flatten().max().copied().unwrap_or(own);
                let mut end = last.to_vec();
                end.push(0);
                (first.to_vec(), deletions.with_range(end))
            }
            Target::Key(key) => (key.clone(), WatchOptions::new()),
            Target::AnyDeletion => (pfx.as_bytes().to_vec(), deletions.with_prefix()),
        }
    }

    /// What an event on `key` means to a waiter whose own key is `own` (`Line` tells them
    /// apart; a semaphore waiter re-checks on any event).
    fn seen(&self, key: &[u8], own: &[u8]) -> Seen {
        match self {
            _ if key == own => Seen::Own,
            Target::Line { pred, ahead: None } if key == pred.as_slice() => Seen::Holder,
            Target::Line { pred, ahead }
                if key == pred.as_slice() || ahead.as_deref() == Some(key) =>
            {
                Seen::Watched
            }
            Target::Line { .. } => Seen::Other,
            Target::Key(_) | Target::AnyDeletion => Seen::Watched,
        }
    }

    /// What the events of `response` after revision `read_at` mean, and the revision of the
    /// first that counts (the holder's deletion). Every event counts, and our own key's
    /// deletion wins: one revision can delete `pred` and ours together (a DeleteRange over
    /// the lock's prefix), and etcd lists its events in key order, so ours may come after
    /// `pred`'s.
    pub(super) fn first_event(
        &self,
        response: &WatchResponse,
        own: &[u8],
        read_at: i64,
    ) -> (Seen, i64) {
        let mut seen = Seen::Other;
        let mut at = read_at;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            if kv.mod_revision() <= read_at {
                continue;
            }
            let this = self.seen(kv.key(), own);
            tracing::debug!(
                "event on {} at revision {}: {this:?}",
                String::from_utf8_lossy(kv.key()),
                kv.mod_revision()
            );
            if this == Seen::Own {
                return (Seen::Own, at);
            }
            if seen == Seen::Other {
                seen = this;
                at = kv.mod_revision();
            }
        }
        (seen, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    fn line(pred: &str, ahead: Option<&str>) -> Target {
        Target::Line {
            pred: pred.into(),
            ahead: ahead.map(Into::into),
        }
    }

    #[test]
    fn a_waiter_watches_what_is_just_before_it() {
        assert_eq!(
            Target::for_waiter(&keys(&["p", "a"]), 1),
            line("p", Some("a"))
        );
        assert_eq!(Target::for_waiter(&keys(&["p"]), 1), line("p", None));
        assert_eq!(
            Target::for_waiter(&keys(&["p", "a", "b"]), 2),
            Target::Key(b"p".to_vec())
        );
        assert_eq!(
            Target::for_waiter(&keys(&["p", "a"]), 2),
            Target::AnyDeletion
        );
        assert_eq!(Target::for_waiter(&[], 1), Target::AnyDeletion);
    }

    #[test]
    fn only_the_holders_deletion_hands_the_lock_over() {
        let head = line("p", None);
        assert_eq!(head.seen(b"own", b"own"), Seen::Own);
        assert_eq!(head.seen(b"p", b"own"), Seen::Holder);
        assert_eq!(head.seen(b"q", b"own"), Seen::Other);
        let second = line("p", Some("a"));
        assert_eq!(second.seen(b"p", b"own"), Seen::Watched);
        assert_eq!(second.seen(b"a", b"own"), Seen::Watched);
        assert_eq!(Target::AnyDeletion.seen(b"q", b"own"), Seen::Watched);
    }

    #[test]
    fn a_watch_serves_a_later_target_it_covers() {
        let second = line("p", Some("a"));
        assert!(second.covers(&line("p", None)));
        assert!(second.covers(&line("p", Some("a"))));
        assert!(!second.covers(&line("p", Some("b"))));
        assert!(!second.covers(&line("q", None)));
        let (start, _) = line("p", Some("a")).watch(b"own", "dlock/x/");
        assert_eq!(start, b"a".to_vec());
    }
}
