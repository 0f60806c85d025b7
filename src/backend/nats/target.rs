//! Where a NATS JetStream key-value bucket is: `nats://` (and `tls://`, `nats+tls://`, as the
//! NATS clients spell TLS) with one or more servers and the bucket as the path, the user and
//! password of the URL, and the credentials and TLS files the `nats` CLI reads from the
//! environment (`NATS_CREDS`, a `.creds` file; `NATS_NKEY`, an NKey seed file; `NATS_CA`,
//! `NATS_CERT`, `NATS_KEY`).

use std::path::PathBuf;

use crate::error::Error;
use crate::kit::url::{parse_query, sorted_endpoints, split_host_port, split_userinfo, Params};
use crate::secrets::{check_tls_files, Secret, TlsFiles};

/// The bucket dlock keeps its locks in when the URL names none.
pub const DEFAULT_BUCKET: &str = "dlock";
/// The port a URL without one reaches.
pub const DEFAULT_PORT: u16 = 4222;
/// The most replicas a JetStream stream has.
const MAX_REPLICAS: usize = 5;

/// A NATS server or cluster and the bucket of the locks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsTarget {
    pub servers: Vec<(String, u16)>,
    pub tls: bool,
    pub bucket: String,
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// The replicas of a bucket dlock creates (`?replicas=N`).
    pub replicas: usize,
    /// A `.creds` file (JWT and NKey seed), from `NATS_CREDS`.
    pub creds: Option<PathBuf>,
    /// An NKey seed file, from `NATS_NKEY`.
    pub nkey: Option<PathBuf>,
    /// The CA (`NATS_CA`) and client certificate (`NATS_CERT`, `NATS_KEY`) of TLS.
    pub tls_files: TlsFiles,
}

impl NatsTarget {
    /// The scheme name shown in DLOCK_BACKEND.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "tls"
        } else {
            "nats"
        }
    }

    /// The servers and bucket, for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        format!("nats://{}/{}", sorted_endpoints(&self.servers), self.bucket)
    }

    /// Credentials from the environment, the way the `nats` CLI reads them; the files are
    /// read when connecting.
    pub fn complete(&mut self) -> Result<(), Error> {
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        self.creds = path("NATS_CREDS");
        self.nkey = path("NATS_NKEY");
        if self.creds.is_some() && self.nkey.is_some() {
            return Err(Error::Config(
                "NATS_CREDS and NATS_NKEY are both set; set one".into(),
            ));
        }
        self.tls_files = TlsFiles {
            ca_file: path("NATS_CA"),
            cert_file: path("NATS_CERT"),
            key_file: path("NATS_KEY"),
        };
        check_tls_files(&self.tls_files)
    }
}

const PARAMS: Params = Params {
    url: "a NATS URL",
    keys: &[("replicas", "replicas=N")],
    aliases: &[],
    fold: false,
    note: "credentials go in the URL's user info, NATS_CREDS or NATS_NKEY",
};

/// `nats://[user[:password]@]host[:port][,host[:port]…][/bucket][?replicas=N]`, `tls://…`,
/// `nats+tls://…`.
pub fn parse(scheme: &str, rest: &str) -> Result<NatsTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or_else(|| format!("expected {scheme}://host[:port][,host[:port]…][/bucket]"))?;
    if after.contains('#') {
        return Err("NATS URLs take no fragment".into());
    }
    let (after, query) = after.split_once('?').unwrap_or((after, ""));
    let mut replicas = 1;
    for (key, value) in parse_query(query, &PARAMS)? {
        if key == "replicas" {
            replicas = value
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_REPLICAS).contains(n))
                .ok_or_else(|| format!("replicas must be a number from 1 to {MAX_REPLICAS}"))?;
        }
    }
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let bucket = match path.trim_start_matches('/') {
        "" => DEFAULT_BUCKET.to_owned(),
        name if name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')) =>
        {
            name.to_owned()
        }
        // Not shown: a password with an unencoded `/` ends up here.
        _ => {
            return Err(
                "a NATS bucket name is letters, digits, '_' and '-' (a '/' in a \
                        password must be written %2F)"
                    .into(),
            )
        }
    };
    let (user, password, hosts) = split_userinfo(authority)?;
    let servers = hosts
        .split(',')
        .map(|h| split_host_port(h, DEFAULT_PORT))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NatsTarget {
        servers,
        tls: scheme != "nats",
        bucket,
        user,
        password,
        replicas,
        creds: None,
        nkey: None,
        tls_files: TlsFiles::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    #[test]
    fn nats_urls_name_servers_bucket_and_replicas() {
        let Ok(t) = Target::parse_as::<NatsTarget>("nats://u:pw@127.0.0.1:4223,[::1],h/locks")
        else {
            panic!()
        };
        assert_eq!(
            t.servers,
            vec![
                ("127.0.0.1".into(), 4223),
                ("::1".into(), 4222),
                ("h".into(), 4222)
            ]
        );
        assert_eq!(t.bucket, "locks");
        assert_eq!(t.user.as_deref(), Some("u"));
        assert_eq!(t.password.as_ref().map(Secret::expose), Some("pw"));
        assert!(!t.tls);
        let Ok(t) = Target::parse_as::<NatsTarget>("tls://h?replicas=3") else {
            panic!()
        };
        assert_eq!((t.tls, t.bucket.as_str(), t.replicas), (true, "dlock", 3));
        assert!(matches!(
            Target::parse_as::<NatsTarget>("nats+tls://h/"),
            Ok(NatsTarget { tls: true, .. })
        ));
        for bad in [
            "nats://",
            "nats://h,",
            "nats://h/a/b",
            "nats://h/a.b",
            "nats://h?replicas=0",
            "nats://h?replicas=6",
            "nats://h#x",
            "nats://h:0",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
