//! A small HTTP/1.1 client for the backends that speak HTTP (the object stores): requests
//! signed by the backend, sent over TCP or TLS (rustls, the system's CA certificates) on
//! keep-alive connections, each exchange bounded in time.
//!
//! hyper is in the build already (tonic, under the etcd client, sends its gRPC over it), so
//! this adds no crate to compile. A connection carries one exchange at a time (HTTP/1.1), so
//! a request finds an idle connection or opens one: a renewal never queues behind a slow
//! status read. A failed exchange drops its connection.
//!
//! What a failure means matters to a lock: [`SendError::NotSent`] says the request never
//! reached the server (connecting failed), so nothing it asked for happened;
//! [`SendError::Unknown`] says it may have, and a backend re-reads before it trusts its own
//! view again.

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;

use super::url::{join_host_port, split_host_port};

mod connect;

use self::connect::connect;

/// The largest answer read: a page of a listing is far below it.
const MAX_BODY: usize = 16 << 20;

/// Idle connections kept per client: a holder needs one, `list` beside a renewal two.
const MAX_IDLE: usize = 2;

/// Where requests go: scheme, host and port of an endpoint URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

impl Origin {
    /// `http://host[:port]` or `https://host[:port]`, with nothing after the authority but
    /// an optional `/`.
    pub fn parse(url: &str) -> Result<Origin, String> {
        let (origin, path) = Origin::split(url)?;
        if !path.is_empty() {
            return Err("an endpoint URL has no path here: give scheme, host and port".into());
        }
        Ok(origin)
    }

    /// An endpoint URL as its origin and its path (without a trailing `/`; empty for none),
    /// for endpoints that carry one, as Azurite's `http://127.0.0.1:10000/devstoreaccount1`.
    pub fn split(url: &str) -> Result<(Origin, String), String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or("an endpoint URL starts with http:// or https://")?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return Err("an endpoint URL starts with http:// or https://".into()),
        };
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if path.starts_with(['?', '#']) {
            return Err("an endpoint URL has no query or fragment".into());
        }
        if authority.contains('@') {
            return Err(
                "an endpoint URL carries no user or password: give credentials in the environment"
                    .into(),
            );
        }
        let (host, port) = split_host_port(authority, if https { 443 } else { 80 })?;
        let origin = Origin {
            https,
            host: host.to_ascii_lowercase(),
            port,
        };
        Ok((origin, path.trim_end_matches('/').to_owned()))
    }

    fn default_port(&self) -> u16 {
        if self.https {
            443
        } else {
            80
        }
    }

    /// The `Host` header: `host`, or `host:port` when the port is not the scheme's default
    /// (with brackets around an IPv6 address). Signatures cover this value.
    pub fn host_header(&self) -> String {
        if self.port == self.default_port() {
            if self.host.contains(':') {
                format!("[{}]", self.host)
            } else {
                self.host.clone()
            }
        } else {
            join_host_port(&self.host, self.port)
        }
    }

    /// An IP address or `localhost`: no bucket or account name can be put in front of it as
    /// a DNS label, so the name goes in the path (the AWS CLI's rule).
    pub fn is_ip_or_localhost(&self) -> bool {
        self.host.parse::<IpAddr>().is_ok() || self.host == "localhost"
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.host_header())
    }
}

/// One request; the client adds `Host` and `Content-Length`.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: http::Method,
    /// Already percent-encoded, starting with `/`.
    pub path_and_query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A whole answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Response {
    /// A header's value, if it is there and is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The server's clock when it answered (`Date`, whole seconds).
    pub fn date(&self) -> Option<SystemTime> {
        self.header("date")
            .and_then(|text| httpdate::parse_http_date(text).ok())
    }

    /// When the object answered about was last written, on the server's clock (whole seconds).
    pub fn last_modified(&self) -> Option<SystemTime> {
        self.header("last-modified")
            .and_then(|text| httpdate::parse_http_date(text).ok())
    }

    /// The `<Code>` of an XML error body (S3's and Azure's error format).
    pub fn error_code(&self) -> Option<&str> {
        let text = std::str::from_utf8(&self.body).ok()?;
        super::xml::element(text, "Code").map(str::trim)
    }
}

/// Why no answer came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendError {
    /// Connecting failed: the request never reached the server.
    NotSent(String),
    /// The request was sent, or may have been, and no whole answer came: whatever it asked
    /// for may or may not have happened.
    Unknown(String),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::NotSent(why) | SendError::Unknown(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for SendError {}

type Connection = SendRequest<Full<Bytes>>;

/// A client for one origin; clones share its idle connections.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    origin: Origin,
    idle: Mutex<Vec<Connection>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Client({})", self.inner.origin)
    }
}

impl Client {
    pub fn new(origin: Origin) -> Client {
        Client {
            inner: Arc::new(Inner {
                origin,
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    pub fn origin(&self) -> &Origin {
        &self.inner.origin
    }

    /// Send `request` and read the whole answer, all within `limit`.
    pub async fn send(&self, request: Request, limit: Duration) -> Result<Response, SendError> {
        let origin = &self.inner.origin;
        let deadline = tokio::time::Instant::now() + limit;
        let connection = match self.idle_connection() {
            Some(connection) => connection,
            None => tokio::time::timeout_at(deadline, connect(origin))
                .await
                .map_err(|_| {
                    SendError::NotSent(format!(
                        "no connection to {origin} within {}",
                        humantime::format_duration(limit)
                    ))
                })??,
        };
        let exchange = exchange(connection, origin, request);
        let (response, connection) =
            tokio::time::timeout_at(deadline, exchange)
                .await
                .map_err(|_| {
                    SendError::Unknown(format!(
                        "{origin} did not answer within {}",
                        humantime::format_duration(limit)
                    ))
                })??;
        self.keep(connection);
        Ok(response)
    }

    fn idle_connection(&self) -> Option<Connection> {
        let mut idle = self.inner.idle.lock().ok()?;
        while let Some(connection) = idle.pop() {
            if !connection.is_closed() {
                return Some(connection);
            }
        }
        None
    }

    fn keep(&self, connection: Connection) {
        if connection.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.inner.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(connection);
            }
        }
    }
}

/// One request and its whole answer on `connection`, which comes back for the next.
async fn exchange(
    mut connection: Connection,
    origin: &Origin,
    request: Request,
) -> Result<(Response, Connection), SendError> {
    let unknown = |what: &str, err: &(dyn std::error::Error + 'static)| {
        SendError::Unknown(format!(
            "{what} {origin}: {}",
            super::error_text::chain_text(err)
        ))
    };
    // A connection the server closed while idle fails before anything is written: that
    // request was never sent.
    if connection.ready().await.is_err() {
        return Err(SendError::NotSent(format!(
            "the connection to {origin} closed"
        )));
    }
    let mut builder = http::Request::builder()
        .method(request.method)
        .uri(request.path_and_query)
        .header(http::header::HOST, origin.host_header())
        .header(http::header::CONTENT_LENGTH, request.body.len());
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let sent = builder
        .body(Full::new(Bytes::from(request.body)))
        .map_err(|err| SendError::NotSent(format!("a request dlock could not form: {err}")))?;
    let answer = connection
        .send_request(sent)
        .await
        .map_err(|err| unknown("no answer from", &err))?;
    let (parts, body) = answer.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|err| SendError::Unknown(format!("reading the answer of {origin}: {err}")))?
        .to_bytes();
    let response = Response {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: body.to_vec(),
    };
    Ok((response, connection))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn origins_are_read_as_scheme_host_and_port() {
        let origin = Origin::parse("http://127.0.0.1:9000").unwrap();
        assert_eq!(
            (origin.https, origin.host.as_str(), origin.port),
            (false, "127.0.0.1", 9000)
        );
        assert_eq!(origin.host_header(), "127.0.0.1:9000");
        assert!(origin.is_ip_or_localhost());
        let origin = Origin::parse("HTTPS://S3.eu-west-1.amazonaws.com/").unwrap();
        assert_eq!(origin.port, 443);
        assert_eq!(origin.host_header(), "s3.eu-west-1.amazonaws.com");
        assert!(!origin.is_ip_or_localhost());
        assert_eq!(
            Origin::parse("http://[::1]:80").unwrap().host_header(),
            "[::1]"
        );
        assert_eq!(
            Origin::parse("https://[::1]:8443").unwrap().host_header(),
            "[::1]:8443"
        );
        let (origin, path) = Origin::split("http://localhost:10000/devstoreaccount1/").unwrap();
        assert_eq!(
            (origin.host.as_str(), path.as_str()),
            ("localhost", "/devstoreaccount1")
        );
        assert!(origin.is_ip_or_localhost());
    }

    #[test]
    fn bad_endpoints_are_refused_without_echoing_them() {
        for bad in [
            "ftp://host",
            "host:9000",
            "http://",
            "http://user:secret@host",
            "http://host/path",
            "http://host?x=secret",
            "http://host:0",
        ] {
            let err = Origin::parse(bad).unwrap_err();
            assert!(!err.contains("secret"), "{bad}: {err}");
        }
    }

    #[test]
    fn xml_error_codes_and_dates_are_read() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "date",
            http::HeaderValue::from_static("Mon, 07 Dec 2026 18:00:01 GMT"),
        );
        let response = Response {
            status: 412,
            headers,
            body: b"<?xml version=\"1.0\"?><Error><Code>PreconditionFailed</Code></Error>".to_vec(),
        };
        assert_eq!(response.error_code(), Some("PreconditionFailed"));
        let date = response.date().unwrap();
        let secs = date
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(secs % 60, 1);
        assert_eq!(response.last_modified(), None);
    }

    /// A loopback server that answers each request of a connection with `answers` in turn,
    /// counting connections.
    async fn server(answers: Vec<&'static str>) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            for _ in 0..8 {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answers = answers.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    for answer in answers {
                        let mut seen = Vec::new();
                        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        }
                        if answer.is_empty() {
                            return; // hang up without an answer
                        }
                        if answer == "silence" {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            return;
                        }
                        let _ = stream.write_all(answer.as_bytes()).await;
                    }
                });
            }
        });
        (port, connections)
    }

    fn get() -> Request {
        Request {
            method: http::Method::GET,
            path_and_query: "/b/k".into(),
            headers: vec![("x-test".into(), "1".into())],
            body: Vec::new(),
        }
    }

    const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nETag: \"e1\"\r\n\r\nhi";

    #[tokio::test]
    async fn a_connection_is_kept_for_the_next_request() {
        let (port, connections) = server(vec![OK, OK]).await;
        let client = Client::new(Origin::parse(&format!("http://127.0.0.1:{port}")).unwrap());
        for _ in 0..2 {
            let response = client.send(get(), Duration::from_secs(5)).await.unwrap();
            assert_eq!(
                (response.status, response.body.as_slice()),
                (200, &b"hi"[..])
            );
            assert_eq!(response.header("etag"), Some("\"e1\""));
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_hang_up_after_the_request_is_an_unknown_outcome_and_the_next_request_reconnects() {
        let (port, connections) = server(vec![""]).await;
        let client = Client::new(Origin::parse(&format!("http://127.0.0.1:{port}")).unwrap());
        let err = client
            .send(get(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, SendError::Unknown(_)), "{err:?}");
        let _ = client.send(get(), Duration::from_secs(5)).await;
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_silent_server_is_an_unknown_outcome_within_the_limit() {
        let (port, _) = server(vec!["silence"]).await;
        let client = Client::new(Origin::parse(&format!("http://127.0.0.1:{port}")).unwrap());
        let started = std::time::Instant::now();
        let err = client
            .send(get(), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, SendError::Unknown(_)), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_refused_connection_was_not_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = Client::new(Origin::parse(&format!("http://127.0.0.1:{port}")).unwrap());
        let err = client
            .send(get(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, SendError::NotSent(_)), "{err:?}");
    }
}
