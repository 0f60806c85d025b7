//! Where dlock's own directory is (file locks without `--url`, the host-local queues):
//! `DLOCK_DIR`, or one per user, the same from cron and from a login session, under
//! directories only root controls where the system has them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// dlock's own directory, for file locks without `--url` and the host-local queues
/// (docs/backends/file.md): `$DLOCK_DIR` when set; for root, `/run/dlock` where `/run` is
/// root's alone, else `/var/lib/dlock`; for any other user, `/run/lock/dlock-<uid>` where
/// `/run/lock` is root's and sticky (as on Debian), else `/tmp/dlock-<uid>`. One per user, the
/// same from cron and from a login session (nothing depends on `XDG_RUNTIME_DIR`, which cron
/// does not set and logout removes), and not aged out by tmp cleaners where `/run` is used.
///
/// Root's is under no directory others can write to, so nobody can make it first. Another
/// user can make a user's in `/run/lock` or `/tmp` first; it is then refused, naming them,
/// never exchanged for another directory: whether a run used the fallback would then be the
/// other user's choice, made anew for each run, and two runs could lock in two directories.
pub fn default_dir() -> PathBuf {
    default_dir_for(nix::unistd::getuid(), std::env::var_os("DLOCK_DIR"))
}

fn default_dir_for(uid: nix::unistd::Uid, dlock_dir: Option<std::ffi::OsString>) -> PathBuf {
    match dlock_dir.map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ if uid.is_root() => {
            if root_only_dir(Path::new(RUN)) {
                Path::new(RUN).join("dlock")
            } else {
                PathBuf::from(ROOT_FALLBACK)
            }
        }
        _ if shared_sticky_root_dir(Path::new(RUN_LOCK)) => {
            Path::new(RUN_LOCK).join(format!("dlock-{uid}"))
        }
        _ => PathBuf::from(format!("/tmp/dlock-{uid}")),
    }
}

/// Where root's default directory goes when only root may create directories there.
const RUN: &str = "/run";
/// Root's default directory where `/run` is not root's alone.
const ROOT_FALLBACK: &str = "/var/lib/dlock";
/// Where the default directory goes when users may create directories there.
const RUN_LOCK: &str = "/run/lock";

/// Whether `dir` is a real directory (no link) of root's that everyone may create entries in
/// and only their owners may remove (mode 1777), like /tmp.
fn shared_sticky_root_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir)
        .is_ok_and(|meta| meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o1777 == 0o1777)
}

/// Whether `dir` is a real directory (no link) of root's that no one else may write to.
fn root_only_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir)
        .is_ok_and(|meta| meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o022 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::unistd::Uid;

    #[test]
    fn the_default_directory_is_per_user_and_roots_is_under_root_only_directories() {
        let root = default_dir_for(Uid::from_raw(0), None);
        assert!(root == Path::new("/run/dlock") || root == Path::new(ROOT_FALLBACK));
        let user = default_dir_for(Uid::from_raw(1000), None);
        assert!(
            user == Path::new("/run/lock/dlock-1000") || user == Path::new("/tmp/dlock-1000"),
            "{}",
            user.display()
        );
        // DLOCK_DIR wins when absolute, for root too; a relative one is ignored.
        let set = Some(std::ffi::OsString::from("/srv/locks"));
        assert_eq!(
            default_dir_for(Uid::from_raw(0), set),
            Path::new("/srv/locks")
        );
        let relative = Some(std::ffi::OsString::from("locks"));
        assert_eq!(default_dir_for(Uid::from_raw(1000), relative), user);
    }
}
