//! A private S3 server per test: moto in server mode (`moto_server`'s application, from
//! `.servers/venv`), on a free loopback port, its bucket created with an unsigned
//! `PUT /BUCKET` (moto checks no signatures); ready when `/moto-api/` answers; killed by pid
//! on drop.
//!
//! moto checks a write's condition and then writes, with nothing between two requests
//! handled at once: `moto_server` serves requests on threads, and two conditional writes on
//! one ETag can then both succeed (seen here: two holders with one token). The server is run
//! as `moto_server` runs it but with one request in moto at a time, so that each is whole
//! before the next starts, which is what S3 promises of a conditional write.
//!
//! SeaweedFS (`weed server -s3`, also from `.servers/venv`) is the second server: it applies
//! a conditional write atomically, so the contention case and the scale test run on it too
//! ([`S3Server::start_seaweedfs`]), where an emulator's own race could not hide one of dlock's.
//!
//! dlock finds the endpoint and region in the URL's query, and the credentials (moto takes
//! any) in `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, which the server gives every dlock a
//! test runs ([`credentials`], `LockServer::env`).

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The bucket every test server has.
pub const BUCKET: &str = "dlock-tests";

/// The credentials the tests give dlock (moto takes any).
pub const ACCESS_KEY_ID: &str = "AKIDTESTINGDLOCK";
pub const SECRET_ACCESS_KEY: &str = "s3cr3t-never-shown-Qx7";

/// One plain HTTP/1.0 exchange with the server on `port`: status and body. moto reads the
/// account from an `Authorization` header (without one it refuses to read objects) and
/// checks no signature, so the header signs nothing.
pub fn s3_request(port: u16, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    request(port, method, path, body, true)
}

/// [`s3_request`], with the `Authorization` header moto wants or without it (SeaweedFS
/// without identities takes anonymous requests, and refuses a header it cannot check).
fn request(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    authorization: bool,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let signed = if authorization {
        format!(
            "Authorization: AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/20240101/us-east-1/s3/\
             aws4_request, SignedHeaders=host, Signature=0\r\n"
        )
    } else {
        String::new()
    };
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n\
         {signed}\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut answer = Vec::new();
    stream.take(64 << 20).read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = match answer.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => answer[at + 4..].to_vec(),
        None => Vec::new(),
    };
    Ok((status, body))
}

/// What dlock is given to reach a test server, on every dlock a test runs
/// (`LockServer::env`): the credentials (moto and SeaweedFS take any), and none of the
/// machine's own AWS set-up (an empty variable counts as unset).
pub fn credentials() -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.to_owned()),
        ("AWS_CONFIG_FILE", "/nonexistent/aws-config".to_owned()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials".to_owned()),
    ];
    for unset in ["AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"] {
        env.push((unset, String::new()));
    }
    env
}

/// `moto_server` with one request handled at a time (see the module doc): connections are
/// read on threads, so a client that sends nothing (a black-holed link) holds up no other,
/// and a lock lets one request into moto at a time. The port is its argument.
const ONE_AT_A_TIME: &str = "import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
app = DomainDispatcherApplication(create_backend_app)
turn = threading.Lock()
def one_at_a_time(environ, start_response):
    with turn:
        return list(app(environ, start_response))
run_simple('127.0.0.1', int(sys.argv[1]), one_at_a_time, threaded=True, request_handler=MotoRequestHandler)
";

/// A private moto server on a free loopback port; killed on drop.
pub struct S3Server {
    pub port: u16,
    /// moto (else SeaweedFS): whether requests of the tests carry an `Authorization`.
    moto: bool,
    /// SeaweedFS's gRPC ports, whose Unix sockets it makes in /tmp whatever it is told.
    grpc_ports: Vec<u16>,
    _dir: tempfile::TempDir,
    child: Option<Child>,
}

impl S3Server {
    /// A moto shared by every test of the run that calls this (see `shared`).
    pub fn shared() -> Shared<S3Server> {
        static SERVER: std::sync::OnceLock<S3Server> = std::sync::OnceLock::new();
        shared(&SERVER, S3Server::start)
    }

    pub fn start() -> S3Server {
        let moto = project_server_binary("moto_server");
        // The venv's interpreter, beside moto_server.
        let python = moto.with_file_name("python3");
        let dir = server_dir();
        let port = free_port();
        let mut command = Command::new(python);
        command
            .args(["-c", ONE_AT_A_TIME, &port.to_string()])
            .env("MOTO_PORT", port.to_string())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_server(&mut command, "moto_server");
        let server = S3Server {
            port,
            moto: true,
            grpc_ports: Vec::new(),
            _dir: dir,
            child: Some(child),
        };
        wait_until("moto answers", PATIENCE, || {
            s3_request(port, "GET", "/moto-api/", b"").is_ok_and(|(status, _)| status == 200)
        });
        let (status, body) =
            s3_request(port, "PUT", &format!("/{BUCKET}"), b"").expect("create the bucket");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        server
    }

    /// The endpoint as dlock's URL names it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The body of the object `key` of the bucket, if there is one.
    pub fn object(&self, key: &str) -> Option<Vec<u8>> {
        let path = format!("/{BUCKET}/{}", encode_key(key));
        let (status, body) = request(self.port, "GET", &path, b"", self.moto).ok()?;
        (status == 200).then_some(body)
    }

    /// Every key of the bucket (one page: the tests store far fewer than 1000).
    pub fn keys(&self) -> Vec<String> {
        let path = format!("/{BUCKET}?list-type=2");
        let (_, body) = request(self.port, "GET", &path, b"", self.moto).expect("list the bucket");
        let text = String::from_utf8_lossy(&body).into_owned();
        text.split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split_once("</Key>").map(|(k, _)| k.replace("&amp;", "&")))
            .collect()
    }

    /// A private SeaweedFS (master, volume, filer and S3 gateway in one `weed server`), every
    /// port of it a free loopback one, its data in a temp dir; ready when the S3 port answers.
    pub fn start_seaweedfs() -> S3Server {
        let binary = project_server_binary("weed");
        let dir = server_dir();
        let ports: Vec<u16> = (0..8).map(|_| free_port()).collect();
        let path = dir.path().display().to_string();
        let mut command = Command::new(binary);
        command
            .arg("server")
            .arg(format!("-dir={path}"))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3"])
            .arg(format!("-master.port={}", ports[0]))
            .arg(format!("-master.port.grpc={}", ports[1]))
            .arg(format!("-volume.port={}", ports[2]))
            .arg(format!("-volume.port.grpc={}", ports[3]))
            .arg(format!("-filer.port={}", ports[4]))
            .arg(format!("-filer.port.grpc={}", ports[5]))
            .arg(format!("-filer.localSocket={path}/filer.sock"))
            .arg(format!("-s3.port={}", ports[6]))
            .arg(format!("-s3.port.grpc={}", ports[7]))
            .arg(format!("-s3.localSocket={path}/s3.sock"))
            .args([
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-metricsPort=0",
                "-volume.max=8",
                "-master.volumeSizeLimitMB=64",
            ])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SeaweedFS takes AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for an identity of its
        // own and then wants an IAM set-up; without them it takes every request.
        for variable in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
            command.env_remove(variable);
        }
        let child = spawn_server(&mut command, "weed server");
        let port = ports[6];
        let server = S3Server {
            port,
            moto: false,
            grpc_ports: vec![ports[1], ports[3], ports[5], ports[7]],
            _dir: dir,
            child: Some(child),
        };
        wait_until("SeaweedFS's S3 gateway answers", PATIENCE * 3, || {
            request(port, "GET", "/", b"", false).is_ok_and(|(status, _)| status == 200)
        });
        wait_until("SeaweedFS makes the bucket", PATIENCE * 3, || {
            request(port, "PUT", &format!("/{BUCKET}"), b"", false)
                .is_ok_and(|(status, _)| status == 200 || status == 409)
        });
        server
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for port in &self.grpc_ports {
            for kind in ["master", "volume", "filer", "s3"] {
                let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{kind}-grpc-{port}.sock"));
            }
        }
    }
}

/// A key as a path segment of a request.
pub fn encode_key(key: &str) -> String {
    key.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LockServer for S3Server {
    fn url(&self) -> String {
        format!("s3://{BUCKET}?endpoint={}&region=us-east-1", self.endpoint())
    }

    fn scheme(&self) -> &'static str {
        "s3"
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        credentials()
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("5s")
    }

    /// Every object's key and body.
    fn stored_text(&self) -> Option<String> {
        let mut text = String::new();
        for key in self.keys() {
            text.push_str(&key);
            text.push_str(&String::from_utf8_lossy(&self.object(&key).unwrap_or_default()));
        }
        Some(text)
    }
}

impl LeaseServer for S3Server {
    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("s3://{BUCKET}?endpoint=http://127.0.0.1:{port}&region=us-east-1")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
