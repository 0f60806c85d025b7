//! The byte stream under a connection, TCP or a Unix socket, and the probe that tells a
//! server that speaks only the binary protocol by its answer to a binary `version`.

use tokio::net::{TcpStream, UnixStream};

use super::{BINARY_HEADER, PROBE_TIMEOUT};
use crate::backend::memcached::target::McAddr;

pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

macro_rules! on_stream {
    ($stream:expr, $s:ident => $body:expr) => {
        match $stream {
            Stream::Tcp($s) => $body,
            Stream::Unix($s) => $body,
        }
    };
}

impl Stream {
    pub(super) async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            on_stream!(self, s => s.writable().await)?;
            match on_stream!(self, s => s.try_write(data)) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Append what arrives next to `into`.
    pub(super) async fn read_more(&self, into: &mut Vec<u8>) -> std::io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            on_stream!(self, s => s.readable().await)?;
            match on_stream!(self, s => s.try_read(&mut chunk)) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ))
                }
                Ok(n) => {
                    into.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether the server answers a binary-protocol `version` request (magic 0x80, opcode
/// 0x0b, no body) with a binary response (magic 0x81), on a fresh connection.
pub(super) async fn speaks_binary(addr: &McAddr) -> bool {
    let probe = async {
        let stream = match addr {
            McAddr::Tcp { host, port } => {
                Stream::Tcp(TcpStream::connect((host.as_str(), *port)).await?)
            }
            McAddr::Unix { path } => Stream::Unix(UnixStream::connect(path).await?),
        };
        let mut header = [0u8; BINARY_HEADER];
        header[0] = 0x80;
        header[1] = 0x0b;
        stream.write_all(&header).await?;
        let mut answer = Vec::new();
        stream.read_more(&mut answer).await?;
        Ok::<bool, std::io::Error>(answer.first() == Some(&0x81))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Ok(true))
    )
}
