//! Opening a connection for [`super::Client`]: TCP, TLS (rustls with the system's CA
//! certificates, loaded once per process) for `https`, the HTTP/1.1 handshake. A failure here
//! is always [`SendError::NotSent`]: no request has been written yet.

use std::sync::{Arc, OnceLock};

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{Connection, Origin, SendError};
use crate::kit::error_text::io_words;

/// A new connection to `origin`: TCP, then TLS for `https`, then the HTTP/1.1 handshake,
/// its driver spawned on the runtime.
pub(super) async fn connect(origin: &Origin) -> Result<Connection, SendError> {
    let not_sent = |what: &str, why: String| SendError::NotSent(format!("{what} {origin}: {why}"));
    let tcp = TcpStream::connect((origin.host.as_str(), origin.port))
        .await
        .map_err(|err| not_sent("cannot connect to", io_words(&err)))?;
    let _ = tcp.set_nodelay(true);
    if !origin.https {
        return handshake(TokioIo::new(tcp), origin).await;
    }
    let config = tls_config().map_err(|why| not_sent("no TLS for", why))?;
    let name = rustls::pki_types::ServerName::try_from(origin.host.clone())
        .map_err(|_| not_sent("no TLS for", "the host is not a valid TLS name".into()))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|err| not_sent("no TLS session with", io_words(&err)))?;
    handshake(TokioIo::new(tls), origin).await
}

async fn handshake<T>(io: TokioIo<T>, origin: &Origin) -> Result<Connection, SendError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, driver) = http1::handshake(io)
        .await
        .map_err(|err| SendError::NotSent(format!("no HTTP with {origin}: {err}")))?;
    tokio::spawn(async move {
        if let Err(err) = driver.await {
            tracing::debug!("an HTTP connection ended: {err}");
        }
    });
    Ok(sender)
}

/// rustls with the system's CA certificates, loaded once per process.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::kit::tls::install_tls_provider();
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "no CA certificates found on this host (Debian: apt-get install ca-certificates)"
                        .into(),
                );
            }
            let mut config = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}
