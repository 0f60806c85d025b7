//! Opening a connection: every server of the URL with the credentials of the URL or the
//! environment, within the server's time to answer; a server too old for per-key TTLs
//! refused; the bucket found, or created with the settings a lock needs.

use std::time::Duration;

use async_nats::jetstream::{self, context, stream};

use super::{MARKER_TTL, SERVER};
use crate::backend::nats::target::NatsTarget;
use crate::error::Error;
use crate::kit::timeouts::{CONNECT_TIMEOUT, OP_TIMEOUT};

/// The oldest server with per-key TTLs (`allow_msg_ttl`, `Nats-TTL`).
const LEAST_VERSION: (u64, u64) = (2, 11);

/// Why no connection was made: worth another try within `--wait` (nothing answered, or
/// nothing yet), or not (another kind of server, credentials, settings).
#[derive(Debug)]
pub(in crate::backend::nats) enum Unreached {
    Again(Error),
    Final(Error),
}

impl Unreached {
    pub(in crate::backend::nats) fn into_error(self) -> Error {
        match self {
            Unreached::Again(e) | Unreached::Final(e) => e,
        }
    }
}

impl From<Error> for Unreached {
    fn from(e: Error) -> Unreached {
        Unreached::Final(e)
    }
}

/// Connect to the first server that answers, with the URL's or the environment's
/// credentials.
pub(super) async fn connect(
    target: &NatsTarget,
    display: &str,
) -> Result<async_nats::Client, Unreached> {
    crate::kit::tls::install_tls_provider();
    let mut options = async_nats::ConnectOptions::new()
        .name("dlock")
        .connection_timeout(CONNECT_TIMEOUT)
        .request_timeout(Some(OP_TIMEOUT));
    if target.servers.len() == 1 {
        // A server that has not failed yet is tried at once: the client's own choice waits a
        // timer tick (up to 1 ms) even before its first attempt. Once every server has
        // failed, the client's growing pauses apply. (With several servers in the URL the
        // client's own choice stays: a first attempt the callback chose that fails ends the
        // connect, where the client's would try the next server.)
        options = options.reconnect_to_server_callback(|servers, _| async move {
            servers
                .iter()
                .find(|server| server.failed_attempts == 0)
                .map(|server| async_nats::ReconnectToServer {
                    addr: server.addr.clone(),
                    delay: Some(Duration::ZERO),
                })
        });
    }
    if target.tls {
        options = options.require_tls(true);
    }
    if let Some(ca) = &target.tls_files.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&target.tls_files.cert_file, &target.tls_files.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if let Some(user) = &target.user {
        let password = target
            .password
            .as_ref()
            .map(|p| p.expose().to_owned())
            .unwrap_or_default();
        options = options.user_and_password(user.clone(), password);
    }
    if let Some(creds) = &target.creds {
        options = options.credentials_file(creds).await.map_err(|e| {
            Unreached::Final(Error::Config(format!(
                "NATS_CREDS {}: {}",
                creds.display(),
                crate::kit::error_text::io_words(&e)
            )))
        })?;
    }
    if let Some(nkey) = &target.nkey {
        let seed = crate::files::read_small_file(nkey, 4096)
            .map_err(|e| Error::Config(format!("NATS_NKEY {}: {e}", nkey.display())))?;
        options = options.nkey(seed.trim().to_owned());
    }
    let scheme = if target.tls { "tls" } else { "nats" };
    let servers: Vec<async_nats::ServerAddr> = target
        .servers
        .iter()
        .filter_map(|(host, port)| {
            crate::kit::url::join_host_port(host, *port)
                .parse::<async_nats::ServerAddr>()
                .ok()
                .or_else(|| {
                    format!(
                        "{scheme}://{}",
                        crate::kit::url::join_host_port(host, *port)
                    )
                    .parse()
                    .ok()
                })
        })
        .collect();
    // A server of another kind may keep the connection open and never greet: it is asked
    // what it is while the client waits for the greeting.
    let other = async {
        let (host, port) = target.servers.first()?;
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        crate::sniff::other_server(host, *port, deadline, &crate::backend::nats::kind::KIND).await
    };
    let other = async {
        match other.await {
            Some(what) => what,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        connected = options.connect(servers) => match connected {
            Ok(client) => Ok(client),
            Err(e) => Err(connect_error(target, display, &e).await),
        },
        what = other => Err(Unreached::Final(not_nats(target, what))),
    }
}

/// The refusal of a URL at another kind of server.
fn not_nats(target: &NatsTarget, what: &str) -> Error {
    let (host, port) = target.servers.first().cloned().unwrap_or_default();
    crate::wording::not_a(
        &crate::kit::url::join_host_port(&host, port),
        &SERVER,
        &format!("it answers like {what}"),
    )
}

/// What a failed connection means, in dlock's words.
async fn connect_error(
    target: &NatsTarget,
    display: &str,
    e: &async_nats::ConnectError,
) -> Unreached {
    use async_nats::ConnectErrorKind as Kind;
    let text = crate::kit::error_text::chain_text(e);
    match e.kind() {
        Kind::Authentication | Kind::AuthorizationViolation => {
            Unreached::Final(Error::Permission(format!(
                "{display}: the server refused the credentials (authorization violation); give \
                 them in the URL (user:password@), NATS_CREDS or NATS_NKEY"
            )))
        }
        // rustls's refusal of the server's certificate comes as an I/O error.
        _ if matches!(e.kind(), Kind::Tls) || text.contains("certificate") => {
            Unreached::Final(Error::Config(format!(
                "TLS with {display} failed: {text} (NATS_CA names the CA to trust)"
            )))
        }
        _ if crate::wording::refused_in(e) || text.contains("onnection refused") => {
            Unreached::Again(crate::wording::connection_refused(display, &SERVER))
        }
        _ => {
            if let Some((host, port)) = target.servers.first() {
                let budget = crate::sniff::AFTER_FAILURE;
                let kind = &crate::backend::nats::kind::KIND;
                if let Some(what) = crate::sniff::other_than(host, *port, budget, kind).await {
                    return Unreached::Final(not_nats(target, what));
                }
            }
            Unreached::Again(Error::Unavailable(format!(
                "cannot connect to {display}: {text}"
            )))
        }
    }
}

/// Refuse a server without per-key TTLs (78, naming its version).
pub(super) fn check_version(display: &str, version: &str) -> Result<(), Error> {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < LEAST_VERSION {
        return Err(Error::Config(format!(
            "{display}: the NATS server is {version}; dlock needs {}.{} or newer (per-key \
             TTLs: the lease of a lock)",
            LEAST_VERSION.0, LEAST_VERSION.1
        )));
    }
    Ok(())
}

/// The bucket's stream: found, or created with the settings a lock needs (`create`), or
/// `None`. A bucket without per-key TTLs or expiry markers is refused (78, naming the
/// setting).
pub(super) async fn bucket(
    js: &jetstream::Context,
    target: &NatsTarget,
    display: &str,
    create: bool,
) -> Result<Option<stream::Stream>, Error> {
    let name = format!("KV_{}", target.bucket);
    let stream = match js.get_stream(&name).await {
        Ok(stream) => stream,
        Err(e) if is_not_found(&e) => {
            if !create {
                return Ok(None);
            }
            match js.create_stream(bucket_config(target)).await {
                Ok(stream) => stream,
                // Another client created it meanwhile.
                Err(_) => js
                    .get_stream(&name)
                    .await
                    .map_err(|e| jetstream_error(display, &e))?,
            }
        }
        Err(e) => return Err(jetstream_error(display, &e)),
    };
    let config = &stream.cached_info().config;
    if !config.allow_message_ttl {
        return Err(Error::Config(format!(
            "{display}: the bucket '{}' does not allow per-key TTLs, which are the lease of a \
             lock: recreate it with allow_msg_ttl (nats kv add {} --marker-ttl 1m), or name \
             another bucket and dlock creates it",
            target.bucket, target.bucket
        )));
    }
    if config.subject_delete_marker_ttl.is_none() {
        return Err(Error::Config(format!(
            "{display}: the bucket '{}' leaves no marker when a key expires \
             (subject_delete_marker_ttl), so waiters would not see a dead holder's key go: \
             recreate it with nats kv add {} --marker-ttl 1m, or name another bucket",
            target.bucket, target.bucket
        )));
    }
    Ok(Some(stream))
}

/// A bucket as dlock creates it: history 1, per-key TTLs, markers of expired keys, the
/// URL's replicas, and its first revision the clock in µs (see the module doc, tokens).
fn bucket_config(target: &NatsTarget) -> stream::Config {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2));
    stream::Config {
        name: format!("KV_{}", target.bucket),
        description: Some("dlock's locks (dlock run --url nats://…)".into()),
        subjects: vec![format!("$KV.{}.>", target.bucket)],
        max_messages_per_subject: 1,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        num_replicas: target.replicas,
        discard: stream::DiscardPolicy::New,
        allow_message_ttl: true,
        subject_delete_marker_ttl: Some(MARKER_TTL),
        first_sequence: Some(now_us.max(1)),
        ..Default::default()
    }
}

fn is_not_found(e: &context::GetStreamError) -> bool {
    matches!(e.kind(), context::GetStreamErrorKind::JetStream(js)
        if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// A JetStream request that failed: JetStream not enabled (78), else 69.
fn jetstream_error(display: &str, e: &context::GetStreamError) -> Error {
    let text = crate::kit::error_text::chain_text(e);
    if text.contains("no responders") {
        return Error::Config(format!(
            "{display}: JetStream is not enabled on the server (start nats-server with -js)"
        ));
    }
    if text.contains("ermission") || text.contains("uthorization") {
        return Error::Permission(format!("{display}: {text}"));
    }
    Error::Unavailable(format!("{display}: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_before_2_11_are_refused_naming_their_version() {
        assert!(check_version("n", "2.11.0").is_ok());
        assert!(check_version("n", "2.15.1").is_ok());
        assert!(check_version("n", "3.0.0").is_ok());
        let Err(Error::Config(said)) = check_version("n", "2.10.22") else {
            panic!()
        };
        assert!(said.contains("2.10.22") && said.contains("2.11"), "{said}");
    }
}
