//! The PostgreSQL backend: a session advisory lock on a connection of dlock's own.
//!
//! Key: `key(prefix, name)` is the first 8 bytes, big-endian, of
//! `SHA-256("dlock\0v1\0" ‖ prefix ‖ "\0" ‖ name)` as a signed 64-bit integer: one bigint
//! advisory key, stable across versions (pinned by tests), so SQL can take the same lock (see
//! the README). With `--limit N` the slots are the keys of `name ‖ "\0slot\0" ‖ i` for
//! `1 ≤ i < N` (slot 0 is the plain key) and waiters queue on a turnstile key,
//! `name ‖ "\0queue"`.
//!
//! One connection per dlock process. Session settings travel in the start-up packet (no extra
//! round trip): no statement or idle-in-transaction timeouts, `lock_timeout` = `--wait`,
//! `idle_session_timeout` = `--ttl` (14+) so the server ends a session that went silent
//! behind a live connection, server-side TCP keepalives that notice a silent client only
//! after `--ttl`, and `client_connection_check_interval` so a killed waiter leaves the
//! queue. Acquiring is one
//! pipelined round trip after connecting: the lock call (the server's own FIFO lock queue),
//! which also marks the server session as ours (`dlock.owner`), and the statement that reads
//! the fencing token (`txid_current()`, which only grows and is on disk before the reply),
//! checks the mark and that the start-up settings arrived (a pooler could route the
//! statements to different server sessions, share one between clients, or drop the settings)
//! and labels the session in `pg_stat_activity`.
//!
//! A session lock has no lease: it lives as long as the session. The [`Keeper`] heartbeats
//! every TTL/3 (the lock must still show up for our backend; each heartbeat also restarts
//! the server's idle count, so its deadline arithmetic applies as for a lease), and the end
//! of the connection is noticed at once; either ends the hold (design §4).

pub mod target;
mod tls;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::poll_fn;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use target::{PgHost, PgTarget, SslMode};

use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError, Schedule};
use crate::lock::MAX_LIMIT;
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, HolderStatus, Lease, LockName,
    LockStatus, Lost, Wait,
};

/// Bound for connecting (TCP, TLS, authentication) when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound for one statement outside the keeper.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound for a cancel request and for the cancelled statement to answer.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest `application_name` the server keeps (NAMEDATALEN − 1).
const MAX_APPLICATION_NAME: usize = 63;

/// The advisory-lock key of `name` in the namespace `prefix`. Never change this function:
/// holders running different dlock versions must compute the same key.
pub fn key(prefix: &str, name: &str) -> i64 {
    key_with(prefix, name, b"")
}

fn key_with(prefix: &str, name: &str, suffix: &[u8]) -> i64 {
    let mut hash = Sha256::new();
    hash.update(b"dlock\0v1\0");
    hash.update(prefix.as_bytes());
    hash.update(b"\0");
    hash.update(name.as_bytes());
    hash.update(suffix);
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Slot `i` of a `--limit N` lock (slot 0 is the plain key).
fn slot_key(prefix: &str, name: &str, slot: u32) -> i64 {
    if slot == 0 {
        key(prefix, name)
    } else {
        key_with(prefix, name, format!("\0slot\0{slot}").as_bytes())
    }
}

/// The key `--limit N > 1` waiters queue on.
fn turnstile_key(prefix: &str, name: &str) -> i64 {
    key_with(prefix, name, b"\0queue")
}

/// The key a holder of `name` with `--limit limit` holds in shared mode, so that others can
/// see which `--limit` the holders use: the key of `name ‖ "\0limit"` with its low 11 bits
/// replaced by the limit (at most [`MAX_LIMIT`] < 2048), so SQL can read the limit back.
fn limit_key(prefix: &str, name: &str, limit: u32) -> i64 {
    (key_with(prefix, name, b"\0limit") & !LIMIT_MASK) | i64::from(limit) & LIMIT_MASK
}

/// The low bits of a [`limit_key`] that hold the limit.
const LIMIT_MASK: i64 = 2047;

/// A scalar subquery: the smallest `--limit` other than `limit` that another session holding
/// `name` (a granted exclusive key other than the turnstile: one dlock session takes one
/// lock) records with its [`limit_key`], or NULL.
fn other_limit_sql(prefix: &str, name: &str, limit: u32) -> String {
    let base = limit_key(prefix, name, 0) as u64;
    let high = base >> 32;
    let low = base & 0xffff_ffff;
    let turnstile = turnstile_key(prefix, name);
    format!(
        "(SELECT min(m.objid::int8 & {LIMIT_MASK})::int4 FROM pg_locks m \
         WHERE m.locktype = 'advisory' AND m.objsubid = 1 AND m.granted AND m.mode = 'ShareLock' \
         AND m.pid <> pg_backend_pid() \
         AND m.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND m.classid = {high}::oid AND (m.objid::int8 & {}) = {low} \
         AND (m.objid::int8 & {LIMIT_MASK}) <> {limit} \
         AND EXISTS (SELECT 1 FROM pg_locks s WHERE s.pid = m.pid AND s.locktype = 'advisory' \
         AND s.objsubid = 1 AND s.granted AND s.mode = 'ExclusiveLock' \
         AND ((s.classid::int8 << 32) | s.objid::int8) <> {turnstile}))",
        0xffff_ffff_i64 & !LIMIT_MASK
    )
}

/// The usage error for a lock held with another `--limit`.
fn limit_mismatch(name: &LockName, theirs: i32) -> Error {
    Error::Usage(format!(
        "lock '{name}' is held with --limit {theirs}; all holders must use the same --limit"
    ))
}

/// The NOTIFY channel a released slot wakes (`dlock_` and the slot-0 key in hex).
fn channel(prefix: &str, name: &str) -> String {
    format!("dlock_{:016x}", key(prefix, name))
}

pub struct PgBackend {
    target: PgTarget,
    prefix: String,
    display: String,
}

impl PgBackend {
    pub fn new(target: &PgTarget, prefix: &str, display: &str) -> PgBackend {
        PgBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
            display: display.to_owned(),
        }
    }

    /// Connect with dlock's session settings; `lock_timeout` bounds lock waits, and a `--wait`
    /// deadline bounds connecting.
    async fn connect(
        &self,
        label: &str,
        ttl: Duration,
        lock_timeout: Option<Duration>,
        deadline: Option<Deadline>,
    ) -> Result<Session, Error> {
        let tls = tls::connector(&self.target)?;
        let mut features = Features::ALL;
        // At most one retry per feature the server may not know.
        for _ in 0..3 {
            match self
                .connect_with(&tls, label, ttl, lock_timeout, features, deadline)
                .await
            {
                Err(e) => match features.without(&e.to_string()) {
                    Some(fewer) => features = fewer,
                    None => return Err(e),
                },
                Ok(session) => {
                    if !features.idle_timeout {
                        tracing::warn!(
                            "{} ({}) has no idle_session_timeout (PostgreSQL 14+): a holder that goes silent behind a live connection (a stopped dlock, a proxy or NAT keeping the connection open) keeps the lock until TCP keepalives notice",
                            self.display,
                            if session.version.is_empty() { "version unknown" } else { &session.version }
                        );
                    }
                    return Ok(session);
                }
            }
        }
        Err(Error::Internal(
            "connecting: the server refused every set of session settings".into(),
        ))
    }

    async fn connect_with(
        &self,
        tls: &MakeRustlsConnect,
        label: &str,
        ttl: Duration,
        lock_timeout: Option<Duration>,
        features: Features,
        deadline: Option<Deadline>,
    ) -> Result<Session, Error> {
        let target = &self.target;
        let mut config = Config::new();
        for host in &target.hosts {
            match host {
                PgHost::Tcp { host, port } => config.host(host).port(*port),
                PgHost::Unix { dir, port } => config.host_path(dir).port(*port),
            };
        }
        config.user(target.user()).dbname(target.dbname());
        if let Some(password) = &target.password {
            config.password(password.expose());
        }
        let app = match &target.application_name {
            Some(name) => format!("{name} {label}"),
            None => label.to_owned(),
        };
        config.application_name(truncate(&app, MAX_APPLICATION_NAME));
        let mut options = session_options(ttl, lock_timeout, features);
        if let Some(theirs) = &target.options {
            options = format!("{theirs} {options}");
        }
        config.options(&options);
        let only_sockets = target
            .hosts
            .iter()
            .all(|h| matches!(h, PgHost::Unix { .. }));
        if target.hosts.len() > 1 {
            // After a failover the first host may be the new standby: go on to the primary.
            config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        }
        // libpq ignores sslmode on Unix sockets (there is no TLS over them).
        config.ssl_mode(match target.sslmode {
            _ if only_sockets => tokio_postgres::config::SslMode::Disable,
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Allow | SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
        let timeout = target.connect_timeout.unwrap_or(CONNECT_TIMEOUT);
        // Linux refuses keepalive times above 32767 s (TCP_KEEPIDLE).
        config
            .connect_timeout(timeout)
            .keepalives(true)
            .keepalives_idle((ttl / 6).clamp(Duration::from_secs(1), MAX_KEEPALIVE))
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3)
            .tcp_user_timeout((ttl / 3).clamp(Duration::from_secs(1), MAX_USER_TIMEOUT));
        let hosts = u32::try_from(target.hosts.len()).unwrap_or(1).max(1);
        let mut budget = timeout.saturating_mul(hosts);
        // The whole acquisition ends by the --wait deadline, connecting included.
        let wait = deadline.filter(|d| d.at.remaining() < budget);
        if let Some(d) = wait {
            budget = d.at.remaining();
        }
        let (client, mut connection) =
            match tokio::time::timeout(budget, config.connect(tls.clone())).await {
                Err(_) => {
                    return Err(Error::Unavailable(match wait {
                        Some(d) => format!(
                            "no answer from {} within --wait {}",
                            self.display,
                            humantime::format_duration(d.wait)
                        ),
                        None => format!(
                            "cannot reach {}: no answer within {}",
                            self.display,
                            humantime::format_duration(budget)
                        ),
                    }))
                }
                Ok(Err(e)) => return Err(classify(&e, &self.display)),
                Ok(Ok(pair)) => pair,
            };
        let version = connection
            .parameter("server_version")
            .map(str::to_owned)
            .unwrap_or_default();
        let (end_tx, ended) = watch::channel(None);
        let (note_tx, notes) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(note))) => {
                        let _ = note_tx.send(note.channel().to_owned());
                    }
                    Some(Ok(AsyncMessage::Notice(notice))) => {
                        tracing::debug!("server notice: {}", notice.message());
                    }
                    Some(Ok(_)) => {}
                    None => {
                        // Not proof that the server ended the session: assume it may still
                        // hold the lock until it notices.
                        end_tx.send_replace(Some(End {
                            reason: "the connection was closed".into(),
                            server_ended: false,
                        }));
                        return;
                    }
                    Some(Err(e)) => {
                        end_tx.send_replace(Some(End {
                            reason: describe(&e),
                            server_ended: e.as_db_error().is_some(),
                        }));
                        return;
                    }
                }
            }
        });
        let cancel = client.cancel_token();
        Ok(Session {
            marker: uuid::Uuid::new_v4().simple().to_string(),
            client: Arc::new(client),
            ended,
            notes,
            cancel,
            tls: tls.clone(),
            version,
            idle_timeout: features.idle_timeout,
        })
    }

    fn holder_label(&self, holder: &Holder) -> (String, String) {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        (
            format!("dlock {} {since} t", holder.pid),
            format!(" {}", holder.host),
        )
    }

    /// `--limit 1`: the server's lock queue. Returns the token and when its request was sent.
    async fn acquire_single(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        key: i64,
        deadline: Option<Deadline>,
        cancel: &mut Cancel,
    ) -> Result<Granted, Error> {
        let client = session.client.clone();
        let try_only = request.wait == Wait::No;
        let name = request.name.as_str();
        let other = other_limit_sql(&self.prefix, name, request.limit);
        // One statement claims the session and takes the lock, so both happen on the same
        // server session; the waiter's metadata rides along, so `status` can list the queue.
        // First (the subquery) it records our --limit and looks for holders with another one,
        // and only then, if there are none, sets what is left of --wait as the server's lock
        // wait limit and takes (or queues for) the lock.
        let lock_sql = format!(
            "{} SELECT {}, o.other, {}, CASE WHEN o.other IS NULL THEN {} END \
             FROM (SELECT {other} AS other, pg_advisory_lock_shared({})::text AS mark OFFSET 0) o",
            metadata_comment(&request.holder),
            claim_sql("$2"),
            Deadline::lock_timeout_sql(deadline),
            if try_only {
                "pg_try_advisory_lock($1)"
            } else {
                "pg_advisory_lock($1)::text"
            },
            limit_key(&self.prefix, name, request.limit),
        );
        let (label, host) = self.holder_label(&request.holder);
        let token_sql = token_sql(&request.holder, &other);
        let lock_params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&key, Type::INT8), (&session.marker, Type::TEXT)];
        let token_params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&label, Type::TEXT),
            (&host, Type::TEXT),
            (&session.marker, Type::TEXT),
        ];
        let sent = BootInstant::now();
        let lock = client.query_typed(&lock_sql, &lock_params);
        let token = client.query_typed(&token_sql, &token_params);
        // Both requests go out at once, in the order `join` first polls them: the lock call,
        // then the token statement, which the server runs as soon as the lock is granted.
        let work = async { tokio::join!(lock, token) };
        tokio::pin!(work);
        let backstop = async {
            match deadline {
                Some(d) => sleep_until(d.at + Duration::from_secs(1)).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(backstop);
        let mut ended = session.ended.clone();
        // Biased, work first: its first poll puts the requests on the wire, so a cancel that
        // is already set finds something to cancel on the server.
        let (lock, token) = tokio::select! {
            biased;
            done = &mut work => done,
            () = cancel.cancelled() => {
                return Err(self.abandon(session, work.as_mut(), key, Error::Cancelled).await);
            }
            () = &mut backstop => {
                let busy = Error::Busy(format!("{} is held; waited {}", request.name, wait_text(request.wait)));
                return Err(self.abandon(session, work.as_mut(), key, busy).await);
            }
            _ = ended.wait_for(Option::is_some) => {
                return Err(Error::Unavailable(format!("lost the connection to {} while waiting: {}", self.display, session.end_reason())));
            }
        };
        let rows = match lock {
            Ok(rows) => rows,
            Err(e) => return Err(self.busy_or(&e, request, session).await),
        };
        let row = rows.first();
        let theirs: Option<i32> = row.and_then(|r| r.try_get(2).ok()).flatten();
        // pg_advisory_lock returns void (as '' here): an answer is a grant.
        let granted = theirs.is_none()
            && if try_only {
                row.and_then(|r| r.try_get::<_, Option<bool>>(4).ok())
                    .flatten()
                    .unwrap_or(false)
            } else {
                row.and_then(|r| r.try_get::<_, Option<String>>(4).ok())
                    .flatten()
                    .is_some()
            };
        self.check_claim(&rows, &client, granted.then_some(key), &session.marker)
            .await?;
        if let Some(theirs) = theirs {
            return Err(limit_mismatch(&request.name, theirs));
        }
        if !granted {
            let who = self.describe_holders(session, &request.name).await;
            return Err(Error::Busy(format!("{} is held{who}", request.name)));
        }
        let token = self
            .check_token(token, &client, key, &session.marker, &request.name)
            .await?;
        Ok(Granted { token, sent })
    }

    /// `--limit N > 1`: queue on the turnstile, then take the first free slot; a released slot
    /// wakes the head of the queue by NOTIFY.
    async fn acquire_slot(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        deadline: Option<Deadline>,
        cancel: &mut Cancel,
    ) -> Result<(Granted, i64), Error> {
        let client = session.client.clone();
        let name = request.name.as_str();
        let slots: Vec<i64> = (0..request.limit)
            .map(|i| slot_key(&self.prefix, name, i))
            .collect();
        let other = other_limit_sql(&self.prefix, name, request.limit);
        let mark = format!(
            "pg_advisory_lock_shared({})::text AS mark",
            limit_key(&self.prefix, name, request.limit)
        );
        // Our --limit is recorded (`mark`) before we can take a slot: by the turnstile
        // statement when we queue, else here.
        let try_sql = format!(
            "{} SELECT {}, o.other, CASE WHEN o.other IS NULL THEN {} END \
             FROM (SELECT {other} AS other{} OFFSET 0) o",
            metadata_comment(&request.holder),
            claim_sql("$1"),
            try_slots_sql(&slots),
            if request.wait == Wait::No {
                format!(", {mark}")
            } else {
                String::new()
            },
        );
        if request.wait != Wait::No {
            let turnstile = turnstile_key(&self.prefix, name);
            let listen = format!("LISTEN {}", channel(&self.prefix, name));
            within(deadline, client.batch_execute(&listen))
                .await
                .map_err(|()| self.no_answer(deadline, "LISTEN"))?
                .map_err(|e| classify(&e, &self.display))?;
            let params: [(&(dyn ToSql + Sync), Type); 1] = [(&turnstile, Type::INT8)];
            let lock_sql = format!(
                "{} SELECT o.other, {}, CASE WHEN o.other IS NULL THEN pg_advisory_lock($1)::text END \
                 FROM (SELECT {other} AS other, {mark} OFFSET 0) o",
                metadata_comment(&request.holder),
                Deadline::lock_timeout_sql(deadline),
            );
            let lock = client.query_typed(&lock_sql, &params);
            tokio::pin!(lock);
            let backstop = async {
                match deadline {
                    Some(d) => sleep_until(d.at + Duration::from_secs(1)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(backstop);
            let mut ended = session.ended.clone();
            tokio::select! {
                biased;
                done = &mut lock => {
                    match done {
                        Err(e) => return Err(self.busy_or(&e, request, session).await),
                        Ok(rows) => {
                            if let Some(theirs) = rows.first().and_then(|r| r.try_get::<_, Option<i32>>(0).ok()).flatten() {
                                return Err(limit_mismatch(&request.name, theirs));
                            }
                        }
                    }
                }
                () = cancel.cancelled() => {
                    return Err(self.abandon(session, lock.as_mut(), turnstile, Error::Cancelled).await);
                }
                () = &mut backstop => {
                    let busy = Error::Busy(format!("{} is held by {} holders; waited {}", request.name, request.limit, wait_text(request.wait)));
                    return Err(self.abandon(session, lock.as_mut(), turnstile, busy).await);
                }
                _ = ended.wait_for(Option::is_some) => {
                    return Err(Error::Unavailable(format!("lost the connection to {} while waiting: {}", self.display, session.end_reason())));
                }
            }
        }
        let recheck = (request.ttl / 3).min(Duration::from_secs(1));
        for _ in 0..u32::MAX {
            let sent = BootInstant::now();
            let rows = within(
                deadline,
                client.query_typed(&try_sql, &[(&session.marker, Type::TEXT)]),
            )
            .await
            .map_err(|()| self.no_answer(deadline, "taking a slot"))?
            .map_err(|e| classify(&e, &self.display))?;
            let row = rows.first();
            let theirs: Option<i32> = row.and_then(|r| r.try_get(2).ok()).flatten();
            let slot = row
                .and_then(|r| r.try_get::<_, Option<i32>>(3).ok())
                .flatten()
                .and_then(|s| usize::try_from(s).ok());
            let won = slot.and_then(|s| slots.get(s).copied());
            self.check_claim(&rows, &client, won, &session.marker)
                .await?;
            if let Some(theirs) = theirs {
                return Err(limit_mismatch(&request.name, theirs));
            }
            if let Some(key) = won {
                let (label, host) = self.holder_label(&request.holder);
                let token_sql = token_sql(&request.holder, &other);
                let token_params: [(&(dyn ToSql + Sync), Type); 3] = [
                    (&label, Type::TEXT),
                    (&host, Type::TEXT),
                    (&session.marker, Type::TEXT),
                ];
                // Leave the queue and read the token in one round trip; the token statement
                // goes last so its metadata comment is what pg_stat_activity shows.
                let leave = async {
                    if request.wait == Wait::No {
                        return Ok(());
                    }
                    let turnstile = turnstile_key(&self.prefix, name);
                    client
                        .batch_execute(&format!(
                            "SELECT pg_advisory_unlock({turnstile}); UNLISTEN *"
                        ))
                        .await
                };
                let both =
                    async { tokio::join!(leave, client.query_typed(&token_sql, &token_params)) };
                let (left, token) = within(deadline, both)
                    .await
                    .map_err(|()| self.no_answer(deadline, "reading the token"))?;
                left.map_err(|e| classify(&e, &self.display))?;
                let token = self
                    .check_token(token, &client, key, &session.marker, &request.name)
                    .await?;
                return Ok((Granted { token, sent }, key));
            }
            if request.wait == Wait::No {
                let who = self.describe_holders(session, &request.name).await;
                return Err(Error::Busy(format!(
                    "{} is held by {} holders{who}",
                    request.name, request.limit
                )));
            }
            let mut ended = session.ended.clone();
            let next_check = BootInstant::now() + recheck;
            let wake = match deadline {
                Some(d) if d.at < next_check => d.at,
                _ => next_check,
            };
            tokio::select! {
                _ = session.notes.recv() => {}
                () = sleep_until(wake) => {
                    if deadline.is_some_and(|d| BootInstant::now() >= d.at) {
                        let turnstile = turnstile_key(&self.prefix, name);
                        let _ = tokio::time::timeout(CANCEL_TIMEOUT, client.query_typed("SELECT pg_advisory_unlock($1)", &[(&turnstile, Type::INT8)])).await;
                        return Err(Error::Busy(format!("{} is held by {} holders; waited {}", request.name, request.limit, wait_text(request.wait))));
                    }
                }
                () = cancel.cancelled() => {
                    let turnstile = turnstile_key(&self.prefix, name);
                    let _ = tokio::time::timeout(CANCEL_TIMEOUT, client.query_typed("SELECT pg_advisory_unlock($1)", &[(&turnstile, Type::INT8)])).await;
                    return Err(Error::Cancelled);
                }
                _ = ended.wait_for(Option::is_some) => {
                    return Err(Error::Unavailable(format!("lost the connection to {} while waiting: {}", self.display, session.end_reason())));
                }
            }
        }
        Err(Error::Internal("slot wait loop ended".into()))
    }

    /// A statement did not answer by the `--wait` deadline (and a second more).
    fn no_answer(&self, deadline: Option<Deadline>, what: &str) -> Error {
        let wait = deadline.map_or(Duration::ZERO, |d| d.wait);
        Error::Unavailable(format!(
            "no answer from {} ({what}) within --wait {}",
            self.display,
            humantime::format_duration(wait)
        ))
    }

    /// Read the token statement's answer: a standby or a pooler is refused.
    async fn check_token(
        &self,
        token: Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
        client: &Client,
        key: i64,
        marker: &str,
        name: &LockName,
    ) -> Result<u64, Error> {
        let rows = match token {
            Ok(rows) => rows,
            Err(e) => {
                // Granted but unusable (e.g. the role may not write the token's WAL record).
                give_back(client, key, marker).await;
                return Err(classify(&e, &self.display));
            }
        };
        let row = rows
            .first()
            .ok_or_else(|| Error::Internal("the token statement returned no row".into()))?;
        let standby: bool = row.try_get(0).unwrap_or(false);
        let mine: bool = row.try_get(2).unwrap_or(false);
        let settings_arrived: bool = row.try_get(3).unwrap_or(false);
        let refuse = |message: String| async move {
            give_back(client, key, marker).await;
            Err(Error::Config(message))
        };
        if standby {
            return refuse(format!(
                "{} is a hot standby (pg_is_in_recovery() is true); locks must be taken on the primary",
                self.display
            ))
            .await;
        }
        if !settings_arrived {
            return refuse(format!(
                "dlock's session settings (keepalives, timeouts) did not reach the server behind {}: a connection pooler that drops start-up options (pgbouncer ignore_startup_parameters = options?); use a direct connection",
                self.display
            ))
            .await;
        }
        if !mine {
            return refuse(format!(
                "the lock taken on {} does not show up for our own session: the connection goes through a transaction-pooling proxy (pgbouncer pool_mode=transaction?); use a direct or session-pooled connection",
                self.display
            ))
            .await;
        }
        // Read after our own --limit was recorded and the lock granted: of two holders that
        // disagree, at least one sees the other.
        if let Some(theirs) = row.try_get::<_, Option<i32>>(6).ok().flatten() {
            give_back(client, key, marker).await;
            return Err(limit_mismatch(name, theirs));
        }
        let token: Option<i64> = row.try_get(1).unwrap_or(None);
        token
            .and_then(|t| u64::try_from(t).ok())
            .ok_or_else(|| Error::Internal("the server gave no transaction id".into()))
    }

    /// Read the claim's answer (the first column of the lock statement): a server session
    /// another dlock marked is shared with it.
    async fn check_claim(
        &self,
        rows: &[tokio_postgres::Row],
        client: &Client,
        taken: Option<i64>,
        marker: &str,
    ) -> Result<(), Error> {
        let previous: String = rows
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or_default();
        if previous.is_empty() || previous == marker {
            return Ok(());
        }
        // Taken on a shared session, the lock only had its count raised: one unlock undoes it.
        if let Some(key) = taken {
            give_back(client, key, marker).await;
        }
        Err(Error::Config(format!(
            "the server session behind {} is shared with another dlock client: the connection goes through a transaction-pooling proxy (pgbouncer pool_mode=transaction?); use a direct or session-pooled connection",
            self.display
        )))
    }

    /// A lock statement failed: 55P03 is the `--wait` deadline (lock_timeout); the rest is
    /// classified.
    async fn busy_or(
        &self,
        e: &tokio_postgres::Error,
        request: &AcquireRequest,
        session: &Session,
    ) -> Error {
        match e.code().map(|c| c.code()) {
            Some("55P03") => {
                let who = self.describe_holders(session, &request.name).await;
                Error::Busy(format!(
                    "{} is held{who}; waited {}",
                    request.name,
                    wait_text(request.wait)
                ))
            }
            _ => classify(e, &self.display),
        }
    }

    /// Give up a waiting lock call: cancel it on the server and wait for the answer, so no lock
    /// request stays queued; a grant that won the race is given back.
    async fn abandon<F>(
        &self,
        session: &Session,
        lock: std::pin::Pin<&mut F>,
        key: i64,
        outcome: Error,
    ) -> Error
    where
        F: Future,
    {
        let cancelled = tokio::time::timeout(
            CANCEL_TIMEOUT,
            session.cancel.cancel_query(session.tls.clone()),
        )
        .await;
        if !matches!(cancelled, Ok(Ok(()))) {
            tracing::warn!("could not cancel the waiting lock request; closing the connection instead (a server ≥ 14 drops the request within a second)");
            return outcome;
        }
        if tokio::time::timeout(CANCEL_TIMEOUT, lock).await.is_err() {
            tracing::warn!("the cancelled lock request did not answer; closing the connection");
            return outcome;
        }
        // Granted before the cancel arrived (or cancelled): unlocking is harmless either way.
        let _ = tokio::time::timeout(
            CANCEL_TIMEOUT,
            session
                .client
                .query_typed("SELECT pg_advisory_unlock($1)", &[(&key, Type::INT8)]),
        )
        .await;
        outcome
    }

    /// Connect for `status`, `list`, `release --force` and `check`.
    async fn admin(&self) -> Result<Session, Error> {
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

    async fn status_with(&self, session: &Session, name: &LockName) -> Result<LockStatus, Error> {
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
        })
    }

    async fn describe_holders(&self, session: &Session, name: &LockName) -> String {
        match self.status_with(session, name).await {
            Ok(status) => status.held_by(),
            Err(_) => String::new(),
        }
    }
}

/// `work`, ended a second after the `--wait` deadline if it has not answered by then.
async fn within<F: Future>(deadline: Option<Deadline>, work: F) -> Result<F::Output, ()> {
    match deadline {
        Some(d) => {
            let limit = (d.at + Duration::from_secs(1)).remaining();
            tokio::time::timeout(limit, work).await.map_err(|_| ())
        }
        None => Ok(work.await),
    }
}

/// Undo what an acquisition did on a session it must not keep: one unlock (a lock taken
/// again on a shared session only raised its count) and our mark, if it is ours.
async fn give_back(client: &Client, key: i64, marker: &str) {
    let _ = tokio::time::timeout(
        CANCEL_TIMEOUT,
        client.query_typed(
            "SELECT pg_advisory_unlock($1), CASE WHEN current_setting('dlock.owner', true) = $2 \
             THEN set_config('dlock.owner', '', false) END",
            &[(&key, Type::INT8), (&marker, Type::TEXT)],
        ),
    )
    .await;
}

/// `-c name=value` start-up options: no timeouts that could end a live hold, `--wait` as the
/// server's own lock wait limit, `idle_session_timeout` = `ttl` so the server ends a session
/// (and frees its lock) that sent nothing for the TTL (the keeper heartbeats every TTL/3; the
/// session is idle between statements), and keepalives that give a silent client at least
/// `ttl` before its session is dropped.
fn session_options(ttl: Duration, lock_timeout: Option<Duration>, features: Features) -> String {
    let (idle, interval, count) = keepalives(ttl);
    // Beyond the server's range (~24.8 days) the client-side backstop ends the wait instead.
    let lock_ms = match lock_timeout {
        Some(d) if d.as_millis() <= i32::MAX as u128 => d.as_millis().max(1),
        _ => 0,
    };
    let mut options = format!(
        "-c dlock.session=on -c statement_timeout=0 -c idle_in_transaction_session_timeout=0 -c lock_timeout={lock_ms} \
         -c synchronous_commit=on \
         -c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval} -c tcp_keepalives_count={count} \
         -c tcp_user_timeout={}",
        server_millis(ttl)
    );
    if features.idle_timeout {
        options.push_str(&format!(" -c idle_session_timeout={}", server_millis(ttl)));
    }
    if features.check_interval {
        options.push_str(" -c client_connection_check_interval=1000");
    }
    options
}

/// `ttl` in milliseconds, at least a second and at most what a server setting holds (i32).
fn server_millis(ttl: Duration) -> u128 {
    ttl.as_millis().clamp(1000, i32::MAX as u128)
}

/// Linux's limits for TCP_KEEPIDLE and TCP_KEEPINTVL (seconds) and TCP_KEEPCNT.
const MAX_KEEPALIVE: Duration = Duration::from_secs(32767);
const MAX_KEEPALIVE_COUNT: u64 = 127;
/// TCP_USER_TIMEOUT is milliseconds in an int.
const MAX_USER_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// Server-side keepalives `(idle, interval, count)` in seconds that notice a silent client no
/// sooner than `ttl`: `idle + interval·(count − 1) ≥ ttl`, each within Linux's limits (a value
/// out of range is only logged by the server, which then keeps the OS default of ~2 hours).
fn keepalives(ttl: Duration) -> (u64, u64, u64) {
    let max = MAX_KEEPALIVE.as_secs();
    let ttl_s = ttl.as_secs().max(2);
    let idle = ttl_s.div_ceil(2).min(max);
    let rest = ttl_s - idle;
    let interval = rest.div_ceil(MAX_KEEPALIVE_COUNT - 1).clamp(1, max);
    let count = (rest.div_ceil(interval) + 1).min(MAX_KEEPALIVE_COUNT);
    (idle, interval, count)
}

/// Session settings a server may not know, dropped one at a time when it refuses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Features {
    /// `idle_session_timeout` (PostgreSQL 14+).
    idle_timeout: bool,
    /// `client_connection_check_interval` (PostgreSQL 14+, and only where the platform can
    /// watch client sockets).
    check_interval: bool,
}

impl Features {
    const ALL: Features = Features {
        idle_timeout: true,
        check_interval: true,
    };

    /// The settings to try after the server refused the connection with `error`, if one of
    /// ours is to blame.
    fn without(self, error: &str) -> Option<Features> {
        if error.contains("unrecognized configuration parameter") {
            // Older than 14: neither exists.
            let fewer = Features {
                idle_timeout: false,
                check_interval: false,
            };
            return (fewer != self).then_some(fewer);
        }
        if self.check_interval && error.contains("client_connection_check_interval") {
            return Some(Features {
                check_interval: false,
                ..self
            });
        }
        if self.idle_timeout && error.contains("idle_session_timeout") {
            return Some(Features {
                idle_timeout: false,
                ..self
            });
        }
        None
    }
}

/// When a `--wait` ends, and how long it was (for messages).
#[derive(Clone, Copy, Debug)]
struct Deadline {
    at: BootInstant,
    wait: Duration,
}

impl Deadline {
    fn of(wait: Wait, from: BootInstant) -> Option<Deadline> {
        match wait {
            Wait::For(d) => Some(Deadline {
                at: from + d,
                wait: d,
            }),
            _ => None,
        }
    }

    /// `set_config` of `lock_timeout` to what is left (at least 1 ms: 0 would mean none).
    fn lock_timeout_sql(deadline: Option<Deadline>) -> String {
        match deadline {
            Some(d) => format!(
                "set_config('lock_timeout', '{}', false)",
                d.at.remaining().as_millis().clamp(1, i32::MAX as u128)
            ),
            None => "NULL::text".into(),
        }
    }
}

/// The statement run right after a grant: standby?, fencing token, is it still our session
/// (the mark set by the lock statement: statements that a pooler spreads over several server
/// sessions do not all see it), the session's label (`application_name`), and `other_limit`
/// (a holder that records another `--limit`; see [`other_limit_sql`]). The holder's
/// metadata rides along as a comment, first, so `status` can read it from
/// `pg_stat_activity.query` where the role may see it (the server keeps only the first
/// `track_activity_query_size` bytes, 1024 by default).
///
/// The token is the transaction's XID, and it must survive a crash: PostgreSQL flushes a
/// commit at once only when the transaction wrote WAL, and an XID whose commit never reached
/// the disk is handed out again after a crash. A (transactional, empty) logical message is
/// the cheapest WAL record any role may write, so with `synchronous_commit=on` the reply
/// comes only after the XID is on disk.
fn token_sql(holder: &Holder, other_limit: &str) -> String {
    format!(
        "{} SELECT pg_is_in_recovery(), \
         CASE WHEN pg_is_in_recovery() THEN NULL ELSE txid_current() END, \
         coalesce(current_setting('dlock.owner', true), '') = $3, \
         coalesce(current_setting('dlock.session', true), '') = 'on', \
         set_config('application_name', \
         left($1 || coalesce(txid_current_if_assigned()::text, '0') || $2, {MAX_APPLICATION_NAME}), false), \
         CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_logical_emit_message(true, 'dlock', '') END, \
         {other_limit}",
        metadata_comment(holder)
    )
}

/// Select-list items that mark the server session as ours (`dlock.owner`, a custom session
/// setting, set to the parameter `marker`) unless another client marked it first, and return
/// the previous mark. A direct connection always starts unmarked. Through a
/// transaction-pooling proxy, a server session still marked by another dlock is shared with
/// it: refused, so the lock is never taken twice on one session.
fn claim_sql(marker: &str) -> String {
    format!(
        "coalesce(current_setting('dlock.owner', true), ''), \
         CASE WHEN coalesce(current_setting('dlock.owner', true), '') = '' \
         THEN set_config('dlock.owner', {marker}, false) END"
    )
}

/// The heartbeat: does our session still hold the key, and is it still our session?
fn heartbeat_sql(holder: &Holder) -> String {
    format!(
        "{} SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
         AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
         AND classid = (($1 >> 32) & 4294967295)::oid AND objid = ($1 & 4294967295)::oid) \
         AND coalesce(current_setting('dlock.owner', true), '') = $2",
        metadata_comment(holder)
    )
}

/// `/*dlock {json}*/`, with every `*` written as `\u002a` (valid JSON; `*` only occurs in
/// strings) so the text can neither end the comment nor open a nested one.
fn metadata_comment(holder: &Holder) -> String {
    let json = serde_json::to_string(holder).unwrap_or_default();
    format!("/*dlock {}*/", json.replace('*', "\\u002a"))
}

/// An expression that takes the first free slot, in slot order (`CASE` evaluates its
/// conditions in order and stops at the first true one), and returns its index or NULL.
fn try_slots_sql(slots: &[i64]) -> String {
    let mut sql = String::from("CASE");
    for (i, slot) in slots.iter().enumerate() {
        sql.push_str(&format!(" WHEN pg_try_advisory_lock({slot}) THEN {i}"));
    }
    sql.push_str(" END::int4");
    sql
}

const STATUS_SQL: &str = "SELECT l.pid, l.granted, \
     ((l.classid::int8 << 32) | l.objid::int8) AS key, \
     a.application_name, a.query, host(a.client_addr), a.client_port, \
     extract(epoch FROM a.backend_start)::int8 \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND ((l.classid::int8 << 32) | l.objid::int8) = ANY($1) \
     ORDER BY l.granted DESC, a.query_start NULLS LAST, l.pid";

/// Every dlock-labelled advisory lock holder in the database.
const LIST_SQL: &str = "SELECT l.pid, l.granted, \
     ((l.classid::int8 << 32) | l.objid::int8) AS key, \
     a.application_name, a.query, host(a.client_addr), a.client_port, \
     extract(epoch FROM a.backend_start)::int8 \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock' \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     ORDER BY key, a.query_start NULLS LAST, l.pid";

/// A row of [`STATUS_SQL`] / [`LIST_SQL`].
struct Seen {
    backend_pid: i32,
    granted: bool,
    key: i64,
    application_name: String,
    /// The holder's metadata from its last statement, where our role may read it.
    metadata: Option<Holder>,
    client: Option<String>,
}

impl Seen {
    fn from_row(row: &tokio_postgres::Row) -> Seen {
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
        }
    }

    /// The holder as far as we can see it: the metadata comment where visible, completed and
    /// corrected from the `application_name` label (`dlock <pid> <since> t<token> <host>`).
    fn status(&self, name: &LockName) -> HolderStatus {
        let mut holder = self.metadata.clone().unwrap_or_default();
        if holder.name.is_empty() {
            holder.name = name.as_str().to_owned();
        }
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
                if holder.since.is_empty() {
                    let at = std::time::UNIX_EPOCH + Duration::from_secs(secs);
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

/// A grant: the token, and when the request that took it was sent (the server ran the token
/// statement after that, and ends the session no sooner than `ttl` after it went idle).
struct Granted {
    token: u64,
    sent: BootInstant,
}

/// How a connection ended.
#[derive(Clone, Debug)]
struct End {
    reason: String,
    /// The server ended the session (terminated, shut down): the lock is already free.
    server_ended: bool,
}

/// One connection and what its driver task reports.
struct Session {
    client: Arc<Client>,
    ended: watch::Receiver<Option<End>>,
    notes: mpsc::UnboundedReceiver<String>,
    cancel: CancelToken,
    tls: MakeRustlsConnect,
    version: String,
    /// This session's `dlock.owner` mark.
    marker: String,
    /// The server ends this session when it sends nothing for the TTL (PostgreSQL 14+).
    idle_timeout: bool,
}

impl Session {
    fn end_reason(&self) -> String {
        self.ended
            .borrow()
            .as_ref()
            .map_or_else(|| "connection closed".into(), |end| end.reason.clone())
    }
}

async fn query(
    session: &Session,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
    display: &str,
) -> Result<Vec<tokio_postgres::Row>, Error> {
    match tokio::time::timeout(OP_TIMEOUT, session.client.query_typed(sql, params)).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) => Err(classify(&e, display)),
        Err(_) => Err(Error::Unavailable(format!(
            "{display} did not answer within {}",
            humantime::format_duration(OP_TIMEOUT)
        ))),
    }
}

fn wait_text(wait: Wait) -> String {
    match wait {
        Wait::For(d) => humantime::format_duration(d).to_string(),
        Wait::No => "not at all (--no-wait)".into(),
        Wait::Forever => "for ever".into(),
    }
}

fn truncate(text: &str, max: usize) -> String {
    let mut cut = text.len().min(max);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_owned()
}

/// A driver error in words: the server's message and SQLSTATE where there is one
/// (tokio-postgres's own Display says only "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                let more = cause.to_string();
                if !text.contains(&more) {
                    text.push_str(": ");
                    text.push_str(&more);
                }
                source = cause.source();
            }
            text
        }
    }
}

fn is_tls_error(e: &tokio_postgres::Error) -> bool {
    crate::error::caused_by_tls(e) || e.to_string().contains("TLS")
}

/// The exit status a driver error stands for (design §6).
fn classify(e: &tokio_postgres::Error, display: &str) -> Error {
    let text = describe(e);
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        return match code {
            "28P01" | "28000" | "42501" => Error::Permission(format!("{display}: {text}")),
            "3D000" => Error::Config(format!("{display}: {text}")),
            "55P03" => Error::Busy(text),
            "08P01" if text.contains("startup parameter") => Error::Config(format!(
                "{display} refused dlock's session settings ({text}); a connection pooler? use a direct connection"
            )),
            c if c.starts_with("42") => Error::Internal(format!("{display}: {text}")),
            _ => Error::Unavailable(format!("{display}: {text}")),
        };
    }
    if is_tls_error(e) {
        return Error::Config(format!("TLS with {display} failed: {text}"));
    }
    if text.contains("password missing") {
        return Error::Permission(format!(
            "{display} wants a password; give it in the URL, DLOCK_PASSWORD, password_file or ~/.pgpass"
        ));
    }
    Error::Unavailable(format!("cannot reach {display}: {text}"))
}

impl Backend for PgBackend {
    type Lease = PgLease;

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<PgLease, Error> {
        let deadline = Deadline::of(request.wait, BootInstant::now());
        let lock_timeout = match request.wait {
            Wait::For(d) if request.limit <= 1 => Some(d),
            _ => None,
        };
        let label = format!("dlock {} wait {}", request.holder.pid, request.holder.host);
        // Nothing is queued on the server yet: a cancel during connect just drops it.
        let mut session = tokio::select! {
            session = self.connect(&label, request.ttl, lock_timeout, deadline) => session?,
            () = cancel.cancelled() => return Err(Error::Cancelled),
        };
        let (granted, key) = if request.limit <= 1 {
            let key = key(&self.prefix, request.name.as_str());
            let granted = self
                .acquire_single(&mut session, request, key, deadline, &mut cancel)
                .await?;
            (granted, key)
        } else {
            self.acquire_slot(&mut session, request, deadline, &mut cancel)
                .await?
        };
        let schedule = Schedule::new(request.ttl, request.kill_after);
        let last_ack = Arc::new(Mutex::new(granted.sent));
        let mut renewer = Renewer {
            client: session.client.clone(),
            marker: session.marker.clone(),
            ended: session.ended.clone(),
            key,
            ttl: request.ttl,
            sql: heartbeat_sql(&Holder {
                token: granted.token,
                ..request.holder.clone()
            }),
            last_ack: last_ack.clone(),
        };
        // The server ends a session that was idle for the TTL, counting from the end of its
        // last statement, which it ran after we sent it. After a prompt grant that is the
        // token statement, sent with the lock call; after a wait (or a stopped process)
        // the grant may be old news, so one heartbeat confirms the hold and restarts the count.
        let mut since = granted.sent;
        if BootInstant::now().saturating_since(granted.sent) > schedule.attempt_timeout() {
            since = BootInstant::now();
            let confirmed = tokio::time::timeout(schedule.attempt_timeout(), renewer.renew()).await;
            let failure = match confirmed {
                Ok(Ok(_)) => None,
                Ok(Err(RenewError::Gone(why) | RenewError::Failed(why))) => Some(why),
                Err(_) => Some(format!(
                    "the server did not confirm it within {}",
                    humantime::format_duration(schedule.attempt_timeout())
                )),
            };
            if let Some(why) = failure {
                give_back(&session.client, key, &session.marker).await;
                return Err(Error::Unavailable(format!(
                    "'{}' was granted but could not be confirmed: {why}; the command was not started",
                    request.name
                )));
            }
        }
        let keeper = Keeper::start(renewer, since, request.ttl, request.kill_after);
        let notify = (request.limit > 1).then(|| channel(&self.prefix, request.name.as_str()));
        Ok(PgLease {
            keeper,
            session,
            key,
            limit_key: limit_key(&self.prefix, request.name.as_str(), request.limit),
            token: granted.token,
            notify,
            schedule,
            last_ack,
        })
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let session = self.admin().await?;
        self.status_with(&session, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        let session = self.admin().await?;
        let rows = query(&session, LIST_SQL, &[], &self.display).await?;
        let mut locks: Vec<LockStatus> = Vec::new();
        for row in &rows {
            let seen = Seen::from_row(row);
            // Only dlock's holders: a label or a metadata comment says so.
            if seen.metadata.is_none() && !seen.application_name.contains("dlock ") {
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
            let status = seen.status(&lock_name);
            match locks.iter_mut().find(|l| l.name == name) {
                Some(lock) => lock.holders.push(status),
                None => locks.push(LockStatus {
                    name,
                    held: true,
                    holders: vec![status],
                    waiters: None,
                    queue: Vec::new(),
                    last_token: None,
                }),
            }
        }
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(locks)
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
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

    async fn check(&self) -> Result<CheckReport, Error> {
        let started = BootInstant::now();
        let session = self.admin().await?;
        let connect_time = BootInstant::now().saturating_since(started);
        let rows = query(
            &session,
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
        let version: String = row.try_get(0).unwrap_or_default();
        let standby: bool = row.try_get(1).unwrap_or(false);
        let user: String = row.try_get(2).unwrap_or_default();
        let database: String = row.try_get(3).unwrap_or_default();
        let can_signal: bool = row.try_get(4).unwrap_or(false);
        let ssl: Option<bool> = row.try_get(5).unwrap_or(None);
        let ssl_version: Option<String> = row.try_get(6).unwrap_or(None);
        if standby {
            return Err(Error::Config(format!(
                "{} is a hot standby (pg_is_in_recovery() is true); locks must be taken on the primary",
                self.display
            )));
        }
        let mut round_trips = Vec::new();
        for _ in 0..5 {
            let sent = BootInstant::now();
            query(&session, "SELECT 1", &[], &self.display).await?;
            round_trips.push(BootInstant::now().saturating_since(sent));
        }
        round_trips.sort();
        // Take and give back a test key; it must show up for our own backend (no pooler).
        let probe = key_with(&self.prefix, "!check", uuid::Uuid::new_v4().as_bytes());
        let rows = query(
            &session,
            "SELECT pg_try_advisory_lock($1)",
            &[(&probe, Type::INT8)],
            &self.display,
        )
        .await?;
        let took = rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
        let seen = query(
            &session,
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() \
             AND granted AND objsubid = 1 AND classid = (($1 >> 32) & 4294967295)::oid \
             AND objid = ($1 & 4294967295)::oid)",
            &[(&probe, Type::INT8)],
            &self.display,
        )
        .await?;
        let mine = seen.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true);
        query(
            &session,
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
        let mut warnings = Vec::new();
        if !session.idle_timeout {
            warnings.push(
                "the server has no idle_session_timeout (PostgreSQL 14+): a holder that goes silent behind a live connection (a stopped dlock, a proxy or NAT keeping it open) keeps the lock until TCP keepalives notice".into(),
            );
        }
        if ssl != Some(true) && !matches!(self.target.hosts.first(), Some(PgHost::Unix { .. })) {
            warnings.push(format!(
                "the connection is not encrypted (sslmode={})",
                self.target.sslmode.as_str()
            ));
        }
        if !can_signal {
            warnings.push(format!(
                "role {user} is not in pg_signal_backend: 'dlock release --force' can end only its own role's sessions"
            ));
        }
        let median = round_trips
            .get(round_trips.len() / 2)
            .copied()
            .unwrap_or_default();
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
}

/// A held advisory lock on our own connection.
pub struct PgLease {
    keeper: Keeper<Renewer>,
    session: Session,
    key: i64,
    /// Our [`limit_key`], held in shared mode.
    limit_key: i64,
    token: u64,
    /// The channel to NOTIFY on release (`--limit N > 1`).
    notify: Option<String>,
    schedule: Schedule,
    last_ack: Arc<Mutex<BootInstant>>,
}

impl Lease for PgLease {
    fn token(&self) -> u64 {
        self.token
    }

    async fn lost(&mut self) -> Lost {
        let mut ended = self.session.ended.clone();
        // Biased: when the connection ended, that (with its deadline) is the truth, not the
        // keeper's reading of the same event.
        tokio::select! {
            biased;
            _ = ended.wait_for(Option::is_some) => {
                let end = self.session.ended.borrow().clone();
                let end = end.unwrap_or(End { reason: "connection closed".into(), server_ended: false });
                if end.server_ended {
                    Lost {
                        reason: format!("the server ended our session, which frees the lock: {}", end.reason),
                        kill_by: None,
                    }
                } else {
                    // The server may keep the session until it notices the silence.
                    let last = self.last_ack.lock().map(|at| *at).unwrap_or_else(|_| BootInstant::now());
                    Lost {
                        reason: format!("the connection to the server broke: {}", end.reason),
                        kill_by: Some(self.schedule.kill_by(last)),
                    }
                }
            }
            lost = self.keeper.lost() => lost,
        }
    }

    async fn release(self) -> Result<(), Error> {
        drop(self.keeper.stop().await);
        let client = &self.session.client;
        // Bounded: after a lost hold the connection may be a black hole.
        let bound = (self.schedule.ttl / 3).min(CANCEL_TIMEOUT);
        let unlock =
            async {
                match &self.notify {
                    Some(channel) => {
                        client
                            .query_typed(
                                "SELECT pg_advisory_unlock($1), pg_notify($2, ''), \
                             set_config('dlock.owner', '', false), pg_advisory_unlock_shared($3)",
                                &[
                                    (&self.key, Type::INT8),
                                    (channel, Type::TEXT),
                                    (&self.limit_key, Type::INT8),
                                ],
                            )
                            .await
                    }
                    None => client
                        .query_typed(
                            "SELECT pg_advisory_unlock($1), set_config('dlock.owner', '', false), \
                             pg_advisory_unlock_shared($2)",
                            &[(&self.key, Type::INT8), (&self.limit_key, Type::INT8)],
                        )
                        .await,
                }
            };
        let Ok(unlocked) = tokio::time::timeout(bound, unlock).await else {
            tracing::warn!(
                "the server did not answer the unlock; closing the session frees the lock"
            );
            return Ok(());
        };
        match unlocked {
            Ok(rows) if rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true) => {
                Ok(())
            }
            Ok(_) => {
                tracing::warn!("the lock was no longer held by our session when it was released");
                Ok(())
            }
            // Closing the session frees the lock anyway.
            Err(e) => {
                tracing::debug!(
                    "unlock failed ({}); closing the session frees the lock",
                    describe(&e)
                );
                Ok(())
            }
        }
    }
}

/// Heartbeats for the [`Keeper`]: the lock must still show up for our backend.
struct Renewer {
    client: Arc<Client>,
    marker: String,
    ended: watch::Receiver<Option<End>>,
    key: i64,
    ttl: Duration,
    sql: String,
    last_ack: Arc<Mutex<BootInstant>>,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let ended = self.ended.borrow().clone();
        if let Some(end) = ended {
            // A session the server ended is gone; a broken connection may still hold the
            // lock on the server until it notices, so the deadline applies.
            let reason = format!("the connection to the server ended: {}", end.reason);
            return Err(if end.server_ended {
                RenewError::Gone(reason)
            } else {
                RenewError::Failed(reason)
            });
        }
        let sent = BootInstant::now();
        match self
            .client
            .query_typed(
                &self.sql,
                &[(&self.key, Type::INT8), (&self.marker, Type::TEXT)],
            )
            .await
        {
            Ok(rows) if rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true) => {
                if let Ok(mut last) = self.last_ack.lock() {
                    *last = sent;
                }
                Ok(self.ttl)
            }
            Ok(_) => Err(RenewError::Gone(
                "the advisory lock is no longer held by our session (or the session is no longer ours)".into(),
            )),
            Err(e) if e.as_db_error().is_some() => Err(RenewError::Gone(format!(
                "the heartbeat failed: {}",
                describe(&e)
            ))),
            Err(e) => Err(RenewError::Failed(describe(&e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These values are the contract with every other dlock version and with SQL users.
    /// `limit_key("dlock", "probe", 2)`: a contract with every other dlock version.
    const PINNED_LIMIT_KEY: i64 = 565720361972807682;

    #[test]
    fn keys_never_change() {
        assert_eq!(key("dlock", "probe"), -707979539756708059);
        assert_eq!(key("dlock", "probe") as u64, 0xf62cc05c108e8f25);
        assert_ne!(key("dlock", "a/b"), key("dlock", "ab"));
        assert_ne!(key("x", "a"), key("dlock", "a"));
        assert_eq!(slot_key("dlock", "probe", 0), key("dlock", "probe"));
        assert_ne!(slot_key("dlock", "probe", 1), key("dlock", "probe"));
    }

    #[test]
    fn options_give_the_server_a_ttl_of_silence() {
        let options = session_options(
            Duration::from_secs(10),
            Some(Duration::from_millis(300)),
            Features::ALL,
        );
        assert!(options.contains("lock_timeout=300 "), "{options}");
        assert!(options.contains("tcp_keepalives_idle=5 "), "{options}");
        assert!(options.contains("tcp_keepalives_count=6 "), "{options}");
        assert!(options.contains("idle_session_timeout=10000"), "{options}");
        assert!(
            options.contains("client_connection_check_interval=1000"),
            "{options}"
        );
        let old = Features {
            idle_timeout: false,
            check_interval: false,
        };
        let options = session_options(Duration::from_secs(10), None, old);
        assert!(!options.contains("client_connection"), "{options}");
        assert!(!options.contains("idle_session"), "{options}");
    }

    #[test]
    fn refused_settings_are_dropped_one_at_a_time() {
        let refused =
            Features::ALL.without("unrecognized configuration parameter \"idle_session_timeout\"");
        assert_eq!(
            refused,
            Some(Features {
                idle_timeout: false,
                check_interval: false
            })
        );
        assert_eq!(
            refused.and_then(|f| f.without("unrecognized configuration parameter")),
            None
        );
        let no_check = Features::ALL
            .without("client_connection_check_interval must be set to 0 on this platform");
        assert_eq!(
            no_check,
            Some(Features {
                idle_timeout: true,
                check_interval: false
            })
        );
        assert_eq!(
            Features::ALL.without("password authentication failed"),
            None
        );
    }

    #[test]
    fn keepalives_stay_in_linux_range_and_cover_the_ttl() {
        for secs in [1, 2, 3, 10, 599, 600, 3600, 86_400, 3 * 86_400, 7 * 86_400] {
            let (idle, interval, count) = keepalives(Duration::from_secs(secs));
            assert!((1..=32767).contains(&idle), "{secs}s: idle {idle}");
            assert!(
                (1..=32767).contains(&interval),
                "{secs}s: interval {interval}"
            );
            assert!((1..=127).contains(&count), "{secs}s: count {count}");
            assert!(
                idle + interval * (count - 1) >= secs,
                "{secs}s: the server would drop a silent client after {idle}+{interval}·({count}-1)"
            );
        }
        assert!(server_millis(Duration::from_secs(7 * 86_400)) <= i32::MAX as u128);
    }

    #[test]
    fn limit_keys_never_change_and_carry_the_limit() {
        assert_eq!(limit_key("dlock", "probe", 0) & LIMIT_MASK, 0);
        for limit in [1, 2, 1024] {
            let key = limit_key("dlock", "probe", limit);
            assert_eq!(key & LIMIT_MASK, i64::from(limit));
            assert_eq!(key & !LIMIT_MASK, limit_key("dlock", "probe", 0));
        }
        assert_eq!(limit_key("dlock", "probe", 2), PINNED_LIMIT_KEY);
        assert_ne!(limit_key("dlock", "probe", 1), key("dlock", "probe"));
    }

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

    #[test]
    fn slot_statement_tries_in_order() {
        assert_eq!(
            try_slots_sql(&[5, -7]),
            "CASE WHEN pg_try_advisory_lock(5) THEN 0 WHEN pg_try_advisory_lock(-7) THEN 1 END::int4"
        );
    }
}
