//! What answers at a TCP address, for the message of a client that got no answer in its own
//! protocol, or an answer it could not read: a MySQL URL pointed at a Redis port waits for a
//! greeting that never comes, a Redis client's first command at a ZooKeeper port gets the
//! connection closed. Instead of "no answer within --wait" or "broken pipe", the user reads
//! "HOST:PORT does not look like a MySQL server (it answers like a Redis server)"
//! ([`crate::wording::not_a`]).
//!
//! Each kind of the registry says how its server is told ([`Kind::server`]): the first bytes
//! it answers in a way of its own and how the answer reads, or what it says to anything (a
//! greeting it sends unasked). The sniffer sends each kind's probe once, each on a
//! connection of its own, all at once, and reads every answer with the readers of the kinds
//! that asked for it; the probes that should reach only an HTTP server go last, where no other
//! server was named. It knows only the servers that are no dlock backend (SSH, a plain HTTP
//! server) itself. Bounded by the caller's budget; `None` when nothing tells. The servers read
//! nothing of these as a request to change anything.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::backend::KINDS;
use crate::kind::{Kind, Recognition};

/// How long the answer to one probe may take, from its connection.
const LISTEN: Duration = Duration::from_millis(500);

/// The most of an answer that is read.
const ANSWER_BYTES: usize = 1024;

/// An HTTP/1 server that did not say which server it is.
const HTTP: &str = "an HTTP server";

/// A server that greets with its SSH version.
const SSH: &str = "an SSH server";

/// What kind of server answers at `host:port` ("a Redis server"), if it says so within
/// `budget`.
pub async fn what_answers(host: &str, port: u16, budget: Duration) -> Option<&'static str> {
    tokio::time::timeout(budget, identify(host, port))
        .await
        .ok()
        .flatten()
}

async fn identify(host: &str, port: u16) -> Option<&'static str> {
    let first = ask(host, port, probes(false)).await;
    if first.is_some_and(|what| what != HTTP) {
        return first;
    }
    ask(host, port, probes(true)).await.or(first)
}

/// The servers the registry can tell.
fn servers() -> impl Iterator<Item = &'static Recognition> {
    KINDS.iter().filter_map(|kind| kind.server.as_ref())
}

/// The distinct first bytes of every kind's probes, those sent only after the others
/// (`last`) or the others.
fn probes(last: bool) -> Vec<&'static [u8]> {
    let mut sends: Vec<&'static [u8]> = Vec::new();
    for probe in servers().flat_map(|server| server.probes) {
        if let Some(send) = probe.send {
            if probe.after_others == last && !sends.contains(&send) {
                sends.push(send);
            }
        }
    }
    sends
}

/// Send each of `sends` on a connection of its own, all at once: the first answer that names
/// a server other than a plain HTTP one ends the others (dropping the set aborts them); an
/// HTTP server where nothing else is named.
async fn ask(host: &str, port: u16, sends: Vec<&'static [u8]>) -> Option<&'static str> {
    let mut probes = tokio::task::JoinSet::new();
    for sent in sends {
        let host = host.to_owned();
        probes.spawn(async move {
            let answer = probe(&host, port, sent).await?;
            what_it_tells(sent, &answer)
        });
    }
    let mut seen = None;
    // Bounded: one result per probe, each within LISTEN.
    while let Some(done) = probes.join_next().await {
        match done.ok().flatten() {
            Some(HTTP) => seen = Some(HTTP),
            Some(what) => return Some(what),
            None => {}
        }
    }
    seen
}

/// What `answer`, to `sent`, tells of the server that gave it: an SSH greeting; the readers of
/// the kinds that sent these bytes, in the registry's order; then what a kind's server says
/// to anything; then an HTTP server.
pub(crate) fn what_it_tells(sent: &[u8], answer: &[u8]) -> Option<&'static str> {
    if answer.starts_with(b"SSH-") {
        return Some(SSH);
    }
    let told = |to_anything: bool| {
        servers()
            .find(|server| {
                server.probes.iter().any(|probe| {
                    let asked = match probe.send {
                        Some(send) => !to_anything && send == sent,
                        None => to_anything,
                    };
                    asked && (probe.read)(answer)
                })
            })
            .map(|server| server.called)
    };
    told(false)
        .or_else(|| told(true))
        .or_else(|| answer.starts_with(b"HTTP/").then_some(HTTP))
}

/// What other kind of server than `ours`'s answers at `host:port`, asked while a client's
/// connection attempt is slow to get an answer: after a third of the time left before
/// `deadline` (at most a second), the probes within what is left then. `None` when it
/// answers like `ours` or says nothing: the attempt goes on.
pub async fn other_server(
    host: &str,
    port: u16,
    deadline: tokio::time::Instant,
    ours: &Kind,
) -> Option<&'static str> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    tokio::time::sleep((left / 3).min(Duration::from_secs(1))).await;
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    what_answers(host, port, left)
        .await
        .filter(|what| !is_ours(what, ours))
}

/// What other kind of server than `ours`'s answers at `host:port` within `budget` (at most
/// [`AFTER_FAILURE`]), asked after a client's first exchange failed in a way a server of
/// another kind causes (the connection closed or reset at the first request, an answer that
/// could not be read). `None` when it answers like `ours` or says nothing: the failure is
/// what it said.
pub async fn other_than(
    host: &str,
    port: u16,
    budget: Duration,
    ours: &Kind,
) -> Option<&'static str> {
    what_answers(host, port, budget.min(AFTER_FAILURE))
        .await
        .filter(|what| !is_ours(what, ours))
}

/// Whether `what` answers is the server of `ours`.
fn is_ours(what: &str, ours: &Kind) -> bool {
    ours.server.is_some_and(|server| server.called == what)
}

/// The longest [`other_than`] asks: both rounds of probes.
pub const AFTER_FAILURE: Duration = Duration::from_millis(1200);

/// Send `bytes` on a connection of its own and read what comes back within [`LISTEN`] (up
/// to [`ANSWER_BYTES`]; a server that closes or resets the connection at once has said
/// nothing).
async fn probe(host: &str, port: u16, bytes: &[u8]) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + LISTEN;
    let mut stream = tokio::time::timeout_at(deadline, TcpStream::connect((host, port)))
        .await
        .ok()?
        .ok()?;
    tokio::time::timeout_at(deadline, stream.write_all(bytes))
        .await
        .ok()?
        .ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    // Bounded: each read adds at least a byte, up to ANSWER_BYTES, until the deadline.
    while answer.len() < ANSWER_BYTES {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
        // An HTTP answer is read to its end (etcd names itself in the body); the others
        // tell by their first bytes.
        if !answer.starts_with(b"HTTP/") {
            break;
        }
    }
    (!answer.is_empty()).then_some(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The servers that are no backend, and what no kind claims.
    #[test]
    fn greetings_and_answers_name_the_server() {
        assert_eq!(
            what_it_tells(b"PING\r\n", b"SSH-2.0-OpenSSH_9.2"),
            Some("an SSH server")
        );
        for sent in probes(false).into_iter().chain(probes(true)) {
            assert_eq!(
                what_it_tells(sent, b"HTTP/1.1 404 Not Found\r\n\r\n"),
                Some("an HTTP server")
            );
            assert_eq!(what_it_tells(sent, b""), None);
            assert_eq!(what_it_tells(sent, b"\0\0\0\x10"), None);
        }
    }

    /// Against a listener on a free loopback port that answers only one probe, with its
    /// kind's example answer (or greets with it, for a server that speaks first): for every
    /// kind the registry can tell.
    #[tokio::test]
    async fn a_listener_that_answers_like_a_kind_is_named() {
        for kind in KINDS {
            let Some(server) = kind.server else {
                continue;
            };
            let probe = server.probes[0];
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
                .await
                .expect("bind");
            let port = listener.local_addr().expect("address").port();
            let answering = tokio::spawn(async move {
                // One connection per probe, until the sniffer is done.
                loop {
                    let Ok((mut socket, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(async move {
                        if let Some(send) = probe.send {
                            let mut got = Vec::new();
                            let mut buf = [0u8; 256];
                            // Bounded: each read adds a byte, until the probe is whole or
                            // is another one.
                            while got.len() < send.len() && send.starts_with(&got) {
                                match socket.read(&mut buf).await {
                                    Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                                    _ => return,
                                }
                            }
                            if got != send {
                                return;
                            }
                        }
                        let _ = socket.write_all(probe.example).await;
                    });
                }
            });
            let what = what_answers("127.0.0.1", port, Duration::from_secs(5)).await;
            answering.abort();
            assert_eq!(what, Some(server.called), "{}", kind.name);
        }
    }
}
