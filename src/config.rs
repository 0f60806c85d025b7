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
    pub(crate) wait: Option<String>,
    pub(crate) no_wait: Option<bool>,
    pub(crate) conflict_exit_code: Option<i64>,
    pub(crate) ttl: Option<String>,
    pub(crate) limit: Option<i64>,
    pub(crate) shared: Option<bool>,
    pub(crate) on_lost: Option<String>,
    pub(crate) kill_after: Option<String>,
    pub(crate) min_hold: Option<String>,
    pub(crate) prefix: Option<String>,
    pub(crate) local_queue: Option<bool>,
    pub(crate) record_command: Option<bool>,
    pub(crate) report: Option<PathBuf>,
    /// Read by the remote backends (not needed by the file backend).
    pub(crate) password_file: Option<PathBuf>,
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
            let line = e
                .span()
                .map(|s| {
                    format!(
                        " (line {})",
                        text[..s.start.min(text.len())].lines().count().max(1)
                    )
                })
                .unwrap_or_default();
            format!("{}{line}", e.message().trim())
        })?;
        let mut tables = BTreeMap::new();
        for name in table_names {
            if let Some(value) = table.remove(*name) {
                let section = BackendFileConfig::deserialize(value)
                    .map_err(|e| format!("[{name}]: {}", e.message().trim()))?;
                tables.insert((*name).to_owned(), section);
            }
        }
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
    FileConfig::parse(&text, tables)
        .map_err(|e| Error::Config(format!("bad config file {}: {e}", path.display())))
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
