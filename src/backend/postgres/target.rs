//! Where a PostgreSQL server is and how to talk to it: the `postgres://` URL and libpq's
//! `key=value` form, parsed by dlock itself (tokio-postgres's parser rejects `verify-ca`,
//! `sslrootcert` and `passfile` without naming them); the password from `~/.pgpass` is
//! `pgpass.rs`'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::pgpass::pgpass_password;
use crate::config::FileConfig;
use crate::error::Error;
use crate::kit::url::{join_host_port, parse_query, unknown_parameter, Params};
use crate::lock::decode_component;
use crate::secrets::{check_tls_files, credentials, Secret, TlsFiles};

/// libpq's default port.
pub const DEFAULT_PORT: u16 = 5432;
/// Debian's (and libpq's usual) socket directory, used when no host is named.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// One server address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PgHost {
    Tcp {
        host: String,
        port: u16,
    },
    /// A Unix socket directory (a host that starts with `/`).
    Unix {
        dir: PathBuf,
        port: u16,
    },
}

impl PgHost {
    /// The host as `.pgpass` matches it (`localhost` for sockets, like libpq).
    pub(super) fn pgpass_host(&self) -> &str {
        match self {
            PgHost::Tcp { host, .. } => host,
            PgHost::Unix { .. } => "localhost",
        }
    }

    pub(super) fn port(&self) -> u16 {
        match self {
            PgHost::Tcp { port, .. } | PgHost::Unix { port, .. } => *port,
        }
    }
}

impl std::fmt::Display for PgHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PgHost::Tcp { host, port } => f.write_str(&join_host_port(host, *port)),
            PgHost::Unix { dir, port } => write!(f, "{}/.s.PGSQL.{port}", dir.display()),
        }
    }
}

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Result<SslMode, String> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                "sslmode '{other}' is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Modes that never fall back to plaintext.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

/// A PostgreSQL server, database and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgTarget {
    pub hosts: Vec<PgHost>,
    /// `None`: the operating-system user, as libpq does.
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// `None`: the user name, as libpq does.
    pub dbname: Option<String>,
    pub sslmode: SslMode,
    /// `sslrootcert`, `sslcert`, `sslkey` (or the `[postgres]` table's files).
    pub tls_files: TlsFiles,
    pub passfile: Option<PathBuf>,
    pub connect_timeout: Option<Duration>,
    /// Shown before dlock's own label in `pg_stat_activity`.
    pub application_name: Option<String>,
    /// Server options (`-c name=value …`).
    pub options: Option<String>,
}

impl PgTarget {
    pub fn user(&self) -> String {
        self.user.clone().unwrap_or_else(crate::lock::user_name)
    }

    pub fn dbname(&self) -> String {
        self.dbname.clone().unwrap_or_else(|| self.user())
    }

    /// The same server and database whatever the order the hosts were listed in.
    pub fn identity(&self) -> String {
        let mut hosts: Vec<String> = self.hosts.iter().map(ToString::to_string).collect();
        hosts.sort();
        format!("postgres://{}/{}", hosts.join(","), self.dbname())
    }
}

impl Default for PgTarget {
    fn default() -> PgTarget {
        PgTarget {
            hosts: Vec::new(),
            user: None,
            password: None,
            dbname: None,
            sslmode: SslMode::Prefer,
            tls_files: TlsFiles::default(),
            passfile: None,
            connect_timeout: None,
            application_name: None,
            options: None,
        }
    }
}

/// The parameters dlock takes, in a URL's query or libpq's `key=value` form, with libpq's
/// names and meanings.
const PARAMS: Params = Params {
    url: "a PostgreSQL URL",
    keys: &[
        ("host", "host"),
        ("hostaddr", "hostaddr"),
        ("port", "port"),
        ("user", "user"),
        ("password", "password"),
        ("dbname", "dbname"),
        ("sslmode", "sslmode"),
        ("sslrootcert", "sslrootcert"),
        ("sslcert", "sslcert"),
        ("sslkey", "sslkey"),
        ("passfile", "passfile"),
        ("connect_timeout", "connect_timeout"),
        ("application_name", "application_name"),
        ("fallback_application_name", "fallback_application_name"),
        ("options", "options"),
    ],
    aliases: &[],
    fold: false,
    note: "",
};

/// Is `url` libpq's `key=value` form rather than a URL?
pub fn is_key_value(url: &str) -> bool {
    !url.contains("://") && url.contains('=')
}

/// `postgres[ql]://[user[:password]@][host][:port][,host[:port]…][/dbname][?key=value&…]`.
pub fn parse_url(url: &str) -> Result<PgTarget, String> {
    let (scheme, rest) = url.split_once("://").ok_or("expected postgres://…")?;
    if !matches!(
        scheme.to_ascii_lowercase().as_str(),
        "postgres" | "postgresql"
    ) {
        return Err(format!("'{scheme}' is not a PostgreSQL URL scheme"));
    }
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let decode = |s: &str, what: &str| {
        decode_component(s).ok_or_else(|| format!("bad percent-encoding in the URL's {what}"))
    };
    let mut pairs: Vec<(String, String)> = Vec::new();
    let hosts = match authority.rsplit_once('@') {
        Some((info, hosts)) => {
            let (user, password) = info.split_once(':').unwrap_or((info, ""));
            if !user.is_empty() {
                pairs.push(("user".into(), decode(user, "user name")?));
            }
            if !password.is_empty() {
                pairs.push(("password".into(), decode(password, "password")?));
            }
            hosts
        }
        None => authority,
    };
    let mut host_list = Vec::new();
    let mut port_list = Vec::new();
    if !hosts.is_empty() {
        for entry in hosts.split(',') {
            let (host, port) = split_url_host(entry)?;
            host_list.push(decode(&host, "host")?);
            port_list.push(port.unwrap_or_default());
        }
        pairs.push(("host".into(), host_list.join(",")));
        if port_list.iter().any(|p| !p.is_empty()) {
            pairs.push(("port".into(), port_list.join(",")));
        }
    }
    let db = path.strip_prefix('/').unwrap_or(path);
    if !db.is_empty() {
        pairs.push(("dbname".into(), decode(db, "database name")?));
    }
    for (key, value) in parse_query(query, &PARAMS)? {
        pairs.push((key.to_owned(), value));
    }
    from_pairs(pairs)
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, `:port` (the port may be absent or empty).
fn split_url_host(entry: &str) -> Result<(String, Option<String>), String> {
    if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed [ in the host")?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or("expected :port after ]")?
                    .to_owned(),
            ),
        };
        return Ok((host.to_owned(), port));
    }
    match entry.rsplit_once(':') {
        Some((h, _)) if h.contains(':') => {
            Err("IPv6 addresses in the URL need brackets, e.g. [::1]:5432".into())
        }
        Some((h, p)) => Ok((h.to_owned(), Some(p.to_owned()))),
        None => Ok((entry.to_owned(), None)),
    }
}

/// libpq's `key=value key='quoted value' …` form.
pub fn parse_key_value(text: &str) -> Result<PgTarget, String> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            // The word is not shown: it may be a password that lost its `password=`.
            return Err("a word in the connection string is not key=value".into());
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(format!("unterminated quoted value for '{key}'")),
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return Err(format!("unterminated quoted value for '{key}'")),
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
    from_pairs(pairs)
}

fn from_pairs(pairs: Vec<(String, String)>) -> Result<PgTarget, String> {
    let mut target = PgTarget::default();
    let mut hosts: Vec<String> = Vec::new();
    let mut ports: Vec<String> = Vec::new();
    let mut sslmode = None;
    for (key, value) in pairs {
        match key.as_str() {
            "host" | "hostaddr" => hosts = value.split(',').map(str::to_owned).collect(),
            "port" => ports = value.split(',').map(str::to_owned).collect(),
            "user" => target.user = Some(value).filter(|v| !v.is_empty()),
            "password" => {
                target.password = Some(Secret::new(value)).filter(|p| !p.expose().is_empty())
            }
            "dbname" => target.dbname = Some(value).filter(|v| !v.is_empty()),
            "sslmode" => sslmode = Some(SslMode::parse(&value)?),
            "sslrootcert" => target.tls_files.ca_file = Some(PathBuf::from(value)),
            "sslcert" => target.tls_files.cert_file = Some(PathBuf::from(value)),
            "sslkey" => target.tls_files.key_file = Some(PathBuf::from(value)),
            "passfile" => target.passfile = Some(PathBuf::from(value)),
            "connect_timeout" => {
                let seconds: u64 = value
                    .parse()
                    .map_err(|_| format!("connect_timeout '{value}' is not a number of seconds"))?;
                target.connect_timeout =
                    Some(Duration::from_secs(seconds)).filter(|d| !d.is_zero());
            }
            "application_name" | "fallback_application_name" => {
                target.application_name = Some(value).filter(|v| !v.is_empty());
            }
            "options" => target.options = Some(value).filter(|v| !v.is_empty()),
            other => {
                let params = Params {
                    url: "a PostgreSQL connection string",
                    ..PARAMS
                };
                return Err(unknown_parameter("connection parameter", other, &params));
            }
        }
    }
    if ports.len() > 1 && ports.len() != hosts.len().max(1) {
        return Err(format!(
            "{} ports given for {} hosts; give one port, or one per host",
            ports.len(),
            hosts.len().max(1)
        ));
    }
    let port_at = |i: usize| -> Result<u16, String> {
        let text = ports.get(i).or(ports.first()).map_or("", String::as_str);
        if text.is_empty() {
            return Ok(DEFAULT_PORT);
        }
        text.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| "a port in the URL is not a number from 1 to 65535".to_owned())
    };
    if hosts.is_empty() {
        hosts.push(String::new());
    }
    for (i, host) in hosts.iter().enumerate() {
        let port = port_at(i)?;
        target.hosts.push(if host.is_empty() {
            PgHost::Unix {
                dir: PathBuf::from(DEFAULT_SOCKET_DIR),
                port,
            }
        } else if host.starts_with('/') {
            PgHost::Unix {
                dir: PathBuf::from(host),
                port,
            }
        } else {
            PgHost::Tcp {
                host: host.clone(),
                port,
            }
        });
    }
    target.sslmode = sslmode.unwrap_or(SslMode::Prefer);
    Ok(target)
}

/// `~/.postgresql/root.crt`, libpq's default root certificate, where it exists.
pub fn default_root_cert() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql/root.crt");
    path.exists().then_some(path)
}

/// Password and TLS files for PostgreSQL: the URL's password, DLOCK_PASSWORD, the
/// `[postgres]` table's or the top-level `password_file`, then `.pgpass` (see
/// [`credentials`]). No password is required: trust, peer and certificate authentication
/// need none, and the server asks when it wants one.
pub fn complete(target: &mut PgTarget, file: &FileConfig) -> Result<(), Error> {
    let (password, tls) = credentials(
        "PostgreSQL",
        file.table("postgres"),
        file,
        false,
        target.password.take(),
        true,
    )?;
    target.password = match password {
        Some(password) => Some(password),
        None => pgpass_password(target)?,
    };
    // Files named in the URL win over the config table's.
    let files = &mut target.tls_files;
    files.ca_file = files.ca_file.take().or(tls.ca_file);
    files.cert_file = files.cert_file.take().or(tls.cert_file);
    files.key_file = files.key_file.take().or(tls.key_file);
    if files.ca_file.is_none() && target.sslmode.requires_tls() {
        files.ca_file = default_root_cert();
    }
    if target.sslmode != SslMode::Disable {
        check_tls_files(&target.tls_files)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
