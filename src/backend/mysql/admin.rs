//! `status`, `list`, `release --force` and `check`, each on a connection of its own.
//!
//! A holder is what `IS_USED_LOCK` says holds a key, completed by its row in `dlock_locks`
//! (metadata, token) where that row names the same connection, and by the process list
//! (client address; other users' sessions only with the PROCESS privilege). Waiters are the
//! sessions the process list shows waiting for a user lock in a dlock statement of the name
//! (MariaDB has no table of user-lock waiters; MySQL 8's `performance_schema.metadata_locks`
//! would have one).

use std::time::Duration;

use super::conn::{cell, Session};
use super::keys::{key, quoted, turnstile_key};
use super::sql::CREATE_TABLE;
use super::MysqlBackend;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::round_trip::median_round_trip;
use crate::lock::{CheckReport, Holder, HolderStatus, LockName, LockStatus};

/// The live holders recorded in `dlock_locks`, with their client address: `WHERE` is added.
const HOLDERS_SQL: &str = "SELECT r.conn_id, r.held_token, r.holder, \
     (SELECT p.HOST FROM information_schema.PROCESSLIST p WHERE p.ID = r.conn_id), r.name_key \
     FROM dlock_locks r WHERE r.conn_id > 0 AND IS_USED_LOCK(r.lock_key) = r.conn_id";

/// One holder as the server shows it.
struct Seen {
    connection: u64,
    token: u64,
    holder: Option<Holder>,
    client: Option<String>,
}

impl Seen {
    fn from_row(row: &mysql_async::Row) -> Seen {
        Seen {
            connection: cell::<u64>(row, 0).unwrap_or(0),
            token: cell::<u64>(row, 1).unwrap_or(0),
            holder: cell::<String>(row, 2).and_then(|j| serde_json::from_str(&j).ok()),
            client: cell::<String>(row, 3),
        }
    }

    fn status(&self, name: &str) -> HolderStatus {
        let mut holder = self.holder.clone().unwrap_or_default();
        if holder.name.is_empty() {
            holder.name = name.to_owned();
        }
        holder.token = self.token;
        let mut session = format!("connection id {}", self.connection);
        if let Some(client) = &self.client {
            session.push_str(&format!(" from {client}"));
        }
        HolderStatus {
            holder,
            ttl_left_ms: None,
            session: Some(session),
        }
    }
}

/// What `check` reads of the server in its first statement.
struct ServerFacts {
    version: String,
    user: String,
    database: Option<String>,
    read_only: bool,
    wait_timeout: u64,
    /// The session's connection id, which every later statement must share.
    first_id: u64,
    max_connections: u64,
}

impl MysqlBackend {
    /// Connect for `status`, `list`, `release --force` and `check`.
    pub(super) async fn admin(&self) -> Result<Session, Error> {
        self.connect(None).await
    }

    /// Holders, waiters and the last token of `name`.
    pub(super) async fn status_on(
        &self,
        session: &mut Session,
        name: &LockName,
    ) -> Result<LockStatus, Error> {
        let name_key = key(&self.prefix, name.as_str());
        let turnstile = turnstile_key(&self.prefix, name.as_str());
        let nk = quoted(&name_key);
        let sql = format!("{HOLDERS_SQL} AND r.name_key = {nk} ORDER BY r.lock_key");
        let mut seen: Vec<Seen> = match session.rows(&sql, super::OP_TIMEOUT).await {
            Ok(rows) => rows.iter().map(Seen::from_row).collect(),
            Err(f) if f.server_code() == Some(1146) => Vec::new(),
            Err(f) => return Err(f.into_error(&self.display)),
        };
        // Waiting sessions: in a user-lock wait, in a statement about this name.
        let facts = session
            .query(
                &format!(
                    "SELECT IS_USED_LOCK({nk}), IS_USED_LOCK({}), \
                     (SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE ID <> CONNECTION_ID() AND STATE LIKE '%user%lock%' \
                     AND LOCATE({nk}, INFO) > 0), \
                     (SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK({nk}))",
                    quoted(&turnstile)
                ),
                &self.display,
            )
            .await?;
        let row = facts.first();
        let plain: Option<u64> = row.and_then(|r| cell(r, 0));
        let head: Option<u64> = row.and_then(|r| cell(r, 1));
        let waiting: u64 = row.and_then(|r| cell(r, 2)).unwrap_or(0);
        // A holder of the plain key without a row of its own (SQL, or a row not written).
        if let Some(id) = plain.filter(|id| !seen.iter().any(|s| s.connection == *id)) {
            seen.insert(
                0,
                Seen {
                    connection: id,
                    token: 0,
                    holder: None,
                    client: row.and_then(|r| cell(r, 3)),
                },
            );
        }
        let last_token = match session
            .rows(
                &format!("SELECT token FROM dlock_locks WHERE lock_key = {nk}"),
                super::OP_TIMEOUT,
            )
            .await
        {
            Ok(rows) => rows.first().and_then(|r| cell::<u64>(r, 0)),
            Err(_) => None,
        };
        let holders: Vec<HolderStatus> = seen.iter().map(|s| s.status(name.as_str())).collect();
        Ok(LockStatus {
            name: name.as_str().to_owned(),
            held: !holders.is_empty(),
            holders,
            waiters: Some(waiting + u64::from(head.is_some())),
            queue: Vec::new(),
            last_token,
            waiting_here: Vec::new(),
            location: None,
        })
    }

    /// Every lock a dlock holds in this database under our prefix.
    pub(super) async fn list_locks(&self) -> Result<Vec<LockStatus>, Error> {
        let mut session = self.admin().await?;
        let rows = match session.rows(HOLDERS_SQL, super::OP_TIMEOUT).await {
            Ok(rows) => rows,
            Err(f) if f.server_code() == Some(1146) => Vec::new(),
            Err(f) => return Err(f.into_error(&self.display)),
        };
        let mut locks: Vec<LockStatus> = Vec::new();
        for row in &rows {
            let seen = Seen::from_row(row);
            let Some(name) = seen.holder.as_ref().map(|h| h.name.clone()) else {
                continue;
            };
            // Only names of our namespace: the row's name key must be the name's.
            if cell::<String>(row, 4).as_deref() != Some(key(&self.prefix, &name).as_str()) {
                continue;
            }
            let status = seen.status(&name);
            LockStatus::add_holder(&mut locks, name, status);
        }
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        // The waiters, as `status` counts them: the same column on every backend.
        for lock in &mut locks {
            if let Ok(name) = LockName::new(&lock.name) {
                if let Ok(status) = self.status_on(&mut session, &name).await {
                    lock.waiters = status.waiters;
                }
            }
        }
        Ok(locks)
    }

    /// `release --force`: end the holders' connections (`KILL`), which frees their locks.
    /// Another user's connection needs the CONNECTION ADMIN (MariaDB ≥ 10.5, MySQL 8) or
    /// SUPER privilege.
    pub(super) async fn release_by_force(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let mut session = self.admin().await?;
        let status = self.status_on(&mut session, name).await?;
        let mut removed = Vec::new();
        for holder in status.holders {
            let id = holder
                .session
                .as_deref()
                .and_then(|s| s.strip_prefix("connection id "))
                .and_then(|s| s.split(' ').next())
                .and_then(|s| s.parse::<u64>().ok());
            let Some(id) = id else { continue };
            match session.rows(&format!("KILL CONNECTION {id}"), super::OP_TIMEOUT).await {
                Ok(_) => removed.push(holder.holder),
                // Gone already (error 1094: unknown thread id).
                Err(f) if f.server_code() == Some(1094) => removed.push(holder.holder),
                Err(f) if matches!(f.server_code(), Some(1095 | 1227)) => {
                    return Err(Error::Permission(format!(
                        "not permitted to end the holder's connection (id {id}): {}; it needs the CONNECTION ADMIN privilege (MariaDB 10.5+, MySQL 8) or SUPER, or the holder's own user",
                        f.describe()
                    )))
                }
                Err(f) => return Err(f.into_error(&self.display)),
            }
        }
        Ok(removed)
    }

    /// `check`: reach the server, ask it about itself, time round trips, make sure the table
    /// can be written and a test lock shows up for our own session.
    pub(super) async fn check_server(&self) -> Result<CheckReport, Error> {
        let started = BootInstant::now();
        let mut session = self.admin().await?;
        let connect_time = BootInstant::now().saturating_since(started);
        let ServerFacts {
            version,
            user,
            database,
            read_only,
            wait_timeout,
            first_id,
            max_connections,
        } = self.server_facts(&mut session).await?;
        let database = self.lock_database(read_only, database)?;
        let median = median_round_trip(5, async || {
            session.query("SELECT 1", &self.display).await.map(drop)
        })
        .await?;
        self.probe(&mut session, first_id).await?;
        let tls = self.session_tls(&mut session).await?;
        let ssl_mode = self.target.ssl_mode.as_str();
        let mut warnings = Vec::new();
        if !self.target.is_local() && tls.is_none() {
            warnings.push(format!(
                "the connection is not encrypted (ssl-mode={ssl_mode})"
            ));
        }
        self.warn_of_missing_privileges(&mut session, &user, &mut warnings)
            .await;
        Ok(CheckReport {
            backend: "mysql".into(),
            location: self.display.clone(),
            version: version.clone(),
            round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
            warnings,
            details: vec![
                ("server version".into(), version),
                ("database".into(), database),
                ("user".into(), user),
                (
                    "wait_timeout (server default)".into(),
                    format!("{wait_timeout}s; dlock sets its session's to --ttl"),
                ),
                ("max_connections".into(), max_connections.to_string()),
                (
                    "tls".into(),
                    format!("{} (ssl-mode={ssl_mode})", tls.as_deref().unwrap_or("none")),
                ),
                (
                    "connect".into(),
                    humantime::format_duration(Duration::from_micros(
                        u64::try_from(connect_time.as_micros()).unwrap_or(u64::MAX),
                    ))
                    .to_string(),
                ),
                (
                    "lock table".into(),
                    "dlock_locks present and writable; a test lock taken and released".into(),
                ),
            ],
        })
    }

    /// What `check` asks the server about itself, in one statement.
    async fn server_facts(&self, session: &mut Session) -> Result<ServerFacts, Error> {
        let rows = session
            .query(
                "SELECT VERSION(), CURRENT_USER(), DATABASE(), @@global.read_only, \
                 @@global.wait_timeout, CONNECTION_ID(), @@global.max_connections",
                &self.display,
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::Internal("check: no row".into()))?;
        Ok(ServerFacts {
            version: cell(row, 0).unwrap_or_default(),
            user: cell(row, 1).unwrap_or_default(),
            database: cell(row, 2),
            read_only: cell::<i64>(row, 3).unwrap_or(0) != 0,
            wait_timeout: cell(row, 4).unwrap_or(0),
            first_id: cell(row, 5).unwrap_or(0),
            max_connections: cell(row, 6).unwrap_or(0),
        })
    }

    /// The database that holds dlock's table; a read-only server, or a URL that names no
    /// database, is refused.
    fn lock_database(&self, read_only: bool, database: Option<String>) -> Result<String, Error> {
        if read_only {
            return Err(Error::Config(format!(
                "{} is read-only (@@read_only = 1: a replica, or a server in read-only mode); locks must be taken on the primary",
                self.display
            )));
        }
        let Some(database) = database else {
            return Err(Error::Config(format!(
                "{}: no database selected; name the database for dlock's table in the URL (mysql://host/DATABASE)",
                self.display
            )));
        };
        Ok(database)
    }

    /// The TLS version the session uses (none for plaintext). What the session uses, not
    /// what was asked for: PREFERRED goes on in plaintext when the server offers no TLS.
    async fn session_tls(&self, session: &mut Session) -> Result<Option<String>, Error> {
        Ok(session
            .query("SHOW SESSION STATUS LIKE 'Ssl_version'", &self.display)
            .await?
            .first()
            .and_then(|row| cell::<String>(row, 1))
            .filter(|version| !version.is_empty()))
    }

    /// Warns of what `user` may not do: see other users' waiters (PROCESS), end other users'
    /// connections (CONNECTION ADMIN or SUPER).
    async fn warn_of_missing_privileges(
        &self,
        session: &mut Session,
        user: &str,
        warnings: &mut Vec<String>,
    ) {
        let process = self.has_privilege(session, "PROCESS").await;
        if !process {
            warnings.push(format!("{user} lacks the PROCESS privilege: 'dlock status' cannot count other users' waiters or show their client addresses"));
        }
        let kill = self.has_privilege(session, "CONNECTION ADMIN").await
            || self.has_privilege(session, "SUPER").await;
        if !kill {
            warnings.push(format!("{user} has neither CONNECTION ADMIN nor SUPER: 'dlock release --force' can end only its own user's connections"));
        }
    }

    /// Create the table if needed, prove we may write it (rolled back), and take a test lock
    /// that must show up for our own session in a second statement (no multiplexing proxy).
    async fn probe(&self, session: &mut Session, first_id: u64) -> Result<(), Error> {
        let probe = key(&self.prefix, &format!("!check {}", uuid::Uuid::new_v4()));
        let p = quoted(&probe);
        let write = format!(
            "{CREATE_TABLE}; START TRANSACTION; \
             INSERT INTO dlock_locks (lock_key, name_key) VALUES ({p}, {p}) \
             ON DUPLICATE KEY UPDATE token = token; ROLLBACK"
        );
        if let Err(f) = session.rows(&write, super::OP_TIMEOUT).await {
            return Err(self.refused(session, f).await);
        }
        let took = session
            .query(
                &format!("SELECT GET_LOCK({p}, 0), CONNECTION_ID()"),
                &self.display,
            )
            .await?;
        let seen = session
            .query(
                &format!("SELECT IS_USED_LOCK({p}) = CONNECTION_ID(), CONNECTION_ID(), RELEASE_LOCK({p})"),
                &self.display,
            )
            .await?;
        let took_it = took.first().and_then(|r| cell::<i64>(r, 0)) == Some(1);
        let ids = [
            first_id,
            took.first().and_then(|r| cell::<u64>(r, 1)).unwrap_or(0),
            seen.first().and_then(|r| cell::<u64>(r, 1)).unwrap_or(0),
        ];
        let mine = seen.first().and_then(|r| cell::<i64>(r, 0)) == Some(1);
        if !took_it || !mine || ids.iter().any(|id| *id != session.id) {
            return Err(Error::Config(format!(
                "the statements on {} do not all run on the connection dlock opened (connection ids {ids:?}, expected {}): a proxy that multiplexes sessions (ProxySQL?) is in between; connect to the server directly",
                self.display, session.id
            )));
        }
        Ok(())
    }

    /// Whether the current user holds the global privilege `privilege`.
    async fn has_privilege(&self, session: &mut Session, privilege: &str) -> bool {
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES WHERE PRIVILEGE_TYPE = '{privilege}' \
             AND GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')"
        );
        match session.rows(&sql, super::OP_TIMEOUT).await {
            Ok(rows) => rows.first().and_then(|r| cell::<u64>(r, 0)).unwrap_or(0) > 0,
            Err(_) => false,
        }
    }
}
