//! Redaction: secrets masked in URLs (a password in the userinfo or a `password=` parameter)
//! and in command lines (secret-looking options and variables, the password options of a few
//! programs, every URL of a line on its own), before anything is shown or stored.

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
    // From /proc: the binary's own `main` leaves Rust's copy of the arguments empty on
    // musl (src/start.rs).
    let words = crate::process::arguments(std::process::id()).unwrap_or_default();
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
mod tests;
