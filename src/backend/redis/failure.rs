//! What a failed call means: the kinds of failure a call on a [`super::conn::Conn`] can end
//! with, and the mapping of redis-rs errors to dlock's error kinds (exit statuses), a Redis
//! Cluster's own errors included (a migration or failover under way, a cluster that is down).

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::Error;
use crate::wording::Server;

/// Why a call failed.
pub(super) enum Failure {
    Redis(RedisError),
    Timeout(Duration),
    /// What the cluster said makes the request impossible (not a cluster, no such node).
    Refused(Error),
    /// Behind Sentinel: no usable master could be located (already classified).
    Sentinel(Error),
}

impl Failure {
    /// Worth another attempt (the connection, not the request, was the problem).
    pub(super) fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => {
                e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || in_transition(e)
            }
            Failure::Refused(_) => false,
            Failure::Sentinel(e) => matches!(e, Error::Unavailable(_)),
        }
    }

    /// A Redis Cluster in the middle of a slot migration or a failover (`TRYAGAIN`,
    /// `CLUSTERDOWN`, redirections back and forth): the cluster answers, and the same request
    /// gets through once it settles.
    pub(super) fn is_settling(&self) -> bool {
        match self {
            Failure::Redis(e) => {
                in_transition(e)
                    || matches!(
                        e.kind(),
                        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
                    )
            }
            _ => false,
        }
    }

    /// The call got no answer in time (ours or the client's timeout).
    pub(super) fn is_timeout(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => e.is_timeout(),
            Failure::Refused(_) | Failure::Sentinel(_) => false,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Failure::Timeout(d) => format!("no answer within {}", humantime::format_duration(*d)),
            Failure::Redis(e) => e.to_string(),
            Failure::Refused(e) | Failure::Sentinel(e) => e.to_string(),
        }
    }

    pub(super) fn into_error(self, display: &str) -> Error {
        match self {
            Failure::Timeout(d) => Error::Unavailable(format!(
                "{display} did not answer within {}",
                humantime::format_duration(d)
            )),
            Failure::Redis(e) => classify(&e, display),
            Failure::Refused(e) | Failure::Sentinel(e) => e,
        }
    }
}

/// Map a redis-rs error to dlock's error kinds (exit statuses).
pub(super) fn classify(e: &RedisError, display: &str) -> Error {
    let code = e.code().unwrap_or_default();
    let detail = e.detail().unwrap_or_default();
    let text = e.to_string();
    if text.contains("max number of clients reached") {
        return crate::kit::capacity::refused(display, "Redis maxclients", &text);
    }
    // A server that wants a password closes unauthenticated connections that send scripts
    // ("Protocol error: unauthenticated multibulk length").
    let endpoint = crate::wording::endpoint_of(display, server_of(display).port);
    let user = crate::wording::user_in(display).unwrap_or("default");
    if text.contains("without any password configured") {
        return Error::Permission(format!(
            "{endpoint} has no password set for user '{user}', and one was given: remove it from \
             the URL, DLOCK_PASSWORD or password_file"
        ));
    }
    if code == "NOAUTH" || text.contains("unauthenticated") {
        return crate::wording::password_missing(&endpoint, user, &[]);
    }
    if e.kind() == ErrorKind::AuthenticationFailed || code == "WRONGPASS" {
        return crate::wording::password_refused(&endpoint, user, &[]);
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
    if let Some(error) = cluster_error(e, display) {
        return error;
    }
    if e.is_connection_refusal() || crate::wording::refused_in(e) {
        return refused(display);
    }
    // An HTTP/2 server (etcd) resets a connection whose first bytes are a Redis command.
    if e.kind() == ErrorKind::Io && text.contains("reset by peer") {
        let tls_hint = if display.starts_with("redis:") {
            "; if the server speaks TLS only, use rediss://"
        } else {
            ""
        };
        return crate::wording::not_a(
            display,
            server_of(display),
            &format!("it reset the connection at the first command{tls_hint}"),
        );
    }
    if is_tls_error(e) {
        return Error::Config(format!("TLS with {display} failed: {text}"));
    }
    if e.kind() == ErrorKind::InvalidClientConfig {
        return Error::Config(format!("cannot set up the connection to {display}: {text}"));
    }
    if e.is_connection_refusal() || e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return Error::Unavailable(format!(
            "cannot reach {display}: {}",
            crate::kit::error_text::without_os_error_numbers(&text)
        ));
    }
    if e.kind() == ErrorKind::Parse || text.contains("Parse error") {
        return crate::wording::not_a(
            display,
            server_of(display),
            "it did not answer in the Redis protocol",
        );
    }
    if text.contains("refused to switch database") {
        return crate::wording::no_database(
            &endpoint,
            &database_in(display),
            " (its `databases` setting, 16 as shipped, numbers them from 0): choose one in the \
             URL (redis://HOST:PORT/N)",
        );
    }
    if text.contains("user_script") {
        return Error::Internal(format!("a dlock script failed on {display}: {text}"));
    }
    Error::Unavailable(format!("{display}: {text}"))
}

/// The database a Redis URL (as shown) selects: its path (`/2`) or `db=` (`?db=2`).
fn database_in(display: &str) -> String {
    let rest = display.split_once("://").map_or(display, |(_, rest)| rest);
    let (before, query) = rest.split_once('?').unwrap_or((rest, ""));
    let from_query = query
        .split(['&', '#'])
        .find_map(|pair| pair.strip_prefix("db="));
    let socket = display.contains("unix:");
    let from_path = Some(before)
        .filter(|_| !socket)
        .and_then(|before| before.split_once('/'))
        .map(|(_, path)| path.split('#').next().unwrap_or(path))
        .filter(|path| !path.is_empty() && !path.contains('/'));
    from_query.or(from_path).unwrap_or("0").to_owned()
}

fn is_tls_error(e: &RedisError) -> bool {
    crate::error::caused_by_tls(e)
}

/// A migration or a failover is under way: the same request may succeed in a moment.
pub(super) fn in_transition(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown
        )
    )
}

/// The errors of a Redis Cluster, as dlock's error kinds; `None` for the others.
fn cluster_error(e: &RedisError, display: &str) -> Option<Error> {
    let text = e.to_string();
    Some(match e.kind() {
        ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown) => {
            Error::Unavailable(format!(
                "{display}: the Redis Cluster cannot serve this lock now ({text}); check `dlock \
                 check` for slots without a master, or wait for the failover to finish"
            ))
        }
        ErrorKind::Server(ServerErrorKind::TryAgain) => Error::Unavailable(format!(
            "{display}: the lock's slot is still being migrated ({text}); try again"
        )),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
            Error::Unavailable(format!(
                "{display}: the Redis Cluster kept redirecting ({text}); its slot table is changing, try again"
            ))
        }
        ErrorKind::Server(ServerErrorKind::CrossSlot) => {
            Error::Internal(format!("{display}: a dlock call spanned two slots: {text}"))
        }
        _ if text.contains("SELECT is not allowed in cluster mode") => Error::Usage(format!(
            "{display}: a Redis Cluster has only database 0; remove the /N from the URL"
        )),
        _ => return None,
    })
}

/// How messages name a Redis server, and the port a URL without one reaches.
pub(super) const SERVER: Server = Server {
    listening: "Redis server",
    name: "Redis",
    port: 6379,
};

/// The same for the sentinels a `redis-sentinel://` URL names.
pub(super) const SENTINEL: Server = Server {
    listening: "sentinel",
    name: "Redis Sentinel",
    port: 26379,
};

/// Nothing listens where `display` (a URL as shown) points: for a `redis-sentinel://` URL,
/// none of its sentinels answered.
pub(super) fn refused(display: &str) -> Error {
    if names_sentinels(display) {
        return Error::Unavailable(format!(
            "cannot connect to {}: connection refused (no sentinel answered: none is \
             listening there)",
            crate::wording::endpoint_of(display, SENTINEL.port)
        ));
    }
    crate::wording::connection_refused(display, &SERVER)
}

/// The words for the servers `display` (a URL as shown) names: Redis, or its sentinels.
pub(super) fn server_of(display: &str) -> &'static Server {
    if names_sentinels(display) {
        &SENTINEL
    } else {
        &SERVER
    }
}

/// Whether `display` is a `redis-sentinel://` URL (its hosts are sentinels).
fn names_sentinels(display: &str) -> bool {
    display.starts_with("redis-sentinel:") || display.starts_with("rediss-sentinel:")
}
