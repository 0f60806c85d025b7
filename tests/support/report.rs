//! Reading `--report` files, a URL of the backend under test that reaches no server, and the
//! places a report can be sent to: directories and links of another user, a small full disk.

use std::path::Path;

use super::*;

/// Every line of the report at `path`, each parsed as one JSON object (a line that is not
/// one fails the test).
pub fn report_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the report {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object: {line:?}: {e}\n{text}"));
            assert!(value.is_object(), "not an object: {line}");
            value
        })
        .collect()
}

/// The only line of the report at `path`.
pub fn report_line(path: &Path) -> serde_json::Value {
    let mut lines = report_lines(path);
    assert_eq!(lines.len(), 1, "one line expected: {lines:?}");
    lines.remove(0)
}

/// `url` (of the backend under test) with every loopback endpoint moved to a free port, a
/// socket path to one that does not exist, and a file backend's directory under a regular
/// file: a URL of the same backend that reaches nothing.
pub fn unreachable_url(env: &TestEnv, url: &str) -> String {
    if let Some(_dir) = url.strip_prefix("file://") {
        let blocker = env.path("not-a-directory");
        std::fs::write(&blocker, b"").expect("write a file in the way");
        return format!("file://{}/locks", blocker.display());
    }
    if let Some((scheme, _)) = url.split_once("+unix://") {
        return format!("{scheme}+unix://{}", env.path("no-such.sock").display());
    }
    let port = free_port().to_string();
    let mut out = String::new();
    let mut rest = url;
    while let Some(at) = rest.find("127.0.0.1:") {
        let (before, after) = rest.split_at(at + "127.0.0.1:".len());
        out.push_str(before);
        out.push_str(&port);
        rest = after.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    assert_ne!(out, url, "no loopback endpoint in {url}");
    out
}

/// The uid of "nobody", standing in for another user (the tests run as root).
pub const ANOTHER_USER: u32 = 65534;

/// A directory with exactly `mode` (set after creation, so the umask does not interfere).
pub fn dir_of_mode(path: &Path, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path.to_owned()
}

/// Make `path` (a symbolic link itself, not what it points to) [`ANOTHER_USER`]'s.
pub fn hand_to_another_user(path: &Path) {
    std::os::unix::fs::lchown(path, Some(ANOTHER_USER), None)
        .expect("lchown (these tests run as root)");
}

/// A tmpfs of `bytes` mounted on a new directory `path`, unmounted when dropped: a small disk
/// that a test can fill (mounting needs root, as these tests run).
pub struct SmallDisk {
    pub path: std::path::PathBuf,
}

impl SmallDisk {
    pub fn mount(path: &Path, bytes: u64) -> SmallDisk {
        std::fs::create_dir(path).expect("mkdir the mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0755")])
            .arg("tmpfs")
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount -t tmpfs on {}: {status}",
            path.display()
        );
        SmallDisk {
            path: path.to_owned(),
        }
    }

    /// The size of the blocks the disk's space is counted in (a memory page on tmpfs).
    pub fn block_size(&self) -> usize {
        let stat = nix::sys::statvfs::statvfs(&self.path).expect("statvfs");
        usize::try_from(stat.block_size()).expect("a block size")
    }

    /// Fill the disk: `name` grows until no byte more fits (bounded by the disk's size).
    pub fn fill(&self, name: &str) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.path.join(name)).expect("create the filler");
        let block = vec![0u8; 4096];
        for _ in 0..100_000 {
            match file.write(&block) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return,
                Err(e) => panic!("filling {}: {e}", self.path.display()),
            }
        }
        panic!("{} did not fill up", self.path.display());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.path)
            .status();
    }
}
