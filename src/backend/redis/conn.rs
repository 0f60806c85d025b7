//! One connection to Redis and the calls made on it: connecting (TCP, TLS, a Unix socket;
//! AUTH and SELECT), every call bounded by its own budget, and the mapping of redis-rs errors
//! to dlock's error kinds (exit statuses).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo,
    RedisError,
};

use crate::error::Error;

use super::sentinel::Locator;
use super::{RedisAddr, RedisTarget};

/// Bound for connecting (TCP, TLS handshake, AUTH, SELECT).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound for one script call outside the lease keeper.
pub(super) const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call failed.
pub(super) enum Failure {
    Redis(RedisError),
    Timeout(Duration),
    /// Behind Sentinel: no usable master could be located (already classified).
    Sentinel(Error),
}

impl Failure {
    /// Worth another attempt (the connection, not the request, was the problem).
    pub(super) fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => e.is_io_error() || e.is_connection_dropped() || e.is_timeout(),
            Failure::Sentinel(e) => matches!(e, Error::Unavailable(_)),
        }
    }

    /// The call got no answer in time (ours or the client's timeout).
    pub(super) fn is_timeout(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => e.is_timeout(),
            Failure::Sentinel(_) => false,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Failure::Timeout(d) => format!("no answer within {}", humantime::format_duration(*d)),
            Failure::Redis(e) => e.to_string(),
            Failure::Sentinel(e) => e.to_string(),
        }
    }

    pub(super) fn into_error(self, display: &str) -> Error {
        match self {
            Failure::Timeout(d) => Error::Unavailable(format!(
                "{display} did not answer within {}",
                humantime::format_duration(d)
            )),
            Failure::Redis(e) => classify(&e, display),
            Failure::Sentinel(e) => e,
        }
    }
}

/// Map a redis-rs error to dlock's error kinds (exit statuses).
pub(super) fn classify(e: &RedisError, display: &str) -> Error {
    use redis::ErrorKind;
    let code = e.code().unwrap_or_default();
    let detail = e.detail().unwrap_or_default();
    let text = e.to_string();
    // A server that wants a password closes unauthenticated connections that send scripts
    // ("Protocol error: unauthenticated multibulk length").
    if e.kind() == ErrorKind::AuthenticationFailed
        || code == "NOAUTH"
        || code == "WRONGPASS"
        || text.contains("unauthenticated")
    {
        return Error::Permission(format!(
            "{display} refused authentication: wrong user or password, a missing password, or a password \
             where none is set (give it in the URL, DLOCK_PASSWORD or password_file)"
        ));
    }
    if code == "NOPERM"
        || detail.starts_with("The user executing the script can't")
        || text.contains("NOPERM")
    {
        return Error::Permission(format!(
            "{display}: the Redis ACL does not allow dlock's commands: {text}"
        ));
    }
    if code == "READONLY" {
        return Error::Config(format!(
            "{display} is a read-only replica; locks must be taken on the master"
        ));
    }
    if is_tls_error(e) {
        return Error::Config(format!("TLS with {display} failed: {text}"));
    }
    if e.kind() == ErrorKind::InvalidClientConfig {
        return Error::Config(format!("cannot set up the connection to {display}: {text}"));
    }
    if e.is_connection_refusal() || e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return Error::Unavailable(format!("cannot reach {display}: {text}"));
    }
    if text.contains("refused to switch database") {
        return Error::Usage(format!(
            "{display}: the server has no such database ({text})"
        ));
    }
    if text.contains("user_script") {
        return Error::Internal(format!("a dlock script failed on {display}: {text}"));
    }
    Error::Unavailable(format!("{display}: {text}"))
}

fn is_tls_error(e: &RedisError) -> bool {
    crate::error::caused_by_tls(e)
}

/// Connect into `slot` unless a connection is there already.
async fn open<'a>(
    client: &Client,
    slot: &'a mut Option<MultiplexedConnection>,
) -> Result<&'a mut MultiplexedConnection, RedisError> {
    if slot.is_none() {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None);
        *slot = Some(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        );
    }
    slot.as_mut()
        .ok_or_else(|| RedisError::from((redis::ErrorKind::Io, "no connection")))
}

/// One connection to Redis, re-opened after an error or an abandoned call.
///
/// No response timeout is configured on the connection itself: a `BLPOP` blocks for as long
/// as it was asked to, and every call is bounded here instead. A call abandoned by a timeout
/// leaves the connection "dirty" (its reply may still arrive, or never), so the next call
/// starts on a fresh socket rather than queueing behind it.
pub(super) struct Conn {
    client: Client,
    connection: Option<MultiplexedConnection>,
    dirty: bool,
    /// Behind Sentinel: where to connect is asked anew at every (re)connect.
    pub(super) sentinel: Option<Locator>,
}

impl Conn {
    pub(super) fn new(target: &RedisTarget, display: &str) -> Result<Conn, Error> {
        Ok(Conn {
            client: Conn::client_for(target, display)?,
            connection: None,
            dirty: false,
            sentinel: Locator::new(target, display)?,
        })
    }

    /// Drop the connection: the next call connects again (behind Sentinel, to the master the
    /// sentinels name then).
    pub(super) fn reconnect(&mut self) {
        self.connection = None;
    }

    /// Behind Sentinel, a connection about to be opened goes to the master the sentinels name
    /// now, checked with `ROLE`.
    async fn locate(&mut self) -> Result<(), Failure> {
        if let (Some(locator), None) = (&mut self.sentinel, &self.connection) {
            let (client, connection) = locator.locate().await.map_err(Failure::Sentinel)?;
            self.client = client;
            self.connection = Some(connection);
        }
        Ok(())
    }

    /// A client for the server `target.addr` (nothing is connected yet).
    pub(super) fn client_for(target: &RedisTarget, display: &str) -> Result<Client, Error> {
        let addr = match &target.addr {
            RedisAddr::Tcp { host, port } => ConnectionAddr::Tcp(host.clone(), *port),
            RedisAddr::Tls { host, port } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            RedisAddr::Unix { path } => ConnectionAddr::Unix(path.clone()),
        };
        let mut redis = RedisConnectionInfo::default()
            .set_db(target.db)
            .set_skip_set_lib_name();
        if let Some(user) = &target.user {
            redis = redis.set_username(user);
        }
        if let Some(password) = &target.password {
            redis = redis.set_password(password.expose());
        }
        let setup = |e: RedisError| {
            Error::Config(format!("cannot set up the connection to {display}: {e}"))
        };
        let info = addr
            .into_connection_info()
            .map_err(setup)?
            .set_redis_settings(redis)
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = match &target.addr {
            RedisAddr::Tls { .. } => {
                let read = |path: &std::path::PathBuf| {
                    std::fs::read(path)
                        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))
                };
                let root_cert = target.tls.ca_file.as_ref().map(read).transpose()?;
                let client_tls = match (&target.tls.cert_file, &target.tls.key_file) {
                    (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                        client_cert: read(cert)?,
                        client_key: read(key)?,
                    }),
                    _ => None,
                };
                Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls,
                        root_cert,
                    },
                )
                .map_err(setup)?
            }
            _ => Client::open(info).map_err(setup)?,
        };
        Ok(client)
    }

    /// The open connection, (re)connecting first if needed.
    pub(super) async fn ensure(&mut self) -> Result<&mut MultiplexedConnection, Failure> {
        if std::mem::take(&mut self.dirty) {
            self.connection = None;
        }
        self.locate().await?;
        open(&self.client, &mut self.connection)
            .await
            .map_err(Failure::Redis)
    }

    /// Start a call: a connection left dirty by an abandoned call is replaced, and this one
    /// counts as dirty until its reply is in (the future may be dropped by a caller's timeout).
    fn begin(&mut self) {
        if std::mem::replace(&mut self.dirty, true) {
            self.connection = None;
        }
    }

    fn finish<T>(
        &mut self,
        outcome: Result<Result<T, Failure>, tokio::time::error::Elapsed>,
        budget: Duration,
    ) -> Result<T, Failure> {
        match outcome {
            Ok(Ok(value)) => {
                self.dirty = false;
                Ok(value)
            }
            Ok(Err(Failure::Redis(e))) => {
                // A server error leaves the connection usable; a transport error does not.
                self.dirty =
                    e.is_io_error() || e.is_unrecoverable_error() || e.is_connection_dropped();
                Err(Failure::Redis(e))
            }
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::Timeout(budget)),
        }
    }

    /// Run a script (EVALSHA, loading it on NOSCRIPT).
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &mut self,
        invocation: &redis::ScriptInvocation<'_>,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.call(budget, async |connection| {
            invocation.invoke_async(connection).await
        })
        .await
    }

    pub(super) async fn query<T: redis::FromRedisValue>(
        &mut self,
        command: &redis::Cmd,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.call(budget, async |connection| {
            command.query_async(connection).await
        })
        .await
    }

    /// One request within `budget`, connecting first if need be.
    async fn call<T>(
        &mut self,
        budget: Duration,
        request: impl AsyncFnOnce(&mut MultiplexedConnection) -> Result<T, RedisError>,
    ) -> Result<T, Failure> {
        self.begin();
        let outcome = tokio::time::timeout(budget, async {
            self.locate().await?;
            let connection = open(&self.client, &mut self.connection)
                .await
                .map_err(Failure::Redis)?;
            request(connection).await.map_err(Failure::Redis)
        })
        .await;
        self.finish(outcome, budget)
    }

    /// Block until our mailbox gets a wake-up or `block` passes.
    pub(super) async fn blpop(&mut self, key: &str, block: Duration) -> Result<(), Failure> {
        let mut command = redis::cmd("BLPOP");
        command.arg(key).arg(format!("{:.3}", block.as_secs_f64()));
        self.query::<Option<(String, String)>>(&command, block + OP_TIMEOUT)
            .await
            .map(drop)
    }
}
