//! Connecting: one connection of dlock's own (never a pooled one), TLS as `ssl-mode` says,
//! bounded by `--wait`. The statements on the session are in `statements` (bounded in time),
//! and what a driver error means as an exit status in `failure`.
//!
//! Two second attempts, each within the same bound: VERIFY_CA against a certificate that
//! names another host (the driver checks names even when told not to), and TLS after an
//! "Access denied" without it (MariaDB's only answer to a server or account that requires
//! TLS, which must not read as a wrong password).
//!
//! The client is told the server's `wait_timeout` and `max_allowed_packet` up front, so that
//! connecting costs no query of its own: the session settings travel with the first lock
//! statement.

use std::time::Duration;

use mysql_async::{Conn, OptsBuilder, SslOpts};

use super::target::{MysqlHost, SslMode};
use super::MysqlBackend;
use crate::error::Error;
use crate::kit::timeouts::{CONNECT_TIMEOUT, OP_TIMEOUT};
use crate::wording::Server;

mod failure;
mod statements;

pub(super) use self::failure::Failure;
use self::failure::{classify, describe};
pub(super) use self::statements::cell;

/// How messages name a MySQL or MariaDB server, and the port a URL without one reaches.
pub(super) const SERVER: Server = Server {
    listening: "MySQL/MariaDB server",
    name: "MySQL",
    port: super::target::DEFAULT_PORT,
};

/// One connection and what we know about it.
pub(super) struct Session {
    pub(super) conn: Conn,
    /// The connection id the server gave in its handshake (`CONNECTION_ID()` must agree:
    /// behind a proxy that multiplexes sessions it does not).
    pub(super) id: u64,
    /// Whether the session settings (`settings_sql`) were sent yet.
    pub(super) configured: bool,
    /// A statement was sent and its answer not read to the end: when that is still so at
    /// the next statement, the earlier one was abandoned (a timeout, a cancelled future),
    /// and the connection is out of step (its answer would be taken for the next one's).
    in_flight: bool,
    /// Statements that must run before the next one, in the same round trip: the end of a
    /// grant's transaction (`sql::grant_tail`), which no reply waits for.
    pub(super) tail: Option<String>,
}

impl MysqlBackend {
    /// Connect, bounded by the connect timeout and by `budget` (what is left of `--wait`)
    /// plus [`WAIT_GRACE`]: a `--wait` that is nearly or wholly spent still gets a connection
    /// that can try the lock once, and its run ends within `--wait` + 0.5 s. A second attempt
    /// (see below) shares the same bound.
    pub(super) async fn connect(&self, budget: Option<Duration>) -> Result<Session, Error> {
        let timeout = self.target.connect_timeout.unwrap_or(CONNECT_TIMEOUT);
        let limit = budget.map_or(timeout, |b| b.saturating_add(WAIT_GRACE).min(timeout));
        let deadline = tokio::time::Instant::now() + limit;
        let attempt = |tls: bool, name: Option<String>| async move {
            match self.opts(tls, name) {
                Err(e) => Err(e),
                Ok(opts) => {
                    let connecting = tokio::time::timeout_at(deadline, Conn::new(opts));
                    tokio::select! {
                        connected = connecting => match connected {
                            Err(_) => Err(self.no_answer(limit)),
                            Ok(result) => Ok(result),
                        },
                        Some(what) = self.other_server(deadline) => Err(crate::wording::not_a(
                            &self.display,
                            &SERVER,
                            &format!("it answers like {what}"),
                        )),
                    }
                }
            }
        };
        let tls = self.wants_tls();
        let conn = match attempt(tls, None).await? {
            Ok(conn) => conn,
            Err(e) if self.target.ssl_mode == SslMode::VerifyCa && certified_name(&e).is_some() => {
                // VERIFY_CA checks no host name, but mysql_async 0.37.1 checks it anyway with
                // rustls 0.23 (mysql_async issue #404, fixed upstream, not yet released). The
                // chain was checked before the name, so the certificate is the CA's: connect
                // again, checking the chain and a name that the certificate gives.
                let name = certified_name(&e);
                attempt(true, name)
                    .await?
                    .map_err(|e| self.connect_error(&e))?
            }
            Err(e) if tls && self.target.ssl_mode == SslMode::Preferred && no_tls(&e) => {
                // PREFERRED: the server offers no TLS, so plaintext (as the mysql client does).
                attempt(false, None)
                    .await?
                    .map_err(|e| self.connect_error(&e))?
            }
            Err(e) if no_tls(&e) => {
                return Err(Error::Config(crate::wording::no_tls_handshake(
                    &self.display,
                    &SERVER,
                    &format!(
                        "ssl-mode={} requires TLS; use ssl-mode=PREFERRED, or DISABLED, for a \
                         server without TLS",
                        self.target.ssl_mode.as_str()
                    ),
                )))
            }
            Err(e) if !tls && self.may_need_tls(&e) => {
                // Refused without TLS over TCP. MariaDB refuses a server's
                // `require_secure_transport` or an account's `REQUIRE SSL` with the same
                // "Access denied" (1045) as a wrong password: one attempt with TLS tells them
                // apart. PREFERRED then keeps the encrypted session (the mysql client would
                // have used TLS from the start); DISABLED is told which ssl-mode to use.
                match attempt(true, None).await {
                    Ok(Ok(conn)) if self.target.ssl_mode == SslMode::Preferred => conn,
                    Ok(Ok(conn)) => {
                        let _ = tokio::time::timeout(OP_TIMEOUT, conn.disconnect()).await;
                        return Err(self.plaintext_refused());
                    }
                    _ => return Err(self.connect_error(&e)),
                }
            }
            Err(e) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                return Err(match self.not_mysql(&e, left).await {
                    Some(other) => other,
                    None => self.connect_error(&e),
                });
            }
        };
        Ok(Session {
            id: u64::from(conn.id()),
            conn,
            configured: false,
            in_flight: false,
            tail: None,
        })
    }

    /// Might `e`, from a TCP connection without TLS, be a server that wants TLS? MySQL says
    /// so (3159); MariaDB says "Access denied" (1045).
    fn may_need_tls(&self, e: &mysql_async::Error) -> bool {
        matches!(self.target.host, MysqlHost::Tcp { .. })
            && matches!(e, mysql_async::Error::Server(s) if s.code == 1045 || s.code == ER_SECURE_TRANSPORT_REQUIRED)
    }

    /// The server refuses connections without TLS and the ssl-mode sends none.
    fn plaintext_refused(&self) -> Error {
        Error::Config(format!(
            "{} refuses unencrypted connections (the server's require_secure_transport, or the \
             account's REQUIRE SSL), and ssl-mode={} sends none: use ssl-mode=REQUIRED, or \
             VERIFY_CA / VERIFY_IDENTITY with ssl-ca=FILE",
            self.display,
            self.target.ssl_mode.as_str()
        ))
    }

    /// What other kind of server listens at our TCP address, asked when the greeting is slow
    /// in coming ([`crate::sniff::other_server`]); `None` for a socket.
    async fn other_server(&self, deadline: tokio::time::Instant) -> Option<&'static str> {
        let MysqlHost::Tcp { host, port } = &self.target.host else {
            return None;
        };
        crate::sniff::other_server(host, *port, deadline, &super::kind::KIND).await
    }

    /// A failed connection, in the words every backend uses for passwords, databases and
    /// sockets; the rest as [`classify`] says.
    fn connect_error(&self, e: &mysql_async::Error) -> Error {
        let endpoint = self.target.host.to_string();
        let user = self
            .target
            .user
            .clone()
            .unwrap_or_else(crate::lock::user_name);
        let database = self.target.database.as_deref().unwrap_or_default();
        match e {
            mysql_async::Error::Server(s) if s.code == 1045 => {
                let refused = if s.message.contains("using password: NO") {
                    crate::wording::password_missing(&endpoint, &user, &[])
                } else {
                    crate::wording::password_refused(&endpoint, &user, &[])
                };
                if self.wants_tls() && self.target.tls_files.cert_file.is_none() {
                    // An account that REQUIRE X509 / SUBJECT / ISSUER is refused the same way.
                    Error::Permission(format!(
                        "{refused}, or the account wants a client certificate (ssl-cert and \
                         ssl-key)"
                    ))
                } else {
                    refused
                }
            }
            // MariaDB and MySQL say "access denied" for a database that does not exist as
            // for one the user may not use, so as not to tell which exist.
            mysql_async::Error::Server(s) if s.code == 1044 => crate::wording::no_database(
                &endpoint,
                database,
                &format!(
                    " that user '{user}' may use: check the database in the URL \
                     (mysql://HOST/DATABASE), or give the user its privileges (GRANT ALL ON \
                     `{database}`.* TO '{user}'@…)"
                ),
            ),
            mysql_async::Error::Server(s) if s.code == 1049 => crate::wording::no_database(
                &endpoint,
                database,
                ": check the database in the URL (mysql://HOST/DATABASE)",
            ),
            _ if matches!(self.target.host, MysqlHost::Unix(_))
                && crate::wording::not_found_in(e) =>
            {
                crate::wording::no_socket(&endpoint, &SERVER)
            }
            _ => classify(e, &self.display),
        }
    }

    /// Connecting failed without a word from MySQL (the connection closed, an answer that
    /// is no MySQL packet): when another kind of server answers at our TCP address, that is
    /// the message. `left`: what is left of the budget for asking.
    async fn not_mysql(&self, e: &mysql_async::Error, left: Duration) -> Option<Error> {
        let MysqlHost::Tcp { host, port } = &self.target.host else {
            return None;
        };
        if matches!(e, mysql_async::Error::Server(_))
            || crate::wording::refused_in(e)
            || crate::error::caused_by_tls(e)
            || left.is_zero()
        {
            return None;
        }
        let what = crate::sniff::other_than(host, *port, left, &super::kind::KIND).await?;
        Some(crate::wording::not_a(
            &crate::kit::url::join_host_port(host, *port),
            &SERVER,
            &format!("it answers like {what}"),
        ))
    }

    fn no_answer(&self, limit: Duration) -> Error {
        crate::wording::no_answer_in(
            &self.display,
            Duration::from_millis(u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// PREFERRED asks for TLS except on this machine (a socket or a loopback address, where
    /// TLS protects nothing and costs a handshake on every run).
    fn wants_tls(&self) -> bool {
        match self.target.ssl_mode {
            SslMode::Disabled => false,
            SslMode::Preferred => !self.target.is_local(),
            _ => !matches!(self.target.host, MysqlHost::Unix(_)),
        }
    }

    /// The connection's options; `tls_name`: the name to check the certificate against
    /// instead of the host's.
    fn opts(&self, tls: bool, tls_name: Option<String>) -> Result<OptsBuilder, Error> {
        let target = &self.target;
        let mut opts = OptsBuilder::default()
            .user(Some(target.user()))
            .pass(target.password.as_ref().map(|p| p.expose().to_owned()))
            .db_name(target.database.clone())
            .prefer_socket(false)
            // Known up front, so connecting runs no query (we set wait_timeout ourselves).
            .wait_timeout(Some(28_800))
            .max_allowed_packet(Some(4 << 20))
            .stmt_cache_size(0)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(Duration::from_secs(1)));
        opts = match &target.host {
            MysqlHost::Tcp { host, port } => opts.ip_or_hostname(host.clone()).tcp_port(*port),
            MysqlHost::Unix(path) => opts.socket(Some(path.display().to_string())),
        };
        if tls {
            crate::kit::tls::install_tls_provider();
            let mut ssl = SslOpts::default();
            if let Some(ca) = &target.tls_files.ca_file {
                ssl = ssl
                    .with_root_certs(vec![ca.clone().into()])
                    .with_disable_built_in_roots(true);
            }
            if let (Some(cert), Some(key)) =
                (&target.tls_files.cert_file, &target.tls_files.key_file)
            {
                ssl = ssl.with_client_identity(Some(mysql_async::ClientIdentity::new(
                    cert.clone().into(),
                    key.clone().into(),
                )));
            }
            ssl = ssl.with_danger_tls_hostname_override(tls_name);
            ssl = match target.ssl_mode {
                SslMode::VerifyIdentity => ssl,
                SslMode::VerifyCa => ssl.with_danger_skip_domain_validation(true),
                _ => ssl
                    .with_danger_accept_invalid_certs(true)
                    .with_danger_skip_domain_validation(true),
            };
            opts = opts.ssl_opts(Some(ssl));
        }
        Ok(opts)
    }
}

/// How far past the end of `--wait` connecting may go. The design allows a run to end
/// 0.5 s after its `--wait`; this leaves the rest of that half second for the one lock
/// call (`GET_LOCK(key, 0)`, a round trip) and the exit. Not derived from the lease: no
/// lease exists yet, and a lower value makes a short `--wait` fail on a healthy but busy
/// server with "cannot reach".
pub(super) const WAIT_GRACE: Duration = Duration::from_millis(400);

/// MySQL's refusal of a connection without TLS under `require_secure_transport`.
const ER_SECURE_TRANSPORT_REQUIRED: u16 = 3159;

/// A name that the server's certificate gives, when `e` is a certificate that failed only
/// its host name check (rustls checks the chain first). A wildcard's `*` becomes a label.
fn certified_name(e: &mysql_async::Error) -> Option<String> {
    match rustls_cause(e)? {
        rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
            presented,
            ..
        }) => presented.iter().find_map(|name| usable_name(name)),
        _ => None,
    }
}

/// The TLS error (from rustls) that `e` comes from, if any.
fn rustls_cause(e: &mysql_async::Error) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // Bounded: a driver error is a few causes deep.
    for _ in 0..16 {
        let current = cause?;
        let tls = current.downcast_ref::<rustls::Error>().or_else(|| {
            current
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if tls.is_some() {
            return tls;
        }
        cause = current.source();
    }
    None
}

/// A failed TLS handshake in words, with what to do about a certificate that was refused.
fn tls_failure(e: &mysql_async::Error, display: &str) -> Error {
    use rustls::CertificateError as Cert;
    let (reason, advice) = match rustls_cause(e) {
        None => (describe(e), ""),
        Some(tls) => (
            tls.to_string(),
            match tls {
                rustls::Error::InvalidCertificate(
                    Cert::NotValidForName | Cert::NotValidForNameContext { .. },
                ) => {
                    "; connect by a name the certificate gives, or check only the chain with \
                     ssl-mode=VERIFY_CA"
                }
                rustls::Error::InvalidCertificate(Cert::UnknownIssuer | Cert::BadSignature) => {
                    "; ssl-ca must name the CA that signed the server's certificate"
                }
                _ => "",
            },
        ),
    };
    Error::Config(format!("TLS with {display} failed: {reason}{advice}"))
}

/// `DnsName("db.example")` or `IpAddress(192.0.2.1)` (how rustls-webpki lists a
/// certificate's names) as a name to check the certificate against.
fn usable_name(presented: &str) -> Option<String> {
    if let Some(dns) = presented
        .strip_prefix("DnsName(\"")
        .and_then(|rest| rest.strip_suffix("\")"))
    {
        let name = match dns.strip_prefix("*.") {
            Some(parent) => format!("dlock.{parent}"),
            None => dns.to_owned(),
        };
        return rustls::pki_types::ServerName::try_from(name.as_str())
            .is_ok()
            .then_some(name);
    }
    let ip = presented
        .strip_prefix("IpAddress(")?
        .strip_suffix(')')?
        .parse::<std::net::IpAddr>()
        .ok()?;
    Some(ip.to_string())
}

/// The server offered no TLS.
fn no_tls(e: &mysql_async::Error) -> bool {
    matches!(
        e,
        mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_names_as_rustls_lists_them() {
        assert_eq!(
            usable_name("DnsName(\"db.example\")").as_deref(),
            Some("db.example")
        );
        assert_eq!(
            usable_name("DnsName(\"*.db.example\")").as_deref(),
            Some("dlock.db.example")
        );
        assert_eq!(
            usable_name("IpAddress(192.0.2.1)").as_deref(),
            Some("192.0.2.1")
        );
        assert_eq!(usable_name("IpAddress(::1)").as_deref(), Some("::1"));
        assert_eq!(usable_name("UniformResourceIdentifier(\"x\")"), None);
        assert_eq!(usable_name("DirectoryName"), None);
    }
}
