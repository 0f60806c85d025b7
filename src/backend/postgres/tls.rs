//! TLS for PostgreSQL with libpq's `sslmode` meanings, on rustls.
//!
//! | sslmode        | certificate check                                                   |
//! |----------------|---------------------------------------------------------------------|
//! | allow, prefer  | none (and plaintext if the server has no TLS)                       |
//! | require        | none; the chain, if a root certificate is given (libpq's rule)      |
//! | verify-ca      | the chain against the root certificate, not the host name           |
//! | verify-full    | the chain and the host name                                         |
//!
//! `require` and stricter never fall back to plaintext: tokio-postgres fails the connection
//! when the server declines TLS under `SslMode::Require`.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::target::{PgTarget, SslMode};
use crate::error::Error;

/// The connector for `target` (also used for the cancel request, which opens its own
/// connection with the same TLS settings).
pub fn connector(target: &PgTarget) -> Result<MakeRustlsConnect, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("cannot set up TLS: {e}")))?;
    let roots = match (&target.tls_files.ca_file, target.sslmode) {
        (_, SslMode::Disable) => None,
        (Some(path), _) => Some(Arc::new(load_roots(path)?)),
        (None, SslMode::VerifyCa | SslMode::VerifyFull) => {
            return Err(Error::Config(format!(
                "sslmode={} needs a root certificate: give sslrootcert=FILE, the [postgres] table's ca_file, or ~/.postgresql/root.crt",
                target.sslmode.as_str()
            )))
        }
        (None, _) => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (target.sslmode, roots) {
        (SslMode::VerifyFull, Some(roots)) => web_pki(roots, &provider)?,
        (SslMode::VerifyCa | SslMode::Require, Some(roots)) => Arc::new(ChainOnly {
            inner: web_pki(roots, &provider)?,
        }),
        _ => Arc::new(Unchecked { provider }),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&target.tls_files.cert_file, &target.tls_files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    Error::Config(format!(
                        "cannot read TLS certificate {}: {e}",
                        cert.display()
                    ))
                })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                Error::Config(format!("cannot read TLS key {}: {e}", key.display()))
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::Config(format!("bad TLS client certificate or key: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(Error::Config(
                "sslcert and sslkey must be given together".into(),
            ))
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

fn load_roots(path: &Path) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::Config(format!("cannot read TLS CA file {}: {e}", path.display())))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(Error::Config(format!(
            "TLS CA file {} contains no usable certificate",
            path.display()
        )));
    }
    Ok(roots)
}

fn web_pki(
    roots: Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, Error> {
    WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| Error::Config(format!("cannot use the TLS CA file: {e}")))
}

/// verify-ca: the chain must lead to a trusted root; the name is not checked.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// allow/prefer/require without a root certificate: encryption without authentication, as
/// libpq does. The handshake signatures are still checked.
#[derive(Debug)]
struct Unchecked {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
