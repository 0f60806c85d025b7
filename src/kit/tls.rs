//! The TLS set-up the rustls-based clients (Redis, etcd, MySQL) need before their first
//! connection.

/// Make ring rustls's crypto provider: the Redis and etcd clients pick none, and without one
/// the first TLS connection panics. Installing it twice is harmless.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
