//! Opening the report file so that only the user and root decide where the record goes, and
//! appending to it so that a reader sees whole lines only.
//!
//! The path is walked one component at a time from `/` (or the working directory), each
//! directory opened `O_PATH | O_NOFOLLOW` relative to the one before it (`openat`), so that
//! what was checked is what is used:
//!
//! - Every directory on the way must be the user's or root's. One that others (group or
//!   world) can write to must have the sticky bit, as /tmp has, unless it is the report's own
//!   directory, where the file's own checks apply instead. Anyone else who owns a directory on
//!   the path, or can rename entries in one above the report's, could make the path lead to a
//!   directory of their choosing, where root would then create or append to the file.
//! - A symbolic link on the way is followed only if the user or root made it (/var/run ->
//!   /run, a user's own link to a home directory); its target is walked the same way, up to
//!   the kernel's 40 links.
//! - The file itself is never a symbolic link (`O_NOFOLLOW`), is opened `O_NONBLOCK` so that a
//!   FIFO cannot hang dlock, must be a regular file, and in a directory others can write to must
//!   be the user's or root's with a single link. A missing file is created 0600.
//!
//! Appending: each record is one `write` on the `O_APPEND` descriptor, under a `flock` of the
//! file that dlock's writers take for the moment of the write. Under it, a line torn earlier
//! is ended before the record is written, and a record that did not fit whole (a full disk, a
//! file size limit) is cut back off, so the file holds each record whole or not at all.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::kit::flock::flock;

/// The kernel's bound on the symbolic links followed in one path (beyond it, `ELOOP`).
const MAX_LINKS: usize = 40;

/// How long a record waits for another writer's `flock` on the report: dlock's writers hold it
/// for one `write`; a lock held longer is someone else's, and the record is written without it.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// An opened report file.
pub(in crate::run) struct Report {
    file: File,
    /// Opened for reading too, so that its last byte can be looked at.
    readable: bool,
}

/// Open `path` for appending (see the module doc). The error says why not, without the path
/// as given (the caller names the setting).
pub(super) fn open(path: &Path) -> Result<Report, String> {
    let last = path
        .as_os_str()
        .as_bytes()
        .rsplit(|&b| b == b'/')
        .next()
        .unwrap_or_default();
    if matches!(last, b"" | b"." | b"..") {
        return Err("it names a directory, not a file".into());
    }
    let (dir, name) = walk_to_directory(path)?;
    dir.open_file(&name)
}

/// The directory `path`'s last component is in, opened and checked, and that component.
fn walk_to_directory(path: &Path) -> Result<(Dir, OsString), String> {
    let mut dir = if path.is_absolute() {
        Dir::root()?
    } else {
        Dir::working()?
    };
    let mut pending = VecDeque::new();
    push_front(&mut pending, path);
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if pending.is_empty() && name != ".." {
            return Ok((dir, name));
        }
        dir.check_leads_on()?;
        let entry = dir.path.join(&name);
        let stat = nix::sys::stat::fstatat(&dir.fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| cannot_open(&entry, e))?;
        match file_type(&stat) {
            SFlag::S_IFDIR => dir = dir.enter(&name)?,
            SFlag::S_IFLNK => {
                if !trusted_owner(stat.st_uid) {
                    return Err(someone_elses(&entry, "a symbolic link", stat.st_uid));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(cannot_open(&entry, Errno::ELOOP));
                }
                let target = nix::fcntl::readlinkat(&dir.fd, name.as_os_str())
                    .map_err(|e| cannot_open(&entry, e))?;
                if target.is_empty() {
                    return Err(cannot_open(&entry, Errno::ENOENT));
                }
                let target = PathBuf::from(target);
                if target.is_absolute() {
                    dir = Dir::root()?;
                }
                push_front(&mut pending, &target);
            }
            _ => return Err(cannot_open(&entry, Errno::ENOTDIR)),
        }
    }
    Err("it names a directory, not a file".into())
}

/// Put `path`'s components (but `/` and `.`) before those still to be walked.
fn push_front(pending: &mut VecDeque<OsString>, path: &Path) {
    for component in path.components().rev() {
        match component {
            Component::Normal(name) => pending.push_front(name.to_owned()),
            Component::ParentDir => pending.push_front("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

/// A directory on the report's path, opened `O_PATH` (enough to look up and open entries in
/// it, and allowed where the user may search but not list it), and checked.
struct Dir {
    fd: OwnedFd,
    /// For messages: the path walked so far, with links resolved.
    path: PathBuf,
    stat: FileStat,
}

impl Dir {
    const FLAGS: OFlag = OFlag::O_PATH
        .union(OFlag::O_DIRECTORY)
        .union(OFlag::O_NOFOLLOW)
        .union(OFlag::O_CLOEXEC);

    fn root() -> Result<Dir, String> {
        let path = PathBuf::from("/");
        let fd =
            nix::fcntl::open("/", Dir::FLAGS, Mode::empty()).map_err(|e| cannot_open(&path, e))?;
        Dir::checked(fd, path)
    }

    /// The working directory: what a relative path starts from, whatever leads to it.
    fn working() -> Result<Dir, String> {
        let path = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let fd =
            nix::fcntl::open(".", Dir::FLAGS, Mode::empty()).map_err(|e| cannot_open(&path, e))?;
        Dir::checked(fd, path)
    }

    /// The directory `name` in this one (not following a link).
    fn enter(self, name: &OsStr) -> Result<Dir, String> {
        let mut path = self.path;
        if name == ".." && path.file_name().is_some() {
            path.pop();
        } else {
            path.push(name);
        }
        let fd = nix::fcntl::openat(&self.fd, name, Dir::FLAGS, Mode::empty())
            .map_err(|e| cannot_open(&path, e))?;
        Dir::checked(fd, path)
    }

    fn checked(fd: OwnedFd, path: PathBuf) -> Result<Dir, String> {
        let stat = nix::sys::stat::fstat(&fd).map_err(|e| cannot_open(&path, e))?;
        if file_type(&stat) != SFlag::S_IFDIR {
            return Err(cannot_open(&path, Errno::ENOTDIR));
        }
        if !trusted_owner(stat.st_uid) {
            return Err(someone_elses(&path, "a directory", stat.st_uid));
        }
        Ok(Dir { fd, path, stat })
    }

    /// Others (group or world) can create entries here.
    fn shared(&self) -> bool {
        self.stat.st_mode & 0o022 != 0
    }

    /// The path goes on below this directory: no one else may rename or replace its entries.
    fn check_leads_on(&self) -> Result<(), String> {
        let mode = self.stat.st_mode & 0o7777;
        if self.shared() && mode & libc::S_ISVTX == 0 {
            return Err(format!(
                "refusing to use it: others can write to {} (mode {mode:04o}) and it has no \
                 sticky bit, so they could replace what the path goes through there; put the \
                 report where only you and root can write on the way, or add the sticky bit \
                 (chmod +t)",
                self.path.display()
            ));
        }
        Ok(())
    }

    /// Open the report file `name` in this directory.
    fn open_file(&self, name: &OsStr) -> Result<Report, String> {
        let flags = OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(0o600);
        let opened = match nix::fcntl::openat(&self.fd, name, flags | OFlag::O_RDWR, mode) {
            Err(Errno::EACCES) => nix::fcntl::openat(&self.fd, name, flags | OFlag::O_WRONLY, mode)
                .map(|fd| (fd, false)),
            opened => opened.map(|fd| (fd, true)),
        };
        let (fd, readable) = opened.map_err(|e| self.refusal(name, e))?;
        let stat = nix::sys::stat::fstat(&fd).map_err(|e| format!("cannot inspect it: {e}"))?;
        if file_type(&stat) != SFlag::S_IFREG {
            return Err("it is not a regular file".into());
        }
        self.check_file(&stat)?;
        Ok(Report {
            file: File::from(fd),
            readable,
        })
    }

    /// Why the file `name` could not be opened, saying what is in the way where that is known.
    fn refusal(&self, name: &OsStr, err: Errno) -> String {
        match err {
            Errno::ELOOP => return "refusing to follow a symbolic link".into(),
            Errno::ENXIO => return "it is not a regular file".into(),
            // Another user's file in a sticky directory (fs.protected_regular), or a file the
            // user may not write: say whose it is where that is the reason.
            Errno::EACCES => {
                if let Ok(stat) =
                    nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                {
                    if let Err(why) = self.check_file(&stat) {
                        return why;
                    }
                }
            }
            _ => {}
        }
        format!(
            "cannot open it for appending: {}",
            std::io::Error::from(err)
        )
    }

    /// In a directory others can write to, only the user's or root's file with one link.
    fn check_file(&self, stat: &FileStat) -> Result<(), String> {
        if !self.shared() {
            return Ok(());
        }
        if !trusted_owner(stat.st_uid) {
            return Err(format!(
                "it is owned by uid {} in {}, where others can create files; only your own or \
                 root's file is used there, so anyone who creates it first stops your runs: \
                 keep reports in a directory only you and root can write to",
                stat.st_uid,
                self.path.display()
            ));
        }
        if stat.st_nlink > 1 {
            return Err(format!(
                "it has {} hard links, so writing it would change another file",
                stat.st_nlink
            ));
        }
        Ok(())
    }
}

impl Report {
    /// Append `line` (ending in a newline) whole or not at all; the error says what went wrong
    /// and what the file holds now.
    pub(super) fn append(&self, line: &[u8]) -> Result<(), String> {
        let _lock = AppendLock::take(&self.file);
        let ended;
        let line = if self.readable && !self.ends_a_line() {
            // A line torn earlier (a crash, a record that could not be cut back) ends here, so
            // that this record is a line of its own.
            ended = [b"\n", line].concat();
            &ended[..]
        } else {
            line
        };
        match (&self.file).write(line) {
            Ok(n) if n == line.len() => Ok(()),
            Ok(n) => Err(self.cut_back(n, line.len())),
            Err(err) => Err(err.to_string()),
        }
    }

    /// Whether the file is empty or its last byte ends a line (or that cannot be read).
    fn ends_a_line(&self) -> bool {
        let Ok(len) = self.file.metadata().map(|m| m.len()) else {
            return true;
        };
        let mut last = [0u8];
        len == 0 || !matches!(self.file.read_at(&mut last, len - 1), Ok(1) if last[0] != b'\n')
    }

    /// Remove the `written` bytes of a `len`-byte line that did not fit.
    fn cut_back(&self, written: usize, len: usize) -> String {
        let short = format!("only {written} of {len} bytes fit (is the disk full?)");
        // The descriptor's offset is where this write ended (O_APPEND moves it there).
        let end = (&self.file).stream_position();
        let size = self.file.metadata().map(|m| m.len());
        match (end, size) {
            (Ok(end), Ok(size)) if end == size && end >= written as u64 => {
                match self.file.set_len(end - written as u64) {
                    Ok(()) => format!("{short}; they were removed"),
                    Err(err) => format!(
                        "{short}, and removing them failed ({err}): the file ends with a part \
                         of the record, and the next record starts on a new line"
                    ),
                }
            }
            _ => format!("{short}, and another writer appended after them"),
        }
    }
}

/// dlock's writers' `flock` on the report, for the moment of one append; released on drop.
struct AppendLock<'a>(Option<&'a File>);

impl<'a> AppendLock<'a> {
    /// Take the lock, waiting at most [`LOCK_PATIENCE`]; without it (someone else holds it
    /// that long, or the file system has no `flock`) the record is written all the same.
    fn take(file: &'a File) -> AppendLock<'a> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        // Bounded in count as in time: 200 pauses of at most 20 ms are well past the patience.
        for _ in 0..200 {
            match flock(file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => return AppendLock(Some(file)),
                Err(err) if err.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
                Err(_) => break,
            }
            if started.elapsed() >= LOCK_PATIENCE {
                break;
            }
            // The writers hold it for one write: a short pause, doubling up to 20 ms.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        tracing::debug!("writing the report without its lock");
        AppendLock(None)
    }
}

impl Drop for AppendLock<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.0 {
            let _ = flock(file, libc::LOCK_UN);
        }
    }
}

/// The user and root are trusted; anyone else is not.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::getuid().as_raw()
}

fn file_type(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

fn cannot_open(path: &Path, err: Errno) -> String {
    format!(
        "cannot open it for appending: {}: {}",
        path.display(),
        std::io::Error::from(err)
    )
}

/// `path`, `what` (a directory or a symbolic link), is another user's.
fn someone_elses(path: &Path, what: &str, uid: u32) -> String {
    format!(
        "refusing to use it: {} is {what} owned by uid {uid}, who could make the path lead \
         elsewhere; only directories and symbolic links of yours (uid {}) or root's are \
         followed to a report",
        path.display(),
        nix::unistd::getuid()
    )
}
