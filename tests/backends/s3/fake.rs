//! A hostile S3 server on loopback for the cases moto cannot play: one that ignores
//! conditional writes (answers 200 to every PUT), one that refuses a skewed clock. Not a
//! mock of S3: a server dlock must refuse. Each connection gets one answer, then is closed.
//! And a proxy to a real server that throttles the first requests (503 SlowDown).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What the fake answers to a request (method and path): status, extra headers, body.
pub type Answer = fn(&str, &str) -> (u16, Vec<(String, String)>, String);

/// A fake S3 server; it stops taking connections when dropped.
pub struct FakeS3 {
    pub port: u16,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeS3 {
    pub fn start(answer: Answer) -> FakeS3 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake S3");
        let port = listener.local_addr().expect("its address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            // Bounded: at most this many connections, and it ends with its owner.
            for _ in 0..100_000 {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = serve(stream, answer);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeS3 { port, stop }
    }

    pub fn url(&self) -> String {
        format!("s3://fake-bucket?endpoint=http://127.0.0.1:{}", self.port)
    }
}

/// dlock pointed at the fake, with the test servers' credentials.
impl crate::support::LockServer for FakeS3 {
    fn url(&self) -> String {
        FakeS3::url(self)
    }

    fn scheme(&self) -> &'static str {
        "s3"
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        super::server::credentials()
    }
}

impl Drop for FakeS3 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(stream: std::net::TcpStream, answer: Answer) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (method, path) = (
        words.next().unwrap_or_default().to_owned(),
        words.next().unwrap_or_default().to_owned(),
    );
    let mut length = 0usize;
    for _ in 0..100 {
        let mut header = String::new();
        reader.read_line(&mut header)?;
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let (status, headers, text) = answer(&method, &path);
    let date = httpdate_now(0);
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nDate: {date}\r\nContent-Length: {}\r\nConnection: close\r\n",
        text.len()
    );
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&text);
    let mut stream = stream;
    stream.write_all(out.as_bytes())
}

/// An HTTP date `offset` seconds from now.
pub fn httpdate_now(offset: i64) -> String {
    let now = std::time::SystemTime::now();
    let at = if offset >= 0 {
        now + Duration::from_secs(offset as u64)
    } else {
        now - Duration::from_secs(offset.unsigned_abs())
    };
    httpdate::fmt_http_date(at)
}

/// A proxy to the server at `target` that answers its first `refused` connections itself,
/// each with 503 SlowDown, and passes every later one through.
pub struct SlowDown {
    pub port: u16,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl SlowDown {
    pub fn start(target: u16, refused: usize) -> SlowDown {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("its address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let mut seen = 0;
            for _ in 0..1_000_000 {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                seen += 1;
                if seen <= refused {
                    let _ = serve(client, |_, _| {
                        (
                            503,
                            Vec::new(),
                            "<Error><Code>SlowDown</Code><Message>Please reduce your request \
                             rate.</Message></Error>"
                                .into(),
                        )
                    });
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let _ = client.set_nonblocking(false);
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        SlowDown { port, stop }
    }
}

impl Drop for SlowDown {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
