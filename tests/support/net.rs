//! The network between dlock and a server: free loopback ports, a `Proxy` that can black-hole
//! or slow a link, and a `SilentServer` that accepts connections and never answers.

use std::time::{Duration, Instant};

/// Where [`free_port`] looks: below the kernel's ephemeral range (32768–60999 unless
/// configured otherwise), from which every outgoing connection takes its local port. A port
/// the kernel picks for `bind(0)` comes from that range too, and with hundreds of dlock
/// connections a second, one of them took it before the server bound it (redis-server then
/// exits with "Address already in use" and the test waits for it in vain).
const PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A TCP port on 127.0.0.1 that nothing listens on: each call of this process tries the next
/// port of [`PORTS`] (from an offset of its pid, so that test processes running at once start
/// apart) until one can be bound.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(PORTS.end - PORTS.start);
    let offset = std::process::id().wrapping_mul(7919);
    for _ in 0..span {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = PORTS.start + (offset.wrapping_add(step) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {PORTS:?} on 127.0.0.1");
}

/// A TCP proxy on a free loopback port that can stop forwarding without closing anything
/// (a black hole, like a network partition), or forward everything late (a slow link). Its
/// threads end when it is dropped.
pub struct Proxy {
    pub port: u16,
    blackholed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(target_port: u16) -> Proxy {
        Proxy::with_delay(target_port, Duration::ZERO)
    }

    /// A proxy that holds every chunk it reads for `delay` before passing it on.
    pub fn with_delay(target_port: u16, delay: Duration) -> Proxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let blackholed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (blackholed.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target_port))
                        else {
                            continue;
                        };
                        for (from, to) in [
                            (
                                client.try_clone().expect("clone"),
                                server.try_clone().expect("clone"),
                            ),
                            (server, client),
                        ] {
                            let (b, s) = (b.clone(), s.clone());
                            std::thread::spawn(move || pump(from, to, delay, &b, &s));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            port,
            blackholed,
            stop,
        }
    }

    /// From now on, swallow every byte in both directions; connections stay open.
    pub fn blackhole(&self) {
        self.blackholed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    delay: Duration,
    blackholed: &std::sync::atomic::AtomicBool,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                std::thread::sleep(delay);
                if !blackholed.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    if !blackholed.load(Ordering::SeqCst) {
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
}

/// A server on a free loopback port that accepts connections and never answers (keeps them
/// open, reads nothing), until dropped or for at most two minutes.
pub struct SilentServer {
    pub port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SilentServer {
    pub fn start() -> SilentServer {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (s, a) = (stop.clone(), accepted.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(120);
            let mut open = Vec::new();
            while !s.load(Ordering::SeqCst) && Instant::now() < until {
                match listener.accept() {
                    Ok((connection, _)) => {
                        a.fetch_add(1, Ordering::SeqCst);
                        if open.len() < 1000 {
                            open.push(connection);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        SilentServer {
            port,
            accepted,
            stop,
        }
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
