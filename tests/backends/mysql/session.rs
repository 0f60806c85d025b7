//! Losing the session: a SIGKILLed holder frees the lock at once; `KILL` of the holder's
//! connection or of all its connections (its watcher's first, too), `release --force` and a
//! server restart stop its command (124) by the time the next holder's starts, with one line; fencing tokens keep increasing across a server crash
//! right after a grant, across databases of one server, and across an emptied table.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::support::*;

#[test]
fn killed_holder_frees_the_lock_within_one_second() {
    crate::contract::killed_holder_frees_the_lock_within(
        &MysqlServer::shared(),
        Duration::from_secs(1),
    );
}

/// The holder's connection id, from `status`.
fn holder_connection(env: &TestEnv, lock: &str) -> u64 {
    let out = env.run(["status", "--json", lock]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {}", describe(&out)));
    json["holders"][0]["session"]
        .as_str()
        .and_then(|s| s.strip_prefix("connection id "))
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no connection id in {json}"))
}

#[test]
fn kill_of_the_holders_connection_exits_124() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let (mut holder, log) = env.stoppable_holder(&server.url(), &lock);
    let id = holder_connection(&env, &lock);
    server.sql(&format!("KILL {id}"));
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must report the lost lock"
    );
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\n"
    );
    assert!(env.is_free(&lock));
}

/// How much later than the next holder's command start the old holder's stop may be
/// noted: the server frees the lock and tells both at the same instant, and each side then
/// runs a shell (the notes are `date` runs); far below a heartbeat interval (10 s here).
const SAME_MOMENT: Duration = Duration::from_millis(300);

/// A holder with `--ttl 30s` (a heartbeat every 10 s) whose command notes when SIGTERM
/// reached it, and a queued waiter (no `--wait`) whose command notes when it started.
struct Handover {
    holder: Child,
    waiter: Child,
    stopped: PathBuf,
    started: PathBuf,
}

/// The holder of a [`Handover`], once its command runs, and where its stop is noted.
fn holding(env: &TestEnv, lock: &str) -> (Child, PathBuf) {
    let stopped = env.path("stopped");
    let ready = env.path("ready");
    let holder = env
        .dlock([
            "run",
            "--ttl",
            "30s",
            "--kill-after",
            "5s",
            lock,
            "sh",
            "-c",
            &format!(
                "trap 'date +%s%N > {s}; exit 0' TERM; echo ok > {r}; sleep 1000 & wait",
                s = stopped.display(),
                r = ready.display()
            ),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || ready.exists());
    (holder, stopped)
}

/// The waiter of a [`Handover`] (no `--wait`), whose command notes when it started.
impl Handover {
    /// The holder (from [`holding`]) and the waiter (from [`waiting`]) of one hand-over.
    fn of((holder, stopped): (Child, PathBuf), (waiter, started): (Child, PathBuf)) -> Handover {
        Handover {
            holder,
            waiter,
            stopped,
            started,
        }
    }
}

fn waiting(env: &TestEnv, lock: &str) -> (Child, PathBuf) {
    let started = env.path("started");
    let waiter = env
        .dlock([
            "run",
            "--ttl",
            "30s",
            lock,
            "sh",
            "-c",
            &format!("date +%s%N > {}", started.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    (waiter, started)
}

fn handover(env: &TestEnv, lock: &str) -> Handover {
    let (holder, stopped) = holding(env, lock);
    let (waiter, started) = waiting(env, lock);
    wait_until("waiter queued", PATIENCE, || env.waiters(lock) == 1);
    Handover {
        holder,
        waiter,
        stopped,
        started,
    }
}

impl Handover {
    /// The holder exits 124 and its command was stopped no later than the waiter's started
    /// (within [`SAME_MOMENT`]); the waiter succeeds. Returns the holder's stderr.
    fn assert_no_overlap(self) -> String {
        self.assert_stopped_within(SAME_MOMENT)
    }

    /// The holder exits 124 and its command was stopped no later than `late` after the
    /// waiter's started; the waiter succeeds. Returns the holder's stderr.
    fn assert_stopped_within(mut self, late: Duration) -> String {
        let status = wait_within(&mut self.holder, PATIENCE);
        let holder_err = stderr_left(&mut self.holder);
        assert_eq!(status.code(), Some(124), "{holder_err}");
        let status = wait_within(&mut self.waiter, PATIENCE);
        let waiter_err = stderr_left(&mut self.waiter);
        assert!(status.success(), "the waiter: {waiter_err}");
        let stamp = |path: &PathBuf| -> u128 {
            std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .trim()
                .parse()
                .expect("a time stamp")
        };
        let (stopped, started) = (stamp(&self.stopped), stamp(&self.started));
        assert!(
            stopped <= started + late.as_nanos(),
            "the old holder's command was stopped {} ms after the next holder's started: {holder_err}",
            (stopped - started) / 1_000_000
        );
        holder_err
    }
}

/// The holder says what happened once, as it happens, in one line (no retries, no second
/// line at the end), README: "a lost lock is one line".
fn assert_one_line(stderr: &str) {
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("dlock: lock '") && stderr.contains(" was lost while the command ran ("),
        "{stderr}"
    );
}

#[test]
fn kill_of_the_holders_connection_stops_its_command_before_the_next_holder_starts() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let run = handover(&env, &lock);
    let id = holder_connection(&env, &lock);
    server.sql(&format!("KILL {id}"));
    assert_one_line(&run.assert_no_overlap());
}

#[test]
fn kill_of_all_the_holders_connections_stops_its_command_before_the_next_holder_starts() {
    // Every session of the user at once, the lock session and its watcher alike, as a proxy
    // failover or a network blip cuts them; the next holder comes after.
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let held = holding(&env, &lock);
    server.sql("KILL USER 'dlock'");
    let run = Handover::of(held, waiting(&env, &lock));
    assert_one_line(&run.assert_no_overlap());
}

/// The connection id of the holder's watcher (the one connection of the user waiting in
/// `GET_LOCK`), once it waits.
fn watcher_connection(server: &MysqlServer) -> u64 {
    let mut id = None;
    wait_until("the holder's watcher waiting", PATIENCE, || {
        id = server
            .sql(
                "SELECT ID FROM information_schema.PROCESSLIST \
                 WHERE USER = 'dlock' AND INFO LIKE 'SELECT GET_LOCK(%'",
            )
            .parse()
            .ok();
        id.is_some()
    });
    id.unwrap_or_default()
}

#[test]
fn kill_of_the_holders_watcher_then_of_its_lock_session_stops_its_command_before_the_next_holder_starts(
) {
    // A failover or a network cut ends both connections, not always the lock session's
    // first: here the watcher's end comes first, seen while the lock session still answers,
    // and the lock session's a moment later.
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let held = holding(&env, &lock);
    let watcher = watcher_connection(&server);
    let session = holder_connection(&env, &lock);
    server.sql(&format!("KILL {watcher}"));
    server.sql(&format!("KILL {session}"));
    let run = Handover::of(held, waiting(&env, &lock));
    assert_one_line(&run.assert_no_overlap());
}

/// How much later than the next holder's command start the old holder's stop may be noted
/// when its watcher cannot connect: the watcher tries again at least every second, each
/// time after checking the lock session, and a try after the session's end is granted the
/// session key at once; [`SAME_MOMENT`] on top, and still far below a heartbeat interval.
const WITHOUT_A_WATCHER: Duration = Duration::from_secs(2);

#[test]
fn a_holder_whose_watcher_cannot_connect_stops_its_command_within_a_second_of_its_sessions_end() {
    let server = MysqlServer::start();
    // The holder's user may have one connection: its lock session's. The watcher's are
    // refused (error 1203) for as long as that session lives.
    server.sql("ALTER USER 'app'@'%' WITH MAX_USER_CONNECTIONS 1");
    let env = TestEnv::new(&server);
    let mut app = TestEnv::new(&server);
    app.url = server.password_url().expect("a URL with a password");
    let lock = lock_name("m");
    let run = Handover::of(holding(&app, &lock), waiting(&env, &lock));
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let session = holder_connection(&env, &lock);
    server.sql(&format!("KILL {session}"));
    assert_one_line(&run.assert_stopped_within(WITHOUT_A_WATCHER));
}

#[test]
fn release_by_force_stops_the_holders_command_before_the_next_holder_starts() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let run = handover(&env, &lock);
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_one_line(&run.assert_no_overlap());
}

#[test]
fn a_server_restart_stops_the_holders_command_before_the_waiter_gets_the_lock() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let run = handover(&env, &lock);
    server.restart_after_crash();
    assert_one_line(&run.assert_no_overlap());
}

#[test]
fn tokens_increase_across_databases_of_one_server() {
    // GET_LOCK names are server-wide: the same lock taken through another database.
    let server = MysqlServer::start();
    server.sql(
        "CREATE DATABASE dlock2; GRANT ALL ON dlock2.* TO 'dlock'@'%'; \
         CREATE DATABASE dlock3; GRANT ALL ON dlock3.* TO 'dlock'@'%'",
    );
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let mut seen = Vec::new();
    for database in ["dlock", "dlock", "dlock", "dlock2", "dlock", "dlock3"] {
        let url = server.url().replace("/dlock?", &format!("/{database}?"));
        let out = env.run([
            "run",
            "--url",
            &url,
            &lock,
            "sh",
            "-c",
            "echo $DLOCK_FENCING_TOKEN",
        ]);
        assert!(out.status.success(), "{}", describe(&out));
        let token: u64 = stdout_of(&out).trim().parse().expect("a numeric token");
        let highest = seen.iter().copied().max().unwrap_or(0);
        assert!(
            token > highest,
            "token {token} through {database} after {seen:?}"
        );
        seen.push(token);
    }
}

#[test]
fn tokens_increase_after_the_table_was_emptied() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let first = env.token(&lock);
    let second = env.token(&lock);
    assert!(second > first);
    server.sql("DELETE FROM dlock.dlock_locks");
    let third = env.token(&lock);
    assert!(
        third > second,
        "token {third} after {first}, {second} and a reset"
    );
    server.sql("DROP TABLE dlock.dlock_locks");
    let fourth = env.token(&lock);
    assert!(
        fourth > third,
        "token {fourth} after {third} and a dropped table"
    );
}
