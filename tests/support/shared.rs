//! One server of each kind for the whole test run, for the tests that only take, hold and
//! release locks on it (the contract): `Shared<S>` is such a server seen by one test, which
//! gets its own `--prefix` (`DLOCK_PREFIX`) on it besides its unique lock names. A test that
//! restarts, pauses, fails over, reconfigures or fills a server starts a private one.
//!
//! A shared server lives in a static and is never dropped, so it is torn down from outside:
//! its processes run in process groups of their own and its files lie under this run's root
//! directory, and a watchdog process, started with the first shared server, kills those
//! groups and removes the root as soon as this test process is gone, however it ends (every
//! test done, a panic, Ctrl-C, SIGKILL). The watchdog notices by the end of a pipe that only
//! this process holds reaching end-of-file.

use std::cell::Cell;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use super::*;

/// Waits for end-of-file on its stdin, then kills every process group listed in
/// `$1/groups` whose leader is still the process that was recorded (same pid and start time,
/// so a pid reused since is never touched), and removes `$1` and `$2`. It ignores the signals
/// a terminal or `timeout` sends the test run, so that it outlives the run it cleans up
/// after; removal is retried briefly while killed servers close their files.
const WATCHDOG: &str = r#"trap '' INT TERM HUP QUIT
cat > /dev/null
if [ -f "$1/groups" ]; then
    while read -r group start; do
        now=$(awk '{ sub(/.*\) /, ""); print $20 }' "/proc/$group/stat" 2>/dev/null)
        if [ -n "$now" ] && [ "$now" = "$start" ]; then
            kill -s KILL -- "-$group" 2>/dev/null
        fi
    done < "$1/groups"
fi
for try in 1 2 3 4 5 6 7 8 9 10; do
    rm -rf "$1" "$2" 2>/dev/null
    [ ! -e "$1" ] && [ ! -e "$2" ] && break
    sleep 0.2
done"#;

/// This run's root for shared servers' files, and the pipe that keeps its watchdog waiting.
struct Run {
    root: PathBuf,
    /// On tmpfs where there is one, for servers that sync every write (etcd, ZooKeeper).
    fast_root: PathBuf,
    groups: Mutex<std::fs::File>,
    /// Never waited for (it outlives this process); its stdin is never written and never
    /// closed while this process lives.
    _watchdog: Child,
}

fn this_run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let leaf = format!("dlock-tests-{}", std::process::id());
        let root = std::env::temp_dir().join(&leaf);
        let shm = Path::new("/dev/shm");
        let fast_root = if shm.is_dir() {
            shm.join(&leaf)
        } else {
            root.clone()
        };
        for dir in [&root, &fast_root] {
            std::fs::create_dir_all(dir).expect("shared servers' root directory");
            // The PostgreSQL server runs as `postgres` and must reach its directory below.
            std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .expect("chmod the shared servers' root");
        }
        let groups = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("groups"))
            .expect("the list of shared servers' process groups");
        let watchdog = Command::new("/bin/sh")
            .args(["-c", WATCHDOG, "dlock-test-watchdog"])
            .arg(&root)
            .arg(&fast_root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start the shared servers' watchdog (/bin/sh)");
        Run {
            root,
            fast_root,
            groups: Mutex::new(groups),
            _watchdog: watchdog,
        }
    })
}

thread_local! {
    /// Whether this thread is starting a shared server (see [`spawn_server`], [`server_dir`]).
    static STARTING_SHARED: Cell<bool> = const { Cell::new(false) };
}

fn starting_shared() -> bool {
    STARTING_SHARED.with(Cell::get)
}

/// A directory for a server's files: under this run's root while a shared server starts
/// (removed by the watchdog), else a temp dir removed when dropped.
pub fn server_dir() -> tempfile::TempDir {
    if starting_shared() {
        tempfile::tempdir_in(&this_run().root).expect("temp dir")
    } else {
        tempfile::tempdir().expect("temp dir")
    }
}

/// A directory on tmpfs where there is one (for servers that sync every write), under this
/// run's root while a shared server starts.
pub fn fast_server_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if starting_shared() {
        tempfile::tempdir_in(&this_run().fast_root).expect("temp dir")
    } else if shm.is_dir() {
        tempfile::tempdir_in(shm).expect("temp dir")
    } else {
        tempfile::tempdir().expect("temp dir")
    }
}

/// Spawn a server process, leading a process group of its own, which the watchdog kills
/// when the run is over if it still runs then: a shared server always, a test's own server
/// when the run was interrupted (Ctrl-C, a timeout's SIGKILL) before the test could stop it.
pub fn spawn_server(command: &mut Command, what: &str) -> Child {
    command.process_group(0);
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    register_group(child.id() as i32);
    child
}

/// Have the watchdog kill process group `group` (a server's; also one that started its own
/// session, such as the PostgreSQL postmaster under `pg_ctl`) when the run is over, if its
/// leader is still the process that runs now.
pub fn register_group(group: i32) {
    let Some(start) = start_time(group) else {
        // Gone already: nothing to kill later.
        return;
    };
    let run = this_run();
    let mut groups = run.groups.lock().unwrap_or_else(|e| e.into_inner());
    writeln!(groups, "{group} {start}").expect("record a server's process group");
}

/// A process's start time (field 22 of `/proc/PID/stat`, after the parenthesised name), which
/// tells it from a later process given the same pid.
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// The server in `cell`, started by `start` on first use (and then by every test of the
/// run), seen by one test under a prefix of its own.
pub fn shared<S: LockServer>(cell: &'static OnceLock<S>, start: fn() -> S) -> Shared<S> {
    let server = cell.get_or_init(|| {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                STARTING_SHARED.with(|s| s.set(false));
            }
        }
        this_run();
        STARTING_SHARED.with(|s| s.set(true));
        let _reset = Reset;
        start()
    });
    Shared {
        server,
        prefix: Some(format!("t-{}", unique())),
    }
}

/// A shared server as one test sees it: the server, and the test's own prefix on it.
pub struct Shared<S: 'static> {
    server: &'static S,
    prefix: Option<String>,
}

impl<S> Shared<S> {
    /// Without a prefix of its own (dlock's default one): for a test that finds its locks on
    /// the server by their default keys or paths. Its unique lock names keep it apart from
    /// the other tests; it must not count what the whole server holds.
    pub fn unprefixed(self) -> Shared<S> {
        Shared {
            server: self.server,
            prefix: None,
        }
    }
}

/// The server's own methods (its port, raw commands), as on a private one.
impl<S> std::ops::Deref for Shared<S> {
    type Target = S;

    fn deref(&self) -> &S {
        self.server
    }
}

impl<S: LockServer> LockServer for Shared<S> {
    fn url(&self) -> String {
        self.server.url()
    }

    fn scheme(&self) -> &'static str {
        self.server.scheme()
    }

    fn break_hold(&self, env: &TestEnv, name: &str) {
        self.server.break_hold(env, name)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        self.server.env()
    }

    fn password_url(&self) -> Option<String> {
        self.server.password_url()
    }

    fn ttl(&self) -> Option<&'static str> {
        self.server.ttl()
    }

    fn stored_text(&self) -> Option<String> {
        self.server.stored_text()
    }

    fn killed_holder_outlives_it(&self) -> bool {
        self.server.killed_holder_outlives_it()
    }

    fn prefix(&self) -> Option<String> {
        self.prefix.clone()
    }

    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        self.server.url_at(addr)
    }

    fn missing_socket_url(&self, dir: &std::path::Path) -> Option<(String, std::path::PathBuf)> {
        self.server.missing_socket_url(dir)
    }
}

impl<S: LeaseServer> LeaseServer for Shared<S> {
    fn port(&self) -> u16 {
        self.server.port()
    }

    fn url_via(&self, port: u16) -> String {
        self.server.url_via(port)
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
