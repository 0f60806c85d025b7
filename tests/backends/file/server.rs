//! The file backend's test "server": a private lock directory. Tests of no backend use it
//! too (a `TestEnv` needs a server), so `crate::support` gives it to every test.

use crate::support::*;

/// The file backend in a private directory.
pub struct FileServer {
    pub dir: tempfile::TempDir,
}

impl FileServer {
    pub fn start() -> FileServer {
        FileServer {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }
}

impl LockServer for FileServer {
    fn url(&self) -> String {
        format!("file://{}", self.dir.path().display())
    }

    fn scheme(&self) -> &'static str {
        "file"
    }

    fn stored_text(&self) -> Option<String> {
        let mut text = String::new();
        let mut dirs = vec![self.dir.path().to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read lock dir").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Ok(bytes) = std::fs::read(&path) {
                    text.push_str(&String::from_utf8_lossy(&bytes));
                }
            }
        }
        Some(text)
    }

    /// Replace the lock file with a new one, as a careless admin would.
    fn break_hold(&self, env: &TestEnv, name: &str) {
        let path = self.dir.path().join(format!("{name}.lock"));
        assert!(path.exists(), "no lock file at {}", path.display());
        let replacement = env.path("replacement.lock");
        std::fs::write(&replacement, b"").expect("write replacement");
        std::fs::rename(&replacement, &path).expect("replace lock file");
    }
}
