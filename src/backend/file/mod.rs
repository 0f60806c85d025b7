//! The file backend: `flock(2)` on `<dir>/<encoded-name>.lock`. No server; the kernel frees
//! the lock the moment the holding dlock dies.
//!
//! Layout and invariants:
//!
//! - A lock file is `<stem>.lock`, where the stem is [`LockName::encoded`] (names longer than
//!   the file system allows are shortened and made unique with a SHA-256 suffix). Slot `i > 0`
//!   of a `--limit N` semaphore is `<stem>#i.lock`; `#` never occurs in an encoded name. A
//!   non-default `--prefix P` is the sub-directory `<dir>/<P>.d/`.
//! - Directories and lock files are opened as [`dir`] describes: relative to the checked
//!   directory, never following a link, never blocking on a FIFO, and only if nobody else
//!   could have planted them.
//! - Lock files are never unlinked (unlink-and-recreate lets two holders lock two different
//!   inodes). After locking, the (dev, inode) of the descriptor is compared with the directory
//!   entry; if the file was replaced meanwhile, we retry.
//! - Each file starts with a fixed-width header `fence NNNNNNNNNNNNNNNNNNNN\n`; in slot 0 it is
//!   the fencing counter of the name (design §5), updated under an OFD record lock on the
//!   header so that holders of different slots serialize. The next token is
//!   `max(counter + 1, microseconds since the epoch)`, so tokens keep increasing even if a
//!   crash lost the last update of the file; a counter that is unreadable or at `u64::MAX` is
//!   refused. The holder's metadata (JSON) follows the header; it is only believed while
//!   `/proc/locks` shows the same pid holding the file.
//! - Waiting blocks in the kernel (`flock(LOCK_EX)`) on helper threads, one per slot, so a
//!   release hands over without polling. The wait is cancelled by interrupting those threads
//!   with a private real-time signal.
//! - Who holds what is read from `/proc/locks`, which lists holders and blocked waiters by
//!   inode without disturbing them.
//! - A held lock counts as lost when its file is deleted or replaced: checked every second at
//!   first, then watched with inotify (see [`FileLease::lost`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

mod dir;
pub mod target;

pub use target::FileTarget;

use self::dir::LockDir;
use crate::clock::{sleep_until, BootInstant, Readable};
use crate::error::Error;
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, HolderStatus, Lease, LockName,
    LockStatus, Lost, Wait,
};

const HEADER_LEN: usize = 27;
const MAX_STEM: usize = 200;
/// Replacing the file under us repeatedly is an attack, not a race; give up after this many.
const MAX_INODE_RETRIES: u32 = 64;
const RECHECK_EVERY: Duration = Duration::from_secs(5);
/// How long a hold is checked by polling before an inotify watch is set up.
const WATCH_AFTER: Duration = Duration::from_secs(2);

/// What a holder writes after the header of its slot file.
#[derive(Serialize, Deserialize)]
struct Meta {
    #[serde(flatten)]
    holder: Holder,
    /// The `--limit` it holds with (0: not recorded, by an older dlock).
    #[serde(default)]
    limit: u32,
}

pub struct FileBackend {
    base: PathBuf,
    /// dlock chose the base directory itself (so it must be ours and private).
    default_dir: bool,
    /// The `--prefix` sub-directory (`<P>.d`) in `base`, unless the prefix is the default.
    sub: Option<String>,
    /// Where the lock files are, for messages.
    dir: PathBuf,
}

impl FileBackend {
    pub fn new(base: &Path, default_dir: bool, prefix: &str) -> FileBackend {
        let sub = (prefix != crate::lock::DEFAULT_PREFIX)
            .then(|| format!("{}.d", crate::lock::encode_component(prefix)));
        let dir = match &sub {
            Some(sub) => base.join(sub),
            None => base.to_owned(),
        };
        FileBackend {
            base: base.to_owned(),
            default_dir,
            sub,
            dir,
        }
    }

    /// Open the lock directory, creating it (mode 0700) if missing, after checking that
    /// nobody else controls it (see [`dir`]).
    fn prepare_dir(&self) -> Result<LockDir, Error> {
        LockDir::open(&self.base, self.default_dir, self.sub.as_deref(), true)?.ok_or_else(|| {
            Error::CantCreate(format!(
                "lock directory {} vanished as it was created",
                self.dir.display()
            ))
        })
    }

    /// Open the lock directory if it exists (checked as in [`FileBackend::prepare_dir`]).
    fn existing_dir(&self) -> Result<Option<LockDir>, Error> {
        LockDir::open(&self.base, self.default_dir, self.sub.as_deref(), false)
    }

    /// Slot files of `name` that exist, with their slot numbers.
    fn existing_slots(dir: &LockDir, name: &LockName) -> Result<Vec<(u32, String)>, Error> {
        let stem = stem(name);
        let mut slots = Vec::new();
        for entry in dir.entries()? {
            if let Some((entry_stem, slot)) = split_file_name(&entry) {
                if entry_stem == stem {
                    slots.push((slot, entry.clone()));
                }
            }
        }
        slots.sort();
        Ok(slots)
    }

    fn status_of(dir: &LockDir, name: &LockName, locks: &ProcLocks) -> Result<LockStatus, Error> {
        let mut holders = Vec::new();
        let mut waiters = 0;
        let mut last_token = None;
        for (slot, file_name) in Self::existing_slots(dir, name)? {
            let Some(file) = dir.read_lock_file(&file_name)? else {
                continue;
            };
            let Ok(stat) = file.metadata() else {
                continue;
            };
            let key = (stat.dev(), stat.ino());
            let (header, meta) = read_contents(file);
            let holder = meta.map(|m| m.holder);
            if slot == 0 {
                last_token = header.filter(|t| *t > 0);
            }
            waiters += locks.waiters.get(&key).copied().unwrap_or(0);
            if let Some(&pid) = locks.holders.get(&key) {
                let holder = holder.filter(|h| h.pid == pid).unwrap_or_else(|| Holder {
                    name: name.to_string(),
                    pid,
                    ..Holder::default()
                });
                holders.push(HolderStatus {
                    holder,
                    ttl_left_ms: None,
                    session: None,
                });
            }
        }
        Ok(LockStatus {
            name: name.to_string(),
            held: !holders.is_empty(),
            holders,
            waiters: Some(waiters),
            queue: Vec::new(),
            last_token,
        })
    }

    fn describe_holders(dir: &LockDir, name: &LockName) -> String {
        match ProcLocks::read().and_then(|locks| Self::status_of(dir, name, &locks)) {
            Ok(status) if status.held => {
                let who: Vec<String> = status
                    .holders
                    .iter()
                    .map(|h| format!("pid {}{}", h.holder.pid, since_suffix(&h.holder)))
                    .collect();
                format!(" by {}", who.join(", "))
            }
            _ => String::new(),
        }
    }
}

fn since_suffix(holder: &Holder) -> String {
    if holder.since.is_empty() {
        String::new()
    } else {
        format!(" since {}", holder.since)
    }
}

/// The file-name stem of a lock name.
fn stem(name: &LockName) -> String {
    let encoded = name.encoded();
    if encoded.len() <= MAX_STEM {
        return encoded;
    }
    let digest = Sha256::digest(name.as_str().as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    // The encoding is ASCII, so any byte index is a char boundary.
    format!("{}~{hex}", &encoded[..120])
}

/// The file name of slot `slot` of the lock whose file-name stem is `stem`.
fn slot_file_name(stem: &str, slot: u32) -> String {
    if slot == 0 {
        format!("{stem}.lock")
    } else {
        format!("{stem}#{slot}.lock")
    }
}

/// `<stem>.lock` → (stem, 0); `<stem>#N.lock` → (stem, N).
fn split_file_name(file_name: &str) -> Option<(&str, u32)> {
    let base = file_name.strip_suffix(".lock")?;
    match base.rsplit_once('#') {
        Some((stem, slot)) => {
            let slot: u32 = slot.parse().ok()?;
            (!stem.is_empty() && slot > 0).then_some((stem, slot))
        }
        None => (!base.is_empty()).then_some((base, 0)),
    }
}

/// Read the header token and the holder metadata of an open lock file (either may be missing).
fn read_contents(file: File) -> (Option<u64>, Option<Meta>) {
    let mut text = String::new();
    if file.take(64 * 1024).read_to_string(&mut text).is_err() {
        return (None, None);
    }
    let header = parse_header(text.as_bytes());
    let holder = text
        .get(HEADER_LEN..)
        .and_then(|rest| serde_json::from_str::<Meta>(rest.trim()).ok());
    (header, holder)
}

/// The token in a header: exactly `fence `, 20 decimal digits and a newline.
fn parse_header(bytes: &[u8]) -> Option<u64> {
    let digits = bytes
        .get(..HEADER_LEN)?
        .strip_prefix(b"fence ")?
        .strip_suffix(b"\n")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // 20 digits can exceed u64::MAX; parse refuses that.
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn header(token: u64) -> String {
    format!("fence {token:020}\n")
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

fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Take or drop a blocking OFD write lock on the header of `file`.
fn header_lock(file: &File, lock: bool) -> io::Result<()> {
    // SAFETY: a zeroed flock struct is a valid starting value; fcntl reads it only.
    let mut range: libc::flock = unsafe { std::mem::zeroed() };
    range.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    range.l_whence = libc::SEEK_SET as libc::c_short;
    range.l_start = 0;
    range.l_len = HEADER_LEN as libc::off_t;
    loop {
        // SAFETY: F_OFD_SETLKW with a pointer to a live, initialised flock struct.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &range) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn write_at(file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, offset)
}

impl Backend for FileBackend {
    type Lease = FileLease;

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<FileLease, Error> {
        let dir = self.prepare_dir()?;
        let deadline = match request.wait {
            Wait::No => None,
            Wait::For(d) => Some(BootInstant::now() + d),
            Wait::Forever => None,
        };
        let stem = stem(&request.name);
        for _ in 0..MAX_INODE_RETRIES {
            let mut files = Vec::with_capacity(request.limit as usize);
            let mut taken = None;
            for slot in 0..request.limit {
                let file_name = slot_file_name(&stem, slot);
                let file = dir.open_lock_file(&file_name)?;
                match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                    Ok(()) => {
                        taken = Some((slot, file, file_name));
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                        files.push((slot, file, file_name))
                    }
                    Err(e) => {
                        return Err(Error::from_lock_io(
                            format!("cannot lock {}", dir.path_of(&file_name).display()),
                            &e,
                        ))
                    }
                }
            }
            let (slot, file, file_name) = match taken {
                Some(taken) => taken,
                None => {
                    // Refuse a mismatched --limit at once rather than after the wait.
                    check_limits(&dir, request, &stem, None)?;
                    if request.wait == Wait::No {
                        return Err(busy(
                            request,
                            &Self::describe_holders(&dir, &request.name),
                            "not waiting (--no-wait)",
                        ));
                    }
                    let mut blocked = BlockedWait::start(files);
                    let outcome = tokio::select! {
                        got = blocked.first() => got,
                        _ = cancel.cancelled() => Err(Error::Cancelled),
                        _ = sleep_until(deadline.unwrap_or(BootInstant::now())), if deadline.is_some() => {
                            let waited = match request.wait { Wait::For(d) => d, _ => Duration::ZERO };
                            Err(busy(
                                request,
                                &Self::describe_holders(&dir, &request.name),
                                &format!("gave up after waiting {} (--wait)", humantime::format_duration(waited)),
                            ))
                        }
                    };
                    let won = outcome.as_ref().ok().map(|(slot, _, _)| *slot);
                    blocked.stop(won);
                    outcome?
                }
            };
            match dir.is_current(&file, &file_name) {
                Ok(true) => return Self::start_hold(&dir, request, &stem, slot, file, &file_name),
                Ok(false) => {
                    tracing::debug!(
                        "{} was replaced while we locked it; retrying",
                        dir.path_of(&file_name).display()
                    );
                    continue;
                }
                Err(e) => {
                    return Err(Error::from_lock_io(
                        format!("cannot inspect {}", dir.path_of(&file_name).display()),
                        &e,
                    ))
                }
            }
        }
        Err(Error::CantCreate(format!(
            "the lock file for '{}' in {} keeps being replaced; giving up",
            request.name,
            self.dir.display()
        )))
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let locks = ProcLocks::read()?;
        match self.existing_dir()? {
            Some(dir) => Self::status_of(&dir, name, &locks),
            None => Ok(LockStatus {
                name: name.to_string(),
                held: false,
                holders: Vec::new(),
                waiters: Some(0),
                queue: Vec::new(),
                last_token: None,
            }),
        }
    }

    /// Held locks, by name. A lock whose files cannot be trusted is reported on stderr and left
    /// out, so that one planted file cannot hide the others.
    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        let locks = ProcLocks::read()?;
        let Some(dir) = self.existing_dir()? else {
            return Ok(Vec::new());
        };
        let mut names = Vec::new();
        for entry in dir.entries()? {
            let Some((entry_stem, _slot)) = split_file_name(&entry) else {
                continue;
            };
            let Ok(Some(key)) = dir.identity(&entry) else {
                continue;
            };
            if !locks.holders.contains_key(&key) {
                continue;
            }
            // The name is in the metadata; decode the file name when the holder has not
            // written it yet (or the file is not one to read: status_of reports that).
            let name = dir
                .read_lock_file(&entry)
                .ok()
                .flatten()
                .and_then(|file| read_contents(file).1)
                .map(|m| m.holder.name)
                .or_else(|| crate::lock::decode_component(entry_stem));
            if let Some(name) = name.and_then(|n| LockName::new(&n).ok()) {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut statuses = Vec::with_capacity(names.len());
        for name in &names {
            match Self::status_of(&dir, name, &locks) {
                Ok(status) => statuses.push(status),
                Err(e) => tracing::warn!("not listing '{name}': {e}"),
            }
        }
        Ok(statuses)
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let status = self.status(name).await?;
        if !status.held {
            return Ok(Vec::new());
        }
        let pids: Vec<String> = status
            .holders
            .iter()
            .map(|h| h.holder.pid.to_string())
            .collect();
        Err(Error::Permission(format!(
            "the file backend cannot break a kernel lock: '{name}' is held by pid {} on this host; \
             stop that process (kill {}) to free it",
            pids.join(", pid "),
            pids.join(" ")
        )))
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        let started = BootInstant::now();
        let dir = self.prepare_dir()?;
        let probe = format!("#check-{}.lock", std::process::id());
        let probe_path = dir.path_of(&probe);
        let file = dir.open_lock_file(&probe)?;
        let locked = flock(&file, libc::LOCK_EX | libc::LOCK_NB);
        let removed = dir.remove(&probe);
        drop(file);
        locked.map_err(|e| {
            Error::from_lock_io(format!("cannot flock {}", probe_path.display()), &e)
        })?;
        removed.map_err(|e| {
            Error::from_lock_io(format!("cannot remove {}", probe_path.display()), &e)
        })?;
        let round_trip = BootInstant::now().saturating_since(started);
        let mut warnings = Vec::new();
        let fs_type = dir.statfs().map(|s| s.filesystem_type());
        let fs_name = match fs_type {
            Some(t) if t == nix::sys::statfs::NFS_SUPER_MAGIC => {
                warnings.push(
                    "the lock directory is on NFS, where flock(2) may be emulated and unreliable"
                        .to_owned(),
                );
                "nfs".to_owned()
            }
            Some(t) if t == nix::sys::statfs::TMPFS_MAGIC => "tmpfs".to_owned(),
            Some(t) if t == nix::sys::statfs::EXT4_SUPER_MAGIC => "ext4 (or ext2/ext3)".to_owned(),
            Some(t) => format!("0x{:x}", t.0),
            None => "unknown".to_owned(),
        };
        if ProcLocks::read().is_err() {
            warnings
                .push("/proc/locks is not readable: status and list cannot see holders".to_owned());
        }
        let kernel = nix::sys::utsname::uname()
            .map(|u| format!("Linux {}", u.release().to_string_lossy()))
            .unwrap_or_else(|_| "Linux".to_owned());
        Ok(CheckReport {
            backend: "file".into(),
            location: self.dir.display().to_string(),
            version: kernel,
            round_trip_us: u64::try_from(round_trip.as_micros()).unwrap_or(u64::MAX),
            warnings,
            details: vec![
                ("directory".into(), self.dir.display().to_string()),
                ("file system".into(), fs_name),
                (
                    "lease".into(),
                    "none: the kernel frees the lock when the holder exits".into(),
                ),
            ],
        })
    }
}

fn busy(request: &AcquireRequest, holders: &str, what: &str) -> Error {
    Error::Busy(format!("lock '{}' is held{holders}; {what}", request.name))
}

impl FileBackend {
    /// Make the slot just locked a hold: under the lock on the counter's header, check the
    /// other holders' `--limit`, take the next token and write our metadata. Doing all three
    /// under that one lock means that of two holders that start together, the second sees the
    /// first's metadata.
    fn start_hold(
        dir: &LockDir,
        request: &AcquireRequest,
        stem: &str,
        slot: u32,
        file: File,
        file_name: &str,
    ) -> Result<FileLease, Error> {
        let path = dir.path_of(file_name);
        let io_err = |what: &str, e: io::Error| {
            Error::from_lock_io(format!("{what} {}", path.display()), &e)
        };
        // The fencing counter lives in slot 0's header, guarded by an OFD lock on it.
        let counter_name = slot_file_name(stem, 0);
        let counter_file = if slot == 0 {
            None
        } else {
            Some(dir.open_lock_file(&counter_name)?)
        };
        let counter = counter_file.as_ref().unwrap_or(&file);
        header_lock(counter, true).map_err(|e| io_err("cannot lock the header of", e))?;
        let held = check_limits(dir, request, stem, Some(slot))
            .and_then(|()| next_token(counter, &dir.path_of(&counter_name)))
            .and_then(|token| {
                write_at(counter, 0, header(token).as_bytes())
                    .map_err(|e| io_err("cannot write", e))?;
                let mut holder = request.holder.clone();
                holder.token = token;
                // A kernel lock has no lease.
                holder.ttl_ms = 0;
                let meta = Meta {
                    holder,
                    limit: request.limit,
                };
                let mut body = if slot == 0 { String::new() } else { header(0) };
                let body_offset = if slot == 0 { HEADER_LEN as u64 } else { 0 };
                body.push_str(
                    &serde_json::to_string(&meta).map_err(|e| Error::Internal(e.to_string()))?,
                );
                body.push('\n');
                write_at(&file, body_offset, body.as_bytes())
                    .map_err(|e| io_err("cannot write", e))?;
                file.set_len(body_offset + body.len() as u64)
                    .map_err(|e| io_err("cannot truncate", e))?;
                Ok(token)
            });
        let _ = header_lock(counter, false);
        let token = held?;
        Ok(FileLease {
            file,
            path,
            token,
            watch: None,
            acquired: BootInstant::now(),
        })
    }
}

/// Refuse to hold a lock beside holders that use another `--limit` (design: all holders must
/// agree on N), as the other backends do. Each holder records its limit in its metadata,
/// believed while `/proc/locks` shows its pid holding the file. Slot files are created in
/// order and never removed, so the probe stops at the first missing one: for a plain lock it
/// costs one `stat`. `own`: the slot we hold, if any.
fn check_limits(
    dir: &LockDir,
    request: &AcquireRequest,
    stem: &str,
    own: Option<u32>,
) -> Result<(), Error> {
    let mut others = Vec::new();
    for slot in (0..crate::lock::MAX_LIMIT).filter(|s| Some(*s) != own) {
        let file_name = slot_file_name(stem, slot);
        match dir.identity(&file_name) {
            Ok(Some(key)) => others.push((file_name, key)),
            _ => break,
        }
    }
    if others.is_empty() {
        return Ok(());
    }
    let locks = match ProcLocks::read() {
        Ok(locks) => locks,
        Err(e) => {
            tracing::debug!("cannot compare --limit with the other holders: {e}");
            return Ok(());
        }
    };
    for (file_name, key) in others {
        let Some(&pid) = locks.holders.get(&key) else {
            continue;
        };
        // A file that cannot be read or trusted says nothing about a limit.
        let meta = dir
            .read_lock_file(&file_name)
            .ok()
            .flatten()
            .and_then(|file| read_contents(file).1);
        if let Some(meta) = meta.filter(|m| m.holder.pid == pid) {
            if meta.limit != 0 && meta.limit != request.limit {
                return Err(Error::Usage(format!(
                    "lock '{}' is held with --limit {}; all holders must use the same --limit",
                    request.name, meta.limit
                )));
            }
        }
    }
    Ok(())
}

/// The token after the one in the counter (slot 0's header): `max(counter + 1, µs since the
/// epoch)`. An empty file is a fresh counter. Tokens must strictly increase, so a counter that
/// cannot be read, or that has reached `u64::MAX`, is refused rather than guessed at.
fn next_token(counter: &File, path: &Path) -> Result<u64, Error> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; HEADER_LEN];
    let mut read = 0;
    while read < HEADER_LEN {
        match counter.read_at(&mut buf[read..], read as u64) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::from_lock_io(
                    format!("cannot read the fencing counter in {}", path.display()),
                    &e,
                ))
            }
        }
    }
    let stored = match (read, parse_header(&buf)) {
        (0, _) => 0,
        (_, Some(stored)) => stored,
        (_, None) => {
            return Err(Error::CantCreate(format!(
                "the fencing counter in {} is unreadable (it starts {:?}, not 'fence' and 20 digits), \
                 so the next token could repeat an old one; if nothing relies on this lock's tokens, \
                 empty the file (: > FILE) to restart the counter from the clock",
                path.display(),
                String::from_utf8_lossy(&buf[..read])
            )))
        }
    };
    let Some(next) = stored.checked_add(1) else {
        return Err(Error::CantCreate(format!(
            "the fencing counter in {} is at its maximum ({stored}): no larger token can be issued \
             and tokens must never repeat; to use the name again, empty the file (: > FILE) once \
             nothing relies on its old tokens",
            path.display()
        )));
    };
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    Ok(next.max(clock))
}

fn watch_file(path: &Path) -> io::Result<AsyncFd<Readable<Inotify>>> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(
        path,
        AddWatchFlags::IN_ATTRIB | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF,
    )?;
    Readable::register(inotify)
}

/// A held file lock. Dropping it (or dlock dying) releases it.
pub struct FileLease {
    file: File,
    path: PathBuf,
    token: u64,
    /// Set up lazily: see [`FileLease::lost`].
    watch: Option<AsyncFd<Readable<Inotify>>>,
    acquired: BootInstant,
}

impl FileLease {
    fn check(&self) -> Option<Lost> {
        match same_file(&self.file, &self.path) {
            Ok(true) => None,
            Ok(false) => Some(Lost {
                reason: format!("lock file {} was deleted or replaced", self.path.display()),
                kill_by: None,
            }),
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

    async fn release(self) -> Result<(), Error> {
        // Closing drops the flock. The metadata stays behind: `status` shows a holder only when
        // /proc/locks confirms its pid still holds the file.
        drop(self.file);
        Ok(())
    }
}

/// Holders and waiters of flock(2) locks, by (device, inode), from `/proc/locks`.
struct ProcLocks {
    holders: HashMap<(u64, u64), u32>,
    waiters: HashMap<(u64, u64), u64>,
}

impl ProcLocks {
    fn read() -> Result<ProcLocks, Error> {
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
                *locks.waiters.entry(key).or_insert(0) += 1;
            } else {
                locks.holders.insert(key, pid);
            }
        }
        locks
    }
}

/// Blocking `flock(LOCK_EX)` on several slot files at once, one helper thread each; the first
/// to succeed wins. [`BlockedWait::stop`] interrupts the rest and releases any slot that was
/// won after the first.
struct BlockedWait {
    stop: Arc<AtomicBool>,
    threads: Vec<(u32, std::thread::JoinHandle<()>)>,
    results: mpsc::UnboundedReceiver<(u32, io::Result<(File, String)>)>,
}

/// The real-time signal used to interrupt blocked `flock` calls in helper threads.
fn interrupt_signal() -> libc::c_int {
    libc::SIGRTMIN() + 5
}

extern "C" fn ignore_interrupt(_: libc::c_int) {}

fn install_interrupt_handler() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: installing a handler that does nothing; SA_RESTART is deliberately not set so
        // that a blocked flock returns EINTR.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore_interrupt as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(interrupt_signal(), &action, std::ptr::null_mut());
        }
    });
}

impl BlockedWait {
    fn start(files: Vec<(u32, File, String)>) -> BlockedWait {
        install_interrupt_handler();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, results) = mpsc::unbounded_channel();
        let threads = files
            .into_iter()
            .map(|(slot, file, path)| {
                let stop = stop.clone();
                let tx = tx.clone();
                let thread = std::thread::spawn(move || loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match flock(&file, libc::LOCK_EX) {
                        Ok(()) => {
                            // Won after the wait was stopped: dropping the file releases it.
                            if !stop.load(Ordering::SeqCst) {
                                let _ = tx.send((slot, Ok((file, path))));
                            }
                            return;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            let _ = tx.send((slot, Err(e)));
                            return;
                        }
                    }
                });
                (slot, thread)
            })
            .collect();
        BlockedWait {
            stop,
            threads,
            results,
        }
    }

    /// The first slot won, with its file.
    async fn first(&mut self) -> Result<(u32, File, String), Error> {
        match self.results.recv().await {
            Some((slot, Ok((file, path)))) => Ok((slot, file, path)),
            Some((_, Err(e))) => Err(Error::from_lock_io("cannot lock".into(), &e)),
            None => Err(Error::Internal(
                "lock waiters ended without a result".into(),
            )),
        }
    }

    /// Interrupt and join every helper thread; slots won meanwhile are released. The thread
    /// that won slot `won` has nothing left to do but return, so it is just joined: this is
    /// on the hand-over path.
    fn stop(mut self, won: Option<u32>) {
        use std::os::unix::thread::JoinHandleExt;
        self.stop.store(true, Ordering::SeqCst);
        for (slot, thread) in std::mem::take(&mut self.threads) {
            if Some(slot) != won {
                // A signal can arrive just before the thread enters flock; keep nudging it.
                for _ in 0..5000 {
                    if thread.is_finished() {
                        break;
                    }
                    // SAFETY: the thread is not joined yet, so its pthread_t is valid.
                    unsafe { libc::pthread_kill(thread.as_pthread_t(), interrupt_signal()) };
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            let _ = thread.join();
        }
        self.results.close();
        while let Ok((_, won)) = self.results.try_recv() {
            drop(won);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_split_into_stem_and_slot() {
        assert_eq!(split_file_name("a.lock"), Some(("a", 0)));
        assert_eq!(split_file_name("a#3.lock"), Some(("a", 3)));
        assert_eq!(split_file_name("..lock"), Some((".", 0)));
        assert_eq!(split_file_name("#check-1.lock"), None);
        assert_eq!(split_file_name("a#0.lock"), None);
        assert_eq!(split_file_name("a.txt"), None);
    }

    #[test]
    fn long_names_get_short_unique_stems() {
        let a = LockName::new(&"é".repeat(127)).unwrap();
        let b = LockName::new(&format!("{}x", "é".repeat(126))).unwrap();
        assert!(stem(&a).len() < 255 - "#1024.lock".len());
        assert_ne!(stem(&a), stem(&b));
    }

    #[test]
    fn proc_locks_lines_are_parsed() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 4343 fd:01:1234 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 99 fd:01:777 0 EOF\n";
        let locks = ProcLocks::parse(text);
        let key = (libc::makedev(0xfd, 1), 1234);
        assert_eq!(locks.holders.get(&key), Some(&4242));
        assert_eq!(locks.waiters.get(&key), Some(&1));
        assert_eq!(locks.holders.len(), 1);
    }

    #[test]
    fn header_round_trips() {
        assert_eq!(header(42).len(), HEADER_LEN);
        assert_eq!(parse_header(header(42).as_bytes()), Some(42));
        assert_eq!(parse_header(header(u64::MAX).as_bytes()), Some(u64::MAX));
        assert_eq!(parse_header(b"garbage"), None);
        assert_eq!(parse_header(b"fence +0000000000000000042\n"), None);
        assert_eq!(parse_header(b"fence 99999999999999999999\n"), None);
        assert_eq!(parse_header(&[0; HEADER_LEN]), None);
    }
}
