//! Who holds and who waits for which lock file, read from `/proc/locks`: the kernel lists
//! flock(2) holders and blocked waiters by inode there, without disturbing them. `status`,
//! `list` and the `--limit` check believe a holder's recorded metadata only while this table
//! shows the same pid holding the file.

use std::collections::HashMap;

use crate::error::Error;

/// Holders and waiters of flock(2) locks, by (device, inode), from `/proc/locks`.
pub(crate) struct ProcLocks {
    pub(crate) holders: HashMap<(u64, u64), u32>,
    /// The pids blocked waiting, by file (a process waiting for any of N slots is listed
    /// under each).
    pub(crate) waiters: HashMap<(u64, u64), Vec<u32>>,
}

impl ProcLocks {
    pub(crate) fn read() -> Result<ProcLocks, Error> {
        let text = std::fs::read_to_string("/proc/locks")
            .map_err(|e| Error::Unavailable(format!("cannot read /proc/locks: {e}")))?;
        Ok(ProcLocks::parse(&text))
    }

    /// Lines look like `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF`, blocked waiters
    /// like `1: -> FLOCK  ADVISORY  WRITE 1235 fd:01:5678 0 EOF`; the device is `major:minor`
    /// in hex.
    fn parse(text: &str) -> ProcLocks {
        let mut locks = ProcLocks {
            holders: HashMap::new(),
            waiters: HashMap::new(),
        };
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
                locks.holders.insert(key, pid);
            }
        }
        locks
    }
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
    }
}
