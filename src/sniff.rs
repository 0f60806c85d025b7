//! What answers at a TCP address, for the message of a client that got no answer in its own
//! protocol: a MySQL URL pointed at a Redis port waits for a greeting that never comes, a
//! PostgreSQL or ZooKeeper client's first packet gets no reply. Instead of "no answer within
//! --wait", the user reads "HOST:PORT does not look like a MySQL server (it answers like a
//! Redis server)" ([`crate::wording::not_a`]).
//!
//! One connection, read-only at first: a greeting the server sends unasked (MySQL, SSH) is
//! read; else one `PING\r\n`, which Redis, memcached, HTTP and PostgreSQL servers each answer
//! in a way of their own. Bounded by the caller's budget; `None` when nothing tells.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a greeting, and then the answer to the probe, may take.
const LISTEN: Duration = Duration::from_millis(300);

/// What kind of server answers at `host:port` ("a Redis server"), if it says so within
/// `budget`.
pub async fn what_answers(host: &str, port: u16, budget: Duration) -> Option<&'static str> {
    tokio::time::timeout(budget, probe(host, port))
        .await
        .ok()
        .flatten()
}

/// What other kind of server than `ours` ("a MySQL server") answers at `host:port`, asked
/// while a client's connection attempt is slow to get an answer: after a third of the time
/// left before `deadline` (at most a second), one probe within what is left then. `None`
/// when it answers like `ours` or says nothing: the attempt goes on.
pub async fn other_server(
    host: &str,
    port: u16,
    deadline: tokio::time::Instant,
    ours: &str,
) -> Option<&'static str> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    tokio::time::sleep((left / 3).min(Duration::from_secs(1))).await;
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    what_answers(host, port, left)
        .await
        .filter(|what| *what != ours)
}

async fn probe(host: &str, port: u16) -> Option<&'static str> {
    let mut stream = TcpStream::connect((host, port)).await.ok()?;
    let mut buf = [0u8; 64];
    if let Ok(Ok(n)) = tokio::time::timeout(LISTEN, stream.read(&mut buf)).await {
        // Spoke first, or closed at once (n = 0: nothing to tell).
        return greeting(&buf[..n]);
    }
    stream.write_all(b"PING\r\n").await.ok()?;
    match tokio::time::timeout(LISTEN, stream.read(&mut buf)).await {
        Ok(Ok(n)) => answer(&buf[..n]),
        _ => None,
    }
}

/// A server that speaks first, by its greeting.
fn greeting(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"SSH-") {
        return Some("an SSH server");
    }
    // A MySQL/MariaDB handshake packet: 3-byte length, sequence 0, protocol version 10.
    if bytes.len() > 4 && bytes[3] == 0 && bytes[4] == 10 {
        return Some("a MySQL server");
    }
    None
}

/// A server that waits for the client, by its answer to `PING\r\n`.
fn answer(bytes: &[u8]) -> Option<&'static str> {
    let redis: [&[u8]; 4] = [b"+PONG", b"-NOAUTH", b"-ERR", b"-DENIED"];
    if redis.iter().any(|start| bytes.starts_with(start)) {
        return Some("a Redis server");
    }
    if bytes.starts_with(b"ERROR") || bytes.starts_with(b"CLIENT_ERROR") {
        return Some("a memcached server");
    }
    if bytes.starts_with(b"HTTP/") {
        return Some("an HTTP server");
    }
    // PostgreSQL reads the probe as a startup packet of absurd length and says so in an
    // ErrorResponse ('E', then a 4-byte length, then fields starting with 'S').
    if bytes.len() > 5 && bytes[0] == b'E' && bytes[5] == b'S' {
        return Some("a PostgreSQL server");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_and_answers_name_the_server() {
        assert_eq!(greeting(b"SSH-2.0-OpenSSH_9.2"), Some("an SSH server"));
        assert_eq!(
            greeting(&[0x4a, 0, 0, 0, 10, b'8', b'.']),
            Some("a MySQL server")
        );
        assert_eq!(greeting(b""), None);
        assert_eq!(answer(b"+PONG\r\n"), Some("a Redis server"));
        assert_eq!(
            answer(b"-NOAUTH Authentication required.\r\n"),
            Some("a Redis server")
        );
        assert_eq!(answer(b"ERROR\r\n"), Some("a memcached server"));
        assert_eq!(
            answer(b"HTTP/1.1 400 Bad Request\r\n"),
            Some("an HTTP server")
        );
        assert_eq!(answer(b"E\0\0\0\x5aSFATAL\0"), Some("a PostgreSQL server"));
        assert_eq!(answer(b"\0\0\0\x10"), None);
    }

    /// Against a listener that answers like Redis, on a free loopback port.
    #[tokio::test]
    async fn a_redis_like_listener_is_named() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 16];
            let n = socket.read(&mut buf).await.expect("read");
            assert_eq!(&buf[..n], b"PING\r\n");
            socket.write_all(b"+PONG\r\n").await.expect("write");
        });
        let what = what_answers("127.0.0.1", port, Duration::from_secs(5)).await;
        assert_eq!(what, Some("a Redis server"));
        server.await.expect("server");
    }
}
