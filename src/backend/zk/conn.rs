//! Reaching the ensemble: opening a session bounded by `--wait`, bounding every request,
//! closing the session, mapping the client's errors to dlock's exit classes, and asking a
//! member for its version with the `srvr` four-letter word (for `check`).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use zookeeper_client::{self as zk, Client};

use super::ZkBackend;
use crate::budget::WaitBudget;
use crate::error::Error;
use crate::kit::capacity;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::kit::url::join_host_port;
use crate::wording::Server;

/// How messages name a ZooKeeper server, and the port a URL without one reaches.
pub(super) const SERVER: Server = Server {
    listening: "ZooKeeper server",
    name: "ZooKeeper",
    port: 2181,
};

/// Bound for closing the session after a release or a cancel.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// This process was turned away for capacity (a process talks to one ensemble).
static REFUSED_FOR_CAPACITY: AtomicBool = AtomicBool::new(false);
/// How long a connection that tells a full server from a down one waits to be closed. The
/// kernel completes the connection before the server accepts it, so a busy server closes it
/// late; this is only spent when connecting failed.
const CAPACITY_PROBE: Duration = Duration::from_secs(1);

impl ZkBackend {
    /// `h1:p1,[v6]:p2/chroot`, without credentials.
    pub(super) fn connect_string(&self) -> String {
        let hosts: Vec<String> = self
            .target
            .endpoints
            .iter()
            .map(|(host, port)| join_host_port(host, *port))
            .collect();
        format!(
            "{}{}",
            hosts.join(","),
            self.target.chroot.as_deref().unwrap_or("")
        )
    }

    /// The URL's members, for messages: `HOST:PORT[,HOST:PORT…]`.
    fn endpoint(&self) -> String {
        self.target
            .endpoints
            .iter()
            .map(|(host, port)| join_host_port(host, *port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Open a session, bounded by [`OP_TIMEOUT`].
    pub(super) async fn connect(&self, session_timeout: Duration) -> Result<Client, Error> {
        self.connect_by(session_timeout, None).await
    }

    /// Open a session, bounded by [`OP_TIMEOUT`] and by an acquisition's time to answer, if
    /// any.
    pub(super) async fn connect_by(
        &self,
        session_timeout: Duration,
        wait: Option<&WaitBudget>,
    ) -> Result<Client, Error> {
        let budget = wait.map_or(OP_TIMEOUT, |w| w.call_limit(OP_TIMEOUT));
        let mut connector = Client::connector()
            .with_session_timeout(session_timeout)
            .with_fail_eagerly();
        if let (Some(user), Some(password)) = (&self.target.user, &self.target.password) {
            connector =
                connector.with_auth("digest", format!("{user}:{}", password.expose()).as_bytes());
        }
        let deadline = tokio::time::Instant::now() + budget;
        let connect_string = self.connect_string();
        let connecting = tokio::time::timeout(budget, connector.connect(&connect_string));
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
        match connected {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(zk::Error::NoHosts)) if self.over_capacity().await => Err(capacity::refused(
                &self.display,
                "ZooKeeper maxClientCnxns (connections per client address, 60 as shipped)",
                "it closed the connection at once",
            )),
            Ok(Err(zk::Error::NoHosts)) if self.all_refuse().await => {
                Err(crate::wording::connection_refused(&self.display, &SERVER))
            }
            Ok(Err(zk::Error::NoHosts)) => match self.not_zookeeper(deadline).await {
                Some(other) => Err(other),
                None => Err(self.classify(&zk::Error::NoHosts, "connecting")),
            },
            Ok(Err(e)) => Err(self.classify(&e, "connecting")),
            Err(_) => match wait.filter(|_| budget < OP_TIMEOUT) {
                Some(wait) => Err(self.no_answer(wait)),
                None => Err(crate::wording::no_answer_in(&self.display, OP_TIMEOUT)),
            },
        }
    }

    /// Whether a member of the ensemble turns connections away for capacity: a server over
    /// `maxClientCnxns` closes (resets) a connection the moment it accepts it, before reading
    /// anything, which the client only reports as "no available hosts". A member that is down
    /// refuses the connection, and one that is not serving (no quorum) waits for the request
    /// first; both are unavailable, not full, unless this process was turned away for
    /// capacity before (the slot freed between the attempt and the probe).
    async fn over_capacity(&self) -> bool {
        use std::io::ErrorKind;
        use tokio::io::AsyncReadExt;
        for (host, port) in &self.target.endpoints {
            let probe = async {
                let mut stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                let mut byte = [0u8; 1];
                stream.read(&mut byte).await
            };
            let probed = tokio::time::timeout(CAPACITY_PROBE, probe).await;
            tracing::debug!("capacity probe of {host}:{port}: {probed:?}");
            match probed {
                Ok(Ok(0)) => {
                    REFUSED_FOR_CAPACITY.store(true, Ordering::Relaxed);
                    return true;
                }
                Ok(Err(e))
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset
                            | ErrorKind::ConnectionAborted
                            | ErrorKind::BrokenPipe
                            | ErrorKind::UnexpectedEof
                    ) =>
                {
                    REFUSED_FOR_CAPACITY.store(true, Ordering::Relaxed);
                    return true;
                }
                // It accepts now; if it turned us away for capacity before, a slot was freed
                // between our attempt and the probe: try again.
                Err(_) if REFUSED_FOR_CAPACITY.load(Ordering::Relaxed) => return true,
                _ => {}
            }
        }
        false
    }

    /// What other kind of server than ZooKeeper answers at the first member's address, asked
    /// while the session is slow to start ([`crate::sniff::other_server`]).
    async fn other_server(&self, deadline: tokio::time::Instant) -> Option<&'static str> {
        let (host, port) = self.target.endpoints.first()?;
        crate::sniff::other_server(host, *port, deadline, &super::kind::KIND).await
    }

    /// Every member closed the connection at the session's request, as a server of another
    /// kind does: when another kind of server answers at the first member's address (within
    /// what is left before `deadline`), that is the message.
    async fn not_zookeeper(&self, deadline: tokio::time::Instant) -> Option<Error> {
        let (host, port) = self.target.endpoints.first()?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let what = crate::sniff::other_than(host, *port, left, &super::kind::KIND).await?;
        Some(crate::wording::not_a(
            &join_host_port(host, *port),
            &SERVER,
            &format!("it answers like {what}"),
        ))
    }

    /// Whether every member refuses a TCP connection: the client says only "no available
    /// hosts", the same words as for a server that is full or does not speak ZooKeeper.
    async fn all_refuse(&self) -> bool {
        for (host, port) in &self.target.endpoints {
            let connect = tokio::net::TcpStream::connect((host.as_str(), *port));
            match tokio::time::timeout(CAPACITY_PROBE, connect).await {
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                _ => return false,
            }
        }
        true
    }

    /// The error for a server that did not answer within an acquisition's time to answer.
    pub(super) fn no_answer(&self, wait: &WaitBudget) -> Error {
        crate::wording::no_answer(&self.display, None, wait)
    }

    /// Map a client error to dlock's error kinds (exit statuses); `what` names the operation.
    pub(super) fn classify(&self, e: &zk::Error, what: &str) -> Error {
        let display = &self.display;
        match e {
            zk::Error::NoAuth | zk::Error::AuthFailed => {
                let endpoint = self.endpoint();
                // ZooKeeper takes any digest credentials; the nodes' ACLs then let a user in
                // or not.
                let refused = match &self.target.user {
                    None => crate::wording::password_missing(&endpoint, "", &[]),
                    Some(user) => crate::wording::password_refused(&endpoint, user, &[]),
                };
                Error::Permission(format!(
                    "{refused} (ZooKeeper checks them against the ACLs of the prefix's nodes; \
                     refused while {what})"
                ))
            }
            zk::Error::InvalidAcl => Error::Config(format!("{display}: {what}: {e}")),
            zk::Error::BadArguments(_) => Error::Usage(format!("{what}: {e}")),
            zk::Error::NoChildrenForEphemerals => Error::Config(format!(
                "{display}: {what}: the prefix is an ephemeral node; choose another --prefix"
            )),
            zk::Error::NotReadOnly => Error::Config(format!(
                "{display} is a read-only server; dlock needs a quorum member"
            )),
            zk::Error::Timeout => Error::Unavailable(format!(
                "{display} did not answer within {} ({what})",
                humantime::format_duration(OP_TIMEOUT)
            )),
            _ => Error::Unavailable(format!("cannot use {display} ({what}): {e}")),
        }
    }
}

/// Await a request, bounded by [`OP_TIMEOUT`].
pub(super) async fn timed<T>(
    request: impl Future<Output = Result<T, zk::Error>>,
) -> Result<T, zk::Error> {
    tokio::time::timeout(OP_TIMEOUT, request)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
}

/// A read while waiting: after a connection loss (a member stopped, a leader election) the
/// client reconnects to another member and the session lives on, so ask again a few times
/// before giving up. An expired session ends this at once (`SessionExpired`).
pub(super) async fn reread<T, F, Fut>(read: F) -> Result<T, zk::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let mut result = timed(read()).await;
    for attempt in 1..=3u64 {
        match result {
            Err(zk::Error::ConnectionLoss | zk::Error::Timeout) => {
                // A moment for the client to reach another member; a pause, not a deadline
                // (each read has its own bound), so a busy machine only makes it later.
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                result = timed(read()).await;
            }
            _ => break,
        }
    }
    result
}

/// Close the session (which also removes any ephemeral node left) and wait, bounded, until
/// the server confirmed it.
pub(super) async fn close(client: Client) {
    let states = client.state_watcher();
    drop(client);
    closed(states).await;
}

/// Wait, bounded, until the session of a dropped client is closed.
pub(super) async fn closed(mut states: zk::StateWatcher) {
    let closed = async {
        while !states.peek_state().is_terminated() {
            states.changed().await;
        }
    };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, closed).await;
}

/// The server version and mode from the `srvr` four-letter word of the first member that
/// answers it (servers only answer it when it is in `4lw.commands.whitelist`).
pub(super) async fn server_info(endpoints: &[(String, u16)]) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for (host, port) in endpoints {
        let ask = async {
            let mut stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            stream.write_all(b"srvr").await?;
            let mut reply = String::new();
            stream.read_to_string(&mut reply).await?;
            Ok::<String, std::io::Error>(reply)
        };
        let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(2), ask).await else {
            continue;
        };
        let field = |key: &str| {
            reply
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
        };
        if let Some(version) = field("Zookeeper version:") {
            // "3.8.0-<git id>, built on …": the release is what matters.
            let version = version
                .split([',', '-'])
                .next()
                .unwrap_or(&version)
                .to_owned();
            let mode = field("Mode:").unwrap_or_else(|| "unknown".into());
            return (version, format!("{mode} ({host}:{port})"));
        }
    }
    let unknown = "unknown (the srvr four-letter word is not whitelisted)".to_owned();
    (unknown.clone(), unknown)
}
