//! A private PostgreSQL cluster per test: `initdb` once per test run into a template, copied
//! for each server, started by `pg_ctl` on a free loopback port with its socket in its own
//! temp dir. As root, everything runs as the `postgres` user (initdb refuses root). Also
//! pgbouncer in front of one (`Pooler`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::support::*;

/// The superuser's and the `app` role's passwords.
pub const SUPERUSER_PASSWORD: &str = "super-secret";
pub const APP_PASSWORD: &str = "app-secret";

/// The newest installed PostgreSQL's `bin` directory, or a failure saying how to install it.
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `apt-get install -y postgresql` (or `bash .ci/run`, which installs every test server)"),
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Run a PostgreSQL program, as `postgres` when we are root.
fn pg_command(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run_ok(mut command: Command, what: &str) -> Output {
    command.stdin(Stdio::null());
    let out = crate::support::output_within(command, PATIENCE);
    assert!(out.status.success(), "{what} failed: {}", describe(&out));
    out
}

/// The `psql` of the same installation.
pub fn psql_binary() -> PathBuf {
    bin_dir().join("psql")
}

/// Hand a file or directory to the `postgres` user when we are root.
pub fn give_away(path: &Path) {
    if is_root() {
        let user = nix::unistd::User::from_name("postgres")
            .ok()
            .flatten()
            .expect("the postgres user (apt-get install -y postgresql creates it)");
        nix::unistd::chown(path, Some(user.uid), Some(user.gid)).expect("chown to postgres");
    }
}

/// `pg_hba.conf` of every test cluster: the `app` role authenticates with a password, everyone
/// else is trusted (fast connections for the contract tests). Lines are matched in order.
const HBA: &str = "local all all trust\n\
                   local replication all trust\n\
                   host all app 127.0.0.1/32 scram-sha-256\n\
                   host all app ::1/128 scram-sha-256\n\
                   host all all 127.0.0.1/32 trust\n\
                   host all all ::1/128 trust\n";

/// An initialised cluster to copy. `initdb` takes seconds, so the template is kept in the temp
/// directory and reused by later runs (its name changes with the server version and set-up).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let bin = bin_dir();
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(
            &(bin.display().to_string(), HBA, SUPERUSER_PASSWORD),
            &mut hash,
        );
        let path = std::env::temp_dir().join(format!(
            "dlock-test-pg-template-{:016x}",
            std::hash::Hasher::finish(&hash)
        ));
        if path.join("ready").exists() {
            return path;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        make_accessible(dir.path());
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, SUPERUSER_PASSWORD).expect("password file");
        give_away(&pwfile);
        let data = dir.path().join("data");
        let mut initdb = pg_command(&bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "--auth-local=trust",
            ])
            .arg(format!("--pwfile={}", pwfile.display()));
        run_ok(initdb, "initdb");
        std::fs::write(data.join("pg_hba.conf"), HBA).expect("pg_hba.conf");
        std::fs::write(dir.path().join("ready"), "").expect("ready marker");
        let built = dir.keep();
        if std::fs::rename(&built, &path).is_err() {
            // Another test run made it first.
            let _ = std::fs::remove_dir_all(&built);
        }
        path
    })
}

fn make_accessible(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    give_away(dir);
}

/// A private PostgreSQL server; stopped (by its postmaster's pid) on drop.
pub struct PgServer {
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl PgServer {
    /// A PostgreSQL server shared by every test of the run that calls this (see
    /// `shared`), as [`PgServer::start`] starts it.
    pub fn shared() -> Shared<PgServer> {
        static SERVER: std::sync::OnceLock<PgServer> = std::sync::OnceLock::new();
        shared(&SERVER, PgServer::start)
    }

    pub fn start() -> PgServer {
        PgServer::start_with(&[])
    }

    /// With extra server settings, e.g. `["-c", "ssl=on"]`.
    pub fn start_with(extra: &[&str]) -> PgServer {
        let dir = server_dir();
        make_accessible(dir.path());
        let mut copy = pg_command(Path::new("/bin/cp"));
        copy.arg("-a")
            .arg(template().join("data"))
            .arg(dir.path().join("data"));
        run_ok(copy, "copying the template cluster");
        let server = PgServer {
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.launch();
        server.psql(&format!(
            "CREATE ROLE app LOGIN PASSWORD '{APP_PASSWORD}'; GRANT ALL ON DATABASE postgres TO app"
        ));
        server
    }

    /// A hot standby of `primary`, streaming from it (`pg_basebackup -R`).
    pub fn standby_of(primary: &PgServer) -> PgServer {
        let dir = tempfile::tempdir().expect("temp dir");
        make_accessible(dir.path());
        let mut backup = pg_command(&bin_dir().join("pg_basebackup"));
        backup
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-R", "-N", "-X", "stream", "-U", "postgres", "-h"])
            .arg(primary.dir())
            .args(["-p", &primary.port.to_string()]);
        run_ok(backup, "pg_basebackup");
        let server = PgServer {
            port: free_port(),
            dir,
            extra: Vec::new(),
        };
        server.launch();
        server
    }

    fn launch(&self) {
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        for word in &self.extra {
            options.push(' ');
            options.push_str(word);
        }
        let mut start = pg_command(&bin_dir().join("pg_ctl"));
        start
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("log"))
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .stdout(Stdio::null());
        run_ok(start, "pg_ctl start");
        // `pg_ctl` starts the postmaster in a session of its own.
        if let Some(postmaster) = self.postmaster() {
            register_group(postmaster);
        }
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the server logged so far (`pg_ctl -l`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// A `psql` session as the superuser over the socket, with `-v` variables, that runs
    /// `sql` and then reads more from its stdin (piped); end it by dropping its stdin and
    /// waiting.
    pub fn psql_session(&self, vars: &[&str], sql: &str) -> std::process::Child {
        let mut psql = Command::new(bin_dir().join("psql"));
        psql.args(["-X", "-At", "-U", "postgres", "-d", "postgres"])
            .arg("-h")
            .arg(self.dir.path())
            .arg("-p")
            .arg(self.port.to_string());
        for var in vars {
            psql.arg("-v").arg(var);
        }
        let mut session = psql
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn psql");
        let stdin = session.stdin.as_mut().expect("psql stdin");
        writeln!(stdin, "{sql}").expect("write to psql");
        stdin.flush().expect("flush psql");
        session
    }

    /// Granted advisory locks in the cluster, in any mode.
    pub fn granted_advisory_locks(&self) -> u64 {
        self.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
            .parse()
            .unwrap_or(u64::MAX)
    }

    /// The postmaster's pid, from `postmaster.pid`.
    fn postmaster(&self) -> Option<i32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// Stop at once, like a crash (`pg_ctl stop -m immediate`), then start again.
    pub fn restart_immediate(&self) {
        self.stop();
        self.launch();
    }

    /// SIGQUIT to the postmaster (immediate shutdown) and wait until it is gone.
    pub fn stop(&self) {
        if let Some(pid) = self.postmaster() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGQUIT,
            );
            wait_until("postgres stopped", PATIENCE, || !is_alive(pid));
            let _ = std::fs::remove_file(self.data().join("postmaster.pid"));
        }
    }

    /// Run SQL as the superuser over the socket; returns psql's unaligned output.
    pub fn psql(&self, sql: &str) -> String {
        let mut psql = Command::new(bin_dir().join("psql"));
        psql.args([
            "-X",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .arg("-h")
        .arg(self.dir.path())
        .arg("-p")
        .arg(self.port.to_string())
        .arg("-c")
        .arg(sql);
        let out = run_ok(psql, "psql");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Ungranted advisory lock requests (waiters) in the cluster.
    pub fn pending_requests(&self) -> u64 {
        self.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            .parse()
            .unwrap_or(u64::MAX)
    }

    pub fn url_as(&self, user: &str, password: Option<&str>) -> String {
        match password {
            Some(password) => format!(
                "postgres://{user}:{password}@127.0.0.1:{}/postgres?sslmode=disable",
                self.port
            ),
            None => format!(
                "postgres://{user}@127.0.0.1:{}/postgres?sslmode=disable",
                self.port
            ),
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LockServer for PgServer {
    /// SIGKILL every server process (`pg_ctl` starts the postmaster in a process group of
    /// its own, with every child in it), so that nothing more reaches the WAL, then start.
    fn crash_and_restart(&mut self) -> bool {
        if let Some(postmaster) = self.postmaster() {
            let group = nix::unistd::Pid::from_raw(postmaster);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            wait_until("every server process is gone", PATIENCE, || {
                nix::sys::signal::killpg(group, None).is_err()
            });
        }
        self.restart_immediate();
        true
    }

    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        Some((
            format!("postgres://app:x@{addr}/postgres?sslmode=disable"),
            "a PostgreSQL server",
        ))
    }

    /// libpq's form: the socket directory as `host`, the socket in it named by the port.
    fn missing_socket_url(&self, dir: &std::path::Path) -> Option<(String, std::path::PathBuf)> {
        let socket_dir = dir.join("no-postgres");
        Some((
            format!("postgres:///postgres?host={}", socket_dir.display()),
            socket_dir.join(".s.PGSQL.5432"),
        ))
    }

    fn url(&self) -> String {
        self.url_as("postgres", None)
    }

    fn scheme(&self) -> &'static str {
        "postgres"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }

    fn password_url(&self) -> Option<String> {
        Some(self.url_as("app", Some(APP_PASSWORD)))
    }

    /// The advisory lock is the session's: it ends as the killed holder's connection closes.
    fn killed_holder_outlives_it(&self) -> bool {
        false
    }
}

impl LeaseServer for PgServer {
    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}

/// pgbouncer in front of a [`PgServer`], in transaction-pooling mode with one server
/// connection (so two clients share a server session); stopped by its pid on drop.
pub struct Pooler {
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Pooler {
    pub fn start(server: &PgServer) -> Pooler {
        let binary = crate::support::server_binary("pgbouncer", "pgbouncer");
        let dir = tempfile::tempdir().expect("temp dir");
        make_accessible(dir.path());
        let port = free_port();
        let d = dir.path().display();
        let config = format!(
            "[databases]\npostgres = host=127.0.0.1 port={}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {d}/users.txt\npool_mode = transaction\n\
             default_pool_size = 1\nignore_startup_parameters = options\n\
             logfile = {d}/pgbouncer.log\npidfile = {d}/pgbouncer.pid\n",
            server.port
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), config).expect("pgbouncer.ini");
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").expect("users");
        // pgbouncer refuses to run as root.
        let mut start = pg_command(&binary);
        start.arg("-d").arg(dir.path().join("pgbouncer.ini"));
        run_ok(start, "pgbouncer");
        let pooler = Pooler { port, dir };
        wait_until("pgbouncer listening", PATIENCE, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        pooler
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
            wait_until("pgbouncer stopped", PATIENCE, || !is_alive(pid));
        }
    }
}
