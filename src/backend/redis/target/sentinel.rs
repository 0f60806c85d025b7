//! `redis-sentinel://` and `rediss-sentinel://` URLs (the form Lettuce uses): the sentinels,
//! the master's name, the data nodes' database and credentials, and the opt-ins.
//!
//! ```text
//! redis-sentinel://[[user:]password@]host[:port][,host[:port]…][/db][?replicas=N&…]#master-name
//! ```
//!
//! The user info is the *data nodes'* (the master's), exactly as in `redis://`, so that moving
//! from one server to Sentinel changes only the host part. The sentinels often have a password
//! of their own (`requirepass` in sentinel.conf): it is never in the URL, where it would end up
//! in process listings, but comes from `DLOCK_SENTINEL_PASSWORD` or the config file's
//! `[redis-sentinel]` table (`password_file`). The query takes `sentinel-user` (an ACL user on
//! the sentinels), `replicas` and `replicas-timeout`.

use std::time::Duration;

use crate::config::FileConfig;
use crate::error::Error;
use crate::kit::url::{parse_query, sorted_endpoints, split_host_port, split_userinfo, Params};
use crate::secrets::{read_password_file, Secret, TlsFiles};

use super::super::{RedisAddr, RedisTarget};

/// The port of a sentinel when the URL names none.
pub const SENTINEL_PORT: u16 = 26379;
/// How long `?replicas=N` waits for the replicas by default.
const DEFAULT_REPLICAS_TIMEOUT: Duration = Duration::from_secs(1);
/// The config file's table for the sentinels' own credentials.
pub const CONFIG_TABLE: &str = "redis-sentinel";

/// Where the sentinels are and what they call the master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The sentinels, in the order the URL lists them (asked in that order).
    pub sentinels: Vec<(String, u16)>,
    /// The master's name in the sentinels' configuration (`sentinel monitor <name> …`).
    pub master: String,
    /// The sentinels' own credentials (not the data nodes').
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// `?replicas=N`: after acquiring, this many replicas must acknowledge the hold before the
    /// command starts.
    pub replicas: u32,
    pub replicas_timeout: Duration,
    /// TLS to the sentinels as well as to the data nodes (`rediss-sentinel://`).
    pub tls: bool,
}

impl SentinelTarget {
    /// The same sentinels and master whatever the order or spelling, for reentrancy.
    pub fn identity(&self, db: i64) -> String {
        format!(
            "redis-sentinel://{}/{db}#{}",
            sorted_endpoints(&self.sentinels),
            self.master
        )
    }
}

/// What a Sentinel URL's query takes.
const PARAMS: Params = Params {
    url: "a Sentinel URL",
    keys: &[
        ("replicas", "replicas=N"),
        ("replicas-timeout", "replicas-timeout=D"),
        ("sentinel-user", "sentinel-user=NAME"),
    ],
    aliases: &[],
    fold: false,
    note: "the sentinels' password goes in DLOCK_SENTINEL_PASSWORD or the [redis-sentinel] \
           table's password_file",
};

/// Parse what follows `redis-sentinel:` (or `rediss-sentinel:`).
pub fn parse(scheme: &str, rest: &str) -> Result<RedisTarget, String> {
    let tls = scheme == "rediss-sentinel";
    let usage = || format!("expected {scheme}://host[:port][,host[:port]…][/db]#master-name");
    let after = rest.strip_prefix("//").ok_or_else(usage)?;
    let (before_fragment, fragment) = after
        .split_once('#')
        .ok_or("a Sentinel URL must name the master after '#', e.g. …/0#mymaster")?;
    let master = crate::lock::decode_component(fragment)
        .filter(|m| !m.is_empty() && !m.chars().any(char::is_control))
        .ok_or("the master name after '#' is empty or not valid")?;
    let (main, query) = before_fragment
        .split_once('?')
        .unwrap_or((before_fragment, ""));
    let (authority, path) = main.split_at(main.find('/').unwrap_or(main.len()));
    let (user, password, hosts) = split_userinfo(authority)?;
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        sentinels.push(split_host_port(host, SENTINEL_PORT)?);
    }
    let db = match path.trim_start_matches('/') {
        "" => 0,
        n => n
            .parse::<i64>()
            .ok()
            .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
            .ok_or(
                "the URL's path is not a database number (a '/' in a password must be written %2F)",
            )?,
    };
    let mut target = SentinelTarget {
        sentinels,
        master,
        user: None,
        password: None,
        replicas: 0,
        replicas_timeout: DEFAULT_REPLICAS_TIMEOUT,
        tls,
    };
    for (key, value) in parse_query(query, &PARAMS)? {
        match key {
            "replicas" => {
                target.replicas = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n <= 1000)
                    .ok_or("replicas= must be a number of replicas from 0 to 1000")?;
            }
            "replicas-timeout" => {
                target.replicas_timeout = humantime::parse_duration(&value)
                    .ok()
                    .filter(|d| !d.is_zero() && *d <= Duration::from_secs(60))
                    .ok_or("replicas-timeout= must be a duration from 1ms to 60s, e.g. 500ms")?;
            }
            "sentinel-user" if value.is_empty() => {
                return Err("sentinel-user= must name a user".into())
            }
            "sentinel-user" => target.user = Some(value),
            // parse_query gives only the keys of PARAMS.
            _ => {}
        }
    }
    let (host, port) = target.sentinels[0].clone();
    // `addr` names the first sentinel only so that the data-node settings (TLS or not) have a
    // place; connections go where the sentinels say the master is.
    let addr = if tls {
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
        more_hosts: Vec::new(),
        sentinel: Some(Box::new(target)),
    })
}

/// The sentinels' password: `DLOCK_SENTINEL_PASSWORD`, else the `[redis-sentinel]` table's
/// `password_file`. A `sentinel-user` without a password is a usage error.
pub fn complete(target: &mut SentinelTarget, file: &FileConfig) -> Result<(), Error> {
    if let Some(from_env) = std::env::var("DLOCK_SENTINEL_PASSWORD")
        .ok()
        .filter(|p| !p.is_empty())
    {
        target.password = Some(Secret::new(from_env));
    } else if let Some(path) = file
        .table(CONFIG_TABLE)
        .and_then(|t| t.password_file.as_deref())
    {
        target.password = Some(read_password_file(path)?);
    }
    if target.user.is_some() && target.password.is_none() {
        return Err(Error::Usage(
            "sentinel-user= is given but no sentinel password (DLOCK_SENTINEL_PASSWORD or the \
             [redis-sentinel] table's password_file)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    fn sentinel_of(url: &str) -> (RedisTarget, SentinelTarget) {
        let Ok(t) = Target::parse_as::<RedisTarget>(url) else {
            panic!("{url} was refused")
        };
        let s = t.sentinel.clone().expect("a sentinel target");
        (t, *s)
    }

    #[test]
    fn sentinel_urls() {
        let (t, s) = sentinel_of("redis-sentinel://:p%40ss@h1,h2:26380,[::1]/2#my%20master");
        assert_eq!(
            s.sentinels,
            vec![
                ("h1".to_owned(), 26379),
                ("h2".to_owned(), 26380),
                ("::1".to_owned(), 26379)
            ]
        );
        assert_eq!(s.master, "my master");
        assert_eq!(t.db, 2);
        assert_eq!(t.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!((s.replicas, s.tls), (0, false));
        assert_eq!(t.scheme(), "redis-sentinel");
        assert_eq!(
            t.identity(),
            "redis-sentinel://::1:26379,h1:26379,h2:26380/2#my master"
        );
        let (t, s) = sentinel_of(
            "rediss-sentinel://h?replicas=1&replicas-timeout=250ms&sentinel-user=sen#m",
        );
        assert_eq!(
            (s.replicas, s.replicas_timeout, s.tls, s.user.as_deref()),
            (1, Duration::from_millis(250), true, Some("sen"))
        );
        assert_eq!(t.scheme(), "rediss-sentinel");
        for bad in [
            "redis-sentinel://h",
            "redis-sentinel://h#",
            "redis-sentinel://h/x#m",
            "redis-sentinel://h:0#m",
            "redis-sentinel://h,#m",
            "redis-sentinel://h?password=x#m",
            "redis-sentinel://h?replicas=x#m",
            "redis-sentinel://h?replicas=1&replicas=2#m",
            "redis-sentinel://h?sentinel-user=#m",
            "redis-sentinel://h?replicas#m",
            "redis-sentinel:h#m",
        ] {
            let error = Target::parse(bad).expect_err(bad);
            assert!(!error.contains("password=x"), "{error}");
        }
        assert_eq!(
            parse("redis-sentinel", "//h?replica=1#m").err().as_deref(),
            Some(
                "unknown URL parameter 'replica' (did you mean 'replicas'?); a Sentinel URL \
                 takes replicas=N, replicas-timeout=D, sentinel-user=NAME; the sentinels' \
                 password goes in DLOCK_SENTINEL_PASSWORD or the [redis-sentinel] table's \
                 password_file; see dlock run --help"
            )
        );
    }
}
