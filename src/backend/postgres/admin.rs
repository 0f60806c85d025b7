//! `status`, `list`, `release --force` and `check`: each on a connection of its own, reading
//! `pg_locks` and `pg_stat_activity` (see [`super::holders`]).

use std::time::Duration;

use tokio_postgres::types::Type;

use super::conn::{classify, describe, query, Session};
use super::holders::{Seen, LIST_SQL, STATUS_SQL};
use super::keys::{key_with, slot_key, turnstile_key};
use super::target::PgHost;
use super::PgBackend;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::round_trip::median_round_trip;
use crate::lock::{CheckReport, Holder, LockName, LockStatus, MAX_LIMIT};

/// What `check` asks the server about itself.
struct ServerFacts {
    version: String,
    standby: bool,
    user: String,
    database: String,
    can_signal: bool,
    ssl: Option<bool>,
    ssl_version: Option<String>,
}

impl PgBackend {
    /// Connect for `status`, `list`, `release --force` and `check`.
    pub(super) async fn admin(&self) -> Result<Session, Error> {
        let label = format!("dlock {} admin", std::process::id());
        self.connect(&label, Duration::from_secs(30), None, None)
            .await
    }

    /// The sessions holding or waiting for `name`'s keys (any slot, and the turnstile).
    async fn seen(&self, session: &Session, name: &LockName) -> Result<(Vec<Seen>, i64), Error> {
        let turnstile = turnstile_key(&self.prefix, name.as_str());
        let keys: Vec<i64> = (0..MAX_LIMIT)
            .map(|i| slot_key(&self.prefix, name.as_str(), i))
            .chain([turnstile])
            .collect();
        let rows = query(
            session,
            STATUS_SQL,
            &[(&keys, Type::INT8_ARRAY)],
            &self.display,
        )
        .await?;
        Ok((rows.iter().map(Seen::from_row).collect(), turnstile))
    }

    /// Holders and queue of `name`: the turnstile's holder heads the queue.
    pub(super) async fn status_with(
        &self,
        session: &Session,
        name: &LockName,
    ) -> Result<LockStatus, Error> {
        let (seen, turnstile) = self.seen(session, name).await?;
        let mut holders = Vec::new();
        let mut queue = Vec::new();
        let mut turnstile_head = Vec::new();
        for seen in &seen {
            if seen.key == turnstile {
                if seen.granted {
                    turnstile_head.push(seen.status(name));
                } else {
                    queue.push(seen.status(name));
                }
            } else if seen.granted {
                holders.push(seen.status(name));
            } else {
                queue.push(seen.status(name));
            }
        }
        turnstile_head.extend(queue);
        let queue = turnstile_head;
        Ok(LockStatus {
            name: name.as_str().to_owned(),
            held: !holders.is_empty(),
            holders,
            waiters: Some(queue.len() as u64),
            queue,
            last_token: None,
            waiting_here: Vec::new(),
            location: None,
        })
    }

    /// "is held by …[, N waiting ahead]" for a busy message ("is held" when status cannot be
    /// read); the words are [`crate::wording::busy_state`]'s.
    pub(super) async fn describe_holders(&self, session: &Session, name: &LockName) -> String {
        match self.status_with(session, name).await {
            Ok(status) if status.held => {
                // Our own session is among the queue once it waited; it is not ahead of us.
                let ahead = status
                    .queue
                    .iter()
                    .filter(|w| w.holder.pid != std::process::id())
                    .count();
                let holders: Vec<_> = status.holders.into_iter().map(|h| h.holder).collect();
                crate::wording::busy_state(&holders, ahead)
            }
            _ => "is held".into(),
        }
    }

    /// Every lock a dlock holds in this database, by name (a key without a readable name as
    /// `key:<n>`).
    pub(super) async fn list_locks(&self) -> Result<Vec<LockStatus>, Error> {
        let session = self.admin().await?;
        let rows = query(&session, LIST_SQL, &[], &self.display).await?;
        let mut locks: Vec<LockStatus> = Vec::new();
        let mut named = std::collections::HashSet::new();
        for row in &rows {
            let seen = Seen::from_row(row);
            // Only dlock's holders: a label or a metadata comment says so.
            if seen.metadata.is_none() && !seen.application_name.contains("dlock ") {
                continue;
            }
            // Without the metadata, a recorded --limit (a shared key) is told apart from a hold
            // by the session's other keys; with it, by the name's keys below.
            let session_exclusive = row.try_get::<_, bool>(9).unwrap_or(false);
            if seen.metadata.is_none() && !seen.is_hold_without_metadata(session_exclusive) {
                continue;
            }
            let name = seen
                .metadata
                .as_ref()
                .map(|h| h.name.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("key:{}", seen.key));
            let Ok(lock_name) = LockName::new(&name) else {
                continue;
            };
            // A name seen in metadata belongs to our namespace only if its key matches.
            if seen.metadata.is_some()
                && !(0..MAX_LIMIT).any(|i| slot_key(&self.prefix, &name, i) == seen.key)
            {
                continue;
            }
            if seen.metadata.is_some() {
                named.insert(name.clone());
            }
            let status = seen.status(&lock_name);
            LockStatus::add_holder(&mut locks, name, status);
        }
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        // The waiters, as `status` counts them (the same column on every backend); a lock
        // known only by its key has no name to count them by.
        for lock in &mut locks {
            if !named.contains(&lock.name) {
                continue;
            }
            if let Ok(name) = LockName::new(&lock.name) {
                if let Ok(status) = self.status_with(&session, &name).await {
                    lock.waiters = status.waiters;
                }
            }
        }
        Ok(locks)
    }

    /// `release --force`: end the sessions holding `name` (the server frees their locks).
    pub(super) async fn release_by_force(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let session = self.admin().await?;
        let (seen, turnstile) = self.seen(&session, name).await?;
        let mut removed = Vec::new();
        for holder in seen.iter().filter(|s| s.granted && s.key != turnstile) {
            let pid = holder.backend_pid;
            match session
                .client
                .query_typed("SELECT pg_terminate_backend($1)", &[(&pid, Type::INT4)])
                .await
            {
                Ok(_) => removed.push(holder.status(name).holder),
                Err(e) if e.code().map(|c| c.code()) == Some("42501") => {
                    return Err(Error::Permission(format!(
                        "not permitted to end the holder's session (backend pid {pid}): {}; it needs membership in pg_signal_backend or the holder's role",
                        describe(&e)
                    )))
                }
                Err(e) => return Err(classify(&e, &self.display)),
            }
        }
        Ok(removed)
    }

    /// `check`: reach the server, ask it about itself, time round trips, take a test key.
    pub(super) async fn check_server(&self) -> Result<CheckReport, Error> {
        let started = BootInstant::now();
        let session = self.admin().await?;
        let connect_time = BootInstant::now().saturating_since(started);
        let facts = self.server_facts(&session).await?;
        if facts.standby {
            return Err(Error::Config(format!(
                "{} is a hot standby (pg_is_in_recovery() is true); locks must be taken on the primary",
                self.display
            )));
        }
        let median = median_round_trip(5, async || {
            query(&session, "SELECT 1", &[], &self.display)
                .await
                .map(drop)
        })
        .await?;
        self.probe_advisory_lock(&session).await?;
        let warnings = self.warnings(&session, &facts);
        let ServerFacts {
            version,
            user,
            database,
            ssl,
            ssl_version,
            ..
        } = facts;
        Ok(CheckReport {
            backend: "postgres".into(),
            location: self.display.clone(),
            version: version
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
            round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
            warnings,
            details: vec![
                ("server version".into(), session.version.clone()),
                ("database".into(), database),
                ("user".into(), user),
                (
                    "tls".into(),
                    match (ssl, ssl_version) {
                        (Some(true), Some(v)) => v,
                        _ => "none".into(),
                    },
                ),
                (
                    "connect".into(),
                    humantime::format_duration(Duration::from_micros(
                        connect_time.as_micros() as u64
                    ))
                    .to_string(),
                ),
                (
                    "advisory lock".into(),
                    "taken and released a test key".into(),
                ),
            ],
        })
    }

    async fn server_facts(&self, session: &Session) -> Result<ServerFacts, Error> {
        let rows = query(
            session,
            "SELECT version(), pg_is_in_recovery(), current_user::text, current_database()::text, \
             pg_has_role('pg_signal_backend', 'MEMBER'), \
             (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), \
             (SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid())",
            &[],
            &self.display,
        )
        .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::Internal("check: no row".into()))?;
        Ok(ServerFacts {
            version: row.try_get(0).unwrap_or_default(),
            standby: row.try_get(1).unwrap_or(false),
            user: row.try_get(2).unwrap_or_default(),
            database: row.try_get(3).unwrap_or_default(),
            can_signal: row.try_get(4).unwrap_or(false),
            ssl: row.try_get(5).unwrap_or(None),
            ssl_version: row.try_get(6).unwrap_or(None),
        })
    }

    /// Take and give back a test key; it must show up for our own backend (no pooler).
    async fn probe_advisory_lock(&self, session: &Session) -> Result<(), Error> {
        let probe = key_with(&self.prefix, "!check", uuid::Uuid::new_v4().as_bytes());
        let rows = query(
            session,
            "SELECT pg_try_advisory_lock($1)",
            &[(&probe, Type::INT8)],
            &self.display,
        )
        .await?;
        let took = rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
        let seen = query(
            session,
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() \
             AND granted AND objsubid = 1 AND classid = (($1 >> 32) & 4294967295)::oid \
             AND objid = ($1 & 4294967295)::oid)",
            &[(&probe, Type::INT8)],
            &self.display,
        )
        .await?;
        let mine = seen.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
        query(
            session,
            "SELECT pg_advisory_unlock($1)",
            &[(&probe, Type::INT8)],
            &self.display,
        )
        .await?;
        if !took || !mine {
            return Err(Error::Config(format!(
                "an advisory lock taken on {} does not show up for our own session: the connection goes through a transaction-pooling proxy; use a direct or session-pooled connection",
                self.display
            )));
        }
        Ok(())
    }

    /// What `check` warns about: a server without `idle_session_timeout`, no TLS, and a role
    /// that may end only its own sessions.
    fn warnings(&self, session: &Session, facts: &ServerFacts) -> Vec<String> {
        let mut warnings = Vec::new();
        if !session.idle_timeout {
            warnings.push(
                "the server has no idle_session_timeout (PostgreSQL 14+): a holder that goes silent behind a live connection (a stopped dlock, a proxy or NAT keeping it open) keeps the lock until TCP keepalives notice".into(),
            );
        }
        if facts.ssl != Some(true)
            && !matches!(self.target.hosts.first(), Some(PgHost::Unix { .. }))
        {
            warnings.push(format!(
                "the connection is not encrypted (sslmode={})",
                self.target.sslmode.as_str()
            ));
        }
        if !facts.can_signal {
            warnings.push(format!(
                "role {} is not in pg_signal_backend: 'dlock release --force' can end only its own role's sessions",
                facts.user
            ));
        }
        warnings
    }
}
