//! Credentials for nested dlocks (docs/guide.md: "What the command sees").
//!
//! The command never sees a password dlock consumed: `DLOCK_*PASSWORD*` variables are removed
//! from its environment and a password in `DLOCK_URL` becomes `***`. A `dlock` run inside the
//! command still needs them. So dlock writes the variables it changed, as they were, into a
//! sealed anonymous file (`memfd_create`, named [`MEMFD_NAME`]) that the command inherits,
//! and names its descriptor in [`CREDENTIALS_FD`]. A dlock that starts with that variable
//! checks that the descriptor is such a file (a sealed memfd of that name, owned by the
//! user), reads it, closes it and puts the variables back in its own environment before
//! anything else reads it; its own command then gets a new file the same way.
//!
//! What that means for the command: it can read the descriptor (`cat <&N`), as it could read
//! the variable it replaces. Other users cannot: `/proc/PID/fd/N`, like `/proc/PID/environ`,
//! is open only to the same user (and root). What is gained is that the password is in no
//! environment: not printed by `env`, not in a crash report's or a CI log's dump of the
//! environment, not in `/proc/PID/environ` of the command or of the nested dlock, and not
//! passed on to processes that close inherited descriptors (daemons, `sudo`, `ssh`).
//! A descriptor that is not what dlock makes (the number reused for another file) is ignored,
//! never read.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;

/// The variable that names the inherited descriptor.
pub const CREDENTIALS_FD: &str = "DLOCK_CREDENTIALS_FD";

/// The memfd's name (`/proc/self/fd/N` shows `/memfd:NAME (deleted)`).
const MEMFD_NAME: &str = "dlock-credentials";

/// Every seal: nobody can change the file's contents or size, or its seals.
const SEALS: libc::c_int =
    libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// A sealed memfd holding variables for the command's nested dlocks; close-on-exec in dlock,
/// left open in the command only ([`crate::spawn`] clears the flag in the child).
pub struct Handoff {
    fd: OwnedFd,
}

impl Handoff {
    /// A sealed memfd holding `vars` (`NAME\0VALUE\0` each). `None` when there is nothing to
    /// hand on.
    pub fn new(vars: &[(OsString, OsString)]) -> io::Result<Option<Handoff>> {
        if vars.is_empty() {
            return Ok(None);
        }
        let mut content = Vec::new();
        for (key, value) in vars {
            content.extend_from_slice(key.as_bytes());
            content.push(0);
            content.extend_from_slice(value.as_bytes());
            content.push(0);
        }
        let name = std::ffi::CString::new(MEMFD_NAME).map_err(io::Error::other)?;
        // SAFETY: a plain system call on a NUL-terminated name; the result is checked.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just created and owned by nothing else.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        file.write_all_at(&content, 0)?;
        let fd = OwnedFd::from(file);
        // SAFETY: fcntl on a descriptor owned here.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(Handoff { fd }))
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Take the credentials an ancestor dlock handed on (see the module doc) and put them back
/// into this process's environment: `DLOCK_URL` only where it is still the ancestor's with
/// the password masked, any other variable only where it is unset. Called first thing, while
/// dlock has one thread. Anything doubtful is ignored: the reason is returned, to be logged.
pub fn restore_inherited() -> Option<String> {
    let named = std::env::var_os(CREDENTIALS_FD)?;
    // The variable is for this process only: its own command gets its own file.
    std::env::remove_var(CREDENTIALS_FD);
    let vars = match read_inherited(&named) {
        Ok(vars) => vars,
        Err(why) => return Some(format!("ignoring {CREDENTIALS_FD}: {why}")),
    };
    for (key, value) in vars {
        if key == "DLOCK_URL" {
            let masked = super::redact_url(&value.to_string_lossy());
            if std::env::var_os("DLOCK_URL").is_some_and(|now| now == OsStr::new(&masked)) {
                std::env::set_var(&key, &value);
            }
        } else if std::env::var_os(&key).is_none() {
            std::env::set_var(&key, &value);
        }
    }
    None
}

/// The variables in the descriptor `named`, after checking that it is what a dlock makes;
/// the descriptor is closed once read.
fn read_inherited(named: &OsStr) -> Result<Vec<(OsString, OsString)>, String> {
    let fd: RawFd = named
        .to_str()
        .and_then(|text| text.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| format!("'{}' is not a descriptor number", named.to_string_lossy()))?;
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map_err(|e| format!("descriptor {fd}: {e}"))?;
    if link.as_os_str() != OsStr::new(&format!("/memfd:{MEMFD_NAME} (deleted)")) {
        return Err(format!(
            "descriptor {fd} is {}, not dlock's",
            link.display()
        ));
    }
    // SAFETY: the descriptor is open (its /proc entry exists) and, being a dlock credentials
    // file, is used by nothing else in this process; it is owned and closed from here on.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let meta = file
        .metadata()
        .map_err(|e| format!("descriptor {fd}: {e}"))?;
    // SAFETY: fcntl on a descriptor owned here.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if !meta.is_file()
        || std::os::unix::fs::MetadataExt::uid(&meta) != nix::unistd::getuid().as_raw()
        || seals != SEALS
        || meta.len() > crate::files::MAX_SECRET_BYTES
    {
        return Err(format!(
            "descriptor {fd} is not a sealed credentials file of this user"
        ));
    }
    let mut content = vec![0; usize::try_from(meta.len()).unwrap_or(0)];
    file.read_exact_at(&mut content, 0)
        .map_err(|e| format!("descriptor {fd}: {e}"))?;
    let mut fields = content.split(|b| *b == 0);
    let mut vars = Vec::new();
    while let (Some(key), Some(value)) = (fields.next(), fields.next()) {
        if key.starts_with(b"DLOCK_") && !key.contains(&b'=') && key != CREDENTIALS_FD.as_bytes() {
            vars.push((
                OsString::from_vec(key.to_vec()),
                OsString::from_vec(value.to_vec()),
            ));
        }
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handoff_reads_back_and_another_file_is_refused() {
        let vars = vec![
            (OsString::from("DLOCK_URL"), OsString::from("redis://:pw@h")),
            (OsString::from("DLOCK_PASSWORD"), OsString::from("s3cret")),
        ];
        let handoff = Handoff::new(&vars).expect("memfd").expect("a handoff");
        // read_inherited closes what it reads: give it a duplicate.
        let dup = nix::unistd::dup(&handoff.fd).expect("dup");
        let number = std::mem::ManuallyDrop::new(dup).as_raw_fd();
        assert_eq!(read_inherited(OsStr::new(&number.to_string())), Ok(vars));
        let other = std::fs::File::open("/proc/self/stat").expect("a file");
        let refused = read_inherited(OsStr::new(&other.as_raw_fd().to_string()));
        assert!(refused.is_err(), "{refused:?}");
        assert!(read_inherited(OsStr::new("2")).is_err());
        assert!(Handoff::new(&[]).expect("nothing").is_none());
    }
}
