//! The connection to an etcd cluster: one endpoint at a time, failing over to the next after
//! a transport failure or a timeout (etcd-client does not fail over by itself), every call
//! bounded, and etcd-client's errors mapped to dlock's exit classes.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::EtcdTarget;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::url::join_host_port;
use crate::wording::Server;

/// How messages name an etcd server, and the port a URL without one reaches.
pub(super) const SERVER: Server = Server {
    listening: "etcd server",
    name: "etcd",
    port: 2379,
};

/// Bound for one attempt on one endpoint.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection to the cluster, to one endpoint at a time. A clone shares the connection.
#[derive(Clone)]
pub(super) struct Conn {
    urls: Vec<String>,
    /// The URL's hosts, asked what answers there when etcd's protocol failed.
    endpoints: Vec<(String, u16)>,
    /// A call has been answered: the servers are etcd, and a later failure is an outage,
    /// never a URL pointed at another kind of server.
    answered: bool,
    index: usize,
    options: ConnectOptions,
    client: Option<Client>,
    display: String,
    tls: bool,
    has_client_cert: bool,
}

/// Why a call failed.
enum Failure {
    Etcd(etcd_client::Error),
    Timeout,
}

impl Conn {
    pub(super) fn new(target: &EtcdTarget, display: &str) -> Result<Conn, Error> {
        let scheme = if target.tls { "https" } else { "http" };
        let urls = target
            .endpoints
            .iter()
            .map(|(host, port)| format!("{scheme}://{}", join_host_port(host, *port)))
            .collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(ATTEMPT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(false)
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let (Some(user), Some(password)) = (&target.user, &target.password) {
            options = options.with_user(user, password.expose());
        }
        if target.tls {
            let read = |path: &std::path::PathBuf| {
                std::fs::read(path)
                    .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))
            };
            let mut tls = etcd_client::TlsOptions::new().timeout(ATTEMPT_TIMEOUT);
            tls = match &target.tls_files.ca_file {
                Some(ca) => tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?)),
                None => tls.with_native_roots(),
            };
            if let (Some(cert), Some(key)) =
                (&target.tls_files.cert_file, &target.tls_files.key_file)
            {
                tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            options = options.with_tls(tls);
        }
        Ok(Conn {
            urls,
            endpoints: target.endpoints.clone(),
            answered: false,
            index: 0,
            options,
            client: None,
            display: display.to_owned(),
            tls: target.tls,
            has_client_cert: target.tls_files.cert_file.is_some(),
        })
    }

    pub(super) fn rotate(&mut self) {
        self.client = None;
        self.index = (self.index + 1) % self.urls.len().max(1);
    }

    pub(super) async fn client(&mut self) -> Result<Client, etcd_client::Error> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let url = self.urls[self.index % self.urls.len()].clone();
        let client = Client::connect([url], Some(self.options.clone())).await?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Revoke `lease`, which deletes the keys on it. `Ok(false)`: etcd no longer has it (it
    /// expired, or someone revoked it first).
    pub(super) async fn revoke(&mut self, lease: i64, budget: Duration) -> Result<bool, Error> {
        match self
            .call(budget, |mut c| async move { c.lease_revoke(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Run `op` on the current endpoint; after a transport failure or a timeout move to the
    /// next endpoint and try again, until `budget` is spent. Other errors return at once.
    pub(super) async fn call<T, F, Fut>(&mut self, budget: Duration, op: F) -> Result<T, Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = BootInstant::now() + budget;
        let attempts = (2 * self.urls.len()).max(2);
        let mut last = Failure::Timeout;
        for attempt in 0..attempts {
            let left = deadline.remaining();
            if left.is_zero() {
                break;
            }
            let step = async {
                let client = self.client().await?;
                op(client).await
            };
            match tokio::time::timeout(left.min(ATTEMPT_TIMEOUT), step).await {
                Ok(Ok(value)) => {
                    self.answered = true;
                    return Ok(value);
                }
                Ok(Err(e)) if is_transport(&e) => {
                    tracing::debug!(
                        "etcd endpoint {} failed: {e}",
                        self.urls[self.index % self.urls.len()]
                    );
                    last = Failure::Etcd(e);
                    self.rotate();
                    // A pause before the next endpoint, longer each time; not a deadline:
                    // `budget` ends the tries, so a busy machine only makes one later.
                    tokio::time::sleep(Duration::from_millis(20 * (attempt as u64 + 1))).await;
                }
                Ok(Err(e)) => return Err(self.classify(&e)),
                Err(_) => {
                    last = Failure::Timeout;
                    self.rotate();
                }
            }
        }
        Err(match last {
            Failure::Etcd(e) => match self.not_etcd(&e, deadline.remaining()).await {
                Some(other) => other,
                None => self.classify(&e),
            },
            Failure::Timeout => crate::wording::no_answer_in(&self.display, budget),
        })
    }

    /// The URL's endpoints, for messages: `HOST:PORT[,HOST:PORT…]`.
    fn endpoint(&self) -> String {
        self.endpoints
            .iter()
            .map(|(host, port)| join_host_port(host, *port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every endpoint failed at the transport, the way a server of another kind makes an
    /// HTTP/2 client fail (the connection closed or reset at the preface, bytes that are no
    /// HTTP/2 frame): when another kind of server answers at the first endpoint, that is the
    /// message. `left`: what is left of the call's budget for asking.
    async fn not_etcd(&self, e: &etcd_client::Error, left: Duration) -> Option<Error> {
        let refused = match e {
            etcd_client::Error::GRpcStatus(status) => crate::wording::refused_in(status),
            _ => crate::wording::refused_in(e),
        };
        if self.answered || self.tls || refused || left.is_zero() || !is_transport(e) {
            return None;
        }
        let (host, port) = self.endpoints.first()?;
        let what = crate::sniff::other_than(host, *port, left, &super::kind::KIND).await?;
        Some(crate::wording::not_a(
            &join_host_port(host, *port),
            &SERVER,
            &format!("it answers like {what}"),
        ))
    }

    /// Map an etcd-client error to dlock's error kinds (exit statuses).
    fn classify(&self, e: &etcd_client::Error) -> Error {
        use tonic::Code;
        let display = &self.display;
        let text = e.to_string();
        if is_tls_error(e) {
            return Error::Config(format!("TLS with {display} failed: {text}"));
        }
        let refused = match e {
            // tonic keeps the transport's error behind the status.
            etcd_client::Error::GRpcStatus(status) => {
                crate::wording::refused_in(status)
                    || describe_chain(status).contains("Connection refused")
            }
            _ => crate::wording::refused_in(e),
        };
        if refused {
            return crate::wording::connection_refused(display, &SERVER);
        }
        // A server that is not HTTP/2 (Redis, PostgreSQL, …) answers the gRPC preface with
        // bytes that are not an HTTP/2 frame.
        let chain = match e {
            etcd_client::Error::GRpcStatus(status) => describe_chain(status),
            _ => describe_chain(e),
        };
        if chain.contains("h2 protocol error") {
            return crate::wording::not_a(display, &SERVER, "it did not answer in HTTP/2 (gRPC)");
        }
        // A plain-text server (etcd without TLS, or anything else) closes or resets the
        // connection on a TLS ClientHello.
        if self.tls && plain_text_at_handshake(e) {
            return Error::Unavailable(crate::wording::no_tls_handshake(
                display,
                &SERVER,
                "use etcd:// for a server without TLS",
            ));
        }
        match e {
            etcd_client::Error::GRpcStatus(status) => {
                let message = status.message();
                match status.code() {
                    Code::InvalidArgument | Code::Unauthenticated
                        if message.contains("user name is empty") =>
                    {
                        crate::wording::password_missing(&self.endpoint(), "", &[])
                    }
                    Code::InvalidArgument | Code::Unauthenticated
                        if message.contains("authentication failed") =>
                    {
                        let user = crate::wording::user_in(display).unwrap_or_default();
                        crate::wording::password_refused(&self.endpoint(), user, &[])
                    }
                    Code::InvalidArgument | Code::Unauthenticated
                        if message.contains("auth token") =>
                    {
                        Error::Permission(format!(
                            "{display} refused authentication: {message} (user in the URL, password in the URL, \
                             DLOCK_PASSWORD or password_file)"
                        ))
                    }
                    Code::FailedPrecondition if message.contains("authentication is not enabled") => {
                        Error::Permission(format!("{display}: a user was given but etcd has authentication off"))
                    }
                    Code::PermissionDenied => Error::Permission(format!(
                        "{display}: permission denied (the etcd role needs read/write on the lock prefix): {message}"
                    )),
                    Code::ResourceExhausted => Error::Unavailable(format!(
                        "{display} is out of space (NOSPACE alarm): compact, defragment, then disarm the alarm: {message}"
                    )),
                    // A server that demands a client certificate closes the connection right
                    // after the handshake; tonic reports that as cancelled or as a bare
                    // "transport error".
                    Code::Cancelled | Code::Unknown
                        if self.tls
                            && !self.has_client_cert
                            && (message.contains("canceled") || message.contains("transport error")) =>
                    {
                        Error::Config(format!(
                        "{display} closed the TLS connection; it may require a client certificate \
                         (cert_file/key_file in the [etcd] table): {message}"
                        ))
                    }
                    _ => Error::Unavailable(format!("cannot use {display}: {message}")),
                }
            }
            etcd_client::Error::TransportError(_)
                if text.contains("Keys") || text.contains("key") =>
            {
                Error::Config(format!("cannot set up TLS for {display}: {text}"))
            }
            _ => Error::Unavailable(format!(
                "cannot reach {display}: {}",
                crate::kit::error_text::without_os_error_numbers(&text)
            )),
        }
    }
}

/// An error and all its causes, for matching a cause's words.
fn describe_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Worth trying another endpoint: the transport, not the request, failed.
pub(super) fn is_transport(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Internal
            ) || (status.code() == Code::Cancelled
                && status.message().contains("operation was canceled"))
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => !is_tls_error(e),
        _ => false,
    }
}

/// Whether connecting failed because the server closed or reset the connection during the
/// TLS handshake, as a plain-text server does on a ClientHello: tonic's connect error says
/// "tls handshake eof", or carries the reset (seen only in its debug form).
fn plain_text_at_handshake(e: &etcd_client::Error) -> bool {
    let text = format!("{e} {e:?}");
    text.contains("ConnectError(")
        && (text.contains("tls handshake eof") || text.contains("ConnectionReset"))
}

fn is_tls_error(e: &etcd_client::Error) -> bool {
    if crate::error::caused_by_tls(e) {
        return true;
    }
    let text = format!("{e} {e:?}");
    text.contains("invalid peer certificate")
        || text.contains("UnknownIssuer")
        || text.contains("InvalidCertificate")
}

/// etcd's answer for a lease it does not have (expired, or revoked first): "requested lease
/// not found", which reaches us only as the error's text.
pub(super) fn lease_not_found(e: &Error) -> bool {
    e.to_string().contains("not found")
}
