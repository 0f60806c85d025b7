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

/// Words in an option's or a variable's name that say its value is a secret, wherever they
/// appear in the name (`--api-key`, `DB_PASSWORD`).
const SECRET_WORDS: [&str; 7] = [
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "token",
    "secret",
    "key",
];

/// Parts of an option's or a variable's name, between `-`, `_` and `.`, that say its value is
/// a secret (`--pass X`, `--auth X`, `--credentials X`, `DB_PASS=X`, `REDISCLI_AUTH=X`,
/// `SSHPASS=X`); as parts only, so that `--author` and `--passthrough` stay as they are.
const SECRET_PARTS: [&str; 7] = [
    "pass",
    "pw",
    "auth",
    "credential",
    "credentials",
    "creds",
    "sshpass",
];

fn names_a_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|word| name.contains(word))
        || name
            .split(['-', '_', '.'])
            .any(|part| SECRET_PARTS.contains(&part))
}

/// Programs whose short options (or curl's `USER:PASSWORD`) carry a password. A short option
/// means something else to every other program (`tar -u`, `cp -a`, `ssh -p 22`, `docker -u
/// 1000:1000`), so it is masked only in a line that runs the program, from its name on.
#[derive(Clone, Copy, Default)]
struct Programs {
    /// The MySQL or MariaDB clients (`mysql`, `mysqldump`, `mariadb`, …), anywhere in the
    /// line: `-pX` (only attached: `-p X` prompts, and X is a database).
    mysql: bool,
    /// `redis-cli` (`valkey-cli`, `keydb-cli`): `-a X`.
    redis_cli: bool,
    /// `sshpass`: `-p X`.
    sshpass: bool,
    /// `curl`: `-u`, `-U`, `--user`, `--proxy-user` `USER:PASSWORD`, the part after the colon.
    curl: bool,
}

impl Programs {
    /// Note `token` if it names one of the programs (a path to it included).
    fn note(&mut self, token: &str) {
        let base = token.rsplit('/').next().unwrap_or(token);
        match base {
            "redis-cli" | "valkey-cli" | "keydb-cli" => self.redis_cli = true,
            "sshpass" => self.sshpass = true,
            "curl" => self.curl = true,
            _ => {}
        }
    }
}

/// What the token after an option is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Next {
    Plain,
    /// The option's value, a secret.
    Secret,
    /// curl's `USER:PASSWORD`: the part after the colon is a secret.
    UserPassword,
}

/// The command line as it may be stored and shown (`status`, `list`): each word with
/// [`redact_url`] applied, and the values of secret-bearing options and variables replaced by
/// `***` — `--password=X`, `--token X`, `--key-file X`, `--pass X`, `--passphrase X`, `--auth
/// X`, `--credentials X`, `NAME=X` where NAME says password, passwd, passphrase, pwd, token,
/// secret or key, or has a part pass, pw, auth, credential(s), creds or sshpass (`MYSQL_PWD=X`,
/// `API_SECRET=X`, `REDISCLI_AUTH=X`) — and the short options of the programs that take a
/// password in one (see [`Programs`]): `-pX` to the MySQL and MariaDB clients, `-a X` to
/// redis-cli, `-p X` to sshpass, `-u USER:X` to curl. Words of a shell script (`sh -c '…'`)
/// are looked at one by one too. Masking a value that was no secret is the safe mistake.
pub fn redact_command(words: &[String]) -> Vec<String> {
    let mut programs = Programs {
        mysql: words
            .iter()
            .flat_map(|w| w.split_whitespace())
            .any(|token| {
                let base = token.rsplit('/').next().unwrap_or(token);
                base.starts_with("mysql") || base.starts_with("mariadb")
            }),
        ..Programs::default()
    };
    let mut next = Next::Plain;
    words
        .iter()
        .map(|word| {
            let word = redact_url(word);
            let mut out = String::with_capacity(word.len());
            let mut rest = word.as_str();
            while !rest.is_empty() {
                let space = rest.len() - rest.trim_start().len();
                out.push_str(&rest[..space]);
                rest = &rest[space..];
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                let (token, after) = rest.split_at(end);
                rest = after;
                if token.is_empty() {
                    continue;
                }
                let value = std::mem::replace(&mut next, Next::Plain);
                if value != Next::Plain && !token.starts_with('-') {
                    out.push_str(&match value {
                        Next::UserPassword => user_password(token),
                        _ => "***".to_owned(),
                    });
                    continue;
                }
                programs.note(token);
                let (masked, then) = redact_token(token, programs);
                next = then;
                out.push_str(&masked);
            }
            word_end_keeps(&mut next, &word);
            out
        })
        .collect()
}

/// A command line as `status` shows it: its words masked by [`redact_command`], joined by
/// spaces and cut to `max` bytes (with `…`).
pub fn shown_command_line(words: &[String], max: usize) -> String {
    let mut line = redact_command(words).join(" ");
    crate::process::cut_to(&mut line, max);
    line
}

/// This process's command line as [`shown_command_line`] shows it: what a run waiting in
/// this host's queue records for `status`.
pub fn own_command_line(max: usize) -> String {
    let words: Vec<String> = std::env::args_os()
        .map(|word| word.to_string_lossy().into_owned())
        .collect();
    shown_command_line(&words, max)
}

/// The command line of process `pid` of this host (a waiter `status` shows) as
/// [`shown_command_line`] shows it, or nothing for a dlock that records none: one given
/// `--record-command off`, or started with `DLOCK_RECORD_COMMAND` off where its environment
/// can be read. (A `record_command = false` in its config file cannot be seen from here; a run
/// in this host's queue says what it records itself.)
pub fn command_line_of(pid: u32, max: usize) -> String {
    let Some(words) = crate::process::arguments(pid) else {
        return String::new();
    };
    let from_arguments = words.iter().enumerate().find_map(|(i, word)| {
        let value = match word.strip_prefix("--record-command") {
            Some("") => words.get(i + 1)?.as_str(),
            Some(with) => with.strip_prefix('=')?,
            None => return None,
        };
        Some(value.to_owned())
    });
    let setting =
        from_arguments.or_else(|| crate::process::environment_value(pid, "DLOCK_RECORD_COMMAND"));
    if setting.is_some_and(|value| says_off(&value)) {
        return String::new();
    }
    shown_command_line(&words, max)
}

/// Whether an on/off setting says off (`off`, `false`, `no`, `n`, `f`, `0`, as `--record-command`
/// takes them).
fn says_off(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "off" | "false" | "no" | "n" | "f" | "0"
    )
}

/// A word ending in white space (a script's last token) does not carry `next` into the
/// next word of the command line; a word that is one token does.
fn word_end_keeps(next: &mut Next, word: &str) {
    if word.ends_with(char::is_whitespace) {
        *next = Next::Plain;
    }
}

/// `USER:***` for curl's `USER:PASSWORD`; a user alone (curl asks for the password) stays.
fn user_password(value: &str) -> String {
    match value.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => value.to_owned(),
    }
}

/// One token: its masked form, and what the next token is.
fn redact_token(token: &str, programs: Programs) -> (String, Next) {
    if let Some(long) = token.strip_prefix("--") {
        let (name, value) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (long, None),
        };
        if names_a_secret(name) && !name.starts_with("no-") {
            return match value {
                Some(_) => (format!("--{name}=***"), Next::Plain),
                None => (token.to_owned(), Next::Secret),
            };
        }
        if programs.curl && matches!(name, "user" | "proxy-user") {
            return match value {
                Some(value) => (format!("--{name}={}", user_password(value)), Next::Plain),
                None => (token.to_owned(), Next::UserPassword),
            };
        }
        return (token.to_owned(), Next::Plain);
    }
    let short = |flag: &str| -> Option<Option<&str>> {
        let rest = token.strip_prefix(flag)?;
        Some((!rest.is_empty()).then_some(rest))
    };
    if programs.mysql || programs.sshpass {
        if let Some(Some(_)) = short("-p") {
            return ("-p***".to_owned(), Next::Plain);
        }
    }
    if programs.sshpass && token == "-p" {
        return (token.to_owned(), Next::Secret);
    }
    if programs.redis_cli {
        match short("-a") {
            Some(Some(_)) => return ("-a***".to_owned(), Next::Plain),
            Some(None) => return (token.to_owned(), Next::Secret),
            None => {}
        }
    }
    if programs.curl {
        for flag in ["-u", "-U"] {
            match short(flag) {
                Some(Some(value)) => {
                    return (format!("{flag}{}", user_password(value)), Next::Plain)
                }
                Some(None) => return (token.to_owned(), Next::UserPassword),
                None => {}
            }
        }
    }
    if let Some((name, _)) = token.split_once('=') {
        let is_name = !name.is_empty()
            && name
                .trim_start_matches('-')
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if is_name && names_a_secret(name) {
            return (format!("{name}=***"), Next::Plain);
        }
    }
    (token.to_owned(), Next::Plain)
}

/// Replace the password in a URL's user info with `***`.
pub fn redact_url(url: &str) -> String {
    redact_password_parameter(&redact_userinfo(url))
}

/// Each URL in `text` with the password in its user info masked. A URL ends where the next
/// one starts (`https://api@h1/p; curl https://web@h2/q` is two), so that one URL's mask never
/// takes in the text up to another's `@`.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(scheme_end) = rest.find("://") {
        let start = scheme_end + 3;
        let mut end = start;
        let end = loop {
            match next_url_start(&rest[end..]) {
                Some(at) if !unfinished_user_info(&rest[start..end + at]) => break end + at,
                // A password may hold `;b://`: the next URL starts after this one's `@`.
                Some(at) => end += at + 1,
                None => break rest.len(),
            }
        };
        let (url, after) = rest.split_at(end);
        out.push_str(&redact_one_userinfo(url, start));
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Whether `authority` (what follows a URL's `://`) may be a user info whose `@` is still to
/// come: no `@`, and a colon followed by what is no port number (`u:pass;`, not `h:8443/`).
fn unfinished_user_info(authority: &str) -> bool {
    if authority.contains('@') {
        return false;
    }
    let end = authority
        .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
        .unwrap_or(authority.len());
    let host = &authority[..end];
    // An IPv6 address in brackets has colons of its own.
    let host = host.rsplit(']').next().unwrap_or(host);
    host.split_once(':')
        .is_some_and(|(_, port)| !port.chars().all(|c| c.is_ascii_digit()))
}

/// Where the next URL in `text` starts: its scheme before a later `://`, where the scheme
/// starts with a letter after white space or punctuation a URL does not hold unencoded
/// (`;`, a quote, …). A `://` inside a password is no new URL: what comes before it there is
/// not a scheme after such a character.
fn next_url_start(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let separator = from + found;
        let scheme = text[..separator]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map(|(at, _)| at);
        let starts_a_url = scheme.is_some_and(|at| {
            text[at..].starts_with(|c: char| c.is_ascii_alphabetic())
                && text[..at].chars().next_back().is_some_and(|before| {
                    before.is_whitespace() || "'\"`;|&()<>,=".contains(before)
                })
        });
        match scheme {
            Some(at) if starts_a_url => return Some(at),
            _ => from = separator + 3,
        }
    }
    None
}

/// `url` (its authority starting at `start`) with the password in its user info masked.
fn redact_one_userinfo(url: &str, start: usize) -> String {
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

    fn shown(words: &[&str]) -> String {
        let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        redact_command(&words).join(" ")
    }

    #[test]
    fn secrets_in_a_command_line_are_masked() {
        let cases: &[(&[&str], &str)] = &[
            (&["mysql", "-pS3cret", "-u", "app"], "mysql -p*** -u app"),
            (&["/usr/bin/mariadb", "-pS3cret"], "/usr/bin/mariadb -p***"),
            (&["tool", "--password=S3cret", "x"], "tool --password=*** x"),
            (&["tool", "--token", "S3cret", "x"], "tool --token *** x"),
            (&["tool", "--api-key", "S3cret"], "tool --api-key ***"),
            (
                &["tool", "--key-file", "/k/S3cret.pem"],
                "tool --key-file ***",
            ),
            (
                &["tool", "--Client-Secret=S3cret"],
                "tool --Client-Secret=***",
            ),
            (
                &["env", "MYSQL_PWD=S3cret", "mysql"],
                "env MYSQL_PWD=*** mysql",
            ),
            (
                &["env", "PGPASSWORD=S3cret", "psql"],
                "env PGPASSWORD=*** psql",
            ),
            (&["env", "API_SECRET=S3cret", "x"], "env API_SECRET=*** x"),
            (&["env", "github_token=S3cret"], "env github_token=***"),
            (
                &[
                    "sh",
                    "-c",
                    "MYSQL_PWD=S3cret mysql -pS3cret --token S3cret db",
                ],
                "sh -c MYSQL_PWD=*** mysql -p*** --token *** db",
            ),
            (&["tool", "--passwd", "S3cret"], "tool --passwd ***"),
        ];
        for (words, expected) in cases {
            let line = shown(words);
            assert!(!line.contains("S3cret"), "{words:?} -> {line}");
            assert_eq!(&line, expected, "{words:?}");
        }
        // What is no secret stays as it is.
        for words in [
            &["ssh", "-p", "22", "host"][..],
            &["find", ".", "-print"],
            &["tool", "--no-password", "-h", "db"],
            &["make", "CC=gcc", "-j4"],
            &["tool", "--keep", "x"],
        ] {
            assert_eq!(shown(words), words.join(" "));
        }
        // An option without its value at the end of a script does not mask the next word.
        assert_eq!(
            shown(&["sh", "-c", "prompt --password ", "next"]),
            "sh -c prompt --password  next"
        );
    }

    #[test]
    fn common_secret_options_are_masked() {
        let cases: &[(&[&str], &str)] = &[
            (&["tool", "--pass", "S3cret", "x"], "tool --pass *** x"),
            (&["tool", "--passphrase", "S3cret"], "tool --passphrase ***"),
            (&["tool", "--passphrase=S3cret"], "tool --passphrase=***"),
            (&["tool", "--auth", "S3cret", "x"], "tool --auth *** x"),
            (&["tool", "--http-auth=S3cret"], "tool --http-auth=***"),
            (
                &["tool", "--credentials", "S3cret"],
                "tool --credentials ***",
            ),
            (&["tool", "--db-pass", "S3cret"], "tool --db-pass ***"),
            (
                &["env", "REDISCLI_AUTH=S3cret", "x"],
                "env REDISCLI_AUTH=*** x",
            ),
            (&["env", "SSHPASS=S3cret", "x"], "env SSHPASS=*** x"),
            (&["env", "DB_PASS=S3cret", "x"], "env DB_PASS=*** x"),
            (
                &["redis-cli", "-a", "S3cret", "ping"],
                "redis-cli -a *** ping",
            ),
            (
                &["/usr/bin/redis-cli", "-aS3cret"],
                "/usr/bin/redis-cli -a***",
            ),
            (
                &["valkey-cli", "-h", "h", "-a", "S3cret"],
                "valkey-cli -h h -a ***",
            ),
            (
                &["sshpass", "-p", "S3cret", "ssh", "h"],
                "sshpass -p *** ssh h",
            ),
            (&["sshpass", "-pS3cret", "ssh", "h"], "sshpass -p*** ssh h"),
            (
                &["curl", "-u", "bob:S3cret", "https://h/"],
                "curl -u bob:*** https://h/",
            ),
            (
                &["curl", "-ubob:S3cret", "https://h/"],
                "curl -ubob:*** https://h/",
            ),
            (&["curl", "--user", "bob:S3cret"], "curl --user bob:***"),
            (&["curl", "--user=bob:S3cret"], "curl --user=bob:***"),
            (&["curl", "-U", "proxy:S3cret", "x"], "curl -U proxy:*** x"),
            (
                &[
                    "sh",
                    "-c",
                    "redis-cli -a S3cret ping && curl -u bob:S3cret h",
                ],
                "sh -c redis-cli -a *** ping && curl -u bob:*** h",
            ),
        ];
        for (words, expected) in cases {
            let line = shown(words);
            assert!(!line.contains("S3cret"), "{words:?} -> {line}");
            assert_eq!(&line, expected, "{words:?}");
        }
    }

    #[test]
    fn short_options_of_other_programs_stay_as_they_are() {
        for words in [
            &["tar", "-u", "-f", "a.tar", "b"][..],
            &["cp", "-a", "src", "dst"],
            &["ssh", "-p", "22", "host"],
            &["docker", "run", "-u", "1000:1000", "img"],
            &["rsync", "-a", "src", "dst"],
            &["git", "commit", "--author", "A <a@b>"],
            &["tool", "--passthrough", "x"],
            &["curl", "-u", "bob", "https://h/"],
            &["mysql", "-p", "db"],
        ] {
            assert_eq!(shown(words), words.join(" "));
        }
    }

    #[test]
    fn each_url_of_a_line_is_masked_on_its_own() {
        assert_eq!(
            redact_url("https://api@h1.example/p; curl https://web@h2.example/q"),
            "https://api@h1.example/p; curl https://web@h2.example/q"
        );
        assert_eq!(
            redact_url("a https://u:S3cret@h1/p b https://v:S3cret@h2/q c"),
            "a https://u:***@h1/p b https://v:***@h2/q c"
        );
        assert_eq!(
            shown(&[
                "sh",
                "-c",
                "curl https://api@h1.example/p; curl https://web@h2.example/q"
            ]),
            "sh -c curl https://api@h1.example/p; curl https://web@h2.example/q"
        );
        // A `://` in a password starts no URL of its own.
        for url in ["redis://:a://S3cret@h", "redis://u:x;b://S3cret@h"] {
            let shown = redact_url(url);
            assert!(!shown.contains("S3cret"), "{url} -> {shown}");
        }
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
            let parsed = crate::backend::Target::parse(&text);
            let Some(target) = parsed
                .as_ref()
                .ok()
                .and_then(|t| t.downcast_ref::<crate::backend::postgres::PgTarget>())
            else {
                panic!("{text:?} does not parse as PostgreSQL");
            };
            assert_eq!(
                target
                    .password
                    .as_ref()
                    .map(|p| p.expose().to_owned())
                    .as_deref(),
                Some("s3cret")
            );
        }
        // Keys that merely contain the word stay as they are.
        assert_eq!(redact_url("host=db xpassword=1"), "host=db xpassword=1");
    }
}
