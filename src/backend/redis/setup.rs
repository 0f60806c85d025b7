//! What it takes to open a connection to a node of a target: its credentials, database and
//! TLS files (read once), and a client for one host and port. `Conn` opens its nodes with it,
//! and the Sentinel locator the sentinels and the master they name.

use redis::{
    Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, RedisError, TlsCertificates,
};

use crate::error::Error;

use super::{RedisAddr, RedisTarget};

/// What it takes to open a connection to any node: credentials, database, TLS files (read
/// once), for the URL's hosts and for the nodes a cluster names.
pub(super) struct Setup {
    redis: RedisConnectionInfo,
    tls: Option<TlsCertificates>,
    display: String,
}

impl Setup {
    pub(super) fn new(target: &RedisTarget, display: &str) -> Result<Setup, Error> {
        let mut redis = RedisConnectionInfo::default()
            .set_db(target.db)
            .set_skip_set_lib_name();
        if let Some(user) = &target.user {
            redis = redis.set_username(user);
        }
        if let Some(password) = &target.password {
            redis = redis.set_password(password.expose());
        }
        let tls = match &target.addr {
            RedisAddr::Tls { .. } => {
                let read = |path: &std::path::PathBuf| {
                    std::fs::read(path)
                        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))
                };
                let root_cert = target.tls.ca_file.as_ref().map(read).transpose()?;
                let client_tls = match (&target.tls.cert_file, &target.tls.key_file) {
                    (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                        client_cert: read(cert)?,
                        client_key: read(key)?,
                    }),
                    _ => None,
                };
                Some(TlsCertificates {
                    client_tls,
                    root_cert,
                })
            }
            _ => None,
        };
        Ok(Setup {
            redis,
            tls,
            display: display.to_owned(),
        })
    }

    pub(super) fn display(&self) -> &str {
        &self.display
    }

    /// Over TLS (`rediss://`).
    pub(super) fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A client for one node (a host and port; TLS when the URL said `rediss://`).
    pub(super) fn client(&self, addr: ConnectionAddr) -> Result<Client, Error> {
        let setup = |e: RedisError| {
            Error::Config(format!(
                "cannot set up the connection to {}: {e}",
                self.display
            ))
        };
        let addr = match (addr, &self.tls) {
            (ConnectionAddr::Tcp(host, port), Some(_)) => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            },
            (addr, _) => addr,
        };
        let info = addr
            .into_connection_info()
            .map_err(setup)?
            .set_redis_settings(self.redis.clone())
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        match &self.tls {
            Some(tls) => Client::build_with_tls(info, tls.clone()).map_err(setup),
            None => Client::open(info).map_err(setup),
        }
    }

    /// A client for the server `target.addr` (nothing is connected yet), with that target's
    /// credentials, database and TLS files: a sentinel, or the master one names.
    pub(super) fn client_for(target: &RedisTarget, display: &str) -> Result<Client, Error> {
        let addr = match &target.addr {
            RedisAddr::Tcp { host, port } | RedisAddr::Tls { host, port } => {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
            RedisAddr::Unix { path } => ConnectionAddr::Unix(path.clone()),
        };
        Setup::new(target, display)?.client(addr)
    }
}
