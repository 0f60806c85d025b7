//! Where a MySQL or MariaDB server is and how to talk to it:
//! `mysql://[user[:password]@]host[:port][/database][?ssl-mode=…&…]` (also `mariadb://`),
//! parsed by dlock itself so that every message is ours and no password is ever echoed.
//!
//! A Unix socket is named by `?socket=/path`, or by a host that is a percent-encoded absolute
//! path (`mysql://app@%2Frun%2Fmysqld%2Fmysqld.sock/db`); no host at all means Debian's
//! socket, `/run/mysqld/mysqld.sock`, as the `mysql` client does.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::FileConfig;
use crate::error::Error;
use crate::kit::url::{join_host_port, parse_query, split_host_port, split_userinfo, Params};
use crate::lock::decode_component;
use crate::secrets::{check_tls_files, credentials, Secret, TlsFiles};

/// MySQL's default port.
pub const DEFAULT_PORT: u16 = 3306;
/// Debian's server socket, used when the URL names no host.
pub const DEFAULT_SOCKET: &str = "/run/mysqld/mysqld.sock";

/// One server address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MysqlHost {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl std::fmt::Display for MysqlHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MysqlHost::Tcp { host, port } => f.write_str(&join_host_port(host, *port)),
            MysqlHost::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// MySQL's `--ssl-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disabled,
    /// TLS where the server offers it, without a certificate check (the MySQL client's
    /// default). On a loopback address or a Unix socket: no TLS.
    Preferred,
    /// TLS or nothing; the certificate is not checked.
    Required,
    /// TLS, the chain checked against the CA file; not the host name.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyIdentity,
}

impl SslMode {
    fn parse(text: &str) -> Result<SslMode, String> {
        Ok(match text.to_ascii_uppercase().replace('-', "_").as_str() {
            "DISABLED" => SslMode::Disabled,
            "PREFERRED" => SslMode::Preferred,
            "REQUIRED" => SslMode::Required,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
            _ => {
                return Err(format!(
                    "ssl-mode '{text}' is not one of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY"
                ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disabled => "DISABLED",
            SslMode::Preferred => "PREFERRED",
            SslMode::Required => "REQUIRED",
            SslMode::VerifyCa => "VERIFY_CA",
            SslMode::VerifyIdentity => "VERIFY_IDENTITY",
        }
    }

    /// Modes that check the server's certificate (and so need a CA file).
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyIdentity)
    }
}

/// A MySQL or MariaDB server, database and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MysqlTarget {
    pub host: MysqlHost,
    /// `None`: the operating-system user, as the `mysql` client does.
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// The database that holds dlock's table (`dlock_locks`).
    pub database: Option<String>,
    pub ssl_mode: SslMode,
    /// `ssl-ca`, `ssl-cert`, `ssl-key` (or the `[mysql]` table's files).
    pub tls_files: TlsFiles,
    pub connect_timeout: Option<Duration>,
}

impl MysqlTarget {
    pub fn user(&self) -> String {
        self.user.clone().unwrap_or_else(crate::lock::user_name)
    }

    /// The same server and database however the URL spelled it.
    pub fn identity(&self) -> String {
        format!(
            "mysql://{}/{}",
            self.host,
            self.database.as_deref().unwrap_or("")
        )
    }

    /// Is the server on this machine (a Unix socket or a loopback address)?
    pub fn is_local(&self) -> bool {
        match &self.host {
            MysqlHost::Unix(_) => true,
            MysqlHost::Tcp { host, .. } => {
                host.eq_ignore_ascii_case("localhost")
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
        }
    }
}

/// What a MySQL URL's query takes: keys in any case, `_` for `-`, `sslmode` for `ssl-mode`.
const PARAMS: Params = Params {
    url: "a MySQL URL",
    keys: &[
        ("ssl-mode", "ssl-mode=MODE"),
        ("ssl-ca", "ssl-ca=FILE"),
        ("ssl-cert", "ssl-cert=FILE"),
        ("ssl-key", "ssl-key=FILE"),
        ("socket", "socket=PATH"),
        ("connect-timeout", "connect-timeout=SECONDS"),
    ],
    aliases: &[("sslmode", "ssl-mode")],
    fold: true,
    note: "",
};

/// `mysql://…` or `mariadb://…` (`rest` is what follows the scheme's `:`).
pub fn parse(rest: &str) -> Result<MysqlTarget, String> {
    let rest = rest
        .strip_prefix("//")
        .ok_or("expected mysql://[user[:password]@]host[:port][/database]")?;
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (user, password, hostport) = split_userinfo(authority)?;
    let decode = |s: &str, what: &str| {
        decode_component(s).ok_or_else(|| format!("bad percent-encoding in the URL's {what}"))
    };
    let mut host = if hostport.is_empty() {
        MysqlHost::Unix(PathBuf::from(DEFAULT_SOCKET))
    } else if hostport.starts_with("%2F") || hostport.starts_with("%2f") {
        MysqlHost::Unix(PathBuf::from(decode(hostport, "socket path")?))
    } else {
        let (host, port) = split_host_port(hostport, DEFAULT_PORT)?;
        MysqlHost::Tcp {
            host: decode(&host, "host")?,
            port,
        }
    };
    let database = path.strip_prefix('/').unwrap_or(path);
    if database.contains('/') {
        return Err("the URL's path must be one database name".into());
    }
    let database = Some(decode(database, "database name")?).filter(|d| !d.is_empty());
    let mut target = MysqlTarget {
        host: MysqlHost::Unix(PathBuf::new()),
        user,
        password,
        database,
        ssl_mode: SslMode::Preferred,
        tls_files: TlsFiles::default(),
        connect_timeout: None,
    };
    for (key, value) in parse_query(query, &PARAMS)? {
        match key {
            "ssl-mode" => target.ssl_mode = SslMode::parse(&value)?,
            "ssl-ca" => target.tls_files.ca_file = Some(PathBuf::from(value)),
            "ssl-cert" => target.tls_files.cert_file = Some(PathBuf::from(value)),
            "ssl-key" => target.tls_files.key_file = Some(PathBuf::from(value)),
            "socket" => {
                if !value.starts_with('/') {
                    return Err("socket= must be an absolute path".into());
                }
                host = MysqlHost::Unix(PathBuf::from(value));
            }
            "connect-timeout" => {
                let seconds: u64 = value
                    .parse()
                    .ok()
                    .filter(|s| *s <= 86_400)
                    .ok_or_else(|| format!("connect-timeout '{value}' is not a number of seconds up to 86400 (a day)"))?;
                target.connect_timeout =
                    Some(Duration::from_secs(seconds)).filter(|d| !d.is_zero());
            }
            // parse_query gives only the keys of PARAMS.
            _ => {}
        }
    }
    target.host = host;
    Ok(target)
}

/// Password and TLS files: the URL's password, `DLOCK_PASSWORD`, the `[mysql]` table's or
/// the top-level `password_file` (see [`credentials`]). No password is required: socket
/// authentication (`unix_socket`) needs none, and the server asks when it wants one.
pub fn complete(target: &mut MysqlTarget, file: &FileConfig) -> Result<(), Error> {
    let (password, tls) = credentials(
        "MySQL",
        file.table("mysql"),
        file,
        false,
        target.password.take(),
        true,
    )?;
    target.password = password;
    // Files named in the URL win over the config table's.
    let files = &mut target.tls_files;
    files.ca_file = files.ca_file.take().or(tls.ca_file);
    files.cert_file = files.cert_file.take().or(tls.cert_file);
    files.key_file = files.key_file.take().or(tls.key_file);
    if target.ssl_mode.verifies() && target.tls_files.ca_file.is_none() {
        return Err(Error::Config(format!(
            "ssl-mode={} needs a CA file: give ssl-ca=FILE in the URL or ca_file in the config file's [mysql] table",
            target.ssl_mode.as_str()
        )));
    }
    if target.tls_files.cert_file.is_some() != target.tls_files.key_file.is_some() {
        return Err(Error::Config(
            "ssl-cert and ssl-key must be given together".into(),
        ));
    }
    if target.ssl_mode != SslMode::Disabled {
        check_tls_files(&target.tls_files)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let t =
            parse("//app:s%40cret@db.example:3307/locks?ssl-mode=verify_identity&ssl-ca=/ca.pem")
                .unwrap();
        assert_eq!(
            t.host,
            MysqlHost::Tcp {
                host: "db.example".into(),
                port: 3307
            }
        );
        assert_eq!(t.user.as_deref(), Some("app"));
        assert_eq!(t.password.as_ref().map(Secret::expose), Some("s@cret"));
        assert_eq!(t.database.as_deref(), Some("locks"));
        assert_eq!(t.ssl_mode, SslMode::VerifyIdentity);
        assert_eq!(t.tls_files.ca_file, Some(PathBuf::from("/ca.pem")));
        assert!(!t.is_local());

        let t = parse("//[::1]/db").unwrap();
        assert_eq!(
            t.host,
            MysqlHost::Tcp {
                host: "::1".into(),
                port: DEFAULT_PORT
            }
        );
        assert!(t.is_local());
        assert_eq!(t.ssl_mode, SslMode::Preferred);
        // Not counted as loopback (so PREFERRED tries TLS there): the TLS tests rely on it to
        // reach PREFERRED's remote path on 127.0.0.1.
        assert!(!parse("//[::ffff:127.0.0.1]/db").unwrap().is_local());

        let t = parse("///db").unwrap();
        assert_eq!(t.host, MysqlHost::Unix(PathBuf::from(DEFAULT_SOCKET)));
        let t = parse("//u@%2Ftmp%2Fm.sock/db").unwrap();
        assert_eq!(t.host, MysqlHost::Unix(PathBuf::from("/tmp/m.sock")));
        let t = parse("//u@localhost/db?socket=/tmp/x.sock").unwrap();
        assert_eq!(t.host, MysqlHost::Unix(PathBuf::from("/tmp/x.sock")));
        assert_eq!(t.identity(), "mysql:///tmp/x.sock/db");
    }

    #[test]
    fn bad_urls_never_echo_what_may_be_a_password() {
        for url in [
            "//u:hunter2@h/db?hunter2",
            "//u:hunter2@h/db?ssl-mode=hunter3",
            "//u:hunter2@h:99999/db",
            "//u:hunter2@h/a/b",
            "u:hunter2@h",
        ] {
            let e = parse(url).unwrap_err();
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
        assert!(parse("//h/db?bogus=1").unwrap_err().contains("bogus"));
        assert_eq!(
            parse("//h/db?SSL_CA=/a&ssl-moode=required").unwrap_err(),
            "unknown URL parameter 'ssl-moode' (did you mean 'ssl-mode'?); a MySQL URL takes \
             ssl-mode=MODE, ssl-ca=FILE, ssl-cert=FILE, ssl-key=FILE, socket=PATH, \
             connect-timeout=SECONDS; see dlock run --help"
        );
        assert_eq!(
            parse("//h/db?sslmode=disabled&SSL_MODE=required").unwrap_err(),
            "the URL parameter 'ssl-mode' is given twice"
        );
        assert_eq!(
            parse("//h/db?Ssl_Mode=disabled&connect_timeout=5")
                .map(|t| (t.ssl_mode, t.connect_timeout)),
            Ok((SslMode::Disabled, Some(Duration::from_secs(5))))
        );
    }
}
