//! A private Azurite (the Azure Storage emulator, npm `azurite`, installed by `.ci/servers`)
//! per test or per run: its blob service on a free loopback port with its data in a temp dir,
//! ready when it answers and the container `dlock-locks` exists (created here with a Shared
//! Key request, as a user creates one: dlock never does); killed by pid on drop. dlock
//! reaches it through `AZURE_STORAGE_CONNECTION_STRING` with Azurite's well-known account.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};

use crate::support::*;

/// Azurite's development account and its published key.
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The container the tests' locks live in.
pub const CONTAINER: &str = "dlock-locks";

/// An answer of the blob service: status, headers (lower-case names), body.
pub struct BlobAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl BlobAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One Shared Key request to the blob service at `port`: `method` on `path` (under the
/// account, as sent), `query` pairs (plain values), `headers` (x-ms-* and the rest).
pub fn blob_request(
    port: u16,
    method: &str,
    path: &str,
    query: &[(&str, &str)],
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<BlobAnswer> {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let mut all: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    all.push(("x-ms-date".into(), date));
    all.push(("x-ms-version".into(), "2021-08-06".into()));
    let standard = |name: &str| {
        all.iter()
            .find(|(k, _)| k == name)
            .map_or(String::new(), |(_, v)| v.clone())
    };
    let length = if body.is_empty() {
        String::new()
    } else {
        body.len().to_string()
    };
    let mut to_sign = format!(
        "{method}\n{}\n{}\n{length}\n{}\n{}\n\n{}\n{}\n{}\n{}\n{}\n",
        standard("content-encoding"),
        standard("content-language"),
        standard("content-md5"),
        standard("content-type"),
        standard("if-modified-since"),
        standard("if-match"),
        standard("if-none-match"),
        standard("if-unmodified-since"),
        standard("range"),
    );
    let mut ms: Vec<&(String, String)> = all.iter().filter(|(k, _)| k.starts_with("x-ms-")).collect();
    ms.sort();
    for (k, v) in ms {
        to_sign.push_str(&format!("{k}:{v}\n"));
    }
    let full_path = format!("/{AZURITE_ACCOUNT}{path}");
    to_sign.push_str(&format!("/{AZURITE_ACCOUNT}{full_path}"));
    let mut sorted: Vec<&(&str, &str)> = query.iter().collect();
    sorted.sort();
    for (k, v) in sorted {
        to_sign.push_str(&format!("\n{k}:{v}"));
    }
    let key = base64::engine::general_purpose::STANDARD
        .decode(AZURITE_KEY)
        .expect("Azurite's key");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).expect("an HMAC key");
    mac.update(to_sign.as_bytes());
    let signature =
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let query_text: Vec<String> = query
        .iter()
        .map(|(k, v)| format!("{k}={}", v.replace('/', "%2F")))
        .collect();
    let target = if query_text.is_empty() {
        full_path
    } else {
        format!("{full_path}?{}", query_text.join("&"))
    };
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: {}\r\nAuthorization: SharedKey {AZURITE_ACCOUNT}:{signature}\r\n",
        body.len()
    );
    for (k, v) in &all {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(request.as_bytes())?;
    stream.write_all(body)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    parse_answer(&answer, method == "HEAD")
}

/// An HTTP/1.1 answer (`Connection: close`; a chunked body undone).
fn parse_answer(answer: &[u8], head: bool) -> std::io::Result<BlobAnswer> {
    let bad = || std::io::Error::other("not an HTTP answer");
    let text = String::from_utf8_lossy(answer);
    let (head_text, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let mut lines = head_text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if head {
        String::new()
    } else if chunked {
        let mut out = String::new();
        let mut rest = body;
        // Bounded by the body's length: each round consumes a chunk.
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 || after.len() < size {
                break;
            }
            out.push_str(&after[..size]);
            rest = after[size..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    };
    Ok(BlobAnswer {
        status,
        headers,
        body,
    })
}

/// A private Azurite blob service on a free loopback port; killed on drop.
pub struct AzuriteServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl AzuriteServer {
    /// An Azurite shared by every test of the run that calls this (see `shared`).
    pub fn shared() -> Shared<AzuriteServer> {
        static SERVER: std::sync::OnceLock<AzuriteServer> = std::sync::OnceLock::new();
        shared(&SERVER, AzuriteServer::start)
    }

    pub fn start() -> AzuriteServer {
        let mut server = AzuriteServer {
            port: free_port(),
            dir: server_dir(),
            child: None,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let binary = project_server_binary("azurite-blob");
        let mut command = Command::new(binary);
        command
            .args(["--blobHost", "127.0.0.1", "--blobPort", &self.port.to_string()])
            .arg("--location")
            .arg(self.dir.path())
            .args(["--silent", "--skipApiVersionCheck", "--disableProductStyleUrl"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(spawn_server(&mut command, "azurite"));
        let port = self.port;
        wait_until("azurite ready and the container made", PATIENCE, || {
            blob_request(port, "PUT", &format!("/{CONTAINER}"), &[("restype", "container")], &[], b"")
                .is_ok_and(|answer| answer.status == 201 || answer.status == 409)
        });
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The connection string of Azurite's account at `port`.
    pub fn connection_string(port: u16) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};\
             BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
        )
    }

    /// A Shared Key request to this server (see [`blob_request`]).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> BlobAnswer {
        blob_request(self.port, method, path, query, headers, b"").expect("an Azurite request")
    }

    /// The names of the container's blobs under `prefix`, with their lease states.
    pub fn blobs(&self, prefix: &str) -> Vec<(String, String)> {
        let answer = self.request(
            "GET",
            &format!("/{CONTAINER}"),
            &[("comp", "list"), ("prefix", prefix), ("restype", "container")],
            &[],
        );
        answer
            .body
            .split("<Blob>")
            .skip(1)
            .filter_map(|entry| {
                let name = entry.split_once("<Name>")?.1.split_once("</Name>")?.0;
                let state = entry
                    .split_once("<LeaseState>")
                    .and_then(|(_, rest)| rest.split_once("</LeaseState>"))
                    .map_or("", |(state, _)| state);
                Some((name.to_owned(), state.to_owned()))
            })
            .collect()
    }
}

impl Drop for AzuriteServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LockServer for AzuriteServer {
    /// The endpoint in the URL too (the connection string names it already), so that a test
    /// can point the same URL at another port.
    fn url(&self) -> String {
        self.url_via(self.port)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![(
            "AZURE_STORAGE_CONNECTION_STRING",
            AzuriteServer::connection_string(self.port),
        )]
    }

    fn scheme(&self) -> &'static str {
        "az"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("15s")
    }

    /// Every blob's name, metadata and body.
    fn stored_text(&self) -> Option<String> {
        let mut text = String::new();
        for (name, _) in self.blobs("").into_iter().take(10_000) {
            let path = format!("/{CONTAINER}/{}", name.replace('%', "%25"));
            let answer = self.request("GET", &path, &[], &[]);
            text.push_str(&name);
            for (k, v) in &answer.headers {
                if k.starts_with("x-ms-meta-") {
                    text.push_str(&format!(" {k}={v}"));
                }
            }
            text.push('\n');
            text.push_str(&answer.body);
            text.push('\n');
        }
        Some(text)
    }
}

impl LeaseServer for AzuriteServer {
    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("az://{CONTAINER}?endpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
