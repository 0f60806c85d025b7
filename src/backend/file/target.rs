//! Where the file backend keeps its lock files: `file:///dir`, or the default directory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A lock directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileTarget {
    pub dir: PathBuf,
    /// Whether dlock chose the directory (it then creates it, mode 0700).
    pub default: bool,
}

impl FileTarget {
    /// dlock's own directory, for file locks without `--url` and the host-local queues
    /// (docs/backends/file.md): `$DLOCK_DIR` when set, else
    /// `/run/lock/dlock-<uid>` where `/run/lock` is root's and sticky (as on Debian), else
    /// `/tmp/dlock-<uid>`. One per user, the same from cron and from a login session (nothing
    /// depends on `XDG_RUNTIME_DIR`, which cron does not set and logout removes), and not
    /// aged out by tmp cleaners where `/run/lock` is used.
    pub fn default_dir() -> FileTarget {
        let uid = nix::unistd::getuid();
        let dir = match std::env::var_os("DLOCK_DIR").map(PathBuf::from) {
            Some(dir) if dir.is_absolute() => dir,
            _ if shared_sticky_root_dir(Path::new(RUN_LOCK)) => {
                Path::new(RUN_LOCK).join(format!("dlock-{uid}"))
            }
            _ => PathBuf::from(format!("/tmp/dlock-{uid}")),
        };
        FileTarget { dir, default: true }
    }

    /// The directory, for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        format!("file://{}", self.dir.display())
    }
}

/// Where the default directory goes when users may create directories there.
const RUN_LOCK: &str = "/run/lock";

/// Whether `dir` is a real directory (no link) of root's that everyone may create entries in
/// and only their owners may remove (mode 1777), like /tmp.
fn shared_sticky_root_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir)
        .is_ok_and(|meta| meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o1777 == 0o1777)
}

/// `file:///dir`, `file://localhost/dir`; `file://` alone is the default directory.
pub fn parse(rest: &str) -> Result<FileTarget, String> {
    let path = match rest.strip_prefix("//") {
        Some(after) => {
            let (host, path) = after.split_at(after.find('/').unwrap_or(after.len()));
            if !host.is_empty() && host != "localhost" {
                return Err(format!(
                    "file URLs name a local directory; '{host}' is not this host (use file:///dir)"
                ));
            }
            path
        }
        None => rest,
    };
    if path.contains(['?', '#']) {
        return Err("file URLs take no query or fragment".into());
    }
    if path.is_empty() {
        return Ok(FileTarget::default_dir());
    }
    let decoded = crate::lock::decode_component(path)
        .ok_or_else(|| format!("bad percent-encoding in '{path}'"))?;
    let dir = PathBuf::from(decoded);
    if !dir.is_absolute() {
        return Err(format!(
            "the lock directory must be absolute: file://{path} (use file:///dir)"
        ));
    }
    Ok(FileTarget {
        dir,
        default: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Target;

    #[test]
    fn file_urls() {
        assert_eq!(
            Target::parse_as::<FileTarget>("file:///var/lock/x"),
            Ok(FileTarget {
                dir: "/var/lock/x".into(),
                default: false
            })
        );
        assert!(matches!(
            Target::parse_as::<FileTarget>("file://"),
            Ok(FileTarget { default: true, .. })
        ));
        assert!(Target::parse("file://otherhost/x").is_err());
        assert!(Target::parse("file:relative").is_err());
        assert!(Target::parse("gopher://x").is_err());
        assert!(Target::parse("nourl").is_err());
    }
}
