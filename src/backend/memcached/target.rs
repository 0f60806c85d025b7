//! Where the memcached servers are: `memcached://host[:port][,host[:port]…]` and
//! `memcached+unix:///path`, with the one option a URL can carry, `?allow-evictions=1`; and
//! which of several servers holds a given lock.
//!
//! Several servers are not a cluster: each lock lives on exactly one of them, chosen by
//! rendezvous hashing of the lock name over the servers' canonical identities (highest score
//! wins). There is no failover: while that server is down, its locks cannot be taken. Adding
//! a server moves only the names that now score highest on it; removing one moves only its
//! own names. Every client of a lock must list the same servers, or two of them can hold the
//! "same" lock on different servers.
//!
//! A server's identity is its resolved address and port, never its spelling: `localhost`,
//! `LOCALHOST`, `127.0.0.1` and `[::ffff:127.0.0.1]` are one server, in any order of the
//! list. A name that resolves to several addresses stands for the lowest of them (IPv4
//! before IPv6, then numerically), and dlock connects to that address only, so every client
//! that resolves the name alike reaches the same server (a round-robin name is not a
//! failover). Every listed name is resolved before any lock is touched: when one cannot be
//! resolved, no lock on any of the servers can be placed (69), because the lock might
//! belong to that server. Two entries that resolve to the same address are refused (78).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::kit::url::{join_host_port, split_host_port, Params};
use crate::lock::LockName;

/// memcached's default port.
pub const DEFAULT_PORT: u16 = 11211;

/// How to reach one memcached server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McAddr {
    Tcp { host: String, port: u16 },
    Unix { path: PathBuf },
}

impl McAddr {
    /// `host:port` or the socket path: what the server is called in messages, and what the
    /// name hash is computed over.
    pub fn label(&self) -> String {
        match self {
            McAddr::Tcp { host, port } => join_host_port(host, *port),
            McAddr::Unix { path } => path.display().to_string(),
        }
    }

    /// The server as a URL, for messages.
    pub fn display(&self) -> String {
        match self {
            McAddr::Tcp { .. } => format!("memcached://{}", self.label()),
            McAddr::Unix { .. } => format!("memcached+unix://{}", self.label()),
        }
    }
}

/// A set of memcached servers (one lock per server) and the eviction opt-in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemcachedTarget {
    pub servers: Vec<McAddr>,
    /// The user accepted a server that may evict lock items (`?allow-evictions=1`).
    pub allow_evictions: bool,
}

impl MemcachedTarget {
    /// The scheme name shown in DLOCK_BACKEND.
    pub fn scheme(&self) -> &'static str {
        match self.servers.first() {
            Some(McAddr::Unix { .. }) => "memcached+unix",
            _ => "memcached",
        }
    }

    /// The servers, for reentrancy (DLOCK_HELD): the same set in any order.
    pub fn identity(&self) -> String {
        let mut labels: Vec<String> = self.servers.iter().map(McAddr::label).collect();
        labels.sort();
        format!("{}://{}", self.scheme(), labels.join(","))
    }

    /// memcached keys are at most 250 bytes of printable ASCII without spaces; the prefix
    /// must leave room for the lock's part.
    pub fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        if prefix.len() > 64 {
            return Err(format!(
                "'{prefix}' is longer than 64 bytes (memcached keys are at most 250 bytes)"
            ));
        }
        if !prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "'{prefix}' must be printable ASCII without spaces (it is part of memcached keys)"
            ));
        }
        Ok(())
    }

    /// Every listed server with the address dlock connects to (see the module doc), within
    /// `budget` for each name's resolution.
    pub async fn resolve(&self, budget: Duration) -> Result<Vec<Server>, Error> {
        let mut servers: Vec<Server> = Vec::new();
        for written in &self.servers {
            let at = match written {
                McAddr::Unix { .. } => written.clone(),
                McAddr::Tcp { host, port } => McAddr::Tcp {
                    host: canonical_ip(host, *port, budget).await?.to_string(),
                    port: *port,
                },
            };
            if let Some(same) = servers.iter().find(|s| s.at == at) {
                return Err(Error::Config(format!(
                    "the URL lists one server twice: {} and {} are both {}",
                    same.written.label(),
                    written.label(),
                    at.label()
                )));
            }
            servers.push(Server {
                at,
                written: written.clone(),
            });
        }
        Ok(servers)
    }

    /// The server that holds `name` (rendezvous hashing over the resolved addresses).
    pub async fn server_for(&self, name: &LockName, budget: Duration) -> Result<Server, Error> {
        let servers = self.resolve(budget).await?;
        choose(&servers, name)
            .cloned()
            .ok_or_else(|| Error::Internal("a memcached URL without servers".into()))
    }
}

/// One server: where dlock connects, and how the URL spells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// The resolved address (or the socket path): the server's identity.
    pub at: McAddr,
    /// As the URL lists it.
    pub written: McAddr,
}

impl Server {
    /// The server for messages: as written, with the address when that differs.
    pub fn display(&self) -> String {
        if self.at == self.written {
            self.written.display()
        } else {
            format!("{} ({})", self.written.display(), self.at.label())
        }
    }
}

/// The server with the highest score for `name`; ties (never seen in practice) go to the
/// smaller address, so every client agrees.
fn choose<'a>(servers: &'a [Server], name: &LockName) -> Option<&'a Server> {
    let score = |server: &Server| {
        let mut hash = Sha256::new();
        hash.update(server.at.label().as_bytes());
        hash.update([0u8]);
        hash.update(name.as_str().as_bytes());
        let digest = hash.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(first)
    };
    servers.iter().max_by(|a, b| {
        score(a)
            .cmp(&score(b))
            .then_with(|| b.at.label().cmp(&a.at.label()))
    })
}

/// The address `host` stands for: itself when it is one (an IPv4-mapped IPv6 address as
/// IPv4), else the lowest address it resolves to.
async fn canonical_ip(host: &str, port: u16, budget: Duration) -> Result<IpAddr, Error> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip.to_canonical());
    }
    let cannot = |why: String| {
        Error::Unavailable(format!(
            "cannot resolve the memcached server '{}' ({why}); dlock needs the address of \
             every listed server to know which one holds a lock",
            join_host_port(host, port)
        ))
    };
    match tokio::time::timeout(budget, tokio::net::lookup_host((host, port))).await {
        Ok(Ok(found)) => found
            .map(|a| a.ip().to_canonical())
            .min()
            .ok_or_else(|| cannot("no addresses".into())),
        Ok(Err(e)) => Err(cannot(e.to_string())),
        Err(_) => Err(cannot(format!(
            "no answer within {}",
            humantime::format_duration(budget)
        ))),
    }
}

/// `memcached://host[:port][,host[:port]…][/][?allow-evictions=1]`,
/// `memcached+unix:///path[?allow-evictions=1]`.
pub fn parse(scheme: &str, rest: &str) -> Result<MemcachedTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or_else(|| format!("expected {scheme}://host[:port][,host[:port]…]"))?;
    if after.contains('#') {
        return Err("memcached URLs take no fragment".into());
    }
    let (location, query) = after.split_once('?').unwrap_or((after, ""));
    let allow_evictions = parse_query(query)?;
    if location.contains('@') {
        return Err(
            "memcached URLs take no user or password: dlock does not speak SASL to memcached"
                .into(),
        );
    }
    let servers = if scheme == "memcached+unix" {
        if !location.starts_with('/') {
            return Err("expected memcached+unix:///path/to/socket".into());
        }
        let path = crate::lock::decode_component(location)
            .ok_or("bad percent-encoding in the URL's path")?;
        vec![McAddr::Unix {
            path: PathBuf::from(path),
        }]
    } else {
        let (hosts, path) = location.split_at(location.find('/').unwrap_or(location.len()));
        if !path.is_empty() && path != "/" {
            return Err("memcached URLs take no path; use --prefix for a namespace".into());
        }
        let mut servers = Vec::new();
        for host in hosts.split(',') {
            let (host, port) = split_host_port(host, DEFAULT_PORT)?;
            let addr = McAddr::Tcp { host, port };
            if servers.contains(&addr) {
                return Err(format!("the server {} is listed twice", addr.label()));
            }
            servers.push(addr);
        }
        servers
    };
    Ok(MemcachedTarget {
        servers,
        allow_evictions,
    })
}

/// What the query takes: `allow-evictions`.
const PARAMS: Params = Params {
    url: "a memcached URL",
    keys: &[("allow-evictions", "allow-evictions=1")],
    aliases: &[],
    fold: false,
    note: "",
};

/// The query: only `allow-evictions=1|0|true|false`.
fn parse_query(query: &str) -> Result<bool, String> {
    let mut allow = false;
    for (_, value) in crate::kit::url::parse_query(query, &PARAMS)? {
        allow = match value.as_str() {
            "1" | "true" | "yes" => true,
            "0" | "false" | "no" => false,
            _ => return Err("allow-evictions takes 1 or 0".into()),
        };
    }
    Ok(allow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    fn parse_ok(url: &str) -> MemcachedTarget {
        match Target::parse_as::<MemcachedTarget>(url) {
            Ok(t) => t,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn memcached_urls() {
        let t = parse_ok("memcached://127.0.0.1");
        assert_eq!(
            t.servers,
            vec![McAddr::Tcp {
                host: "127.0.0.1".into(),
                port: 11211
            }]
        );
        assert!(!t.allow_evictions);
        let t = parse_ok("memcached://b:2,[::1]:3/?allow-evictions=1");
        assert_eq!(t.servers.len(), 2);
        assert_eq!(t.servers[1].label(), "[::1]:3");
        assert!(t.allow_evictions);
        assert_eq!(t.identity(), "memcached://[::1]:3,b:2");
        assert_eq!(
            t.identity(),
            parse_ok("memcached://[::1]:3,b:2").identity(),
            "the order of the servers does not matter"
        );
        let t = parse_ok("memcached+unix:///run/mc.sock?allow-evictions=1");
        assert_eq!(
            t.servers,
            vec![McAddr::Unix {
                path: "/run/mc.sock".into()
            }]
        );
        assert_eq!(t.scheme(), "memcached+unix");
        for bad in [
            "memcached://",
            "memcached://h:0",
            "memcached://h/x",
            "memcached://u:p@h",
            "memcached://h?x=1",
            "memcached://h?allow-evictions=maybe",
            "memcached://h?allow-evictions=1&allow-evictions=0",
            "memcached://h?allow-evictions",
            "memcached://h,h:11211",
            "memcached+unix://rel",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} was accepted");
        }
        assert_eq!(
            parse("memcached", "//h?allow-eviction=1").err().as_deref(),
            Some(
                "unknown URL parameter 'allow-eviction' (did you mean 'allow-evictions'?); a \
                 memcached URL takes allow-evictions=1; see dlock run --help"
            )
        );
        assert_eq!(
            parse("memcached", "//h?allow-evictions=no&").map(|t| t.allow_evictions),
            Ok(false)
        );
    }

    /// The servers of `url` as if each name were its own address.
    fn unresolved(url: &str) -> Vec<Server> {
        parse_ok(url)
            .servers
            .into_iter()
            .map(|a| Server {
                at: a.clone(),
                written: a,
            })
            .collect()
    }

    #[test]
    fn a_name_maps_to_one_server_and_moves_only_when_its_server_changes() {
        let three = unresolved("memcached://a,b,c");
        let two = unresolved("memcached://a,b");
        let reordered = unresolved("memcached://c,a,b");
        let mut used = std::collections::HashSet::new();
        for i in 0..300 {
            let name = LockName::new(&format!("job-{i}")).unwrap();
            let chosen = choose(&three, &name).unwrap();
            used.insert(chosen.at.label());
            assert_eq!(chosen, choose(&reordered, &name).unwrap());
            if chosen.at.label() != "c:11211" {
                assert_eq!(
                    chosen,
                    choose(&two, &name).unwrap(),
                    "{name} moved needlessly"
                );
            }
        }
        assert_eq!(used.len(), 3, "every server gets some names");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn every_spelling_of_a_server_is_one_identity() {
        let budget = Duration::from_secs(5);
        let spellings = [
            "memcached://127.0.0.1:7001,127.0.0.1:7002",
            "memcached://localhost:7002,LOCALHOST:7001",
            "memcached://[::ffff:127.0.0.1]:7001,localhost:7002",
        ];
        let mut seen = Vec::new();
        for url in spellings {
            let mut at: Vec<String> = parse_ok(url)
                .resolve(budget)
                .await
                .unwrap()
                .iter()
                .map(|s| s.at.label())
                .collect();
            at.sort();
            seen.push(at);
        }
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
        let twice = parse_ok("memcached://localhost:7001,127.0.0.1:7001");
        assert!(matches!(twice.resolve(budget).await, Err(Error::Config(_))));
        let nowhere = parse_ok("memcached://no-such-host.invalid:7001,127.0.0.1:7002");
        assert!(matches!(
            nowhere.resolve(budget).await,
            Err(Error::Unavailable(_))
        ));
    }

    #[test]
    fn prefixes_must_fit_in_keys() {
        let t = parse_ok("memcached://h");
        assert!(t.check_prefix("dlock").is_ok());
        assert!(t.check_prefix("a b").is_err());
        assert!(t.check_prefix(&"x".repeat(65)).is_err());
        assert!(t.check_prefix("é").is_err());
    }
}
