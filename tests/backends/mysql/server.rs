//! A private MariaDB server per test: `mariadb-install-db` once per test run into a template
//! (kept in the temp directory and reused by later runs), copied for each server, started as
//! `mariadbd` on a free loopback port with its socket and pid file in its own temp dir, ready
//! when the `mariadb` client answers over the socket, and stopped by its pid.
//!
//! Users: `root` over the socket (administration), `dlock` (all privileges on the database
//! `dlock`, plus PROCESS and CONNECTION ADMIN; no password, so that nested runs, which never
//! see a consumed password, can connect: the contract's user), `app` (the same privileges,
//! with a password), `reader` (may read the database but not write dlock's table).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::*;

pub const MYSQL_PASSWORD: &str = "app-secret";
pub const READER_PASSWORD: &str = "reader-secret";

fn mariadbd() -> PathBuf {
    server_binary("mariadbd", "mariadb-server")
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn run_ok(mut command: Command, what: &str) -> Output {
    command.stdin(Stdio::null());
    let out = output_within(command, Duration::from_secs(120));
    assert!(out.status.success(), "{what} failed: {}", describe(&out));
    out
}

/// An initialised data directory to copy (its name changes with the server version).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let binary = mariadbd();
        let install = server_binary("mariadb-install-db", "mariadb-server");
        let version = output_within(
            {
                let mut c = Command::new(&binary);
                c.arg("--version");
                c
            },
            PATIENCE,
        );
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(
            &(String::from_utf8_lossy(&version.stdout), is_root()),
            &mut hash,
        );
        let path = std::env::temp_dir().join(format!(
            "dlock-test-mariadb-template-{:016x}",
            std::hash::Hasher::finish(&hash)
        ));
        if path.join("ready").exists() {
            return path;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        // Every server gets a tmpdir of its own: a starting mariadbd deletes every `#sql*`
        // file in its tmpdir, which in a shared /tmp are other servers' live temporary
        // tables (their information_schema queries then fail, or the server crashes).
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).expect("tmpdir");
        let mut command = Command::new(install);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--innodb-log-file-size=8M",
            ]);
        if is_root() {
            command.arg("--user=root");
        }
        run_ok(command, "mariadb-install-db");
        std::fs::write(dir.path().join("ready"), "").expect("ready marker");
        let built = dir.keep();
        if std::fs::rename(&built, &path).is_err() {
            // Another test run made it first.
            let _ = std::fs::remove_dir_all(&built);
        }
        path
    })
}

/// A private MariaDB server; stopped (by its pid) on drop.
pub struct MysqlServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: std::sync::Mutex<Option<Child>>,
    /// More `mariadbd` options (TLS, for instance), given at every start.
    extra: Vec<String>,
}

impl MysqlServer {
    /// A MariaDB server shared by every test of the run that calls this (see
    /// `shared`), as [`MysqlServer::start`] starts it.
    pub fn shared() -> Shared<MysqlServer> {
        static SERVER: std::sync::OnceLock<MysqlServer> = std::sync::OnceLock::new();
        shared(&SERVER, MysqlServer::start)
    }

    pub fn start() -> MysqlServer {
        MysqlServer::start_with(&[])
    }

    /// With more `mariadbd` options, e.g. [`MysqlServer::tls_options`].
    pub fn start_with(extra: &[&str]) -> MysqlServer {
        let dir = server_dir();
        let mut copy = Command::new("/bin/cp");
        copy.arg("-a")
            .arg(template().join("data"))
            .arg(dir.path().join("data"));
        run_ok(copy, "copying the template data directory");
        let server = MysqlServer {
            port: free_port(),
            dir,
            child: std::sync::Mutex::new(None),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.launch();
        server.sql(&format!(
            "CREATE DATABASE dlock; \
             CREATE USER 'dlock'@'%'; \
             GRANT ALL ON dlock.* TO 'dlock'@'%'; \
             GRANT PROCESS, CONNECTION ADMIN ON *.* TO 'dlock'@'%'; \
             CREATE USER 'app'@'%' IDENTIFIED BY '{MYSQL_PASSWORD}'; \
             GRANT ALL ON dlock.* TO 'app'@'%'; \
             CREATE USER 'reader'@'%' IDENTIFIED BY '{READER_PASSWORD}'; \
             GRANT SELECT ON dlock.* TO 'reader'@'%'"
        ));
        server
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    /// Start `mariadbd` and wait until it answers over its socket.
    fn launch(&self) {
        let d = self.dir.path();
        // Its own tmpdir (see `template`): never the shared /tmp.
        let tmp = d.join("tmp");
        std::fs::create_dir_all(&tmp).expect("tmpdir");
        let mut command = Command::new(mariadbd());
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", self.socket().display()))
            .arg(format!("--pid-file={}", d.join("mysqld.pid").display()))
            .arg(format!("--log-error={}", d.join("error.log").display()))
            .args([
                "--skip-log-bin",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=8M",
                "--performance-schema=OFF",
            ])
            // Later options win.
            .args(&self.extra);
        if is_root() {
            command.arg("--user=root");
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_server(&mut command, "mariadbd");
        let pid = child.id() as i32;
        *self.child.lock().expect("child") = Some(child);
        wait_until("mariadbd answering", Duration::from_secs(60), || {
            assert!(is_alive(pid), "mariadbd exited: {}", self.log());
            self.socket().exists() && self.try_sql("SELECT 1").is_some_and(|o| o.trim() == "1")
        });
        // The port must be ours (another test's server may have taken a port we were given).
        let log = self.log();
        assert!(
            log.contains(&format!("port: {}", self.port)),
            "mariadbd is not listening on port {}: {log}",
            self.port
        );
    }

    /// `mariadbd` options for TLS with `certs`' CA and its leaf certificate `leaf` (`server`,
    /// or one made with [`TestCerts::leaf`]).
    pub fn tls_options(certs: &TestCerts, leaf: &str) -> Vec<String> {
        vec![
            format!("--ssl-cert={}", certs.path(&format!("{leaf}.crt"))),
            format!("--ssl-key={}", certs.path(&format!("{leaf}.key"))),
            format!("--ssl-ca={}", certs.path("ca.crt")),
        ]
    }

    /// Session status variable `name` (e.g. `Ssl_cipher`) of connection `id`, as the server
    /// sees it (needs `--performance-schema=ON`); `None` if there is no such connection.
    pub fn session_status(&self, id: u64, name: &str) -> Option<String> {
        let out = self.sql(&format!(
            "SELECT CONCAT('=', s.VARIABLE_VALUE) FROM performance_schema.status_by_thread s \
             JOIN performance_schema.threads t USING (THREAD_ID) \
             WHERE t.PROCESSLIST_ID = {id} AND s.VARIABLE_NAME = '{name}'"
        ));
        out.strip_prefix('=').map(str::to_owned)
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    pub fn try_sql(&self, sql: &str) -> Option<String> {
        let mut client = Command::new(server_binary("mariadb", "mariadb-client"));
        client
            .arg("--no-defaults")
            .arg("-S")
            .arg(self.socket())
            .args(["-u", "root", "-N", "-B", "-e", sql])
            .stdin(Stdio::null());
        let out = output_within(client, PATIENCE);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Start SQL as root over the socket in the background (kill the child when done).
    pub fn sql_in_background(&self, sql: &str) -> Child {
        Command::new(server_binary("mariadb", "mariadb-client"))
            .arg("--no-defaults")
            .arg("-S")
            .arg(self.socket())
            .args(["-u", "root", "-N", "-B", "-e", sql])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mariadb")
    }

    /// Run SQL as root over the socket; returns the client's tab-separated output.
    pub fn sql(&self, sql: &str) -> String {
        match self.try_sql(sql) {
            Some(out) => out.trim().to_owned(),
            None => panic!("SQL failed: {sql}\n{}", self.log()),
        }
    }

    /// SIGKILL the server (a crash) and wait until it is gone.
    pub fn crash(&self) {
        if let Some(mut child) = self.child.lock().expect("child").take() {
            let _ = child.kill();
            let _ = wait_within(&mut child, PATIENCE);
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Crash, then start again on the same port and data.
    pub fn restart_after_crash(&self) {
        self.crash();
        self.launch();
    }

    /// The URL for `user`, with `password` in it where given.
    pub fn url_as(&self, user: &str, password: Option<&str>) -> String {
        let password = password.map(|p| format!(":{p}")).unwrap_or_default();
        format!(
            "mysql://{user}{password}@127.0.0.1:{}/dlock?ssl-mode=DISABLED",
            self.port
        )
    }
}

impl Drop for MysqlServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            // A crash report from its first line (the signal and the stack), else the tail.
            let lines: Vec<&str> = log.lines().collect();
            let start = lines
                .iter()
                .position(|l| l.contains("got signal"))
                .unwrap_or(lines.len().saturating_sub(30));
            eprintln!("mariadbd's error log ends:");
            for line in lines[start..].iter().take(80) {
                eprintln!("  {line}");
            }
        }
        if let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = wait_within(&mut child, PATIENCE);
        }
    }
}

impl LockServer for MysqlServer {
    fn crash_and_restart(&mut self) -> bool {
        self.restart_after_crash();
        true
    }

    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        Some((
            format!("mysql://app:x@{addr}/dlock?ssl-mode=DISABLED"),
            "a MySQL server",
        ))
    }

    fn missing_socket_url(&self, dir: &std::path::Path) -> Option<(String, std::path::PathBuf)> {
        let socket = dir.join("no-mysql.sock");
        Some((
            format!(
                "mysql://app:{MYSQL_PASSWORD}@localhost/dlock?socket={}",
                socket.display()
            ),
            socket,
        ))
    }

    fn url(&self) -> String {
        self.url_as("dlock", None)
    }

    fn scheme(&self) -> &'static str {
        "mysql"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }

    fn password_url(&self) -> Option<String> {
        Some(self.url_as("app", Some(MYSQL_PASSWORD)))
    }

    /// `GET_LOCK` is the session's: it ends as the killed holder's connection closes.
    fn killed_holder_outlives_it(&self) -> bool {
        false
    }
}

impl LeaseServer for MysqlServer {
    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("mysql://dlock@127.0.0.1:{port}/dlock?ssl-mode=DISABLED")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
