//! What the file backend can tell and do besides holding: `status`, `list`, `release --force`
//! (which it cannot: a kernel lock is broken only by ending its holder) and `check`. Holders
//! are read from `/proc/locks`; their recorded metadata is believed only while the same pid
//! holds the file.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

use super::slot::{
    existing_slots, read_contents, reader_file_name, reader_pids, split_file_name,
    turnstile_file_name,
};
use super::FileBackend;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::flock::flock;
use crate::kit::held::list_held;
use crate::kit::lock_dir::LockDir;
use crate::kit::proc_locks::ProcLocks;
use crate::kit::stem::stem;
use crate::lock::{CheckReport, Holder, HolderStatus, LockName, LockStatus, Mode, Waiter};

/// The holders and waiters of `name`, and the last token handed out for it.
pub(super) fn status(backend: &FileBackend, name: &LockName) -> Result<LockStatus, Error> {
    let status = match backend.existing_dir()? {
        Some(dir) => {
            let locks = ProcLocks::read(&slot_keys(&dir, name)?)?;
            status_of(&dir, name, &locks, None)?
        }
        None => {
            ProcLocks::read(&HashSet::new())?;
            missing_dir(backend);
            free(name)
        }
    };
    Ok(LockStatus {
        location: Some(backend.location()),
        ..status
    })
}

/// The files (device, inode) of `name`'s slots, and of its turnstile (whose waiters wait
/// for the lock too).
fn slot_keys(dir: &LockDir, name: &LockName) -> Result<HashSet<(u64, u64)>, Error> {
    let turnstile = turnstile_file_name(&stem(name));
    Ok(existing_slots(dir, name)?
        .iter()
        .map(|(_, file_name)| file_name)
        .chain([&turnstile])
        .filter_map(|file_name| dir.identity(file_name).ok().flatten())
        .collect())
}

/// Say that the lock directory does not exist (a mistyped `--url` would otherwise read as
/// "free"); `status` and `list` never create it.
fn missing_dir(backend: &FileBackend) {
    tracing::warn!(
        "lock directory {} does not exist: no lock was ever taken there (check --url)",
        backend.dir.display()
    );
}

/// Held locks, by name. A lock whose files cannot be trusted is reported on stderr and left
/// out, so that one planted file cannot hide the others.
pub(super) async fn list(backend: &FileBackend) -> Result<Vec<LockStatus>, Error> {
    let Some(dir) = backend.existing_dir()? else {
        ProcLocks::read(&HashSet::new())?;
        missing_dir(backend);
        return Ok(Vec::new());
    };
    let keys = dir
        .entries()?
        .iter()
        .filter(|entry| split_file_name(entry).is_some())
        .filter_map(|entry| dir.identity(entry).ok().flatten())
        .collect();
    let locks = ProcLocks::read(&keys)?;
    let names = held_names(&dir, &locks)?;
    list_held(names, async |name: &LockName| {
        match status_of(&dir, name, &locks, None) {
            Ok(status) => Ok(status),
            Err(e) => {
                tracing::warn!("not listing '{name}': {e}");
                Ok(free(name))
            }
        }
    })
    .await
}

/// The names of the locks with a slot file that `locks` shows held.
fn held_names(dir: &LockDir, locks: &ProcLocks) -> Result<Vec<LockName>, Error> {
    let mut names = Vec::new();
    for entry in dir.entries()? {
        let Some((entry_stem, _slot)) = split_file_name(&entry) else {
            continue;
        };
        let Ok(Some(key)) = dir.identity(&entry) else {
            continue;
        };
        let record = dir
            .read_lock_file(&entry)
            .ok()
            .flatten()
            .and_then(|file| read_contents(file).1);
        if locks
            .holder(key, record.as_ref().map(|r| r.holder.pid))
            .is_none()
        {
            continue;
        }
        // The name is in the metadata; decode the file name when the holder has not
        // written it yet (or the file is not one to read: status_of reports that).
        let name = record
            .map(|record| record.holder.name)
            .or_else(|| crate::lock::decode_component(entry_stem));
        if let Some(name) = name.and_then(|n| LockName::new(&n).ok()) {
            names.push(name);
        }
    }
    Ok(names)
}

/// A kernel lock cannot be broken from outside: name the holders to stop instead.
pub(super) fn force_release(backend: &FileBackend, name: &LockName) -> Result<Vec<Holder>, Error> {
    let status = status(backend, name)?;
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

/// Create, lock and remove a probe file in the lock directory; report the file system.
/// `check` changes nothing: a missing lock directory is reported (with whether a run could
/// create it), not created.
pub(super) fn check(backend: &FileBackend) -> Result<CheckReport, Error> {
    let started = BootInstant::now();
    let Some(dir) = backend.existing_dir()? else {
        return check_missing(backend, started);
    };
    let probe = format!("#check-{}.lock", std::process::id());
    let probe_path = dir.path_of(&probe);
    let file = dir.open_lock_file(&probe)?;
    let locked = flock(&file, libc::LOCK_EX | libc::LOCK_NB);
    let removed = dir.remove(&probe);
    drop(file);
    locked.map_err(|e| Error::from_lock_io_at("cannot flock", &probe_path, &e))?;
    removed.map_err(|e| Error::from_lock_io_at("cannot remove", &probe_path, &e))?;
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
    if !ProcLocks::readable() {
        warnings.push("/proc/locks is not readable: status and list cannot see holders".to_owned());
    }
    let kernel = nix::sys::utsname::uname()
        .map(|u| format!("Linux {}", u.release().to_string_lossy()))
        .unwrap_or_else(|_| "Linux".to_owned());
    Ok(CheckReport {
        backend: "file".into(),
        location: backend.dir.display().to_string(),
        version: kernel,
        round_trip_us: u64::try_from(round_trip.as_micros()).unwrap_or(u64::MAX),
        warnings,
        details: vec![
            ("directory".into(), backend.dir.display().to_string()),
            ("file system".into(), fs_name),
            (
                "lease".into(),
                "none: the kernel frees the lock when the holder exits".into(),
            ),
        ],
    })
}

/// "is held by pid N on host (…) for T[, N waiting ahead]" for the message of a busy lock,
/// or "is free, N waiting ahead" when the runs ahead have not taken it yet (one stopped
/// while it waits, say); "is held" when it cannot tell.
pub(super) fn describe_holders(dir: &LockDir, name: &LockName) -> String {
    // Our own run may still be queued at the turnstile: it is not waiting ahead of itself.
    let own = std::process::id();
    let status = slot_keys(dir, name)
        .and_then(|keys| ProcLocks::read(&keys))
        .and_then(|locks| status_of(dir, name, &locks, Some(own)));
    match status {
        Ok(status) => {
            let holders: Vec<Holder> = status.holders.into_iter().map(|h| h.holder).collect();
            let ahead = status.waiters.unwrap_or(0) as usize;
            crate::wording::busy_state(&holders, ahead)
        }
        Err(_) => "is held".into(),
    }
}

/// The state of `name` in `dir`, as `locks` shows its slot files held and waited for;
/// `leave_out`: a pid not to count among the waiters (our own run's).
fn status_of(
    dir: &LockDir,
    name: &LockName,
    locks: &ProcLocks,
    leave_out: Option<u32>,
) -> Result<LockStatus, Error> {
    let mut holders = Vec::new();
    // A process waiting for any of N slots blocks on each of them: count it once.
    let mut waiters = std::collections::BTreeSet::<u32>::new();
    let mut last_token = None;
    let recorded_readers = reader_pids(dir, name)?;
    for (slot, file_name) in existing_slots(dir, name)? {
        let Some(file) = dir.read_lock_file(&file_name)? else {
            continue;
        };
        let Ok(stat) = file.metadata() else {
            continue;
        };
        let key = (stat.dev(), stat.ino());
        let (header, record) = read_contents(file);
        let holder = record.map(|r| r.holder);
        if slot == 0 {
            last_token = header.filter(|t| *t > 0);
        }
        waiters.extend(locks.waiters.get(&key).into_iter().flatten());
        // Shared holds are on slot 0 alone.
        let readers = match slot {
            0 => locks.shared_holders(key, &recorded_readers),
            _ => locks.shared.get(&key).cloned().unwrap_or_default(),
        };
        if !readers.is_empty() {
            holders.extend(readers.iter().map(|&pid| shared_holder(dir, name, pid)));
        } else if let Some(pid) = locks.holder(key, holder.as_ref().map(|h| h.pid)) {
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
    // Processes queued at the turnstile wait for the lock as well, and so do those holding
    // it: an exclusive run holds it only while it waits (a stopped one is blocked on nothing
    // else), a shared one while it takes the lock. Each is counted once.
    if let Ok(Some(key)) = dir.identity(&turnstile_file_name(&stem(name))) {
        waiters.extend(locks.waiters.get(&key).into_iter().flatten());
        match locks.shared.get(&key) {
            Some(passing) => waiters.extend(passing),
            None => waiters.extend(locks.holders.get(&key)),
        }
    }
    for holder in &holders {
        waiters.remove(&holder.holder.pid);
    }
    if let Some(pid) = leave_out {
        waiters.remove(&pid);
    }
    Ok(LockStatus {
        name: name.to_string(),
        held: !holders.is_empty(),
        holders,
        waiters: Some(waiters.len() as u64),
        queue: Vec::new(),
        last_token,
        waiting_here: waiting_here(&waiters),
        location: None,
    })
}

/// Shared holder `pid` of `name`, with the record from its own file when that file names it
/// (`flock -s` leaves none: then only the pid is known).
fn shared_holder(dir: &LockDir, name: &LockName, pid: u32) -> HolderStatus {
    let recorded = dir
        .read_lock_file(&reader_file_name(&stem(name), pid))
        .ok()
        .flatten()
        .and_then(|file| read_contents(file).1)
        .map(|record| record.holder)
        .filter(|holder| holder.pid == pid && holder.name == name.as_str());
    HolderStatus {
        holder: recorded.unwrap_or_else(|| Holder {
            name: name.to_string(),
            pid,
            mode: Mode::Shared,
            ..Holder::default()
        }),
        ttl_left_ms: None,
        session: None,
    }
}

/// The processes blocked on a lock's files, longest-waiting first. A process waits from its
/// start: `dlock run` (and `flock(1)`) asks for the lock before anything else.
fn waiting_here(pids: &std::collections::BTreeSet<u32>) -> Vec<Waiter> {
    let mut waiting: Vec<(std::time::SystemTime, u32)> = pids
        .iter()
        .filter_map(|&pid| Some((crate::process::started_at(pid)?, pid)))
        .collect();
    waiting.sort();
    waiting
        .into_iter()
        .map(|(since, pid)| Waiter::new(pid, since, "lock file"))
        .collect()
}

/// A lock nobody holds or waits for.
fn free(name: &LockName) -> LockStatus {
    LockStatus {
        name: name.to_string(),
        held: false,
        holders: Vec::new(),
        waiters: Some(0),
        queue: Vec::new(),
        last_token: None,
        waiting_here: Vec::new(),
        location: None,
    }
}

/// The lock directory does not exist: can the first `dlock run` create it? Its nearest
/// existing ancestor must be a directory we may write to.
fn check_missing(backend: &FileBackend, started: BootInstant) -> Result<CheckReport, Error> {
    use nix::unistd::{access, AccessFlags};
    let missing = &backend.dir;
    let ancestor = missing.ancestors().skip(1).find(|p| p.exists());
    let writable = ancestor
        .is_some_and(|p| p.is_dir() && access(p, AccessFlags::W_OK | AccessFlags::X_OK).is_ok());
    if !writable {
        return Err(Error::CantCreate(format!(
            "lock directory {} does not exist, and {} is not a directory dlock may create it in; \
             create it (mode 0700) or choose another --url",
            missing.display(),
            ancestor.map_or_else(|| "/".into(), |p| p.display().to_string())
        )));
    }
    Ok(CheckReport {
        backend: "file".into(),
        location: missing.display().to_string(),
        version: "-".into(),
        round_trip_us: u64::try_from(BootInstant::now().saturating_since(started).as_micros())
            .unwrap_or(u64::MAX),
        warnings: vec![format!(
            "lock directory {} does not exist; the first dlock run creates it (mode 0700). \
             check created nothing",
            missing.display()
        )],
        details: vec![(
            "directory".into(),
            format!("{} (missing)", missing.display()),
        )],
    })
}
