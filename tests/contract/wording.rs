//! The contract: what a user reads is the same on every backend (the conflict line, the
//! waiting line at a terminal, `list`), and `--min-hold` keeps the lock after the command.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// `dlock: lock 'NAME' is held by pid N on HOST (USER: COMMAND)[ for T]; WHY` with nothing
/// else on the line: the one shape of the conflict line.
fn assert_conflict_line(stderr: &str, lock: &str, pid: i32, why: &str) {
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "one line: {stderr}");
    let head = format!("dlock: lock '{lock}' is held by pid {pid} on ");
    assert!(
        line.starts_with(&head),
        "{line:?} does not start with {head:?}"
    );
    let rest = &line[head.len()..];
    let (host, rest) = rest
        .split_once(" (")
        .unwrap_or_else(|| panic!("no '(user: …)': {line}"));
    assert!(
        !host.is_empty() && !host.contains(' '),
        "host {host:?}: {line}"
    );
    assert!(rest.contains(": sh -c "), "no 'user: command': {line}");
    assert!(
        rest.ends_with(&format!("; {why}")),
        "{line:?} does not end with {why:?}"
    );
}

pub fn conflict_line_reads_the_same_on_every_backend(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert_conflict_line(
        &stderr_of(&out),
        &lock,
        holder.pid(),
        "not waiting (--no-wait)",
    );
    let out = env.run(["run", "--wait", "300ms", &lock, "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert_conflict_line(
        &stderr_of(&out),
        &lock,
        holder.pid(),
        "gave up after waiting 300ms (--wait)",
    );
    // `list` counts waiters in the same column everywhere: a number, never "-".
    let list = stdout_of(&env.run(["list"]));
    let row = list
        .lines()
        .find(|l| l.starts_with(lock.as_str()))
        .unwrap_or_else(|| panic!("{lock} not listed: {list}"));
    let words: Vec<&str> = row.split_whitespace().collect();
    let column = |name: &str| {
        list.lines()
            .next()
            .and_then(|header| header.split_whitespace().position(|w| w == name))
            .unwrap_or_else(|| panic!("no {name} column: {list}"))
    };
    assert_eq!(words[column("PID")], holder.pid().to_string(), "{row}");
    let waiting = words[column("WAITING")];
    assert!(
        waiting.parse::<u64>().is_ok(),
        "waiting column {waiting:?}: {row}"
    );
}

/// Everything written to a pseudo-terminal's other side, collected by a thread.
struct Screen {
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Screen {
    fn watch(master: &OwnedFd) -> Screen {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = std::fs::File::from(master.try_clone().expect("dup master"));
        let sink = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            // EIO once the terminal's last user is gone ends the loop.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().expect("screen").extend_from_slice(&buf[..n]);
            }
        });
        Screen { seen }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().expect("screen")).into_owned()
    }
}

pub fn waiting_at_a_terminal_names_the_holder(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let holder = env.hold(&lock, &[]);
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let screen = Screen::watch(&pty.master);
    let started = Instant::now();
    let mut waiter = env
        .dlock(["run", &lock, "true"])
        .stderr(Stdio::from(pty.slave.try_clone().expect("dup")))
        .spawn()
        .expect("spawn waiter");
    drop(pty.slave);
    let wanted = format!("waiting for '{lock}': held by pid {} on ", holder.pid());
    wait_until("the waiting line", PATIENCE, || {
        screen.text().contains(&wanted)
    });
    let shown_after = started.elapsed();
    // How long it has waited (no --wait: it never gives up).
    let text = screen.text();
    assert!(
        text.contains("; waited ") && !text.contains("gives up in"),
        "{text:?}"
    );
    // Within a second of starting to wait, on an idle machine; generous for a loaded one.
    assert!(
        shown_after < Duration::from_secs(5),
        "shown after {shown_after:?}"
    );
    drop(holder);
    let status = wait_within(&mut waiter, PATIENCE);
    assert_eq!(status.code(), Some(0));
    // The screen is read by a thread: the last line may come a moment after the exit.
    let finished = format!("acquired '{lock}' after waiting ");
    wait_until("the finished line", PATIENCE, || {
        screen.text().contains(&finished)
    });
    let text = screen.text();
    assert!(text.contains("\r\x1b[K"), "not updated in place: {text:?}");
}

pub fn waiting_is_silent_when_not_at_a_terminal(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let holder = env.hold(&lock, &[]);
    // Cron, not a CI job (where the wait is announced), whatever runs the tests.
    let mut cron = env.dlock(["run", "--wait", "1500ms", &lock, "true"]);
    cron.env_remove("CI");
    let out = output_within(cron, PATIENCE);
    assert_eq!(out.status.code(), Some(75));
    assert!(
        !stderr_of(&out).contains("waiting for"),
        "{}",
        describe(&out)
    );
    let out = env.run(["run", "-v", "--wait", "1500ms", &lock, "true"]);
    let wanted = format!("waiting for '{lock}': held by pid {}", holder.pid());
    assert!(stderr_of(&out).contains(&wanted), "{}", describe(&out));
    // How long it has waited, and when it gives up.
    let line = stderr_of(&out)
        .lines()
        .find(|l| l.contains(&wanted))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        line.contains("; waited ") && line.contains(", gives up in "),
        "{line}"
    );
}

/// Two runs a second apart with `--min-hold 4s`: the second finds the lock held (75); the
/// first exits with its command's status once the hold is 4 s old; `status` meanwhile shows
/// the hold kept. A signal in that time releases at once (128+N).
pub fn min_hold_keeps_the_lock_after_the_command_ends(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let ran = env.path("ran");
    let script = format!("touch '{}'; exit 3", ran.display());
    let started = Instant::now();
    let mut first = env
        .dlock(["run", "-n", "--min-hold", "4s", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn first run");
    wait_until("the first command", PATIENCE, || ran.exists());
    std::thread::sleep(Duration::from_secs(1));
    let second = env.run(["run", "-n", "-q", &lock, "touch", "second-ran"]);
    assert_eq!(second.status.code(), Some(75), "{}", describe(&second));
    assert!(!env.path("second-ran").exists());
    let status = stdout_of(&env.run(["status", &lock]));
    assert!(status.contains("state:      held"), "{status}");
    assert!(status.contains("kept"), "min hold not shown: {status}");
    // The backends that rewrite a holder's metadata in place say that the command ended
    // (docs/guide.md: "Min-hold"); the others show the min hold the holder started with.
    if super::capabilities(server).records_finished {
        wait_until("the finish recorded", PATIENCE, || {
            stdout_of(&env.run(["status", &lock])).contains("finished:   the command has ended")
        });
    }
    let code = wait_within(&mut first, PATIENCE).code();
    let took = started.elapsed();
    assert_eq!(code, Some(3), "the command's status");
    assert!(took >= Duration::from_secs(4), "released after {took:?}");
    assert!(
        took < Duration::from_secs(4) + PATIENCE,
        "released after {took:?}"
    );
    assert!(env.is_free(&lock));

    // A signal while the hold is kept: released and 128+N at once.
    let ran = env.path("ran-2");
    let script = format!("touch '{}'", ran.display());
    let mut held = env
        .dlock(["run", "--min-hold", "60s", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until("the command", PATIENCE, || ran.exists());
    // Once dlock has reaped its command, a signal finds it keeping the hold (earlier, it
    // would be forwarded to the command, and dlock would release at once with its status).
    let children = format!("/proc/{0}/task/{0}/children", held.id());
    wait_until("the command reaped", PATIENCE, || {
        std::fs::read_to_string(&children).is_ok_and(|c| c.trim().is_empty())
    });
    assert!(!env.is_free(&lock), "the hold is not kept");
    let signalled = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(held.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal");
    let code = wait_within(&mut held, PATIENCE).code();
    assert_eq!(code, Some(128 + 15));
    assert!(signalled.elapsed() < Duration::from_secs(10));
    assert!(env.is_free(&lock), "not released after the signal");
}

/// A `--min-hold` too long for any clock is refused (64, naming the option) before the lock
/// is taken or the command runs; the lock stays free.
pub fn a_huge_min_hold_is_refused_before_anything_runs(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let ran = env.path("ran");
    for value in ["9000y", "18446744073709551615s"] {
        let out = env.run([
            "run",
            "--min-hold",
            value,
            &lock,
            "touch",
            ran.to_str().expect("utf-8 path"),
        ]);
        assert_fails(&out, 64, "--min-hold");
        assert!(!ran.exists(), "--min-hold {value}: the command ran");
        assert!(env.is_free(&lock), "--min-hold {value}: the lock is held");
    }
}

/// A URL at a port where nothing listens reads the same on every backend:
/// `cannot connect to HOST:PORT: connection refused` (69), within a short `--wait`.
#[test]
fn a_refused_connection_reads_the_same_on_every_backend() {
    let (_server, env) = file_env();
    let port = free_port();
    let urls = [
        format!("redis://127.0.0.1:{port}/0"),
        format!("redis-sentinel://127.0.0.1:{port}/0#m"),
        format!("etcd://127.0.0.1:{port}"),
        format!("zk://127.0.0.1:{port}"),
        format!("postgres://u@127.0.0.1:{port}/db?sslmode=disable"),
        format!("mysql://u@127.0.0.1:{port}/db"),
        format!("memcached://127.0.0.1:{port}"),
    ];
    let wanted = format!("cannot connect to 127.0.0.1:{port}: connection refused");
    for url in &urls {
        let started = Instant::now();
        let out = env.run(["run", "--url", url, "--wait", "2s", "x", "true"]);
        assert_eq!(out.status.code(), Some(69), "{url}: {}", describe(&out));
        let stderr = stderr_of(&out);
        assert!(stderr.contains(&wanted), "{url}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{url}: {stderr}");
        assert!(
            started.elapsed() < PATIENCE,
            "{url}: {:?}",
            started.elapsed()
        );
    }
}

/// A URL of one backend at another kind of server says what it is not, and a TLS URL at a
/// plain-text server says it did not answer the handshake, within `--wait`.
#[test]
fn a_url_at_the_wrong_kind_of_server_says_so() {
    let (_server, env) = file_env();
    let redis = RedisServer::shared();
    let etcd = EtcdServer::shared();
    let cases = [
        (
            format!("etcd://127.0.0.1:{}", redis.port()),
            format!(
                "127.0.0.1:{} does not look like an etcd server (",
                redis.port()
            ),
        ),
        (
            format!("redis://127.0.0.1:{}/0", etcd.port()),
            format!(
                "127.0.0.1:{} does not look like a Redis server (",
                etcd.port()
            ),
        ),
        (
            format!("memcached://127.0.0.1:{}", redis.port()),
            format!(
                "127.0.0.1:{} does not look like a memcached server (",
                redis.port()
            ),
        ),
        (
            format!("mysql://u@127.0.0.1:{}/db", redis.port()),
            format!(
                "127.0.0.1:{} does not look like a MySQL server (it answers like a Redis \
                 server)",
                redis.port()
            ),
        ),
        (
            format!("postgres://u@127.0.0.1:{}/db", redis.port()),
            format!(
                "127.0.0.1:{} does not look like a PostgreSQL server (it answers like a Redis \
                 server)",
                redis.port()
            ),
        ),
        (
            format!("zk://127.0.0.1:{}", redis.port()),
            format!(
                "127.0.0.1:{} does not look like a ZooKeeper server (it answers like a Redis \
                 server)",
                redis.port()
            ),
        ),
        (
            format!("etcds://127.0.0.1:{}", etcd.port()),
            format!(
                "127.0.0.1:{} did not answer the TLS handshake; is it serving plain text? \
                 (use etcd://",
                etcd.port()
            ),
        ),
        (
            format!("rediss://127.0.0.1:{}/0", redis.port()),
            format!(
                "127.0.0.1:{} did not answer the TLS handshake; is it serving plain text? \
                 (use redis://",
                redis.port()
            ),
        ),
    ];
    for (url, wanted) in &cases {
        let started = Instant::now();
        let out = env.run(["run", "--url", url, "--wait", "3s", "x", "true"]);
        assert_eq!(out.status.code(), Some(69), "{url}: {}", describe(&out));
        let stderr = stderr_of(&out);
        assert!(stderr.contains(wanted.as_str()), "{url}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(3) + PATIENCE,
            "{url}: {:?}",
            started.elapsed()
        );
    }
}

/// PostgreSQL asked for TLS by a plain-text server reads like the other backends (78).
#[test]
fn postgres_tls_at_a_plain_server_reads_like_the_others() {
    let (_server, env) = file_env();
    let pg = PgServer::shared();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        pg.port()
    );
    let out = env.run(["run", "--url", &url, "--wait", "3s", "x", "true"]);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    let wanted = format!(
        "127.0.0.1:{} did not answer the TLS handshake; is it serving plain text? (use \
         sslmode=prefer",
        pg.port()
    );
    assert!(stderr_of(&out).contains(&wanted), "{}", describe(&out));
}

/// A holder cut off from its server says that renewing failed once, not once per retry,
/// before its lost-lock line (the keeper is the same on every lease backend).
#[test]
fn renewal_failures_are_one_line_not_one_per_retry() {
    let redis = RedisServer::shared();
    let proxy = Proxy::start(redis.port());
    let env = TestEnv::new(&*redis);
    let lock = lock_name("lock");
    let mut holder = env
        .dlock([
            "run",
            "--url",
            &redis.url_via(proxy.port),
            "--ttl",
            "4s",
            &lock,
            "sleep",
            "60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("the lock held", PATIENCE, || !env.is_free(&lock));
    proxy.blackhole();
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(status.code(), Some(124));
    let mut stderr = String::new();
    holder
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let renewals = stderr
        .lines()
        .filter(|l| l.contains("lease renewal"))
        .count();
    assert_eq!(renewals, 1, "{stderr}");
}

/// A holder of this host whose process was SIGKILLed is shown as gone (its entry stays until
/// its lease runs out), with the way to free it; a `flock(1)` on a lock file is named as such.
#[test]
fn a_killed_holder_of_this_host_shows_as_gone() {
    let redis = RedisServer::shared();
    let env = TestEnv::new(&*redis);
    let lock = lock_name("lock");
    let mut holder = env.hold(&lock, &["--ttl", "60s"]);
    let command = holder.command_pid();
    holder.signal(Signal::SIGKILL);
    holder.wait();
    // The command goes down with dlock; wait until both are gone.
    wait_until("the command gone", PATIENCE, || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(command), None).is_err()
    });
    let status = stdout_of(&env.run(["status", &lock]));
    assert!(
        status.contains("gone: no process") && status.contains("dlock release --force"),
        "{status}"
    );
    let list = stdout_of(&env.run(["list"]));
    let row = list
        .lines()
        .find(|l| l.starts_with(lock.as_str()))
        .unwrap_or_else(|| panic!("{lock} not listed: {list}"));
    assert!(row.contains("(gone)"), "{row}");
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert!(
        stderr_of(&out).contains(", gone; not waiting"),
        "{}",
        describe(&out)
    );
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn a_flock_holder_of_a_lock_file_is_named_as_such() {
    let (server, env) = file_env();
    let lock = lock_name("lock");
    assert!(env.run(["run", &lock, "true"]).status.success());
    let file = std::path::PathBuf::from(server.url().trim_start_matches("file://"))
        .join(format!("{lock}.lock"));
    assert!(file.exists(), "{}", file.display());
    let ready = env.path("flock-ready");
    // The command writes its pid once flock(1) holds the lock; ending it ends flock(1).
    let mut flock = std::process::Command::new("flock")
        .arg(&file)
        .args([
            "sh",
            "-c",
            &format!(
                "echo $$ > '{}.tmp'; mv '{0}.tmp' '{0}'; exec sleep 1000",
                ready.display()
            ),
        ])
        .spawn()
        .expect("flock(1)");
    wait_until("flock(1) holding", PATIENCE, || ready.exists());
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    let stderr = stderr_of(&out);
    let sleeper: i32 = std::fs::read_to_string(&ready)
        .expect("pid")
        .trim()
        .parse()
        .expect("a pid");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(sleeper), Signal::SIGKILL);
    wait_within(&mut flock, PATIENCE);
    assert!(stderr.contains("a flock(1) holder (not dlock)"), "{stderr}");
    assert!(!stderr.contains(" on ?"), "{stderr}");
}

/// A URL pointed at another kind of server is 69 at once, in one line that names what
/// answers there, on every backend that reaches a server over TCP (two servers of other
/// kinds each).
pub fn a_url_at_another_kind_of_server_names_what_answers_there(server: &dyn LockServer) {
    let Some((_, ours)) = server.url_at("127.0.0.1:1") else {
        return;
    };
    let pg = PgServer::shared();
    let zk = ZkServer::shared();
    let mysql = MysqlServer::shared();
    let others = [
        (pg.port, "a PostgreSQL server"),
        (zk.members[0].client_port, "a ZooKeeper server"),
        (mysql.port, "a MySQL server"),
    ];
    for (port, theirs) in others.into_iter().filter(|(_, t)| *t != ours).take(2) {
        let Some((url, _)) = server.url_at(&format!("127.0.0.1:{port}")) else {
            unreachable!("url_at gave a URL for port 1");
        };
        crate::backends::assert_names_the_server_there(&url, ours, theirs);
    }
}

/// A Unix socket no server listens on is named (69), on every backend that has them.
pub fn a_unix_socket_that_does_not_exist_is_named(server: &dyn LockServer) {
    let file = FileServer::start();
    let env = TestEnv::new(&file);
    let Some((url, socket)) = server.missing_socket_url(env.scratch.path()) else {
        return;
    };
    let out = env.run(["run", "--url", &url, &lock_name("s"), "touch", "ran"]);
    assert_fails(&out, 69, &crate::backends::no_socket(&socket));
    assert!(!env.path("ran").exists(), "the command ran");
}
