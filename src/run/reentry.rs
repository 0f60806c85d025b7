//! Reentrancy: when a nested `dlock run NAME` may skip acquiring (docs/guide.md: "Reentrancy").
//!
//! A holder adds an entry to `DLOCK_HELD` in its command's environment:
//! `BACKEND|NAME|PID|START|TOKEN` — the backend identity and the encoded lock name, the
//! holding dlock's pid and start time (field 22 of `/proc/PID/stat`, in clock ticks since
//! boot), and the fencing token of the hold. A hold (`dlock hold`) adds
//! `BACKEND|NAME|PID|START|TOKEN|KEEPER-PID|KEEPER-START`: PID and START are then the process
//! the hold belongs to (0 for none: `--until-released`), and the keeper, the process the backend
//! shows holding, is named apart (`dlock release` reaches it by them). An environment can be copied and a background
//! process can outlive the hold, so an entry alone proves nothing. A nested run trusts an
//! entry only when
//!
//! 1. the pid is one of its own ancestors (the parent chain in `/proc`), so the entry was not
//!    copied by an unrelated process and the process that has it was not orphaned by the
//!    command that held the lock (an orphan is re-parented away from the holder);
//! 2. that ancestor is the process the entry names, not a later one with the same pid (its
//!    start time matches);
//! 3. the backend still shows that holder — same pid, host and token — holding the lock
//!    (the run path asks it), so the ancestor really holds this lock and has not lost it.
//!
//! Anything else acquires normally.

use super::hold::Handle;
use crate::lock::LockName;
use crate::process::{parent_of, start_ticks};

/// Bound on the walk up the parent chain (process trees are never this deep).
const MAX_DEPTH: usize = 4096;

/// One entry of `DLOCK_HELD`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `BACKEND|NAME`: which lock.
    pub lock: String,
    pub pid: u32,
    pub start: u64,
    pub token: u64,
    /// The keeper of a hold (`dlock hold`); `pid` is then the process the hold belongs to.
    pub keeper: Option<Handle>,
    /// A `dlock hold` re-entered this (enclosing) hold: its `dlock release` leaves it alone.
    pub reentered: bool,
}

impl Entry {
    /// The entry for this process holding `name` on the backend `identity` with `token`.
    pub fn for_this_process(identity: &str, name: &LockName, token: u64) -> Option<Entry> {
        let pid = std::process::id();
        Some(Entry {
            lock: lock_key(identity, name),
            pid,
            start: start_ticks(pid)?,
            token,
            keeper: None,
            reentered: false,
        })
    }

    /// The pid the backend shows holding the lock: the keeper's for a hold.
    pub fn holder_pid(&self) -> u32 {
        self.keeper.map_or(self.pid, |keeper| keeper.pid)
    }

    fn parse(text: &str) -> Option<Entry> {
        // The backend identity is escaped and the name encoded: neither has a `|`.
        let mut fields: Vec<&str> = text.split('|').collect();
        let reentered = fields.last() == Some(&"r");
        if reentered {
            fields.pop();
        }
        let (lock, rest) = match fields.len() {
            5 | 7 => fields.split_at(2),
            _ => return None,
        };
        let keeper = match rest {
            [_, _, _, pid, start] => Some(Handle {
                pid: pid.parse().ok()?,
                start: start.parse().ok()?,
            }),
            _ => None,
        };
        Some(Entry {
            lock: lock.join("|"),
            pid: rest[0].parse().ok()?,
            start: rest[1].parse().ok()?,
            token: rest[2].parse().ok()?,
            keeper,
            reentered,
        })
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}|{}|{}|{}",
            self.lock, self.pid, self.start, self.token
        )?;
        if let Some(keeper) = self.keeper {
            write!(f, "|{}|{}", keeper.pid, keeper.start)?;
        }
        if self.reentered {
            write!(f, "|r")?;
        }
        Ok(())
    }
}

/// `BACKEND|NAME` for `name` on the backend `identity`, escaped so that entries can be
/// separated by spaces and split at `|`.
pub fn lock_key(identity: &str, name: &LockName) -> String {
    format!("{}|{}", escape(identity), name.encoded())
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | ' ' | '|') || c.is_control() {
            for byte in c.to_string().bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The entry of `held` (a `DLOCK_HELD` value) for `lock` whose holder is a live ancestor of
/// this process (conditions 1 and 2 of the module doc). The backend check is the caller's.
pub fn ancestor_entry(held: &str, lock: &str) -> Option<Entry> {
    let candidates: Vec<Entry> = held
        .split(' ')
        .filter_map(Entry::parse)
        .filter(|entry| entry.lock == lock)
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let mut pid = parent_of(std::process::id())?;
    for _ in 0..MAX_DEPTH {
        if pid <= 1 {
            return None;
        }
        if let Some(entry) = candidates.iter().find(|entry| entry.pid == pid) {
            return (start_ticks(pid) == Some(entry.start)).then(|| entry.clone());
        }
        pid = parent_of(pid)?;
    }
    None
}

/// The last hold (`dlock hold`) `held` names for `lock`, or the mark of a hold that re-entered
/// an enclosing one: `dlock release` asks the keeper (which answers only its own user), or
/// leaves the enclosing hold alone.
pub fn hold_entry(held: &str, lock: &str) -> Option<Entry> {
    held.rsplit(' ')
        .filter_map(Entry::parse)
        .find(|entry| entry.lock == lock && (entry.keeper.is_some() || entry.reentered))
}

/// The entry of `held` (a `DLOCK_HELD` value) for `lock` whose holder is a live ancestor,
/// marked as re-entered by a `dlock hold`: the value for the shell of that hold.
pub fn reentered_by_a_hold(held: &str, lock: &str) -> Option<String> {
    let entry = Entry {
        reentered: true,
        ..ancestor_entry(held, lock)?
    };
    Some(with_entry(held, &entry))
}

/// `held` without entries for `lock`, with `entry` added: the value for the command.
pub fn with_entry(held: &str, entry: &Entry) -> String {
    let mut kept: Vec<&str> = held
        .split(' ')
        .filter(|text| !text.is_empty())
        .filter(|text| Entry::parse(text).is_none_or(|e| e.lock != entry.lock))
        // Entries in the old `BACKEND|NAME` form name no holder; they are dropped too.
        .filter(|text| *text != entry.lock)
        .collect();
    let entry = entry.to_string();
    kept.push(&entry);
    kept.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> LockName {
        LockName::new(text).expect("a valid name")
    }

    #[test]
    fn entries_round_trip_through_the_environment_form() {
        let entry = Entry {
            lock: lock_key("redis://h:6379/0|dlock", &name("a b|c")),
            pid: 42,
            start: 7,
            token: 9,
            keeper: None,
            reentered: false,
        };
        assert_eq!(Entry::parse(&entry.to_string()), Some(entry.clone()));
        let mark = Entry {
            reentered: true,
            ..entry.clone()
        };
        assert_eq!(Entry::parse(&mark.to_string()), Some(mark));
        let hold = Entry {
            keeper: Some(Handle { pid: 43, start: 8 }),
            reentered: true,
            ..entry.clone()
        };
        assert_eq!(Entry::parse(&hold.to_string()), Some(hold.clone()));
        assert_eq!(hold.holder_pid(), 43);
        assert_eq!(Entry::parse(&entry.to_string()), Some(entry.clone()));
        assert!(!entry.to_string().contains(' '));
    }

    #[test]
    fn this_process_is_not_its_own_ancestor() {
        let entry =
            Entry::for_this_process("file:///x|dlock", &name("job"), 1).expect("own /proc entry");
        assert_eq!(ancestor_entry(&entry.to_string(), &entry.lock), None);
    }

    #[test]
    fn the_parent_with_its_start_time_is_an_ancestor_and_a_wrong_start_time_is_not() {
        let parent = parent_of(std::process::id()).expect("a parent");
        let lock = lock_key("file:///x|dlock", &name("job"));
        let start = start_ticks(parent).expect("the parent's start time");
        let good = Entry {
            lock: lock.clone(),
            pid: parent,
            start,
            token: 3,
            keeper: None,
            reentered: false,
        };
        let held = format!("junk {good}");
        assert_eq!(ancestor_entry(&held, &lock), Some(good.clone()));
        let reused = Entry {
            start: start + 1,
            ..good.clone()
        };
        assert_eq!(ancestor_entry(&reused.to_string(), &lock), None);
        let other_lock = lock_key("file:///x|dlock", &name("other"));
        assert_eq!(ancestor_entry(&held, &other_lock), None);
    }

    #[test]
    fn with_entry_replaces_the_entry_for_the_same_lock() {
        let lock = lock_key("file:///x|dlock", &name("job"));
        let old = Entry {
            lock: lock.clone(),
            pid: 5,
            start: 6,
            token: 7,
            keeper: None,
            reentered: false,
        };
        let other = Entry {
            lock: lock_key("file:///x|dlock", &name("other")),
            pid: 5,
            start: 6,
            token: 1,
            keeper: None,
            reentered: false,
        };
        let new = Entry {
            pid: 8,
            ..old.clone()
        };
        let held = with_entry(&format!("{old} {other}"), &new);
        assert_eq!(held, format!("{other} {new}"));
    }
}
