//! Connecting: one connection of dlock's own, with its session settings, bounded by
//! `--wait`; the task that drives it and reports notifications and its end; and what a driver
//! error means as an exit status.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::poll_fn;
use tokio::sync::{mpsc, watch};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config, Connection};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::settings::{client_keepalives, session_options, Features};
use super::target::{PgHost, SslMode};
use super::{tls, PgBackend, MAX_APPLICATION_NAME};
use crate::budget::WaitBudget;
use crate::error::Error;
use crate::kit::timeouts::{CONNECT_TIMEOUT, OP_TIMEOUT};
use crate::wording::Server;

/// How messages name a PostgreSQL server, and the port a URL without one reaches.
pub(super) const SERVER: Server = Server {
    listening: "PostgreSQL server",
    name: "PostgreSQL",
    port: super::target::DEFAULT_PORT,
};

impl PgBackend {
    /// Connect with dlock's session settings; `lock_timeout` bounds lock waits, and an
    /// acquisition's `--wait` budget bounds connecting.
    pub(super) async fn connect(
        &self,
        label: &str,
        ttl: Duration,
        lock_timeout: Option<Duration>,
        budget: Option<&WaitBudget>,
    ) -> Result<Session, Error> {
        let tls = tls::connector(&self.target)?;
        let mut features = Features::ALL;
        // At most one retry per feature the server may not know.
        for _ in 0..3 {
            match self
                .connect_with(&tls, label, ttl, lock_timeout, features, budget)
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

    /// What other kind of server than PostgreSQL answers at the first TCP host, asked while
    /// connecting is slow to get an answer ([`crate::sniff::other_server`]).
    async fn other_server(&self, deadline: tokio::time::Instant) -> Option<&'static str> {
        let (host, port) = self.target.hosts.iter().find_map(|h| match h {
            PgHost::Tcp { host, port } => Some((host, *port)),
            PgHost::Unix { .. } => None,
        })?;
        crate::sniff::other_server(host, port, deadline, &super::kind::KIND).await
    }

    /// Where the first host is, for messages: `HOST:PORT`, or the socket's path.
    fn endpoint(&self) -> String {
        match self.target.hosts.first() {
            Some(PgHost::Tcp { host, port }) => crate::kit::url::join_host_port(host, *port),
            Some(PgHost::Unix { dir, port }) => {
                dir.join(format!(".s.PGSQL.{port}")).display().to_string()
            }
            None => self.display.clone(),
        }
    }

    /// A failed connection, in the words every backend uses for passwords, databases and
    /// sockets; the rest as [`classify`] says.
    fn connect_error(&self, e: &tokio_postgres::Error) -> Error {
        let endpoint = self.endpoint();
        let user = self.target.user();
        let code = e.as_db_error().map(|db| db.code().code());
        if code == Some("28P01") {
            return crate::wording::password_refused(&endpoint, &user, &["~/.pgpass"]);
        }
        if code == Some("3D000") {
            return crate::wording::no_database(
                &endpoint,
                &self.target.dbname(),
                ": check the database in the URL (the path, or dbname=)",
            );
        }
        if describe(e).contains("password missing") {
            return crate::wording::password_missing(&endpoint, &user, &["~/.pgpass"]);
        }
        if crate::wording::not_found_in(e) && endpoint.starts_with('/') {
            return crate::wording::no_socket(&endpoint, &SERVER);
        }
        classify(e, &self.display)
    }

    /// Connecting failed without a word from PostgreSQL (the connection closed, or an
    /// answer that is no PostgreSQL message): when another kind of server answers at the
    /// first TCP host, that is the message. `left`: what is left of the budget for asking.
    async fn not_postgres(&self, e: &tokio_postgres::Error, left: Duration) -> Option<Error> {
        if e.as_db_error().is_some()
            || crate::wording::refused_in(e)
            || crate::error::caused_by_tls(e)
            || left.is_zero()
        {
            return None;
        }
        let (host, port) = self.target.hosts.iter().find_map(|h| match h {
            PgHost::Tcp { host, port } => Some((host, *port)),
            PgHost::Unix { .. } => None,
        })?;
        let what = crate::sniff::other_than(host, port, left, &super::kind::KIND).await?;
        Some(crate::wording::not_a(
            &crate::kit::url::join_host_port(host, port),
            &SERVER,
            &format!("it answers like {what}"),
        ))
    }

    async fn connect_with(
        &self,
        tls: &MakeRustlsConnect,
        label: &str,
        ttl: Duration,
        lock_timeout: Option<Duration>,
        features: Features,
        wait: Option<&WaitBudget>,
    ) -> Result<Session, Error> {
        let timeout = self.target.connect_timeout.unwrap_or(CONNECT_TIMEOUT);
        let config = self.config(label, ttl, lock_timeout, features, timeout);
        let hosts = u32::try_from(self.target.hosts.len()).unwrap_or(1).max(1);
        let every_host = timeout.saturating_mul(hosts);
        // The whole acquisition ends by the server's time to answer, connecting included.
        let budget = wait.map_or(every_host, |w| w.call_limit(every_host));
        let wait = wait.filter(|_| budget < every_host);
        let deadline = tokio::time::Instant::now() + budget;
        let connecting = tokio::time::timeout(budget, config.connect(tls.clone()));
        let connected = tokio::select! {
            connected = connecting => connected,
            Some(what) = self.other_server(deadline) => {
                return Err(crate::wording::not_a(
                    &self.display,
                    &SERVER,
                    &format!("it answers like {what}"),
                ));
            }
        };
        let (client, connection) = match connected {
            Err(_) => {
                return Err(match wait {
                    Some(wait) => crate::wording::no_answer(&self.display, None, wait),
                    None => crate::wording::no_answer_in(&self.display, budget),
                })
            }
            Ok(Err(e)) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                return Err(match self.not_postgres(&e, left).await {
                    Some(other) => other,
                    None => self.connect_error(&e),
                });
            }
            Ok(Ok(pair)) => pair,
        };
        let version = connection
            .parameter("server_version")
            .map(str::to_owned)
            .unwrap_or_default();
        let (ended, notes) = drive(connection);
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

    /// The connection's configuration: hosts, credentials, TLS mode, our session settings.
    fn config(
        &self,
        label: &str,
        ttl: Duration,
        lock_timeout: Option<Duration>,
        features: Features,
        timeout: Duration,
    ) -> Config {
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
        config.connect_timeout(timeout);
        client_keepalives(&mut config, ttl);
        config
    }
}

/// Drive `connection` on its own task: notifications go to the returned channel, and its end
/// (with whether the server ended the session) to the returned watch.
fn drive<S, T>(
    mut connection: Connection<S, T>,
) -> (
    watch::Receiver<Option<End>>,
    mpsc::UnboundedReceiver<String>,
)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
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
    (ended, notes)
}

/// How a connection ended.
#[derive(Clone, Debug)]
pub(super) struct End {
    pub(super) reason: String,
    /// The server ended the session (terminated, shut down): the lock is already free.
    pub(super) server_ended: bool,
}

/// One connection and what its driver task reports.
pub(super) struct Session {
    pub(super) client: Arc<Client>,
    pub(super) ended: watch::Receiver<Option<End>>,
    pub(super) notes: mpsc::UnboundedReceiver<String>,
    pub(super) cancel: CancelToken,
    pub(super) tls: MakeRustlsConnect,
    pub(super) version: String,
    /// This session's `dlock.owner` mark.
    pub(super) marker: String,
    /// The server ends this session when it sends nothing for the TTL (PostgreSQL 14+).
    pub(super) idle_timeout: bool,
}

impl Session {
    pub(super) fn end_reason(&self) -> String {
        self.ended
            .borrow()
            .as_ref()
            .map_or_else(|| "connection closed".into(), |end| end.reason.clone())
    }
}

/// One statement outside the keeper, bounded by [`OP_TIMEOUT`].
pub(super) async fn query(
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

fn truncate(text: &str, max: usize) -> String {
    let mut cut = text.len().min(max);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_owned()
}

/// A driver error in words: the server's message and SQLSTATE where there is one
/// (tokio-postgres's own Display says only "db error").
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => crate::kit::error_text::chain_text(e),
    }
}

fn is_tls_error(e: &tokio_postgres::Error) -> bool {
    crate::error::caused_by_tls(e) || e.to_string().contains("TLS")
}

/// The setting behind a `too_many_connections` (53300) refusal, from the server's message.
fn capacity_limit(text: &str) -> &'static str {
    if text.contains("for role") {
        "role's CONNECTION LIMIT"
    } else if text.contains("for database") {
        "database's CONNECTION LIMIT"
    } else {
        "PostgreSQL max_connections"
    }
}

/// The exit status a driver error stands for (README: "Exit status").
pub(super) fn classify(e: &tokio_postgres::Error, display: &str) -> Error {
    let text = describe(e);
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        return match code {
            "28P01" | "28000" | "42501" => Error::Permission(format!("{display}: {text}")),
            "3D000" => Error::Config(format!("{display}: {text}")),
            "55P03" => Error::Busy(text),
            "53300" => crate::kit::capacity::refused(display, capacity_limit(&text), &text),
            "08P01" if text.contains("startup parameter") => Error::Config(format!(
                "{display} refused dlock's session settings ({text}); a connection pooler? use a direct connection"
            )),
            c if c.starts_with("42") => Error::Internal(format!("{display}: {text}")),
            _ => Error::Unavailable(format!("{display}: {text}")),
        };
    }
    if crate::wording::refused_in(e) {
        return crate::wording::connection_refused(display, &SERVER);
    }
    if text.contains("server does not support TLS") {
        return Error::Config(crate::wording::no_tls_handshake(
            display,
            &SERVER,
            "use sslmode=prefer, or sslmode=disable, for a server without TLS",
        ));
    }
    if is_tls_error(e) {
        return Error::Config(format!("TLS with {display} failed: {text}"));
    }
    if text.contains("password missing") {
        return crate::wording::password_missing(
            &crate::wording::endpoint_of(display, SERVER.port),
            // No user in the URL: libpq's default, the login name.
            &crate::wording::user_in(display).map_or_else(crate::lock::user_name, str::to_owned),
            &["~/.pgpass"],
        );
    }
    Error::Unavailable(format!(
        "cannot reach {display}: {}",
        crate::kit::error_text::without_os_error_numbers(&text)
    ))
}
