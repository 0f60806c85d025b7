//! A small client for memcached's meta text protocol (memcached ≥ 1.6): one connection over
//! TCP or a Unix socket, requests written whole (several at once when pipelined), replies
//! read line by line, every exchange bounded in time.
//!
//! It speaks only what dlock needs: `ms`, `mg`, `md` with their flags, `stats`, and
//! `lru_crawler metadump`. A failed exchange leaves the connection in an unknown state, so it
//! is dropped and the next call connects afresh ([`Conn::ensure`]). A fresh connection also
//! matters for correctness: CAS values are only meaningful on a connection that has lived
//! through no server restart (see `lease.rs`), and a restart closes every connection.

use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};

use crate::kit::timeouts::CONNECT_TIMEOUT;
use crate::wording::Server;

use super::target::McAddr;

mod failure;
mod stream;

pub(super) use self::failure::Failure;
use self::failure::{unexpected, UNAUTHENTICATED};
use self::stream::{speaks_binary, Stream};

/// How messages name a memcached server, and the port a URL without one reaches.
pub(super) const SERVER: Server = Server {
    listening: "memcached",
    name: "memcached",
    port: super::target::DEFAULT_PORT,
};

/// Bound for asking a server that closed the connection at dlock's first request whether it
/// speaks only the binary protocol: one loopback-or-LAN round trip on a fresh connection, and
/// only after the real request already failed, so a short fixed bound costs nothing else.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// A memcached started with `-B binary` waits for a 24-byte binary header and closes the
/// connection when the first byte is not the binary magic. The first request on a connection
/// is padded to this length with `mn` no-ops, so such a server closes at once instead of
/// leaving dlock waiting for an answer that never comes.
const BINARY_HEADER: usize = 24;
/// The longest reply line or value accepted (items dlock writes are a few hundred bytes).
const MAX_REPLY: usize = 1 << 20;
/// The longest key listing accepted (`lru_crawler metadump`, about 100 bytes per item).
const MAX_LISTING: usize = 256 << 20;

/// One meta reply: the return code and its flags, and the value for `VA`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Reply {
    /// `HD`, `VA`, `EN`, `NS`, `EX`, `NF`.
    pub(super) code: String,
    pub(super) flags: Vec<String>,
    pub(super) value: Option<Vec<u8>>,
}

impl Reply {
    /// The returned flag `c` (`c123` → "123"), if present.
    pub(super) fn flag(&self, c: char) -> Option<&str> {
        self.flags.iter().find_map(|f| f.strip_prefix(c))
    }

    /// The CAS value (`c` flag).
    pub(super) fn cas(&self) -> Option<u64> {
        self.flag('c').and_then(|c| c.parse().ok())
    }

    pub(super) fn is(&self, code: &str) -> bool {
        self.code == code
    }
}

/// `ms <key> <len> <flags>` and the value.
pub(super) fn ms(key: &str, flags: &str, value: &[u8]) -> Vec<u8> {
    let mut out = format!("ms {key} {} {flags}\r\n", value.len()).into_bytes();
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    out
}

/// `mg <key> <flags>`.
pub(super) fn mg(key: &str, flags: &str) -> Vec<u8> {
    format!("mg {key} {flags}\r\n").into_bytes()
}

/// `md <key> <flags>`.
pub(super) fn md(key: &str, flags: &str) -> Vec<u8> {
    format!("md {key} {flags}\r\n").into_bytes()
}

/// One connection to one memcached server, reconnected after a failure.
pub(super) struct Conn {
    addr: McAddr,
    stream: Option<Stream>,
    buf: Vec<u8>,
    /// Bumped on every new connection: a CAS value learnt under another epoch may belong to
    /// a server that has restarted since.
    pub(super) epoch: u64,
    /// An exchange has started and not finished: if it was abandoned (its future dropped by
    /// a timeout around it), its late answer must never be read as the next one's.
    in_flight: bool,
    /// An exchange has completed on this connection (the first one is padded; see
    /// [`BINARY_HEADER`]).
    spoken: bool,
}

impl Conn {
    /// Not connected yet: the first call connects.
    pub(super) fn new(addr: &McAddr) -> Conn {
        Conn {
            addr: addr.clone(),
            stream: None,
            buf: Vec::new(),
            epoch: 0,
            in_flight: false,
            spoken: false,
        }
    }

    /// Connect unless connected, within `budget`. A connection whose last exchange was
    /// abandoned half-way is replaced.
    pub(super) async fn ensure(&mut self, budget: Duration) -> Result<(), Failure> {
        if self.in_flight {
            self.reset();
            self.in_flight = false;
        }
        if self.stream.is_some() {
            return Ok(());
        }
        let connect = async {
            match &self.addr {
                McAddr::Tcp { host, port } => {
                    let stream = TcpStream::connect((host.as_str(), *port)).await?;
                    stream.set_nodelay(true)?;
                    Ok(Stream::Tcp(stream))
                }
                McAddr::Unix { path } => UnixStream::connect(path).await.map(Stream::Unix),
            }
        };
        let budget = budget.min(CONNECT_TIMEOUT);
        let stream = tokio::time::timeout(budget, connect)
            .await
            .map_err(|_| Failure::Timeout(budget))?
            .map_err(Failure::Io)?;
        self.stream = Some(stream);
        self.buf.clear();
        self.epoch += 1;
        self.spoken = false;
        Ok(())
    }

    /// Forget the connection (after a failure, or to prove a fresh one).
    pub(super) fn reset(&mut self) {
        self.stream = None;
        self.buf.clear();
    }

    /// Send `request` (one or more meta commands) and read `count` meta replies.
    pub(super) async fn meta(
        &mut self,
        request: &[u8],
        count: usize,
        budget: Duration,
    ) -> Result<Vec<Reply>, Failure> {
        self.exchange(request, budget, async |conn: &mut Conn| {
            let mut replies = Vec::with_capacity(count);
            for _ in 0..count {
                replies.push(conn.read_meta().await?);
            }
            Ok(replies)
        })
        .await
    }

    /// One meta command, one reply.
    pub(super) async fn one(&mut self, request: &[u8], budget: Duration) -> Result<Reply, Failure> {
        let mut replies = self.meta(request, 1, budget).await?;
        replies
            .pop()
            .ok_or_else(|| Failure::Protocol("no reply".into()))
    }

    /// `stats [group]` as (name, value) pairs.
    pub(super) async fn stats(
        &mut self,
        group: &str,
        budget: Duration,
    ) -> Result<Vec<(String, String)>, Failure> {
        let request = format!("stats {group}\r\n").into_bytes();
        self.exchange(&request, budget, async |conn: &mut Conn| {
            let mut pairs = Vec::new();
            loop {
                let line = conn.read_line(MAX_REPLY).await?;
                if line == "END" {
                    return Ok(pairs);
                }
                let Some(stat) = line.strip_prefix("STAT ") else {
                    return Err(unexpected(&line));
                };
                let (name, value) = stat.split_once(' ').unwrap_or((stat, ""));
                pairs.push((name.to_owned(), value.to_owned()));
            }
        })
        .await
    }

    /// The lines of a command that answers with lines up to `END` (`lru_crawler metadump`);
    /// an error line ends it as a protocol failure.
    pub(super) async fn lines(
        &mut self,
        command: &str,
        max_lines: usize,
        budget: Duration,
    ) -> Result<Vec<String>, Failure> {
        let request = format!("{command}\r\n").into_bytes();
        self.exchange(&request, budget, async |conn: &mut Conn| {
            // metadump ends its lines with a bare LF and only `END` with CRLF.
            let mut lines = Vec::new();
            loop {
                let chunk = conn.read_line(MAX_LISTING).await?;
                for line in chunk.split('\n').filter(|l| !l.is_empty()) {
                    if line == "END" {
                        return Ok(lines);
                    }
                    if line.starts_with(UNAUTHENTICATED) {
                        return Err(Failure::Unauthenticated);
                    }
                    if line.starts_with("ERROR")
                        || line.starts_with("CLIENT_ERROR")
                        || line.starts_with("SERVER_ERROR")
                        || line.starts_with("BUSY")
                    {
                        return Err(Failure::Protocol(
                            crate::logging::printable(line).into_owned(),
                        ));
                    }
                    if lines.len() >= max_lines {
                        return Err(Failure::Protocol(format!(
                            "more than {max_lines} lines in the answer"
                        )));
                    }
                    lines.push(line.to_owned());
                }
            }
        })
        .await
    }

    /// Connect if needed, write, read with `read`, all within `budget`; any failure drops
    /// the connection.
    async fn exchange<T>(
        &mut self,
        request: &[u8],
        budget: Duration,
        read: impl AsyncFnOnce(&mut Conn) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let mut fresh = false;
        let result = tokio::time::timeout(budget, async {
            self.ensure(budget).await?;
            fresh = !self.spoken;
            self.in_flight = true;
            let noops = if fresh {
                BINARY_HEADER.saturating_sub(request.len()).div_ceil(4)
            } else {
                0
            };
            let mut padded = b"mn\r\n".repeat(noops);
            padded.extend_from_slice(request);
            match &self.stream {
                Some(stream) => stream.write_all(&padded).await.map_err(Failure::Io)?,
                None => return Err(Failure::Protocol("not connected".into())),
            }
            for _ in 0..noops {
                let line = self.read_line(MAX_REPLY).await?;
                if line != "MN" {
                    return Err(unexpected(&line));
                }
            }
            read(self).await
        })
        .await
        .unwrap_or(Err(Failure::Timeout(budget)));
        self.in_flight = false;
        if result.is_ok() {
            self.spoken = true;
        }
        let result = match result {
            Err(Failure::Io(e)) if fresh && e.kind() == std::io::ErrorKind::UnexpectedEof => {
                if speaks_binary(&self.addr).await {
                    Err(Failure::BinaryOnly)
                } else {
                    Err(self.explained(Failure::Io(e)).await)
                }
            }
            Err(failure) if fresh => Err(self.explained(failure).await),
            other => other,
        };
        if result.is_err() {
            self.reset();
        }
        result
    }

    /// The first exchange on a connection failed the way a server of another kind makes it
    /// fail (closed or reset at once, an answer memcached never gives): when another kind of
    /// server answers at the address, that is the failure.
    async fn explained(&self, failure: Failure) -> Failure {
        let confused = match &failure {
            Failure::Io(e) => e.kind() != std::io::ErrorKind::ConnectionRefused,
            Failure::Protocol(_) => true,
            _ => false,
        };
        let McAddr::Tcp { host, port } = &self.addr else {
            return failure;
        };
        if !confused {
            return failure;
        }
        match crate::sniff::other_than(host, *port, crate::sniff::AFTER_FAILURE, &super::kind::KIND)
            .await
        {
            Some(what) => Failure::NotMemcached(what),
            None => failure,
        }
    }

    /// One meta reply (with its value for `VA`); error lines are failures.
    async fn read_meta(&mut self) -> Result<Reply, Failure> {
        let line = self.read_line(MAX_REPLY).await?;
        let mut words = line.split(' ').filter(|w| !w.is_empty());
        let code = words.next().unwrap_or_default().to_owned();
        match code.as_str() {
            "VA" => {
                let size: usize = words
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|&s| s <= MAX_REPLY)
                    .ok_or_else(|| Failure::Protocol(format!("bad value header '{line}'")))?;
                let flags = words.map(str::to_owned).collect();
                let value = self.read_block(size).await?;
                Ok(Reply {
                    code,
                    flags,
                    value: Some(value),
                })
            }
            "HD" | "EN" | "NS" | "EX" | "NF" => Ok(Reply {
                code,
                flags: words.map(str::to_owned).collect(),
                value: None,
            }),
            _ => Err(unexpected(&line)),
        }
    }

    /// The next line, without its `\r\n`.
    async fn read_line(&mut self, max: usize) -> Result<String, Failure> {
        let mut searched = 0;
        loop {
            if let Some(at) = self.buf[searched..].windows(2).position(|w| w == b"\r\n") {
                let end = searched + at;
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            searched = self.buf.len().saturating_sub(1);
            if self.buf.len() > max {
                return Err(Failure::Protocol("a reply line is too long".into()));
            }
            self.fill().await?;
        }
    }

    /// `size` bytes of value and the `\r\n` after them.
    async fn read_block(&mut self, size: usize) -> Result<Vec<u8>, Failure> {
        while self.buf.len() < size + 2 {
            self.fill().await?;
        }
        if &self.buf[size..size + 2] != b"\r\n" {
            return Err(Failure::Protocol("a value is not followed by CRLF".into()));
        }
        let value = self.buf[..size].to_vec();
        self.buf.drain(..size + 2);
        Ok(value)
    }

    async fn fill(&mut self) -> Result<(), Failure> {
        match &self.stream {
            Some(stream) => stream.read_more(&mut self.buf).await.map_err(Failure::Io),
            None => Err(Failure::Protocol("not connected".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers every line it reads with `HD c<connection number>`, after
    /// `delay` (and `mn` with `MN`, at once).
    fn slow_server(delay: Duration) -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().take(4).enumerate() {
                let Ok(stream) = stream else { return };
                std::thread::spawn(move || {
                    use std::io::{BufRead, BufReader, Write};
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                        // The no-ops that pad a connection's first request answer at once.
                        if line.starts_with("mn") {
                            let _ = writer.write_all(b"MN\r\n");
                        } else {
                            std::thread::sleep(delay);
                            let _ = writer.write_all(format!("HD c{}\r\n", n + 1).as_bytes());
                        }
                        line.clear();
                    }
                });
            }
        });
        port
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_abandoned_exchange_never_lends_its_answer_to_the_next() {
        let port = slow_server(Duration::from_millis(300));
        let mut conn = Conn::new(&McAddr::Tcp {
            host: "127.0.0.1".into(),
            port,
        });
        let abandoned = tokio::time::timeout(
            Duration::from_millis(50),
            conn.one(&mg("k", "c"), Duration::from_secs(5)),
        )
        .await;
        assert!(abandoned.is_err(), "the first exchange was not abandoned");
        let reply = conn
            .one(&mg("k", "c"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(conn.epoch, 2, "the abandoned connection was reused");
        assert_eq!(
            reply.cas(),
            Some(2),
            "read the answer of the first connection"
        );
    }

    #[test]
    fn requests_are_meta_commands() {
        assert_eq!(ms("k", "ME T3 c", b"v"), b"ms k 1 ME T3 c\r\nv\r\n");
        assert_eq!(md("k", "C7"), b"md k C7\r\n");
    }
}
