//! Credentials: where a password comes from (URL, `DLOCK_PASSWORD`, password files), the TLS
//! files a backend is given, and redaction, so that no password is ever printed, stored in
//! a lock's metadata or passed to the command.

mod inherit;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::config::{BackendFileConfig, FileConfig};
use crate::error::Error;

pub use inherit::{restore_inherited, Handoff, CREDENTIALS_FD};

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

/// TLS material from the config file (PEM files).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Fill in what a URL did not say, for one backend's config table: the password (URL, else
/// DLOCK_PASSWORD, else the table's `password_file`, else the top-level one) and the TLS files.
/// A user without a password is a usage error.
pub fn credentials(
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
            password = Some(Secret::new(from_env));
        } else if let Some(path) = section.password_file.as_deref().or(file.password_file()) {
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

/// [`credentials`] for a backend that authenticates only when the URL names a user (etcd,
/// ZooKeeper): without a user no password is looked up.
pub fn credentials_for_user(
    backend: &str,
    table: &str,
    file: &FileConfig,
    user: Option<&str>,
    password: Option<Secret>,
) -> Result<(Option<Secret>, TlsFiles), Error> {
    let has_user = user.is_some();
    credentials(
        backend,
        file.table(table),
        file,
        has_user,
        password,
        has_user,
    )
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
    Ok(Secret::new(password))
}

pub fn check_tls_files(tls: &TlsFiles) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
            let Ok(crate::backend::Target::Postgres(target)) = crate::backend::Target::parse(&text)
            else {
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
}
