//! The hold on a lock file, and how its loss is noticed. A kernel lock has no lease to renew:
//! the hold lasts as long as the descriptor is open, and it counts as lost when the file is
//! deleted or replaced (a new run would lock another inode). That is checked once a second
//! at first, then watched with inotify (see [`FileLease::lost`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;

use crate::clock::{sleep_until, BootInstant, Readable};
use crate::error::Error;
use crate::kit::lock_dir::LockDir;
use crate::lock::{Holder, Lease, Lost, Record};

use super::slot::{write_at, HEADER_LEN};

const RECHECK_EVERY: Duration = Duration::from_secs(5);
/// How long a hold is checked by polling before an inotify watch is set up.
const WATCH_AFTER: Duration = Duration::from_secs(2);

/// A held file lock. Dropping it (or dlock dying) releases it.
pub struct FileLease {
    file: File,
    path: PathBuf,
    token: u64,
    /// Set up lazily: see [`FileLease::lost`].
    watch: Option<AsyncFd<Readable<Inotify>>>,
    acquired: BootInstant,
    /// The `--limit` recorded with the hold (rewritten by [`Lease::finished`]).
    limit: u32,
    /// A shared hold: its record is not in the lock file, which other holders share.
    shared: bool,
    /// A shared hold's own record file, removed on release (none where it could not be
    /// created).
    reader: Option<ReaderRecord>,
}

/// Where a shared holder keeps its record (`slot::reader_file_name`).
pub(super) struct ReaderRecord {
    pub(super) dir: LockDir,
    pub(super) name: String,
    pub(super) file: File,
}

impl FileLease {
    /// The hold on `file` (locked, at `path`) with fencing token `token`, starting now.
    pub(super) fn new(file: File, path: PathBuf, token: u64, limit: u32) -> FileLease {
        FileLease {
            file,
            path,
            token,
            watch: None,
            acquired: BootInstant::now(),
            limit,
            shared: false,
            reader: None,
        }
    }

    /// The same for a shared hold whose record is in `reader`, if it has one.
    pub(super) fn shared(
        file: File,
        path: PathBuf,
        token: u64,
        reader: Option<ReaderRecord>,
    ) -> FileLease {
        FileLease {
            shared: true,
            reader,
            ..FileLease::new(file, path, token, 1)
        }
    }

    fn check(&self) -> Option<Lost> {
        match same_file(&self.file, &self.path) {
            Ok(true) => None,
            Ok(false) => Some(Lost::gone(format!(
                "lock file {} was deleted or replaced",
                self.path.display()
            ))),
            Err(e) => {
                tracing::debug!("cannot check {}: {e}", self.path.display());
                None
            }
        }
    }
}

impl Lease for FileLease {
    fn token(&self) -> u64 {
        self.token
    }

    /// Checked once a second during the first `WATCH_AFTER`, then watched with inotify (and
    /// re-checked every `RECHECK_EVERY`). The watch is not set up at once because closing an
    /// inotify descriptor waits for a kernel grace period (≈10 ms), which would double the cost
    /// of a short command.
    async fn lost(&mut self) -> Lost {
        loop {
            if let Some(lost) = self.check() {
                return lost;
            }
            let now = BootInstant::now();
            if self.watch.is_none() && now >= self.acquired + WATCH_AFTER {
                self.watch = watch_file(&self.path)
                    .map_err(|e| {
                        tracing::debug!(
                            "cannot watch {} ({e}); checking it periodically",
                            self.path.display()
                        )
                    })
                    .ok();
                // A change between the check above and the watch would be missed: check again.
                continue;
            }
            match &self.watch {
                Some(watch) => {
                    tokio::select! {
                        ready = watch.readable() => {
                            if let Ok(mut guard) = ready {
                                let _ = guard.get_inner().0.read_events();
                                guard.clear_ready();
                            }
                        }
                        _ = sleep_until(now + RECHECK_EVERY) => {}
                    }
                }
                None => sleep_until(now + Duration::from_secs(1)).await,
            }
        }
    }

    /// The record follows the header in every slot file; the header (slot 0's fencing
    /// counter) is not touched, so this needs no lock beyond the hold itself.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let record = Record {
            holder: Holder {
                ttl_ms: 0,
                ..holder.clone()
            },
            limit: self.limit,
        };
        let mut body =
            serde_json::to_string(&record).map_err(|e| Error::Internal(e.to_string()))?;
        body.push('\n');
        let io_err = |e: io::Error| Error::from_lock_io_at("cannot write", &self.path, &e);
        // A shared holder's record is in its own file, behind the same kind of header, or
        // nowhere.
        let file = match (&self.reader, self.shared) {
            (Some(reader), _) => &reader.file,
            (None, true) => return Ok(false),
            (None, false) => &self.file,
        };
        write_at(file, HEADER_LEN as u64, body.as_bytes()).map_err(io_err)?;
        file.set_len((HEADER_LEN + body.len()) as u64)
            .map_err(io_err)?;
        Ok(true)
    }

    async fn release(self) -> Result<(), Error> {
        // Closing drops the flock. The metadata stays behind: `status` shows a holder only when
        // /proc/locks confirms its pid still holds the file.
        drop(self.file);
        // A shared holder's record file is its own (named by its pid): nobody else removes it.
        if let Some(reader) = self.reader {
            if let Err(e) = reader.dir.remove(&reader.name) {
                tracing::debug!(
                    "cannot remove {}: {e}",
                    reader.dir.path_of(&reader.name).display()
                );
            }
            remove_dead_readers(&reader.dir, &reader.name);
        }
        Ok(())
    }
}

/// Remove the record files of this lock's shared holders whose process is gone (killed
/// before it could remove its own): one `<stem>.<pid>.reader` is left by each, and nothing
/// else would ever remove it. `ours` is our own record's name. Best effort: a file another
/// user's directory permissions protect stays.
fn remove_dead_readers(dir: &LockDir, ours: &str) {
    let Some(stem) = ours
        .strip_suffix(".reader")
        .and_then(|rest| rest.rsplit_once('.'))
        .map(|(stem, _)| stem)
    else {
        return;
    };
    let Ok(entries) = dir.entries() else {
        return;
    };
    for name in entries {
        let pid = name
            .strip_prefix(stem)
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|rest| rest.strip_suffix(".reader"))
            .and_then(|pid| pid.parse::<i32>().ok());
        let Some(pid) = pid.filter(|&pid| pid > 0) else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if gone {
            if let Err(e) = dir.remove(&name) {
                tracing::debug!("cannot remove {}: {e}", dir.path_of(&name).display());
            }
        }
    }
}

/// Whether `file` is still the file at `path`, as a new run would find it.
fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    let held = file.metadata()?;
    if held.nlink() == 0 {
        return Ok(false);
    }
    match std::fs::symlink_metadata(path) {
        Ok(on_disk) => Ok(on_disk.dev() == held.dev() && on_disk.ino() == held.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn watch_file(path: &Path) -> io::Result<AsyncFd<Readable<Inotify>>> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(
        path,
        AddWatchFlags::IN_ATTRIB | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF,
    )?;
    Readable::register(inotify)
}
