//! Where a Redis server is: `redis://`, `rediss://` and `redis+unix://` URLs, and the
//! password and TLS files of the config file's `[redis]` table; `redis-sentinel://` URLs are
//! [`sentinel`].

pub mod sentinel;

use std::path::PathBuf;

use crate::config::FileConfig;
use crate::error::Error;
use crate::kit::url::{parse_query, split_host_port, split_userinfo, Params};
use crate::secrets::{check_tls_files, credentials, Secret, TlsFiles};

use self::sentinel::SentinelTarget;

/// How to reach a Redis server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisAddr {
    Tcp { host: String, port: u16 },
    Tls { host: String, port: u16 },
    Unix { path: PathBuf },
}

/// A Redis server, database and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTarget {
    pub addr: RedisAddr,
    pub db: i64,
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub tls: TlsFiles,
    /// Redis Cluster: the URL's further hosts (`redis://h1:p1,h2:p2,…`), after `addr`.
    pub more_hosts: Vec<(String, u16)>,
    /// Behind Sentinel: the master is wherever the sentinels say (`addr` is then only the
    /// first sentinel, see [`sentinel`]).
    pub sentinel: Option<Box<SentinelTarget>>,
}

impl RedisTarget {
    /// The scheme name shown in DLOCK_BACKEND.
    pub fn scheme(&self) -> &'static str {
        if let Some(sentinel) = &self.sentinel {
            return if sentinel.tls {
                "rediss-sentinel"
            } else {
                "redis-sentinel"
            };
        }
        match self.addr {
            RedisAddr::Tcp { .. } => "redis",
            RedisAddr::Tls { .. } => "rediss",
            RedisAddr::Unix { .. } => "redis+unix",
        }
    }

    /// The server and database, for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        if let Some(sentinel) = &self.sentinel {
            return sentinel.identity(self.db);
        }
        match &self.addr {
            RedisAddr::Tcp { host, port } | RedisAddr::Tls { host, port }
                if !self.more_hosts.is_empty() =>
            {
                // One cluster, however its nodes are listed.
                let mut hosts: Vec<String> = std::iter::once((host, port))
                    .chain(self.more_hosts.iter().map(|(h, p)| (h, p)))
                    .map(|(h, p)| crate::kit::url::join_host_port(h, *p))
                    .collect();
                hosts.sort();
                hosts.dedup();
                format!("redis://{}/{}", hosts.join(","), self.db)
            }
            RedisAddr::Tcp { host, port } | RedisAddr::Tls { host, port } => {
                format!("redis://{host}:{port}/{}", self.db)
            }
            RedisAddr::Unix { path } => format!("redis+unix://{}/{}", path.display(), self.db),
        }
    }

    /// `{` and `}` would make the prefix a hash tag of its own.
    pub fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        if prefix.contains(['{', '}']) {
            return Err(format!(
                "'{prefix}' must not contain {{ or }} (they delimit the Redis hash tag)"
            ));
        }
        Ok(())
    }
}

/// What a `redis+unix://` query takes: the database, which a socket URL has no path for.
const UNIX_PARAMS: Params = Params {
    url: "a redis+unix URL",
    keys: &[("db", "db=N")],
    aliases: &[],
    fold: false,
    note: "",
};

/// What a `redis://` or `rediss://` query takes: nothing.
const TCP_PARAMS: Params = Params {
    url: "a Redis URL",
    keys: &[],
    aliases: &[],
    fold: false,
    note: "the database goes in the path (redis://host/N), TLS files and passwords in the \
           config file",
};

/// `redis://[user[:password]@]host[:port][/db]`, `rediss://…`, `redis+unix:///path[?db=N]`.
pub fn parse(scheme: &str, rest: &str) -> Result<RedisTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or_else(|| format!("expected {scheme}://host[:port][/db]"))?;
    let decode = |s: &str, what: &str| {
        crate::lock::decode_component(s)
            .ok_or_else(|| format!("bad percent-encoding in the URL's {what}"))
    };
    if scheme == "redis+unix" {
        let (path, query) = after.split_once('?').unwrap_or((after, ""));
        if !path.starts_with('/') {
            return Err("expected redis+unix:///path/to/socket[?db=N]".into());
        }
        let mut db = 0;
        for (_, n) in parse_query(query, &UNIX_PARAMS)? {
            db = parse_db(&n)?;
        }
        return Ok(RedisTarget {
            addr: RedisAddr::Unix {
                path: PathBuf::from(decode(path, "path")?),
            },
            db,
            user: None,
            password: None,
            tls: TlsFiles::default(),
            more_hosts: Vec::new(),
            sentinel: None,
        });
    }
    if after.contains('#') {
        return Err(
            "Redis URLs take no fragment here; put TLS files and passwords in the config file"
                .into(),
        );
    }
    let (after, query) = after.split_once('?').unwrap_or((after, ""));
    parse_query(query, &TCP_PARAMS)?;
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let (user, password, hostport) = split_userinfo(authority)?;
    // Several hosts: seed nodes of one Redis Cluster.
    let mut hosts = hostport.split(',');
    let (host, port) = split_host_port(hosts.next().unwrap_or_default(), 6379)?;
    let more_hosts = hosts
        .map(|h| split_host_port(h, 6379))
        .collect::<Result<Vec<_>, _>>()?;
    let db = match path.trim_start_matches('/') {
        "" => 0,
        n => parse_db(n)?,
    };
    if db != 0 && !more_hosts.is_empty() {
        return Err("a Redis Cluster has only database 0; remove the /N from the URL".into());
    }
    let addr = if scheme == "rediss" {
        RedisAddr::Tls { host, port }
    } else {
        RedisAddr::Tcp { host, port }
    };
    Ok(RedisTarget {
        addr,
        db,
        user,
        password,
        tls: TlsFiles::default(),
        more_hosts,
        sentinel: None,
    })
}

fn parse_db(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .ok()
        .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
        // Not shown: a password with an unencoded `/` ends up in the path.
        .ok_or_else(|| {
            "the URL's path is not a database number (a '/' in a password must be written %2F)"
                .to_owned()
        })
}

/// Password and TLS files for Redis, from the `[redis]` table (see [`credentials`]).
pub fn complete(target: &mut RedisTarget, file: &FileConfig) -> Result<(), Error> {
    let (password, tls) = credentials(
        "Redis",
        file.table("redis"),
        file,
        target.user.is_some(),
        target.password.take(),
        true,
    )?;
    target.password = password;
    target.tls = tls;
    if matches!(target.addr, RedisAddr::Tls { .. }) {
        check_tls_files(&target.tls)?;
    }
    if let Some(sentinel) = &mut target.sentinel {
        sentinel::complete(sentinel, file)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    #[test]
    fn redis_urls() {
        let Ok(t) = Target::parse_as::<RedisTarget>("redis://u:p%40ss@127.0.0.1:6380/2") else {
            panic!()
        };
        assert_eq!(
            t.addr,
            RedisAddr::Tcp {
                host: "127.0.0.1".into(),
                port: 6380
            }
        );
        assert_eq!(
            (
                t.db,
                t.user.as_deref(),
                t.password.as_ref().map(Secret::expose)
            ),
            (2, Some("u"), Some("p@ss"))
        );
        let Ok(t) = Target::parse_as::<RedisTarget>("rediss://[::1]") else {
            panic!()
        };
        assert_eq!(
            t.addr,
            RedisAddr::Tls {
                host: "::1".into(),
                port: 6379
            }
        );
        let Ok(t) = Target::parse_as::<RedisTarget>("redis+unix:///run/redis.sock?db=3") else {
            panic!()
        };
        assert_eq!(
            (t.addr.clone(), t.db),
            (
                RedisAddr::Unix {
                    path: "/run/redis.sock".into()
                },
                3
            )
        );
        for bad in [
            "redis://",
            "redis://h:0",
            "redis://h:70000",
            "redis://h/x",
            "redis://::1",
            "redis://h?x=1",
            "redis+unix://rel",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} was accepted");
        }
        assert!(!format!("{t:?}").contains("p@ss"));
        let Ok(t) = Target::parse_as::<RedisTarget>("redis://h2:7001,[::1]:7000,h1") else {
            panic!()
        };
        assert_eq!(
            t.more_hosts,
            vec![("::1".to_owned(), 7000), ("h1".to_owned(), 6379)]
        );
        let Ok(same) = Target::parse_as::<RedisTarget>("redis://h1:6379,h2:7001,[::1]:7000/0")
        else {
            panic!()
        };
        assert_eq!(t.identity(), same.identity());
        assert!(Target::parse("redis://h1,h2/3").is_err());
        assert!(Target::parse("redis://h1,").is_err());
        for (url, message) in [
            (
                "//h/0?db=1",
                "unknown URL parameter 'db'; a Redis URL takes no parameters; the database goes \
                 in the path (redis://host/N), TLS files and passwords in the config file; see \
                 dlock run --help",
            ),
            (
                "///run/redis.sock?dbb=1",
                "unknown URL parameter 'dbb' (did you mean 'db'?); a redis+unix URL takes db=N; \
                 see dlock run --help",
            ),
            (
                "///run/redis.sock?db=1&db=2",
                "the URL parameter 'db' is given twice",
            ),
        ] {
            let scheme = if url.starts_with("///") {
                "redis+unix"
            } else {
                "redis"
            };
            assert_eq!(parse(scheme, url).err().as_deref(), Some(message), "{url}");
        }
    }
}
