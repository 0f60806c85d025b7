//! Credentials: where a password comes from (URL, `DLOCK_PASSWORD`, password files), the TLS
//! files a backend is given, their hand-over to nested dlocks (`inherit`), and redaction
//! (`redact`), so that no password is ever printed, stored in a lock's metadata or passed to
//! the command.

mod inherit;
mod redact;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::config::{BackendFileConfig, FileConfig};
use crate::error::Error;

pub use inherit::{restore_inherited, Handoff, CREDENTIALS_FD};
pub use redact::{
    command_line_of, own_command_line, redact_command, redact_url, shown_command_line,
};

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
