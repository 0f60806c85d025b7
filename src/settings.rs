//! Flags > `DLOCK_*` environment > config file > defaults, merged once into validated settings.
//!
//! clap already folds the environment into the flag values, so this module only has to fill
//! what is still missing from the config file (design §8) and the defaults, and to validate
//! everything before any backend is contacted (design §4.1). Config file problems are 78,
//! bad flag or environment values 64.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::backend::postgres::{self, PgTarget};
use crate::cli::{self, OnLost};
use crate::error::Error;
use crate::lock::{LockName, Wait};

pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);
pub const DEFAULT_CONFLICT_EXIT_CODE: u8 = 75;
pub const DEFAULT_PREFIX: &str = "dlock";
/// A crashed holder blocks everyone for up to one TTL; beyond a week is surely a mistake.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
pub const MAX_LIMIT: u32 = 1024;
/// The shortest lease a remote backend accepts (see [`minimum_ttl`]).
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The config file (TOML). Unknown keys are an error.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    url: Option<OneOrMany>,
    wait: Option<String>,
    no_wait: Option<bool>,
    conflict_exit_code: Option<i64>,
    ttl: Option<String>,
    limit: Option<i64>,
    on_lost: Option<String>,
    kill_after: Option<String>,
    prefix: Option<String>,
    /// Read by the remote backends (not needed by the file backend).
    pub password_file: Option<PathBuf>,
    pub redis: Option<BackendFileConfig>,
    pub etcd: Option<BackendFileConfig>,
    pub zookeeper: Option<BackendFileConfig>,
    pub postgres: Option<BackendFileConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// Per-backend secrets and TLS material.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendFileConfig {
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Where the locks live, as parsed from the URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// `file:///dir`; `default` when dlock chose the directory.
    File { dir: PathBuf, default: bool },
    /// `redis://`, `rediss://`, `redis+unix://`.
    Redis(RedisTarget),
    /// `etcd://h:p[,h:p…]`, `etcds://…`.
    Etcd(EtcdTarget),
    /// `postgres://…`, `postgresql://…`, or libpq's `key=value …` form.
    Postgres(PgTarget),
    /// `zk://h:p[,h:p…][/chroot]`.
    Zk(ZkTarget),
}

/// A ZooKeeper ensemble: its members, the chroot and the digest credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkTarget {
    pub endpoints: Vec<(String, u16)>,
    /// Absolute, without a trailing `/`; `None` for the root.
    pub chroot: Option<String>,
    pub user: Option<String>,
    pub password: Option<Secret>,
}

/// An etcd cluster: its client endpoints and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTarget {
    pub endpoints: Vec<(String, u16)>,
    pub tls: bool,
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub tls_files: TlsFiles,
}

/// How to reach a Redis server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisAddr {
    Tcp { host: String, port: u16 },
    Tls { host: String, port: u16 },
    Unix { path: PathBuf },
}

/// A Redis server, database and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTarget {
    pub addr: RedisAddr,
    pub db: i64,
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub tls: TlsFiles,
}

/// TLS material from the config file (PEM files).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// A credential: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: String) -> Secret {
        Secret(secret)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Settings every subcommand shares.
#[derive(Clone, Debug)]
pub struct Common {
    pub location: Location,
    pub prefix: String,
    pub ttl: Duration,
    /// The URL as given, with any password replaced by `***` (safe to print or pass on).
    pub display_url: String,
}

impl Common {
    /// The scheme name shown in DLOCK_BACKEND.
    pub fn scheme(&self) -> &'static str {
        match &self.location {
            Location::File { .. } => "file",
            Location::Redis(target) => match target.addr {
                RedisAddr::Tcp { .. } => "redis",
                RedisAddr::Tls { .. } => "rediss",
                RedisAddr::Unix { .. } => "redis+unix",
            },
            Location::Etcd(target) => {
                if target.tls {
                    "etcds"
                } else {
                    "etcd"
                }
            }
            Location::Postgres(_) => "postgres",
            Location::Zk(_) => "zk",
        }
    }

    /// Identifies "the same backend and namespace" for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        let prefix = crate::lock::encode_component(&self.prefix);
        match &self.location {
            Location::File { dir, .. } => format!("file://{}|{prefix}", dir.display()),
            Location::Redis(target) => match &target.addr {
                RedisAddr::Tcp { host, port } | RedisAddr::Tls { host, port } => {
                    format!("redis://{host}:{port}/{}|{prefix}", target.db)
                }
                RedisAddr::Unix { path } => {
                    format!("redis+unix://{}/{}|{prefix}", path.display(), target.db)
                }
            },
            Location::Etcd(target) => {
                // The same cluster whatever order the endpoints were listed in.
                let mut endpoints: Vec<String> = target
                    .endpoints
                    .iter()
                    .map(|(h, p)| format!("{h}:{p}"))
                    .collect();
                endpoints.sort();
                format!("etcd://{}|{prefix}", endpoints.join(","))
            }
            Location::Postgres(target) => format!("{}|{prefix}", target.identity()),
            Location::Zk(target) => {
                let mut endpoints: Vec<String> = target
                    .endpoints
                    .iter()
                    .map(|(h, p)| format!("{h}:{p}"))
                    .collect();
                endpoints.sort();
                format!(
                    "zk://{}{}|{prefix}",
                    endpoints.join(","),
                    target.chroot.as_deref().unwrap_or("")
                )
            }
        }
    }
}

/// The program to run.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    /// The resolved executable.
    pub program: PathBuf,
    /// `argv[0]` as the user wrote it.
    pub arg0: OsString,
    pub args: Vec<OsString>,
    /// The command line for messages and holder metadata.
    pub display: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct RunSettings {
    pub common: Common,
    pub name: LockName,
    pub command: CommandSpec,
    pub wait: Wait,
    pub conflict_exit_code: u8,
    pub limit: u32,
    pub on_lost: OnLost,
    pub kill_after: Duration,
}

/// Load the config file named by `--config` / `DLOCK_CONFIG`, else the first of
/// `$XDG_CONFIG_HOME/dlock/config.toml` and `/etc/dlock/config.toml` that exists.
pub fn load_config(explicit: Option<&Path>) -> Result<FileConfig, Error> {
    let path = match explicit {
        Some(path) => path.to_owned(),
        None => match default_config_paths().into_iter().find(|p| p.exists()) {
            Some(path) => path,
            None => return Ok(FileConfig::default()),
        },
    };
    let text = crate::files::read_small_file(&path, crate::files::MAX_CONFIG_BYTES)
        .map_err(|e| Error::Config(format!("cannot read config file {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| {
        let detail = e.message().trim().to_owned();
        let line = e
            .span()
            .map(|s| {
                format!(
                    " (line {})",
                    text[..s.start.min(text.len())].lines().count().max(1)
                )
            })
            .unwrap_or_default();
        Error::Config(format!(
            "bad config file {}{line}: {detail}",
            path.display()
        ))
    })
}

fn default_config_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(dir) = xdg {
        paths.push(dir.join("dlock/config.toml"));
    }
    paths.push(PathBuf::from("/etc/dlock/config.toml"));
    paths
}

/// A value with the place it came from, so errors can say which setting was wrong.
struct Sourced<T> {
    value: T,
    from_file: bool,
}

fn pick<T>(flag: Option<T>, file: Option<T>) -> Option<Sourced<T>> {
    match (flag, file) {
        (Some(value), _) => Some(Sourced {
            value,
            from_file: false,
        }),
        (None, Some(value)) => Some(Sourced {
            value,
            from_file: true,
        }),
        (None, None) => None,
    }
}

/// A bad value: 64 when it came from a flag or the environment, 78 from the config file.
fn bad(from_file: bool, what: &str, message: String) -> Error {
    if from_file {
        Error::Config(format!("config file: {what}: {message}"))
    } else {
        Error::Usage(format!("{what}: {message}"))
    }
}

/// Parse a duration that must carry a unit (`500ms`, `30s`, `5m`). `0` only where allowed.
pub fn parse_duration(text: &str, zero_allowed: bool) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" && zero_allowed {
        return Ok(Duration::ZERO);
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!(
            "'{text}' has no unit; write e.g. {text}s or {text}ms"
        ));
    }
    let duration =
        humantime::parse_duration(text).map_err(|e| format!("'{text}' is not a duration ({e})"))?;
    if duration.is_zero() && !zero_allowed {
        return Err(format!("'{text}' must be greater than zero"));
    }
    Ok(duration)
}

fn duration_setting(
    flag: Option<String>,
    file: Option<String>,
    what: &str,
    zero_allowed: bool,
) -> Result<Option<Duration>, Error> {
    match pick(flag, file) {
        None => Ok(None),
        Some(s) => parse_duration(&s.value, zero_allowed)
            .map(Some)
            .map_err(|m| bad(s.from_file, what, m)),
    }
}

fn integer_setting(
    flag: Option<String>,
    file: Option<i64>,
    what: &str,
    range: (i64, i64),
) -> Result<Option<i64>, Error> {
    let check = |n: i64, from_file: bool| {
        if n < range.0 || n > range.1 {
            Err(bad(
                from_file,
                what,
                format!("{n} is out of range {}..={}", range.0, range.1),
            ))
        } else {
            Ok(Some(n))
        }
    };
    match (flag, file) {
        (Some(text), _) => match text.trim().parse::<i64>() {
            Ok(n) => check(n, false),
            Err(_) => Err(bad(false, what, format!("'{text}' is not a whole number"))),
        },
        (None, Some(n)) => check(n, true),
        (None, None) => Ok(None),
    }
}

/// Resolve the backend options shared by every subcommand.
pub fn common(
    backend: &cli::BackendArgs,
    ttl: Option<String>,
    file: &FileConfig,
) -> Result<Common, Error> {
    let file_urls = match &file.url {
        None => None,
        Some(OneOrMany::One(u)) => Some(vec![u.clone()]),
        Some(OneOrMany::Many(us)) => Some(us.clone()),
    };
    let urls = pick(
        (!backend.url.is_empty()).then(|| backend.url.clone()),
        file_urls,
    );
    let prefix = pick(backend.prefix.clone(), file.prefix.clone());
    let prefix = match prefix {
        None => DEFAULT_PREFIX.to_owned(),
        Some(p) => {
            LockName::new(&p.value).map_err(|e| {
                bad(
                    p.from_file,
                    "--prefix",
                    e.to_string().replace("lock name", "prefix"),
                )
            })?;
            p.value
        }
    };
    let ttl_from_file = ttl.is_none() && file.ttl.is_some();
    let ttl = duration_setting(ttl, file.ttl.clone(), "--ttl", false)?.unwrap_or(DEFAULT_TTL);
    if ttl > MAX_TTL {
        return Err(bad(
            ttl_from_file,
            "--ttl",
            format!(
                "{} is longer than the limit of {}",
                humantime::format_duration(ttl),
                humantime::format_duration(MAX_TTL)
            ),
        ));
    }
    let (location, display_url) = match urls {
        None => (
            Location::File {
                dir: default_file_dir(),
                default: true,
            },
            "file://".to_owned(),
        ),
        Some(s) => {
            if s.value.len() > 1 {
                return Err(bad(
                    s.from_file,
                    "--url",
                    "several URLs mean Redlock across independent Redis masters, which this build does not support yet; give one URL".into(),
                ));
            }
            let url = &s.value[0];
            let display = redact_url(url);
            let mut location = parse_url(url).map_err(|m| bad(s.from_file, "--url", m))?;
            match &mut location {
                Location::Redis(target) => complete_redis(target, file)?,
                Location::Etcd(target) => complete_etcd(target, file)?,
                Location::Postgres(target) => complete_postgres(target, file)?,
                Location::Zk(target) => complete_zk(target, file)?,
                Location::File { .. } => {}
            }
            (location, display)
        }
    };
    if let Some(minimum) = minimum_ttl(&location) {
        if ttl < minimum {
            return Err(bad(
                ttl_from_file,
                "--ttl",
                format!(
                    "{} is shorter than a lease can be kept; the minimum is {}",
                    humantime::format_duration(ttl),
                    humantime::format_duration(minimum)
                ),
            ));
        }
    }
    if matches!(location, Location::Redis(_)) && prefix.contains(['{', '}']) {
        return Err(Error::Usage(format!(
            "--prefix: '{prefix}' must not contain {{ or }} (they delimit the Redis hash tag)"
        )));
    }
    Ok(Common {
        location,
        prefix,
        ttl,
        display_url,
    })
}

/// The shortest `--ttl` a backend can keep, where it has one.
///
/// A lease is renewed every TTL/3 and the command is stopped a safety margin of at least
/// 500 ms before the lease can expire (see `keeper`): below 2 s that leaves no time for one
/// renewal and a retry, and etcd itself grants no lease under 2 s. PostgreSQL's holder
/// heartbeat follows the same schedule. The file backend has no lease, so any TTL does.
fn minimum_ttl(location: &Location) -> Option<Duration> {
    match location {
        Location::File { .. } => None,
        Location::Redis(_) | Location::Etcd(_) | Location::Zk(_) | Location::Postgres(_) => {
            Some(MIN_LEASE_TTL)
        }
    }
}

/// The default directory of the file backend (design §1).
pub fn default_file_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("dlock"),
        _ => PathBuf::from(format!("/tmp/dlock-{}", nix::unistd::getuid())),
    }
}

fn parse_url(url: &str) -> Result<Location, String> {
    if postgres::is_key_value(url) {
        return postgres::parse_key_value(url).map(Location::Postgres);
    }
    let Some((scheme, rest)) = url.split_once(':') else {
        // Never echo text that is not a URL: it may be a password pasted in the wrong place.
        return Err("this is not a URL; expected e.g. file:///var/lock/dlock".into());
    };
    match scheme.to_ascii_lowercase().as_str() {
        "file" => parse_file_url(rest),
        "redis" | "rediss" | "redis+unix" => {
            parse_redis_url(&scheme.to_ascii_lowercase(), rest).map(Location::Redis)
        }
        "etcd" | "etcds" => parse_etcd_url(&scheme.to_ascii_lowercase(), rest).map(Location::Etcd),
        "postgres" | "postgresql" => postgres::parse_url(url).map(Location::Postgres),
        "zk" => parse_zk_url(rest).map(Location::Zk),
        _ => {
            // A scheme is letters, digits, `+`, `-` and `.`; anything else before the first `:`
            // is part of something else (perhaps `user:password@host` without a scheme).
            let shown = if !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
            {
                format!(" '{scheme}'")
            } else {
                String::new()
            };
            Err(format!(
                "unknown URL scheme{shown}; expected file, redis, rediss, etcd, etcds, zk, postgres or postgresql"
            ))
        }
    }
}

fn parse_file_url(rest: &str) -> Result<Location, String> {
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
        return Ok(Location::File {
            dir: default_file_dir(),
            default: true,
        });
    }
    let decoded = crate::lock::decode_component(path)
        .ok_or_else(|| format!("bad percent-encoding in '{path}'"))?;
    let dir = PathBuf::from(decoded);
    if !dir.is_absolute() {
        return Err(format!(
            "the lock directory must be absolute: file://{path} (use file:///dir)"
        ));
    }
    Ok(Location::File {
        dir,
        default: false,
    })
}

/// `redis://[user[:password]@]host[:port][/db]`, `rediss://…`, `redis+unix:///path[?db=N]`.
fn parse_redis_url(scheme: &str, rest: &str) -> Result<RedisTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or_else(|| format!("expected {scheme}://host[:port][/db]"))?;
    let decode = |s: &str, what: &str| {
        crate::lock::decode_component(s)
            .ok_or_else(|| format!("bad percent-encoding in the URL's {what}"))
    };
    if scheme == "redis+unix" {
        let (path, query) = after.split_once('?').unwrap_or((after, ""));
        if !path.starts_with('/') {
            return Err("expected redis+unix:///path/to/socket[?db=N]".into());
        }
        let mut db = 0;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("db", n)) => db = parse_db(n)?,
                _ => {
                    return Err(
                        "unknown URL parameter (only db=N is accepted after the socket path)"
                            .into(),
                    )
                }
            }
        }
        return Ok(RedisTarget {
            addr: RedisAddr::Unix {
                path: PathBuf::from(decode(path, "path")?),
            },
            db,
            user: None,
            password: None,
            tls: TlsFiles::default(),
        });
    }
    if after.contains(['?', '#']) {
        return Err("Redis URLs take no query or fragment here; put TLS files and passwords in the config file".into());
    }
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let (user, password, hostport) = split_userinfo(authority)?;
    let (host, port) = split_host_port(hostport, 6379)?;
    let db = match path.trim_start_matches('/') {
        "" => 0,
        n => parse_db(n)?,
    };
    let addr = if scheme == "rediss" {
        RedisAddr::Tls { host, port }
    } else {
        RedisAddr::Tcp { host, port }
    };
    Ok(RedisTarget {
        addr,
        db,
        user,
        password,
        tls: TlsFiles::default(),
    })
}

/// `etcd://[user[:password]@]host[:port][,host[:port]…][/]`, `etcds://…`.
fn parse_etcd_url(scheme: &str, rest: &str) -> Result<EtcdTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or_else(|| format!("expected {scheme}://host[:port][,host[:port]…]"))?;
    if after.contains(['?', '#']) {
        return Err(
            "etcd URLs take no query or fragment; put TLS files and passwords in the config file"
                .into(),
        );
    }
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    if !path.is_empty() && path != "/" {
        // The path is not shown: a password with an unencoded `/` ends up here.
        return Err(
            "etcd URLs take no path; use --prefix for a namespace (a '/' in a password must be written %2F)"
                .into(),
        );
    }
    let (user, password, hosts) = split_userinfo(authority)?;
    let endpoints = hosts
        .split(',')
        .map(|h| split_host_port(h, 2379))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EtcdTarget {
        endpoints,
        tls: scheme == "etcds",
        user,
        password,
        tls_files: TlsFiles::default(),
    })
}

/// `zk://[user[:password]@]host[:port][,host[:port]…][/chroot]`.
fn parse_zk_url(rest: &str) -> Result<ZkTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or("expected zk://host[:port][,host[:port]…][/chroot]")?;
    if after.contains(['?', '#']) {
        return Err(
            "ZooKeeper URLs take no query or fragment; put passwords in the config file".into(),
        );
    }
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let (user, password, hosts) = split_userinfo(authority)?;
    let endpoints = hosts
        .split(',')
        .map(|h| split_host_port(h, 2181))
        .collect::<Result<Vec<_>, _>>()?;
    let chroot = match path {
        "" | "/" => None,
        chroot => {
            let chroot = chroot.strip_suffix('/').unwrap_or(chroot);
            if chroot
                .split('/')
                .skip(1)
                .any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Err(
                    "the URL's path is not a ZooKeeper chroot (empty, '.' and '..' components are not allowed)"
                        .into(),
                );
            }
            Some(chroot.to_owned())
        }
    };
    if password.is_some() && user.is_none() {
        return Err("ZooKeeper digest authentication needs a user: zk://user:password@host".into());
    }
    Ok(ZkTarget {
        endpoints,
        chroot,
        user,
        password,
    })
}

/// The digest password for ZooKeeper, from the `[zookeeper]` table (see [`credentials`]).
fn complete_zk(target: &mut ZkTarget, file: &FileConfig) -> Result<(), Error> {
    // Without a user there is no digest authentication: no password is looked up then.
    let wants_password = target.user.is_some();
    let (password, tls_files) = credentials(
        "ZooKeeper",
        file.zookeeper.as_ref(),
        file,
        target.user.is_some(),
        target.password.take(),
        wants_password,
    )?;
    target.password = password;
    if tls_files != TlsFiles::default() {
        return Err(Error::Config(
            "TLS to ZooKeeper is not supported by this build; remove ca_file/cert_file/key_file from the [zookeeper] table".into(),
        ));
    }
    Ok(())
}

/// Password and TLS files for etcd, from the `[etcd]` table (see [`credentials`]).
fn complete_etcd(target: &mut EtcdTarget, file: &FileConfig) -> Result<(), Error> {
    // etcd without a user runs without authentication: no password is looked up then.
    let wants_password = target.user.is_some();
    let (password, tls_files) = credentials(
        "etcd",
        file.etcd.as_ref(),
        file,
        target.user.is_some(),
        target.password.take(),
        wants_password,
    )?;
    target.password = password;
    target.tls_files = tls_files;
    if target.tls {
        check_tls_files(&target.tls_files)?;
    }
    Ok(())
}

/// Fill in what a URL did not say, for one backend's config table: the password (URL, else
/// DLOCK_PASSWORD, else the table's `password_file`, else the top-level one) and the TLS files.
/// A user without a password is a usage error.
fn credentials(
    backend: &str,
    section: Option<&BackendFileConfig>,
    file: &FileConfig,
    has_user: bool,
    password: Option<Secret>,
    look_up: bool,
) -> Result<(Option<Secret>, TlsFiles), Error> {
    let section = section.cloned().unwrap_or_default();
    let mut password = password;
    if password.is_none() && look_up {
        if let Some(from_env) = std::env::var("DLOCK_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty())
        {
            password = Some(Secret(from_env));
        } else if let Some(path) = section
            .password_file
            .as_ref()
            .or(file.password_file.as_ref())
        {
            password = Some(read_password_file(path)?);
        }
    }
    if has_user && password.is_none() {
        return Err(Error::Usage(format!(
            "the {backend} URL names a user but no password is given (URL, DLOCK_PASSWORD or password_file)"
        )));
    }
    let tls = TlsFiles {
        ca_file: section.ca_file,
        cert_file: section.cert_file,
        key_file: section.key_file,
    };
    Ok((password, tls))
}

/// `[user[:password]@]rest` → (user, password, rest), percent-decoded; empty parts are absent.
fn split_userinfo(authority: &str) -> Result<(Option<String>, Option<Secret>, &str), String> {
    let Some((info, rest)) = authority.rsplit_once('@') else {
        return Ok((None, None, authority));
    };
    let decode = |s: &str, what: &str| {
        crate::lock::decode_component(s)
            .ok_or_else(|| format!("bad percent-encoding in the URL's {what}"))
    };
    let (user, password) = match info.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (info, None),
    };
    let user = Some(decode(user, "user name")?).filter(|u| !u.is_empty());
    let password = match password {
        Some(p) => Some(Secret(decode(p, "password")?)).filter(|p| !p.0.is_empty()),
        None => None,
    };
    Ok((user, password, rest))
}

fn parse_db(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .ok()
        .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
        // Not shown: a password with an unencoded `/` ends up in the path.
        .ok_or_else(|| {
            "the URL's path is not a database number (a '/' in a password must be written %2F)"
                .to_owned()
        })
}

/// `host:port`, with brackets around an IPv6 address: the inverse of [`split_host_port`].
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(text: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed [ in the host")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("expected :port after ]")?),
        };
        (host.to_owned(), port)
    } else {
        match text.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                // Never echo URL text: a malformed URL may carry part of a password there.
                return Err("IPv6 addresses in the URL need brackets, e.g. [::1]:2379".into());
            }
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (text.to_owned(), None),
        }
    };
    if host.is_empty() {
        return Err("the URL names no host".into());
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| "a port in the URL is not a number from 1 to 65535".to_owned())?,
    };
    Ok((host, port))
}

/// Password and TLS files for Redis, from the `[redis]` table (see [`credentials`]).
fn complete_redis(target: &mut RedisTarget, file: &FileConfig) -> Result<(), Error> {
    let (password, tls) = credentials(
        "Redis",
        file.redis.as_ref(),
        file,
        target.user.is_some(),
        target.password.take(),
        true,
    )?;
    target.password = password;
    target.tls = tls;
    if matches!(target.addr, RedisAddr::Tls { .. }) {
        check_tls_files(&target.tls)?;
    }
    Ok(())
}

/// Password and TLS files for PostgreSQL: the URL's password, DLOCK_PASSWORD, the
/// `[postgres]` table's or the top-level `password_file`, then `.pgpass` (see
/// [`credentials`]). No password is required: trust, peer and certificate authentication
/// need none, and the server asks when it wants one.
fn complete_postgres(target: &mut PgTarget, file: &FileConfig) -> Result<(), Error> {
    let (password, tls) = credentials(
        "PostgreSQL",
        file.postgres.as_ref(),
        file,
        false,
        target.password.take(),
        true,
    )?;
    target.password = match password {
        Some(password) => Some(password),
        None => postgres::pgpass_password(target)?,
    };
    // Files named in the URL win over the config table's.
    let files = &mut target.tls_files;
    files.ca_file = files.ca_file.take().or(tls.ca_file);
    files.cert_file = files.cert_file.take().or(tls.cert_file);
    files.key_file = files.key_file.take().or(tls.key_file);
    if files.ca_file.is_none() && target.sslmode.requires_tls() {
        files.ca_file = postgres::default_root_cert();
    }
    if target.sslmode != postgres::SslMode::Disable {
        check_tls_files(&target.tls_files)?;
    }
    Ok(())
}

/// `password=…` in a query string or a libpq `key=value` string becomes `password=***`.
///
/// A key counts as `password` exactly when the parsers would take it for one: in a URL's
/// query the key is percent-decoded first (`pass%77ord=`), and in the key=value form any
/// Unicode white space separates pairs (a newline, `\u{b}`, U+3000), as in
/// `postgres::parse_key_value`.
fn redact_password_parameter(text: &str) -> String {
    // In a URL's query a value ends at `&` or `#`; in libpq's key=value form only whitespace
    // ends an unquoted value, and a backslash escapes the next character.
    let url = text.contains("://");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let (before, after) = rest.split_at(eq);
        let key_start = if url {
            before.rfind(['?', '&', ' ', '\t']).map_or(0, |i| i + 1)
        } else {
            before.trim_end().rfind(char::is_whitespace).map_or(0, |i| {
                i + before[i..].chars().next().map_or(1, char::len_utf8)
            })
        };
        let key = before[key_start..].trim();
        let is_password = if url {
            // Only parameters of a query: `?` must come before the key.
            (out.contains('?') || before[..key_start].contains('?'))
                && crate::lock::decode_component(key).is_none_or(|k| k == "password")
        } else {
            key == "password"
        };
        let value = &after[1..];
        if is_password {
            out.push_str(if url { before } else { before.trim_end() });
            let value = if url { value } else { value.trim_start() };
            out.push_str("=***");
            rest = &value[value_end(value, url)..];
        } else {
            out.push_str(before);
            out.push('=');
            rest = value;
        }
    }
    out.push_str(rest);
    out
}

/// Where a `password=` value that starts `value` ends (see [`redact_password_parameter`]).
fn value_end(value: &str, url: bool) -> usize {
    if url {
        return value.find(['&', '#', ' ', '\t']).unwrap_or(value.len());
    }
    let quoted = value.starts_with('\'');
    let mut escaped = false;
    for (i, c) in value.char_indices().skip(usize::from(quoted)) {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if quoted && c == '\'' {
            return i + 1;
        } else if !quoted && c.is_whitespace() {
            return i;
        }
    }
    value.len()
}

/// A password file must not be readable by group or others (like ~/.pgpass).
pub fn read_password_file(path: &Path) -> Result<Secret, Error> {
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::Config(format!("cannot read password file {}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(Error::Config(format!(
            "password file {} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        )));
    }
    let text = crate::files::read_small_file(path, crate::files::MAX_SECRET_BYTES)
        .map_err(|e| Error::Config(format!("cannot read password file {}: {e}", path.display())))?;
    let password = text.trim_end_matches(['\n', '\r']).to_owned();
    if password.is_empty() {
        return Err(Error::Config(format!(
            "password file {} is empty",
            path.display()
        )));
    }
    Ok(Secret(password))
}

fn check_tls_files(tls: &TlsFiles) -> Result<(), Error> {
    let read = |path: &PathBuf, what: &str| {
        crate::files::read_small_file(path, crate::files::MAX_CONFIG_BYTES)
            .map_err(|e| Error::Config(format!("cannot read TLS {what} {}: {e}", path.display())))
    };
    if let Some(ca) = &tls.ca_file {
        if !read(ca, "CA file")?.contains("-----BEGIN CERTIFICATE-----") {
            return Err(Error::Config(format!(
                "TLS CA file {} contains no PEM certificate",
                ca.display()
            )));
        }
    }
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            if !read(cert, "certificate")?.contains("-----BEGIN CERTIFICATE-----") {
                return Err(Error::Config(format!(
                    "TLS certificate {} contains no PEM certificate",
                    cert.display()
                )));
            }
            if !read(key, "key")?.contains("PRIVATE KEY-----") {
                return Err(Error::Config(format!(
                    "TLS key {} contains no PEM private key",
                    key.display()
                )));
            }
            Ok(())
        }
        (None, None) => Ok(()),
        _ => Err(Error::Config(
            "TLS client authentication needs both cert_file and key_file".into(),
        )),
    }
}

/// Replace the password in a URL's user info with `***`.
pub fn redact_url(url: &str) -> String {
    redact_password_parameter(&redact_userinfo(url))
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let start = scheme_end + 3;
    // The last `@` anywhere, not only in the authority: a password with an unencoded `/`, `?`
    // or `#` would otherwise end the authority early and be shown. Over-masking a URL whose
    // query contains `@` is the safe mistake.
    let Some(at) = url[start..].rfind('@').map(|i| start + i) else {
        return url.to_owned();
    };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_owned(),
    }
}

/// Resolve everything `dlock run` needs, validating it all before the backend is contacted.
pub fn run(args: cli::RunArgs, file: &FileConfig) -> Result<RunSettings, Error> {
    let name = lock_name(&args.name)?;
    let common = common(&args.backend, args.ttl, file)?;
    let no_wait =
        args.no_wait || (args.wait.is_none() && file.wait.is_none() && file.no_wait == Some(true));
    let wait = if no_wait {
        Wait::No
    } else {
        match duration_setting(args.wait, file.wait.clone(), "--wait", true)? {
            None => Wait::Forever,
            Some(d) if d.is_zero() => Wait::No,
            Some(d) => Wait::For(d),
        }
    };
    let conflict_exit_code = integer_setting(
        args.conflict_exit_code,
        file.conflict_exit_code,
        "--conflict-exit-code",
        (0, 255),
    )?
    .map_or(DEFAULT_CONFLICT_EXIT_CODE, |n| n as u8);
    let limit = integer_setting(args.limit, file.limit, "--limit", (1, i64::from(MAX_LIMIT)))?
        .map_or(1, |n| n as u32);
    let on_lost = match (args.on_lost, &file.on_lost) {
        (Some(v), _) => v,
        (None, Some(text)) => match text.as_str() {
            "term" => OnLost::Term,
            "kill" => OnLost::Kill,
            "ignore" => OnLost::Ignore,
            other => {
                return Err(bad(
                    true,
                    "on_lost",
                    format!("'{other}' is not one of term, kill, ignore"),
                ))
            }
        },
        (None, None) => OnLost::Term,
    };
    let kill_after = duration_setting(
        args.kill_after,
        file.kill_after.clone(),
        "--kill-after",
        false,
    )?
    .unwrap_or(DEFAULT_KILL_AFTER);
    let command = command_spec(args.shell_command, args.command)?;
    Ok(RunSettings {
        common,
        name,
        command,
        wait,
        conflict_exit_code,
        limit,
        on_lost,
        kill_after,
    })
}

/// Validate a lock name given on the command line.
pub fn lock_name(raw: &std::ffi::OsStr) -> Result<LockName, Error> {
    let text = raw
        .to_str()
        .ok_or_else(|| Error::Usage("lock name must be valid UTF-8".into()))?;
    LockName::new(text)
}

fn command_spec(
    shell_command: Option<OsString>,
    command: Vec<OsString>,
) -> Result<CommandSpec, Error> {
    let (arg0, args) = match shell_command {
        Some(script) => {
            if !command.is_empty() {
                return Err(Error::Usage(format!(
                    "-c takes one shell command and no further arguments (got '{}' after it); quote the whole command",
                    command[0].to_string_lossy()
                )));
            }
            let shell = std::env::var_os("SHELL")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| OsString::from("/bin/sh"));
            (shell, vec![OsString::from("-c"), script])
        }
        None => {
            let mut words = command.into_iter();
            let Some(program) = words.next() else {
                return Err(Error::Usage("no command given: dlock run NAME [--] COMMAND [ARGS]... or dlock run NAME -c 'SHELL COMMAND'".into()));
            };
            (program, words.collect())
        }
    };
    let program = resolve_program(&arg0)?;
    let display = std::iter::once(&arg0)
        .chain(args.iter())
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    Ok(CommandSpec {
        program,
        arg0,
        args,
        display,
    })
}

/// Find `program` the way `execvp` would, so a missing or non-executable command is reported
/// (127 / 126) before the lock is taken.
pub fn resolve_program(program: &std::ffi::OsStr) -> Result<PathBuf, Error> {
    let shown = program.to_string_lossy();
    if program.is_empty() {
        return Err(Error::NotFound(
            "command not found: '' (empty command name)".into(),
        ));
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match check_executable(&path) {
            Ok(()) => Ok(path),
            Err(Problem::Missing) => Err(Error::NotFound(format!("command not found: {shown}"))),
            Err(Problem::NotExecutable(why)) => Err(Error::NotExecutable(format!(
                "cannot execute {shown}: {why}"
            ))),
        };
    }
    let search =
        std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    let mut first_problem = None;
    for dir in std::env::split_paths(&search) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        match check_executable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(Problem::Missing) => {}
            Err(Problem::NotExecutable(why)) => {
                first_problem
                    .get_or_insert(format!("cannot execute {}: {why}", candidate.display()));
            }
        }
    }
    match first_problem {
        Some(message) => Err(Error::NotExecutable(message)),
        None => Err(Error::NotFound(format!(
            "command not found: {shown} (searched PATH)"
        ))),
    }
}

enum Problem {
    Missing,
    NotExecutable(String),
}

fn check_executable(path: &Path) -> Result<(), Problem> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Problem::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Err(Problem::Missing),
        Err(e) => return Err(Problem::NotExecutable(e.to_string())),
    };
    if meta.is_dir() {
        return Err(Problem::NotExecutable("is a directory".into()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(Problem::NotExecutable(
            "permission denied (not executable)".into(),
        ));
    }
    if nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_err() {
        return Err(Problem::NotExecutable("permission denied".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units() {
        assert_eq!(
            parse_duration("500ms", false),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("5m", false), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5", false).is_err());
        assert!(parse_duration("0", false).is_err());
        assert_eq!(parse_duration("0", true), Ok(Duration::ZERO));
        assert!(parse_duration("-5s", false).is_err());
        assert!(parse_duration("5x", false).is_err());
        assert!(parse_duration("0s", false).is_err());
        assert!(parse_duration("", false).is_err());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://:s3cret@h:6379/0"),
            "redis://:***@h:6379/0"
        );
        assert_eq!(
            redact_url("postgres://u:p@db/app?x=1"),
            "postgres://u:***@db/app?x=1"
        );
        assert_eq!(redact_url("etcd://u@h:2379"), "etcd://u@h:2379");
        assert_eq!(redact_url("file:///tmp/x"), "file:///tmp/x");
        assert_eq!(
            redact_url("postgres://db/app?sslmode=require&password=s3cret&x=1"),
            "postgres://db/app?sslmode=require&password=***&x=1"
        );
        assert_eq!(
            redact_url("host=db password = 'a \\'b' dbname=app passwordless=1"),
            "host=db password=*** dbname=app passwordless=1"
        );
        assert_eq!(redact_url("host=db password=x"), "host=db password=***");
        assert_eq!(
            redact_url("host=db password=ab&cd#x\\ y dbname=app"),
            "host=db password=*** dbname=app"
        );
        assert_eq!(
            redact_url("postgres://u:p#ss@db/app"),
            "postgres://u:***@db/app"
        );
        assert_eq!(
            redact_url("postgres://u:pa/ss@db/app"),
            "postgres://u:***@db/app"
        );
    }

    #[test]
    fn passwords_the_parsers_would_find_are_redacted() {
        // A percent-encoded key is still `password` to the URL parser.
        assert_eq!(
            redact_url("postgres://db/app?pass%77ord=s3cret&x=1"),
            "postgres://db/app?pass%77ord=***&x=1"
        );
        assert_eq!(
            redact_url("postgres://db/app?options=-c%20a=b&password=s3cret"),
            "postgres://db/app?options=-c%20a=b&password=***"
        );
        // Any white space separates key=value pairs.
        for sep in ["\n", "\u{b}", "\u{3000}", "\r\n", "\u{c}"] {
            let text = format!("host=db{sep}password=s3cret dbname=app");
            let shown = redact_url(&text);
            assert!(!shown.contains("s3cret"), "{text:?} -> {shown:?}");
            let Ok(Location::Postgres(target)) = parse_url(&text) else {
                panic!("{text:?} does not parse");
            };
            assert_eq!(
                target.password.map(|p| p.expose().to_owned()).as_deref(),
                Some("s3cret")
            );
        }
        // Keys that merely contain the word stay as they are.
        assert_eq!(redact_url("host=db xpassword=1"), "host=db xpassword=1");
    }

    #[test]
    fn postgres_urls_in_both_forms() {
        let Ok(Location::Postgres(t)) = parse_url("postgresql://u@db:6432/app?sslmode=disable")
        else {
            panic!("not a postgres URL");
        };
        assert_eq!(t.dbname.as_deref(), Some("app"));
        assert_eq!(t.sslmode, postgres::SslMode::Disable);
        let Ok(Location::Postgres(t)) = parse_url("host=/run/pg dbname=app") else {
            panic!("not a key=value string");
        };
        assert_eq!(t.dbname.as_deref(), Some("app"));
        assert!(parse_url("host=db bogus=1").is_err());
    }

    #[test]
    fn file_urls() {
        assert_eq!(
            parse_url("file:///var/lock/x"),
            Ok(Location::File {
                dir: "/var/lock/x".into(),
                default: false
            })
        );
        assert!(matches!(
            parse_url("file://"),
            Ok(Location::File { default: true, .. })
        ));
        assert!(parse_url("file://otherhost/x").is_err());
        assert!(parse_url("file:relative").is_err());
        assert!(parse_url("gopher://x").is_err());
        assert!(parse_url("nourl").is_err());
    }

    #[test]
    fn redis_urls() {
        let Ok(Location::Redis(t)) = parse_url("redis://u:p%40ss@127.0.0.1:6380/2") else {
            panic!()
        };
        assert_eq!(
            t.addr,
            RedisAddr::Tcp {
                host: "127.0.0.1".into(),
                port: 6380
            }
        );
        assert_eq!(
            (
                t.db,
                t.user.as_deref(),
                t.password.as_ref().map(Secret::expose)
            ),
            (2, Some("u"), Some("p@ss"))
        );
        let Ok(Location::Redis(t)) = parse_url("rediss://[::1]") else {
            panic!()
        };
        assert_eq!(
            t.addr,
            RedisAddr::Tls {
                host: "::1".into(),
                port: 6379
            }
        );
        let Ok(Location::Redis(t)) = parse_url("redis+unix:///run/redis.sock?db=3") else {
            panic!()
        };
        assert_eq!(
            (t.addr.clone(), t.db),
            (
                RedisAddr::Unix {
                    path: "/run/redis.sock".into()
                },
                3
            )
        );
        for bad in [
            "redis://",
            "redis://h:0",
            "redis://h:70000",
            "redis://h/x",
            "redis://::1",
            "redis://h?x=1",
            "redis+unix://rel",
        ] {
            assert!(parse_url(bad).is_err(), "{bad} was accepted");
        }
        assert!(!format!("{t:?}").contains("p@ss"));
    }

    #[test]
    fn etcd_urls() {
        let Ok(Location::Etcd(t)) = parse_url("etcd://u:pw@127.0.0.1:2379,[::1]:2380,h") else {
            panic!()
        };
        assert_eq!(
            t.endpoints,
            vec![
                ("127.0.0.1".into(), 2379),
                ("::1".into(), 2380),
                ("h".into(), 2379)
            ]
        );
        assert_eq!(
            (
                t.tls,
                t.user.as_deref(),
                t.password.as_ref().map(Secret::expose)
            ),
            (false, Some("u"), Some("pw"))
        );
        assert!(matches!(
            parse_url("etcds://h/"),
            Ok(Location::Etcd(EtcdTarget { tls: true, .. }))
        ));
        for bad in [
            "etcd://",
            "etcd://h,",
            "etcd://h/x",
            "etcd://h?x",
            "etcd://h:0",
        ] {
            assert!(parse_url(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn zk_urls() {
        let Ok(Location::Zk(t)) = parse_url("zk://u:p%40w@127.0.0.1:2182,[::1],h:1/app/locks/")
        else {
            panic!("zk URL rejected");
        };
        assert_eq!(
            t.endpoints,
            vec![
                ("127.0.0.1".to_owned(), 2182),
                ("::1".to_owned(), 2181),
                ("h".to_owned(), 1)
            ]
        );
        assert_eq!(t.chroot.as_deref(), Some("/app/locks"));
        assert_eq!(t.user.as_deref(), Some("u"));
        assert_eq!(t.password.as_ref().map(Secret::expose), Some("p@w"));
        let Ok(Location::Zk(t)) = parse_url("zk://h/") else {
            panic!("zk URL rejected");
        };
        assert_eq!((t.chroot, t.user, t.password), (None, None, None));
        for bad in [
            "zk://",
            "zk://h,",
            "zk://h?x",
            "zk://h:0",
            "zk://h//x",
            "zk://h/a/../b",
            "zk://:pw@h",
            "zk:h",
        ] {
            assert!(parse_url(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(redact_url("zk://u:pw@h:2181/x"), "zk://u:***@h:2181/x");
    }

    #[test]
    fn unknown_config_keys_are_rejected() {
        let parsed: Result<FileConfig, _> = toml::from_str("ttl = '5s'\ncolour = 'red'\n");
        assert!(parsed.is_err());
        let parsed: Result<FileConfig, _> = toml::from_str("ttl = '5s'\n[redis]\nca_file = '/x'\n");
        assert!(parsed.is_ok());
    }
}
