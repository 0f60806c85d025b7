//! The config file (docs/guide.md: "Configuration"; man dlock.toml): which file, and its TOML. Unknown keys are an error (78).
//!
//! The top level holds `run`'s settings; each backend may have a table of its own for secrets
//! and TLS material (`[redis]`, `[etcd]`, …). Which tables exist is the backend registry's
//! business: the caller names them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::Error;

/// The config file.
#[derive(Debug, Default)]
pub struct FileConfig {
    pub(crate) values: Values,
    /// The backends' tables, by name.
    tables: BTreeMap<String, BackendFileConfig>,
}

/// The top-level keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Values {
    pub(crate) url: Option<OneOrMany>,
    #[serde(default, deserialize_with = "duration_text")]
    pub(crate) wait: Option<String>,
    pub(crate) no_wait: Option<bool>,
    pub(crate) conflict_exit_code: Option<i64>,
    #[serde(default, deserialize_with = "duration_text")]
    pub(crate) ttl: Option<String>,
    pub(crate) limit: Option<i64>,
    pub(crate) shared: Option<bool>,
    pub(crate) on_lost: Option<String>,
    #[serde(default, deserialize_with = "duration_text")]
    pub(crate) kill_after: Option<String>,
    #[serde(default, deserialize_with = "duration_text")]
    pub(crate) min_hold: Option<String>,
    pub(crate) prefix: Option<String>,
    pub(crate) local_queue: Option<bool>,
    pub(crate) record_command: Option<bool>,
    pub(crate) report: Option<PathBuf>,
    /// Read by the remote backends (not needed by the file backend).
    pub(crate) password_file: Option<PathBuf>,
}

/// A duration as the command line takes it, `"30s"`, or a number of seconds, `30` or `2.5`,
/// as the text `settings::parse_duration` reads.
fn duration_text<'de, D: serde::Deserializer<'de>>(of: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Text(String),
        Whole(i64),
        Fraction(f64),
    }
    Ok(Some(match Given::deserialize(of)? {
        Given::Text(text) => text,
        Given::Whole(n) => n.to_string(),
        Given::Fraction(x) => x.to_string(),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
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

impl FileConfig {
    /// Parse the text of a config file whose backend tables may be `table_names`. The error says
    /// what is wrong, without the path.
    pub fn parse(text: &str, table_names: &[&str]) -> Result<FileConfig, String> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| {
            let Some(span) = e.span() else {
                return e.message().trim().to_owned();
            };
            let start = span.start.min(text.len());
            let line = text[..start].matches('\n').count() + 1;
            // The key of the line, where it has one (`url = redis://h` is not a value).
            let key = text
                .lines()
                .nth(line - 1)
                .and_then(|l| l.split_once('='))
                .map(|(k, _)| k.trim())
                .filter(|k| !k.is_empty() && !k.starts_with('['))
                .map(|k| format!("{k}: "))
                .unwrap_or_default();
            format!("line {line}: {key}{}", e.message().trim())
        })?;
        let mut tables = BTreeMap::new();
        for name in table_names {
            if let Some(value) = table.remove(*name) {
                let toml::Value::Table(section) = value else {
                    return Err(format!("{name}: expected a table ([{name}])"));
                };
                check_keys(text, Some(name), &section)?;
                let section = BackendFileConfig::deserialize(toml::Value::Table(section))
                    .map_err(|e| format!("[{name}]: {}", e.message().trim()))?;
                tables.insert((*name).to_owned(), section);
            }
        }
        check_keys(text, None, &table)?;
        let values = Values::deserialize(toml::Value::Table(table))
            .map_err(|e| e.message().trim().to_owned())?;
        Ok(FileConfig { values, tables })
    }

    /// The table of one backend (`redis`, `etcd`, …), if the file has one.
    pub fn table(&self, name: &str) -> Option<&BackendFileConfig> {
        self.tables.get(name)
    }

    /// The top-level `password_file`.
    pub fn password_file(&self) -> Option<&Path> {
        self.values.password_file.as_deref()
    }
}

/// Each key of `table` (the top level, or the backend table `[section]`) one by one, so that
/// an error names the key and its line: an unknown key with the known one it is closest to,
/// a value of the wrong type with what the key takes.
fn check_keys(text: &str, section: Option<&str>, table: &toml::Table) -> Result<(), String> {
    for (key, value) in table {
        let at = |message: String| {
            let line = line_of(text, section, key)
                .map(|n| format!("line {n}: "))
                .unwrap_or_default();
            let key = match section {
                Some(s) => format!("[{s}] {key}"),
                None => key.clone(),
            };
            format!("{line}{key}: {message}")
        };
        let mut one = toml::Table::new();
        one.insert(key.clone(), value.clone());
        let checked = match section {
            Some(_) => BackendFileConfig::deserialize(toml::Value::Table(one)).map(|_| ()),
            None => Values::deserialize(toml::Value::Table(one)).map(|_| ()),
        };
        let Err(e) = checked else { continue };
        let message = e.message().trim();
        // serde lists the keys: "unknown field `wiat`, expected one of `url`, `wait`, …".
        if let Some((_, list)) = message
            .split_once("unknown field")
            .and_then(|(_, rest)| rest.split_once("expected "))
        {
            let known: Vec<&str> = list.split('`').skip(1).step_by(2).collect();
            let meant = closest(key, &known)
                .map(|k| format!("; did you mean {k}?"))
                .unwrap_or_default();
            return Err(at(format!("unknown key{meant} (expected {list})")));
        }
        if let Some((takes, example)) = what_it_takes(key) {
            return Err(at(format!(
                "{} is not {takes}; {example}",
                described(value)
            )));
        }
        return Err(at(message.to_owned()));
    }
    Ok(())
}

/// What `key` takes, and how to write it, for a value of the wrong type.
fn what_it_takes(key: &str) -> Option<(&'static str, String)> {
    let quoted = |example: &str| format!("write it in quotes: {key} = \"{example}\"");
    Some(match key {
        "wait" | "ttl" | "kill_after" | "min_hold" => (
            "a duration",
            format!("write it quoted with its unit, or as a number of seconds: {key} = \"30s\""),
        ),
        "limit" => (
            "a whole number",
            format!("write it without quotes: {key} = 2"),
        ),
        "conflict_exit_code" => (
            "a whole number",
            format!("write it without quotes: {key} = 75"),
        ),
        "no_wait" | "shared" | "local_queue" | "record_command" => (
            "true or false",
            format!("write one of them without quotes: {key} = true"),
        ),
        "url" => ("a URL", quoted("redis://locks:6379")),
        "on_lost" => ("text", quoted("term")),
        "prefix" => ("text", quoted("dlock")),
        "report" => ("text", quoted("/var/log/dlock/runs.jsonl")),
        "password_file" => ("text", quoted("/etc/dlock/password")),
        "ca_file" => ("text", quoted("/etc/dlock/ca.pem")),
        "cert_file" => ("text", quoted("/etc/dlock/client.pem")),
        "key_file" => ("text", quoted("/etc/dlock/client.key")),
        _ => return None,
    })
}

/// A TOML value as a message shows it: its type, and the value where it is short.
fn described(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => format!("string {text:?}"),
        toml::Value::Integer(n) => format!("integer `{n}`"),
        toml::Value::Float(x) => format!("floating point `{x}`"),
        toml::Value::Boolean(b) => format!("boolean `{b}`"),
        toml::Value::Datetime(at) => format!("date `{at}`"),
        toml::Value::Array(_) => "a list".to_owned(),
        toml::Value::Table(_) => "a table".to_owned(),
    }
}

/// The line (from 1) where `key` is set in `section` (the top level: before the first table).
fn line_of(text: &str, section: Option<&str>, key: &str) -> Option<usize> {
    let mut current: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            current = header.split(']').next().map(|h| h.trim().to_owned());
            continue;
        }
        let Some((k, _)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim().trim_matches(['"', '\'']);
        if k == key && current.as_deref() == section {
            return Some(n + 1);
        }
    }
    None
}

/// The known key within two edits of `key`, if any (the closest).
pub(crate) fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edits(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance (insertions, deletions, substitutions, one each).
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The config file this process read and its text, so that a bad value found later (a
/// duration without a unit) is placed: [`whereabouts`].
static LOADED: std::sync::OnceLock<(PathBuf, String)> = std::sync::OnceLock::new();

/// ` (in FILE, line N)` for a top-level `key` of the config file read, `""` when unknown.
pub fn whereabouts(key: &str) -> String {
    let Some((path, text)) = LOADED.get() else {
        return String::new();
    };
    match line_of(text, None, key) {
        Some(n) => format!(" (in {}, line {n})", path.display()),
        None => format!(" (in {})", path.display()),
    }
}

/// Load the config file named by `--config` / `DLOCK_CONFIG`, else the first of
/// `$XDG_CONFIG_HOME/dlock/config.toml` and `/etc/dlock/config.toml` that exists; its backend
/// tables may be `tables`.
pub fn load(explicit: Option<&Path>, tables: &[&str]) -> Result<FileConfig, Error> {
    let path = match explicit {
        Some(path) => path.to_owned(),
        None => match default_config_paths().into_iter().find(|p| p.exists()) {
            Some(path) => path,
            None => return Ok(FileConfig::default()),
        },
    };
    let text = crate::files::read_small_file(&path, crate::files::MAX_CONFIG_BYTES)
        .map_err(|e| Error::Config(format!("cannot read config file {}: {e}", path.display())))?;
    let parsed = FileConfig::parse(&text, tables).map_err(|e| {
        let at = if e.starts_with("line ") { ", " } else { ": " };
        Error::Config(format!("bad config file {}{at}{e}", path.display()))
    })?;
    let _ = LOADED.set((path, text));
    Ok(parsed)
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

#[cfg(test)]
mod tests {
    use super::*;

    const TABLES: &[&str] = &["redis", "etcd"];

    #[test]
    fn unknown_config_keys_are_rejected() {
        let parsed = FileConfig::parse("ttl = '5s'\ncolour = 'red'\n", TABLES);
        assert!(parsed.is_err());
        let parsed = FileConfig::parse("ttl = '5s'\n[redis]\nca_file = '/x'\n", TABLES);
        assert!(parsed.is_ok());
    }

    #[test]
    fn errors_name_the_key_and_the_line() {
        let error = |text: &str| FileConfig::parse(text, TABLES).err().unwrap_or_default();
        assert_eq!(
            error("ttl = '5s'\n\nwait = true\n"),
            "line 3: wait: boolean `true` is not a duration; write it quoted with its unit, or \
             as a number of seconds: wait = \"30s\""
        );
        assert!(
            error("wiat = '3s'\n").starts_with("line 1: wiat: unknown key; did you mean wait? ("),
            "{}",
            error("wiat = '3s'\n")
        );
        assert!(error("[redis]\nca_fil = 'x'\n")
            .starts_with("line 2: [redis] ca_fil: unknown key; did you mean ca_file? ("));
        assert!(error("colour = 'red'\n").starts_with("line 1: colour: unknown key (expected"));
        assert!(error("\nurl = redis://h\n").starts_with("line 2: url: "));
    }

    /// A value of the wrong type says what the key takes, with an example, never serde's
    /// "expected i64".
    #[test]
    fn a_value_of_the_wrong_type_says_what_the_key_takes() {
        let error = |text: &str| FileConfig::parse(text, TABLES).err().unwrap_or_default();
        assert_eq!(
            error("limit = \"2\"\n"),
            "line 1: limit: string \"2\" is not a whole number; write it without quotes: limit = 2"
        );
        assert_eq!(
            error("conflict_exit_code = 0.5\n"),
            "line 1: conflict_exit_code: floating point `0.5` is not a whole number; write it \
             without quotes: conflict_exit_code = 75"
        );
        for key in ["no_wait", "shared", "local_queue", "record_command"] {
            assert_eq!(
                error(&format!("{key} = \"yes\"\n")),
                format!(
                    "line 1: {key}: string \"yes\" is not true or false; write one of them \
                     without quotes: {key} = true"
                )
            );
        }
        assert_eq!(
            error("on_lost = 1\n"),
            "line 1: on_lost: integer `1` is not text; write it in quotes: on_lost = \"term\""
        );
        assert_eq!(
            error("[redis]\nca_file = 1\n"),
            "line 2: [redis] ca_file: integer `1` is not text; write it in quotes: \
             ca_file = \"/etc/dlock/ca.pem\""
        );
    }

    /// A duration may be a number of seconds, as on the command line.
    #[test]
    fn a_duration_may_be_a_number_of_seconds() {
        let config = FileConfig::parse(
            "wait = 30\nttl = 2.5\nkill_after = '5'\nmin_hold = '1m'\n",
            TABLES,
        )
        .expect("parses");
        assert_eq!(config.values.wait.as_deref(), Some("30"));
        assert_eq!(config.values.ttl.as_deref(), Some("2.5"));
        assert_eq!(config.values.kill_after.as_deref(), Some("5"));
        assert_eq!(config.values.min_hold.as_deref(), Some("1m"));
    }

    #[test]
    fn backend_tables_are_read_by_name() {
        let config = FileConfig::parse("ttl = '5s'\n[etcd]\npassword_file = '/p'\n", TABLES)
            .expect("parses");
        assert_eq!(
            config
                .table("etcd")
                .and_then(|t| t.password_file.as_deref()),
            Some(Path::new("/p"))
        );
        assert!(config.table("redis").is_none());
        assert!(FileConfig::parse("[etcd]\ncolour = 'red'\n", TABLES).is_err());
        assert!(FileConfig::parse("[gopher]\nca_file = '/x'\n", TABLES).is_err());
    }
}
