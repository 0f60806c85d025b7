//! The lock directory and its lock files, opened so that nobody else can redirect dlock's
//! writes or make it hang (docs/backends/file.md); and dlock's own directory, where the file
//! backend keeps its locks without `--url` and the host-local queues keep their tickets.
//!
//! - The base directory is opened once. The `--prefix` sub-directory and every lock file are
//!   opened relative to it (`openat`) with `O_NOFOLLOW`, so swapping a directory or a file for
//!   a symbolic link after it was checked cannot make dlock write elsewhere.
//! - Each directory (the base and the prefix directory) must be owned by the user or root, and
//!   one that others (group or world) can write to must have the sticky bit, as /tmp does, so
//!   that they cannot rename or replace the user's entries. dlock's default directory must be
//!   the user's and writable by no one else; one another user made first is refused, naming
//!   them and `DLOCK_DIR` ([`default_dir`] says why it is not exchanged for another). A symbolic link as the base itself is followed
//!   only if the user or root made it.
//! - Lock files are opened `O_NONBLOCK` and must be regular files: a FIFO, socket, device or
//!   directory in their place is refused at once instead of blocking `open` or `read`.
//! - In a shared directory (one others can write to), a lock file is used only if the user or
//!   root owns it, no one else can write to it and it has a single link: anyone else could have
//!   planted it to rewind the fencing counter, forge a holder, or (as a hard link to another
//!   file) make dlock write into that file.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, FcntlArg, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::error::Error;

mod default;

pub use self::default::default_dir;

/// What a message about a lock file that users tried to share adds: the way that works.
const SHARING: &str = "; to share a lock between users, root makes the directory and the lock \
    file for their group (docs/backends/file.md: locks shared between users)";

/// An open lock directory: the base, or the `--prefix` directory in it.
pub(crate) struct LockDir {
    fd: OwnedFd,
    path: PathBuf,
    /// Others (group or world) can create entries in it.
    shared: bool,
}

impl LockDir {
    /// Open `base`, or `base/sub` when `sub` is given, after checking who controls them (see
    /// the module doc). With `create`, missing directories are made (mode 0700); without it,
    /// `None` means one does not exist (so there are no locks). `private`: dlock chose `base`
    /// itself, so it must be the user's alone.
    pub(crate) fn open(
        base: &Path,
        private: bool,
        sub: Option<&str>,
        create: bool,
    ) -> Result<Option<LockDir>, Error> {
        if private {
            // Whatever another user put at dlock's own directory is theirs: say so first.
            if let Ok(meta) = std::fs::symlink_metadata(base) {
                if meta.uid() != nix::unistd::getuid().as_raw() {
                    return Err(made_by_another_user(base, meta.uid()));
                }
            }
        }
        if create {
            if let Err(err) = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(base)
            {
                return Err(Error::from_lock_io_at(
                    "cannot create lock directory",
                    base,
                    &err,
                ));
            }
        }
        let Some(fd) = open_base(base, private)? else {
            return Ok(None);
        };
        let stat = fstat(&fd, base)?;
        check_dir(&stat, base, private)?;
        let Some(sub) = sub else {
            return Ok(Some(LockDir {
                fd,
                path: base.to_owned(),
                shared: writable_by_others(&stat),
            }));
        };
        let path = base.join(sub);
        if create {
            match nix::sys::stat::mkdirat(&fd, sub, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => {
                    return Err(Error::from_lock_io_at(
                        "cannot create lock directory",
                        &path,
                        &std::io::Error::from(e),
                    ))
                }
            }
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let sub_fd = match nix::fcntl::openat(&fd, sub, flags, Mode::empty()) {
            Ok(sub_fd) => sub_fd,
            Err(Errno::ENOENT) if !create => return Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                let kind = nix::sys::stat::fstatat(&fd, sub, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_or("file", |s| kind(&s));
                return Err(Error::CantCreate(format!(
                    "refusing to use lock directory {}: it is a {kind}, not a directory",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(Error::from_lock_io_at(
                    "cannot open lock directory",
                    &path,
                    &std::io::Error::from(e),
                ))
            }
        };
        let stat = fstat(&sub_fd, &path)?;
        check_dir(&stat, &path, false)?;
        Ok(Some(LockDir {
            fd: sub_fd,
            path,
            shared: writable_by_others(&stat),
        }))
    }

    /// The path of the entry `name`, for messages and for watching it.
    pub(crate) fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Open the lock file `name` for reading and writing, creating it if missing.
    pub(crate) fn open_lock_file(&self, name: &str) -> Result<File, Error> {
        // A new file in a shared directory must be writable by its owner alone to be trusted
        // later; elsewhere the umask decides, so that an administrator can share lock files.
        let mode = if self.shared { 0o644 } else { 0o666 };
        let file = self.open_file(name, OFlag::O_RDWR | OFlag::O_CREAT, mode)?;
        file.ok_or_else(|| {
            Error::CantCreate(format!(
                "lock file {} vanished as it was created",
                self.path_of(name).display()
            ))
        })
    }

    /// Open the existing lock file `name` for reading and writing; `None` when there is none.
    pub(crate) fn open_existing_lock_file(&self, name: &str) -> Result<Option<File>, Error> {
        self.open_file(name, OFlag::O_RDWR, 0)
    }

    /// Open the existing lock file `name` for reading; `None` when there is none.
    pub(crate) fn read_lock_file(&self, name: &str) -> Result<Option<File>, Error> {
        self.open_file(name, OFlag::O_RDONLY, 0)
    }

    fn open_file(&self, name: &str, access: OFlag, mode: u32) -> Result<Option<File>, Error> {
        let path = self.path_of(name);
        // O_NONBLOCK: opening a FIFO must not wait for a writer. O_NOCTTY: a terminal planted
        // here must not become ours.
        let flags =
            access | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        let fd = match nix::fcntl::openat(&self.fd, name, flags, Mode::from_bits_truncate(mode)) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if !access.contains(OFlag::O_CREAT) => return Ok(None),
            Err(Errno::ELOOP) => {
                return Err(Error::CantCreate(format!(
                    "refusing to follow a symbolic link at {}",
                    path.display()
                )))
            }
            Err(e) => {
                // EISDIR, ENXIO (a socket), or EACCES for another user's file in a sticky
                // directory (fs.protected_regular, protected_fifos): say what is in the way.
                if let Ok(stat) =
                    nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                {
                    if file_type(&stat) != SFlag::S_IFREG {
                        return Err(not_regular(&path, &stat));
                    }
                    self.check_trusted(&stat, &path)?;
                }
                let err = std::io::Error::from(e);
                return Err(
                    match Error::from_lock_io_at("cannot open lock file", &path, &err) {
                        Error::Permission(said) => Error::Permission(format!("{said}{SHARING}")),
                        other => other,
                    },
                );
            }
        };
        let stat = fstat(&fd, &path)?;
        if file_type(&stat) != SFlag::S_IFREG {
            return Err(not_regular(&path, &stat));
        }
        self.check_trusted(&stat, &path)?;
        // Regular files never block; clear the flag anyway so nothing later depends on it.
        let cleared = nix::fcntl::fcntl(&fd, FcntlArg::F_GETFL).and_then(|flags| {
            let flags = OFlag::from_bits_truncate(flags) - OFlag::O_NONBLOCK;
            nix::fcntl::fcntl(&fd, FcntlArg::F_SETFL(flags))
        });
        if let Err(e) = cleared {
            return Err(Error::from_lock_io_at(
                "cannot set up",
                &path,
                &std::io::Error::from(e),
            ));
        }
        Ok(Some(File::from(fd)))
    }

    /// In a shared directory, only the user's or root's lock files that no one else can write
    /// and that have one link are used (see the module doc).
    fn check_trusted(&self, stat: &FileStat, path: &Path) -> Result<(), Error> {
        if !self.shared {
            return Ok(());
        }
        let refuse = |why: String| {
            Err(Error::CantCreate(format!(
                "refusing to use lock file {}: {why}, in {} where others can create files; \
                 only your own or root's lock files, writable only by their owner, are used \
                 there{SHARING}",
                path.display(),
                self.path.display()
            )))
        };
        if !trusted_owner(stat.st_uid) {
            return refuse(format!("it is owned by uid {}", stat.st_uid));
        }
        if stat.st_mode & 0o022 != 0 {
            return refuse(format!(
                "others can write to it (mode {:04o})",
                stat.st_mode & 0o7777
            ));
        }
        if stat.st_nlink > 1 {
            return refuse(format!(
                "it has {} hard links, so writing it would change another file",
                stat.st_nlink
            ));
        }
        Ok(())
    }

    /// (device, inode) of the entry `name` (not following a link); `None` when it is gone.
    pub(crate) fn identity(&self, name: &str) -> io::Result<Option<(u64, u64)>> {
        match nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some((stat.st_dev, stat.st_ino))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether `file` is still the entry `name` (it was not deleted or replaced).
    pub(crate) fn is_current(&self, file: &File, name: &str) -> io::Result<bool> {
        let held = file.metadata()?;
        if held.nlink() == 0 {
            return Ok(false);
        }
        Ok(self.identity(name)? == Some((held.dev(), held.ino())))
    }

    /// The names in the directory.
    pub(crate) fn entries(&self) -> Result<Vec<String>, Error> {
        // Through /proc the listing is of this very directory, whatever happened to its path
        // since; the path is only a fallback (names alone cannot redirect anything).
        let entries = std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .or_else(|_| std::fs::read_dir(&self.path))
            .map_err(|e| Error::from_lock_io_at("cannot read", &self.path, &e))?;
        Ok(entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }

    pub(crate) fn remove(&self, name: &str) -> io::Result<()> {
        nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(io::Error::from)
    }

    /// Remove the directory `name` in this one if it is empty (the kernel checks, atomically
    /// with the removal); `Ok(false)` when it is not empty or gone.
    pub(crate) fn remove_empty_dir(&self, name: &str) -> io::Result<bool> {
        match nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether this directory has been removed (a file can no longer be created in it).
    pub(crate) fn is_removed(&self) -> bool {
        nix::sys::stat::fstat(&self.fd).is_ok_and(|stat| stat.st_nlink == 0)
    }

    pub(crate) fn statfs(&self) -> Option<nix::sys::statfs::Statfs> {
        nix::sys::statfs::fstatfs(&self.fd).ok()
    }
}

/// Open the base directory; `None` when it does not exist.
fn open_base(base: &Path, private: bool) -> Result<Option<OwnedFd>, Error> {
    // Whoever made a symbolic link here chooses where the locks go: follow only the user's or
    // root's (e.g. /var/lock -> /run/lock), and never in dlock's own directory.
    if let Ok(meta) = std::fs::symlink_metadata(base) {
        if meta.file_type().is_symlink() && (private || !trusted_owner(meta.uid())) {
            return Err(Error::CantCreate(format!(
                "refusing to use lock directory {}: it is a symbolic link (owned by uid {}); \
                 remove it or choose another directory with --url file:///dir",
                base.display(),
                meta.uid()
            )));
        }
    }
    let mut flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if private {
        flags |= OFlag::O_NOFOLLOW;
    }
    match nix::fcntl::open(base, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e @ (Errno::ENOTDIR | Errno::ELOOP)) => Err(Error::CantCreate(format!(
            "refusing to use lock directory {}: {e}",
            base.display()
        ))),
        Err(e) => Err(Error::from_lock_io_at(
            "cannot open lock directory",
            base,
            &std::io::Error::from(e),
        )),
    }
}

/// Refuse a directory someone other than the user (or root) controls.
fn check_dir(stat: &FileStat, path: &Path, private: bool) -> Result<(), Error> {
    let uid = nix::unistd::getuid().as_raw();
    let mode = stat.st_mode & 0o7777;
    if private {
        if stat.st_uid != uid {
            return Err(made_by_another_user(path, stat.st_uid));
        }
        if mode & 0o022 != 0 {
            return Err(Error::CantCreate(format!(
                "refusing to use lock directory {}: it must be a directory owned by uid {uid} and writable only by it \
                 (owner uid {}, mode {mode:04o}); remove it or choose another with --url file:///dir",
                path.display(),
                stat.st_uid,
            )));
        }
        return Ok(());
    }
    if !trusted_owner(stat.st_uid) {
        return Err(Error::CantCreate(format!(
            "refusing to use lock directory {}: it is owned by uid {}, who could replace its lock files; \
             use a directory owned by you (uid {uid}) or root",
            path.display(),
            stat.st_uid
        )));
    }
    if writable_by_others(stat) && mode & libc::S_ISVTX == 0 {
        return Err(Error::CantCreate(format!(
            "refusing to use lock directory {}: others can write to it (mode {mode:04o}) and it has no sticky bit, \
             so they could rename or replace its lock files and sub-directories; add the sticky bit \
             (chmod +t) or use a directory only you can write to",
            path.display()
        )));
    }
    Ok(())
}

/// dlock's own directory `path` is another user's (`owner`'s): they made it, or a file or
/// link in its place, before the user did (in `/run/lock` or `/tmp` anyone can). It is never
/// used, and never exchanged for another directory (see [`default_dir`]).
fn made_by_another_user(path: &Path, owner: u32) -> Error {
    Error::CantCreate(format!(
        "refusing to use lock directory {}: another user (uid {owner}) made it before you \
         (uid {}) did, so they could fake or block your locks there; have root remove it, or \
         set DLOCK_DIR to a directory of your own for every run (in your crontab as in your \
         shell profile)",
        path.display(),
        nix::unistd::getuid()
    ))
}

/// The user and root are trusted; anyone else is not.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::getuid().as_raw()
}

fn writable_by_others(stat: &FileStat) -> bool {
    stat.st_mode & 0o022 != 0
}

fn fstat(fd: &OwnedFd, path: &Path) -> Result<FileStat, Error> {
    nix::sys::stat::fstat(fd).map_err(|e| Error::from_lock_io_at("cannot inspect", path, &e.into()))
}

fn file_type(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

fn kind(stat: &FileStat) -> &'static str {
    match file_type(stat) {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symbolic link",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        _ => "special file",
    }
}

fn not_regular(path: &Path, stat: &FileStat) -> Error {
    Error::CantCreate(format!(
        "refusing to use {} as a lock file: it is a {}, not a regular file",
        path.display(),
        kind(stat)
    ))
}
