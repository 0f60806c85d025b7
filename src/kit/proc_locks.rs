//! Who holds and who waits for which lock file, read from `/proc/locks`: the kernel lists
//! flock(2) holders and blocked waiters by inode there, without disturbing them. `status`,
//! `list` and the `--limit` check believe a holder's recorded metadata only while this table
//! shows the same pid holding the file.
//!
//! `/proc/locks` is not one snapshot. Each read(2) returns at most one kernel buffer (a page,
//! about 60 lines) taken under the table's lock, and the next read resumes at a line *number*:
//! when another process releases a lock listed ahead of ours between two reads, every line
//! moves up by one and the line at the page boundary is never shown (one taken ahead shows a
//! line twice). On a machine where other programs take and release many flock(2) locks, a
//! single read of the file misses a held lock now and then. Two defences, both read-only
//! (testing a lock by taking it would make a real contender's `--no-wait` fail while `list`
//! runs):
//!
//! - [`ProcLocks::read`] reads the whole file again until, for each file we ask about, two
//!   consecutive reads agree on who holds it (a skip depends on timing, so two reads
//!   skipping the same line are unlikely), a bounded number of times, else a clear error
//!   (`status`, `list`: complete or loud). Agreement is per file, not on all of them at
//!   once: with dozens of lock files several pages deep in a churning table, nearly every
//!   read skips *some* holder, so whole reads that agree would be rare, while each file's
//!   own answer settles within two or three reads. Each file's answer is then true at one
//!   moment of the call; no caller needs one moment for all files (`list` is one line a
//!   lock, the `--limit` check counts with [`ProcLocks::read_best`]). Waiters are not
//!   compared: a contended lock's queue changes all the time, and a waiter count is a
//!   count, not a promise.
//! - [`ProcLocks::read_best`] is the same, but keeps the last read when no two agree: for
//!   the `--limit` check on the way to a command and the host queue's waiter count, where
//!   a busy table must not fail a run that the lock itself lets through.
//! - [`ProcLocks::holder`] asks the process a lock file's record names directly when the
//!   table shows nobody holding that file: the `lock:` lines of `/proc/<pid>/fdinfo/*` list
//!   that process's own locks, one small file per descriptor, each read in one piece. This
//!   answer is exact where it can be read (our own processes, or as root); elsewhere the
//!   agreed table stands. [`ProcLocks::shared_holders`] does the same for shared holders
//!   whose own records name them (two reads can skip the same line of a table that churns
//!   fast enough).
//!
//! Reading the table twice costs tens of microseconds; `dlock run` reads it only beside other
//! slot files (the `--limit` check), never on the path of an uncontended plain lock.

use std::collections::{HashMap, HashSet};

use crate::error::Error;

/// Holders and waiters of flock(2) locks, by (device, inode), from `/proc/locks`.
pub(crate) struct ProcLocks {
    pub(crate) holders: HashMap<(u64, u64), u32>,
    /// Every pid holding a file shared (`LOCK_SH`, listed as `READ`), in increasing order.
    pub(crate) shared: HashMap<(u64, u64), Vec<u32>>,
    /// The pids blocked waiting, by file (a process waiting for any of N slots is listed
    /// under each).
    pub(crate) waiters: HashMap<(u64, u64), Vec<u32>>,
}

/// Whole reads of `/proc/locks` before giving up on two that agree.
const READS: usize = 20;

impl ProcLocks {
    /// The holders and waiters of the files `keys`, from two consecutive whole reads of
    /// `/proc/locks` that agree on them. Entries for other files are left out.
    pub(crate) fn read(keys: &HashSet<(u64, u64)>) -> Result<ProcLocks, Error> {
        match Self::reads(keys)? {
            (locks, true) => Ok(locks),
            (_, false) => Err(Error::Unavailable(format!(
                "/proc/locks changed under each of {READS} reads: cannot tell who holds the \
                 lock files; try again"
            ))),
        }
    }

    /// As [`ProcLocks::read`], but the last read when no two agree.
    pub(crate) fn read_best(keys: &HashSet<(u64, u64)>) -> Result<ProcLocks, Error> {
        Self::reads(keys).map(|(locks, _)| locks)
    }

    /// Up to [`READS`] whole reads, each file's holders taken from the first two
    /// consecutive reads that agree on them (`true` once every file has such an answer);
    /// else the last read for the files that never settled (`false`). Waiters come from
    /// the last read.
    fn reads(keys: &HashSet<(u64, u64)>) -> Result<(ProcLocks, bool), Error> {
        Self::reads_of(keys, || {
            std::fs::read_to_string("/proc/locks")
                .map_err(|e| Error::Unavailable(format!("cannot read /proc/locks: {e}")))
        })
    }

    /// [`ProcLocks::reads`] of the tables `read` returns.
    fn reads_of(
        keys: &HashSet<(u64, u64)>,
        mut read: impl FnMut() -> Result<String, Error>,
    ) -> Result<(ProcLocks, bool), Error> {
        let mut agreed = ProcLocks::empty();
        let mut unsettled = keys.clone();
        let mut last: Option<ProcLocks> = None;
        for _ in 0..READS {
            let mut locks = ProcLocks::parse(&read()?);
            locks.retain(keys);
            if let Some(last) = &last {
                // Every shared holder counts: one missed is a holder `status` would not show.
                unsettled.retain(|key| {
                    let same = last.holders.get(key) == locks.holders.get(key)
                        && last.shared.get(key) == locks.shared.get(key);
                    if same {
                        agreed.take(&locks, *key);
                    }
                    !same
                });
            }
            let done = last.is_some() && unsettled.is_empty();
            last = Some(locks);
            if done {
                break;
            }
        }
        let Some(last) = last else {
            return Err(Error::Unavailable("/proc/locks was not read".into()));
        };
        for key in &unsettled {
            agreed.take(&last, *key);
        }
        agreed.waiters = last.waiters;
        Ok((agreed, unsettled.is_empty()))
    }

    fn empty() -> ProcLocks {
        ProcLocks {
            holders: HashMap::new(),
            shared: HashMap::new(),
            waiters: HashMap::new(),
        }
    }

    /// Keep only the entries for files `keys`, each file's pids in increasing order.
    fn retain(&mut self, keys: &HashSet<(u64, u64)>) {
        self.holders.retain(|key, _| keys.contains(key));
        self.shared.retain(|key, _| keys.contains(key));
        self.waiters.retain(|key, _| keys.contains(key));
        for pids in self.waiters.values_mut().chain(self.shared.values_mut()) {
            pids.sort_unstable();
        }
    }

    /// Take file `key`'s holders (not its waiters) from `from`.
    fn take(&mut self, from: &ProcLocks, key: (u64, u64)) {
        if let Some(&pid) = from.holders.get(&key) {
            self.holders.insert(key, pid);
        }
        if let Some(pids) = from.shared.get(&key) {
            self.shared.insert(key, pids.clone());
        }
    }

    /// Whether `/proc/locks` can be read at all.
    pub(crate) fn readable() -> bool {
        std::fs::File::open("/proc/locks").is_ok()
    }

    /// The pid holding file `key`: the table's answer, else `recorded` (the pid the file's
    /// record names) when that process's own descriptors show it holding the file.
    pub(crate) fn holder(&self, key: (u64, u64), recorded: Option<u32>) -> Option<u32> {
        if let Some(&pid) = self.holders.get(&key) {
            return Some(pid);
        }
        recorded.filter(|&pid| pid != 0 && holds(pid, key))
    }

    /// The pids holding file `key` shared: the table's, and any of `recorded` (pids whose
    /// own records say they do) that the table left out while their own descriptors show the
    /// shared lock (a line skipped by both reads of a churning table), in increasing order.
    pub(crate) fn shared_holders(&self, key: (u64, u64), recorded: &[u32]) -> Vec<u32> {
        let mut pids = self.shared.get(&key).cloned().unwrap_or_default();
        for &pid in recorded {
            if pid != 0 && !pids.contains(&pid) && holds_shared(pid, key) {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids
    }

    /// Lines look like `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF`, blocked waiters
    /// like `1: -> FLOCK  ADVISORY  WRITE 1235 fd:01:5678 0 EOF`; the device is `major:minor`
    /// in hex.
    fn parse(text: &str) -> ProcLocks {
        let mut locks = ProcLocks::empty();
        for line in text.lines() {
            let mut words: Vec<&str> = line.split_whitespace().skip(1).collect();
            let waiting = words.first() == Some(&"->");
            if waiting {
                words.remove(0);
            }
            if words.len() < 5 || words[0] != "FLOCK" {
                continue;
            }
            let Ok(pid) = words[3].parse::<u32>() else {
                continue;
            };
            let mut id = words[4].split(':');
            let (Some(major), Some(minor), Some(inode)) = (id.next(), id.next(), id.next()) else {
                continue;
            };
            let (Ok(major), Ok(minor), Ok(inode)) = (
                u32::from_str_radix(major, 16),
                u32::from_str_radix(minor, 16),
                inode.parse::<u64>(),
            ) else {
                continue;
            };
            let key = (libc::makedev(major, minor), inode);
            if waiting {
                locks.waiters.entry(key).or_default().push(pid);
            } else {
                if words[2] == "READ" {
                    locks.shared.entry(key).or_default().push(pid);
                }
                locks.holders.insert(key, pid);
            }
        }
        locks
    }
}

/// Whether process `pid` holds a flock(2) lock on file `key`, from the `lock:` lines of
/// `/proc/<pid>/fdinfo/*` (false when they cannot be read).
fn holds(pid: u32, key: (u64, u64)) -> bool {
    own_locks(pid).is_some_and(|locks| locks.holders.contains_key(&key))
}

/// Whether process `pid`'s own descriptors show it holding file `key` shared.
fn holds_shared(pid: u32, key: (u64, u64)) -> bool {
    own_locks(pid).is_some_and(|locks| locks.shared.get(&key).is_some_and(|p| p.contains(&pid)))
}

/// The locks process `pid` holds, from the `lock:` lines of its `/proc/<pid>/fdinfo/*`
/// (each file read in one piece); `None` where they cannot be read.
fn own_locks(pid: u32) -> Option<ProcLocks> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?;
    let mut lines = String::new();
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines().filter_map(|line| line.strip_prefix("lock:")) {
            lines.push_str(line);
            lines.push('\n');
        }
    }
    Some(ProcLocks::parse(&lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_lines_are_parsed() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 4343 fd:01:1234 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 99 fd:01:777 0 EOF\n";
        let locks = ProcLocks::parse(text);
        let key = (libc::makedev(0xfd, 1), 1234);
        assert_eq!(locks.holders.get(&key), Some(&4242));
        assert_eq!(locks.waiters.get(&key), Some(&vec![4343]));
        assert_eq!(locks.holders.len(), 1);
        assert!(locks.shared.is_empty());
    }

    /// Every shared (`READ`) holder of a file is kept, not only the last one listed.
    #[test]
    fn every_shared_holder_is_kept() {
        let text = "1: FLOCK  ADVISORY  READ 4242 fd:01:1234 0 EOF\n\
                    1: FLOCK  ADVISORY  READ 4343 fd:01:1234 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 99 fd:01:777 0 EOF\n";
        let locks = ProcLocks::parse(text);
        let key = (libc::makedev(0xfd, 1), 1234);
        assert_eq!(locks.shared.get(&key), Some(&vec![4242, 4343]));
        assert_eq!(locks.shared.len(), 1);
    }

    /// Each file's holder is taken from two reads that agree on it, though no two whole
    /// reads agree (each skips a different holder), and a file that never settles is
    /// reported as not settled.
    #[test]
    fn each_file_settles_on_its_own() {
        let line =
            |pid: u32, inode: u32| format!("1: FLOCK  ADVISORY  WRITE {pid} fd:01:{inode} 0 EOF\n");
        let (a, b) = (line(10, 1), line(20, 2));
        let key = |inode| (libc::makedev(0xfd, 1), inode);
        let keys = HashSet::from([key(1), key(2)]);
        let tables = [a.clone(), a.clone() + &b, b.clone(), a.clone()];
        let mut next = tables.iter();
        let (locks, settled) =
            ProcLocks::reads_of(&keys, || Ok(next.next().cloned().unwrap_or_default()))
                .expect("reads");
        assert!(settled);
        assert_eq!(locks.holders.get(&key(1)), Some(&10));
        assert_eq!(locks.holders.get(&key(2)), Some(&20));

        // File 2's holder shows in every other read only: never settled, last read stands.
        let tables: Vec<String> = (0..READS)
            .map(|i| {
                if i % 2 == 0 {
                    a.clone()
                } else {
                    a.clone() + &b
                }
            })
            .collect();
        let mut next = tables.iter();
        let (locks, settled) =
            ProcLocks::reads_of(&keys, || Ok(next.next().cloned().unwrap_or_default()))
                .expect("reads");
        assert!(!settled);
        assert_eq!(locks.holders.get(&key(1)), Some(&10));
        assert_eq!(locks.holders.get(&key(2)), Some(&20));
    }

    /// Our own lock is found through our own descriptors, and only on the file it is on.
    #[test]
    fn own_lock_is_seen_in_fdinfo() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = std::fs::File::create(dir.path().join("a")).expect("create");
        let other = std::fs::File::create(dir.path().join("b")).expect("create");
        let key = |f: &std::fs::File| {
            let m = f.metadata().expect("stat");
            (m.dev(), m.ino())
        };
        let pid = std::process::id();
        assert!(!holds(pid, key(&file)));
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert!(holds(pid, key(&file)));
        assert!(!holds(pid, key(&other)));
        let locks = ProcLocks::read(&HashSet::from([key(&file)])).expect("read");
        assert_eq!(locks.holder(key(&file), Some(pid)), Some(pid));
        assert_eq!(locks.holder(key(&other), Some(pid)), None);
    }

    /// A lock held while hundreds of unrelated flock(2) locks are taken and released ahead
    /// of it in the kernel's table is seen by every read.
    /// A shared holder the table left out (as a read of a churning table can) is found by
    /// its own descriptors when its record names it; a recorded pid that does not hold the
    /// file is not.
    #[test]
    fn a_recorded_shared_holder_left_out_of_the_table_is_found() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let held = std::fs::File::create(dir.path().join("held")).expect("create");
        let other = std::fs::File::create(dir.path().join("other")).expect("create");
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_SH) }, 0);
        let key = |file: &std::fs::File| {
            let meta = file.metadata().expect("stat");
            (meta.dev(), meta.ino())
        };
        let pid = std::process::id();
        let missed = ProcLocks::empty();
        assert_eq!(missed.shared_holders(key(&held), &[pid]), [pid]);
        assert!(missed.shared_holders(key(&held), &[]).is_empty());
        assert!(missed.shared_holders(key(&other), &[pid]).is_empty());
    }

    #[test]
    fn held_lock_is_seen_while_other_locks_churn() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        use std::time::{Duration, Instant};
        let dir = tempfile::tempdir().expect("temp dir");
        let open = |name: String| std::fs::File::create(dir.path().join(name)).expect("create");
        let lock = |file: &std::fs::File, op| {
            // SAFETY: flock on a descriptor this test owns.
            assert_eq!(unsafe { libc::flock(file.as_raw_fd(), op) }, 0);
        };
        let ours = open("ours".into());
        lock(&ours, libc::LOCK_EX);
        let meta = ours.metadata().expect("stat");
        let key = (meta.dev(), meta.ino());
        // Newer locks are listed ahead of older ones: these push ours pages deep.
        let held: Vec<std::fs::File> = (0..300).map(|i| open(format!("held-{i}"))).collect();
        for file in &held {
            lock(file, libc::LOCK_EX | libc::LOCK_NB);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let churners: Vec<_> = (0..3)
            .map(|t| {
                let files: Vec<std::fs::File> =
                    (0..40).map(|i| open(format!("churn-{t}-{i}"))).collect();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let started = Instant::now();
                    while !stop.load(Ordering::Relaxed)
                        && started.elapsed() < Duration::from_secs(60)
                    {
                        for file in &files {
                            lock(file, libc::LOCK_EX | libc::LOCK_NB);
                        }
                        for file in &files {
                            lock(file, libc::LOCK_UN);
                        }
                    }
                })
            })
            .collect();
        let pid = std::process::id();
        let keys = HashSet::from([key]);
        let started = Instant::now();
        let (mut reads, mut missed) = (0u32, 0u32);
        // Bounded in time for the unit-test phase (10 s, or up to 120 s for the first ten
        // reads on a machine so busy that a read of the table takes seconds); the integration
        // tests `busy_lock_table` churn the table for longer through `status`, `list` and the
        // `--limit` check.
        let enough = |reads: u32, elapsed: Duration| {
            reads >= 3000
                || elapsed >= Duration::from_secs(120)
                || (reads >= 10 && elapsed >= Duration::from_secs(10))
        };
        while !enough(reads, started.elapsed()) {
            reads += 1;
            match ProcLocks::read(&keys) {
                Ok(locks) if locks.holder(key, Some(pid)) == Some(pid) => {}
                _ => missed += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        for churner in churners {
            let _ = churner.join();
        }
        assert_eq!(missed, 0, "{missed} of {reads} reads missed a held lock");
        assert!(reads >= 10, "only {reads} reads in the time given");
    }
}
