//! What a holder records with its hold: [`Holder`] (who, where, since when, with which
//! command, mode and `--limit`), the JSON [`Record`] of the backends that store one, and the
//! refusal of a `--limit` the holders do not share.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::LockName;
use crate::error::Error;

/// What a holder records with its hold (docs/guide.md: "Looking at locks").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub name: String,
    pub host: String,
    pub pid: u32,
    pub user: String,
    /// The command line, truncated to [`Holder::MAX_COMMAND`] bytes.
    pub command: String,
    /// Start of the hold, RFC 3339 UTC.
    pub since: String,
    /// Lease length in milliseconds (0 where the backend has no lease).
    pub ttl_ms: u64,
    pub token: u64,
    pub version: String,
    /// `--min-hold` in milliseconds (0: none): the lock is kept at least this long.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_hold_ms: u64,
    /// Set once the command has finished while `--min-hold` keeps the lock: until when, RFC
    /// 3339 UTC (where the backend can update a holder's metadata, see [`Lease::finished`](super::Lease::finished)).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kept_until: String,
    /// How it holds the lock: alone, or beside other shared holders (`--shared`). Stored
    /// only when shared, so an exclusive holder's record stays what every dlock wrote;
    /// `status` and `list` always show it ([`HolderStatus`](super::HolderStatus)).
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    /// The hold's `--limit`, so that `status` can say how many of a semaphore's slots are
    /// taken (0: not recorded: a record written by hand, by another program or by a dlock
    /// before it recorded this).
    #[serde(default, skip_serializing_if = "is_no_limit")]
    pub limit: u32,
}

/// How a lock is held: by one exclusive holder, or by any number of shared ones
/// (docs/guide.md: "Shared locks").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Exclusive,
    Shared,
}

impl Mode {
    pub fn is_shared(self) -> bool {
        self == Mode::Shared
    }

    fn is_exclusive(&self) -> bool {
        *self == Mode::Exclusive
    }

    /// `shared` or `exclusive`, as `status` and `list` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Holder {
    pub const MAX_COMMAND: usize = 200;

    /// Mark the hold as granted now: `since` is when the lock was granted, not when this run
    /// started waiting for it (`status` and the busy line count a hold's age from it).
    pub fn granted_now(&mut self) {
        self.since = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    }

    /// Set `since` from a grant `age` old by the server's count, on this host's clock (a
    /// server's clock and ours may differ; an age does not).
    pub fn granted_ago(&mut self, age: Duration) {
        let at = std::time::SystemTime::now()
            .checked_sub(age)
            .unwrap_or(std::time::UNIX_EPOCH);
        self.since = humantime::format_rfc3339_seconds(at).to_string();
    }

    /// Whether this entry was left by a client that is not dlock (`etcdctl lock`, Curator):
    /// it carries no pid and no dlock version.
    pub fn is_foreign(&self) -> bool {
        self.pid == 0 && self.version.is_empty()
    }

    /// Metadata for this process running `command` (its display form, passwords already
    /// masked), to be completed with the token.
    pub fn for_this_process(name: &LockName, command: &[String], ttl: Duration) -> Holder {
        let mut line = command.join(" ");
        crate::process::cut_to(&mut line, Self::MAX_COMMAND);
        Holder {
            name: name.as_str().to_owned(),
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
            pid: std::process::id(),
            user: user_name(),
            command: line,
            since: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            token: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            min_hold_ms: 0,
            kept_until: String::new(),
            mode: Mode::Exclusive,
            limit: 0,
        }
    }
}

pub fn user_name() -> String {
    // $USER is what the login set up ($LOGNAME where cron runs the job: it sets that one);
    // looking the uid up in the user database costs a parse of nsswitch.conf and /etc/passwd
    // on every run, so it is only the fallback.
    for variable in ["USER", "LOGNAME"] {
        if let Some(user) = std::env::var(variable).ok().filter(|u| !u.is_empty()) {
            return user;
        }
    }
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    }
}

fn is_no_limit(limit: &u32) -> bool {
    *limit == 0
}

/// What a holder records with its hold where the backend stores JSON (a lock file, an etcd
/// value, a ZooKeeper node): its metadata and the `--limit` it holds with, as one object
/// (the holder's fields, `limit` among them, once).
#[derive(Clone, Debug)]
pub struct Record {
    pub holder: Holder,
    /// The `--limit` it holds with (0: not recorded: a record written by hand or by another
    /// program, which agrees with any `--limit`).
    pub limit: u32,
}

impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Holder {
            limit: self.limit,
            ..self.holder.clone()
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Record, D::Error> {
        let holder = Holder::deserialize(deserializer)?;
        Ok(Record {
            limit: holder.limit,
            holder,
        })
    }
}

/// The refusal of a run whose `--limit` is not the holders' (all holders must agree).
pub fn limit_mismatch(name: &LockName, theirs: u32) -> Error {
    Error::Usage(format!(
        "lock '{name}' is held with --limit {theirs}; all holders must use the same --limit"
    ))
}
