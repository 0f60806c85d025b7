//! How a holder shows itself to others, and how `status` reads it back: the metadata comment
//! that leads its statements (`pg_stat_activity.query`), the `application_name` label
//! `dlock <pid> <since> t<token> <host>`, and the rows of `pg_locks` they are joined to,
//! whose lock mode says how each one holds or waits (`ShareLock`: `--shared`).

use std::time::Duration;

use super::limit::recorded_limit;
use crate::lock::{Holder, HolderStatus, LockName, Mode};

/// 9999-12-31T23:59:59Z + 1 s: RFC 3339 has four digits for the year.
const LAST_RFC3339_SECOND: u64 = 253_402_300_800;

/// The label's two parts around the grant's time and the token (filled in by the token
/// statement, which alone knows them): `dlock <pid> ` and ` <host>`.
pub(super) fn holder_label(holder: &Holder) -> (String, String) {
    (
        format!("dlock {} ", holder.pid),
        format!(" {}", holder.host),
    )
}

/// `/*dlock {json}*/`, with every `*` written as `\u002a` (valid JSON; `*` only occurs in
/// strings) so the text can neither end the comment nor open a nested one.
pub(super) fn metadata_comment(holder: &Holder) -> String {
    let json = serde_json::to_string(holder).unwrap_or_default();
    format!("/*dlock {}*/", json.replace('*', "\\u002a"))
}

/// The sessions holding or waiting for any of the keys `$1`, holders first.
pub(super) const STATUS_SQL: &str = "SELECT l.pid, l.granted, \
     ((l.classid::int8 << 32) | l.objid::int8) AS key, \
     a.application_name, a.query, host(a.client_addr), a.client_port, \
     extract(epoch FROM a.backend_start)::int8, l.mode = 'ShareLock' \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND ((l.classid::int8 << 32) | l.objid::int8) = ANY($1) \
     ORDER BY l.granted DESC, a.query_start NULLS LAST, l.pid";

/// Every granted advisory lock in the database, exclusive or shared, with whether its
/// session also holds an exclusive one. Besides the holds, the shared ones include every dlock
/// session's recorded `--limit` (see [`super::limit`]): `list` tells them apart.
pub(super) const LIST_SQL: &str = "SELECT l.pid, l.granted, \
     ((l.classid::int8 << 32) | l.objid::int8) AS key, \
     a.application_name, a.query, host(a.client_addr), a.client_port, \
     extract(epoch FROM a.backend_start)::int8, l.mode = 'ShareLock', \
     EXISTS (SELECT 1 FROM pg_locks x WHERE x.pid = l.pid AND x.locktype = 'advisory' \
     AND x.objsubid = 1 AND x.granted AND x.mode = 'ExclusiveLock') \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted \
     AND l.mode IN ('ExclusiveLock', 'ShareLock') \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     ORDER BY key, a.query_start NULLS LAST, l.pid";

/// A row of [`STATUS_SQL`] / [`LIST_SQL`].
pub(super) struct Seen {
    pub(super) backend_pid: i32,
    pub(super) granted: bool,
    pub(super) key: i64,
    pub(super) application_name: String,
    /// The holder's metadata from its last statement, where our role may read it.
    pub(super) metadata: Option<Holder>,
    pub(super) client: Option<String>,
    /// Held (or asked for) in share mode.
    pub(super) shared: bool,
}

impl Seen {
    pub(super) fn from_row(row: &tokio_postgres::Row) -> Seen {
        let query: Option<String> = row.try_get(4).unwrap_or(None);
        let metadata = query.as_deref().and_then(|q| {
            let start = q.find("/*dlock ")? + "/*dlock ".len();
            let end = q[start..].find("*/")? + start;
            serde_json::from_str::<Holder>(&q[start..end]).ok()
        });
        let addr: Option<String> = row.try_get(5).unwrap_or(None);
        let port: Option<i32> = row.try_get(6).unwrap_or(None);
        let client = match (addr, port) {
            (Some(a), Some(p)) if p > 0 => Some(format!("{a}:{p}")),
            (Some(a), _) => Some(a),
            (None, Some(-1)) => Some("local socket".into()),
            _ => None,
        };
        Seen {
            backend_pid: row.try_get(0).unwrap_or(0),
            granted: row.try_get(1).unwrap_or(false),
            key: row.try_get(2).unwrap_or(0),
            application_name: row
                .try_get::<_, Option<String>>(3)
                .unwrap_or(None)
                .unwrap_or_default(),
            metadata,
            client,
            shared: row.try_get::<_, Option<bool>>(8).ok().flatten() == Some(true),
        }
    }

    /// Whether this row is a lock a holder has asked for or holds, as opposed to a recorded
    /// `--limit` ([`super::limit::limit_key`], held shared), when the metadata that would
    /// name the lock cannot be read: an exclusive key; or a shared key of a session that
    /// holds no exclusive key (`session_exclusive`) and is past waiting (its label has a
    /// start time), other than a shared run's recorded `--limit 1`, whose low 11 bits are 1.
    /// Such a session holds two shared keys, and a lock's own key has those bits set by
    /// chance once in 2048 names: that lock is then not listed without its metadata.
    pub(super) fn is_hold_without_metadata(&self, session_exclusive: bool) -> bool {
        if !self.shared {
            return true;
        }
        let since = self
            .application_name
            .find("dlock ")
            .and_then(|at| self.application_name[at..].split(' ').nth(2))
            .is_some_and(|word| word.parse::<u64>().is_ok());
        !session_exclusive && since && recorded_limit(self.key) != 1
    }

    /// The holder as far as we can see it: the metadata comment where visible, completed and
    /// corrected from the `application_name` label (`dlock <pid> <since> t<token> <host>`).
    pub(super) fn status(&self, name: &LockName) -> HolderStatus {
        let mut holder = self.metadata.clone().unwrap_or_default();
        if holder.name.is_empty() {
            holder.name = name.as_str().to_owned();
        }
        // The server's lock table is the truth about the mode, also where the metadata
        // cannot be read.
        holder.mode = if self.shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        let label = self
            .application_name
            .find("dlock ")
            .map(|at| &self.application_name[at + "dlock ".len()..]);
        if let Some(label) = label {
            let mut words = label.split(' ');
            if let Some(pid) = words.next().and_then(|p| p.parse().ok()) {
                holder.pid = pid;
            }
            let since = words.next().unwrap_or("");
            if since == "wait" || since == "admin" {
                if holder.host.is_empty() {
                    holder.host = words.collect::<Vec<_>>().join(" ");
                }
            } else if let Ok(secs) = since.parse::<u64>() {
                // Any session can name itself like a holder: a start time past what RFC 3339
                // can write (the year 9999) is not believed.
                let at = (secs < LAST_RFC3339_SECOND)
                    .then(|| std::time::UNIX_EPOCH.checked_add(Duration::from_secs(secs)))
                    .flatten();
                // The label's time is the grant's; the metadata's is when the run started.
                if let Some(at) = at {
                    holder.since = humantime::format_rfc3339_seconds(at).to_string();
                }
                if let Some(token) = words.next().and_then(|t| t.strip_prefix('t')) {
                    holder.token = token.parse().unwrap_or(holder.token);
                }
                if holder.host.is_empty() {
                    holder.host = words.collect::<Vec<_>>().join(" ");
                }
            }
        }
        let mut session = format!("backend pid {}", self.backend_pid);
        if let Some(client) = &self.client {
            session.push_str(&format!(" from {client}"));
        }
        if !self.application_name.is_empty() {
            session.push_str(&format!(", application_name '{}'", self.application_name));
        }
        HolderStatus {
            holder,
            ttl_left_ms: None,
            session: Some(session),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_comment_cannot_end_or_nest() {
        let name = LockName::new("x").unwrap();
        let holder = Holder::for_this_process(
            &name,
            &["sh".into(), "-c".into(), "echo */ /* done".into()],
            Duration::from_secs(1),
        );
        let comment = metadata_comment(&holder);
        let inner = &comment["/*dlock ".len()..comment.len() - 2];
        assert!(!inner.contains("*/") && !inner.contains("/*"), "{comment}");
        let back: Holder = serde_json::from_str(inner).unwrap();
        assert_eq!(back.command, holder.command);
    }
}
