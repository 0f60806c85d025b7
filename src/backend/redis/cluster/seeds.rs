//! A URL with several hosts names nodes of one cluster: every one of them is checked once per
//! connection, not only the first that answers (a standalone server or a sentinel among them
//! would take locks of its own whenever it is the first to answer).
//!
//! Cost: one `CLUSTER NODES` to the node that answered; a host of the URL that is one of the
//! nodes it lists (by the address the cluster announces, or that address resolved) costs
//! nothing more. Only a host that is not listed so (a NAT, a name that resolves elsewhere) is
//! asked `CLUSTER MYID`; one that does not answer, within [`SEED_ANSWER`], cannot take locks
//! and is let be.

use std::collections::HashSet;
use std::net::IpAddr;

use redis::{ErrorKind, RedisError};

use crate::error::Error;
use crate::kit::url::join_host_port;

use crate::backend::redis::conn::{Conn, Failure, Request};

/// The nodes a `CLUSTER NODES` reply lists: their ids, and their addresses (host or IP, port).
struct Members {
    ids: HashSet<String>,
    addrs: HashSet<(String, u16)>,
}

impl Members {
    /// Parse `<id> <ip:port@cport[,hostname]> <flags> …` lines; `asked` stands for a node
    /// that does not know its own IP yet (`:port@cport`).
    fn parse(text: &str, asked: &str) -> Members {
        let mut members = Members {
            ids: HashSet::new(),
            addrs: HashSet::new(),
        };
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(id), Some(addr)) = (fields.next(), fields.next()) else {
                continue;
            };
            members.ids.insert(id.to_owned());
            let (addr, hostname) = addr.split_once(',').unwrap_or((addr, ""));
            let addr = addr.split_once('@').map_or(addr, |(a, _)| a);
            let Some((ip, port)) = addr.rsplit_once(':') else {
                continue;
            };
            let Ok(port) = port.parse::<u16>() else {
                continue;
            };
            let ip = if ip.is_empty() { asked } else { ip };
            members.addrs.insert((ip.to_owned(), port));
            if !hostname.is_empty() {
                members.addrs.insert((hostname.to_owned(), port));
            }
        }
        members
    }

    /// `host:port` is listed, as written or resolved.
    async fn lists(&self, host: &str, port: u16) -> bool {
        if self.addrs.contains(&(host.to_owned(), port)) {
            return true;
        }
        let Ok(resolved) = tokio::net::lookup_host((host, port)).await else {
            return false;
        };
        let listed: HashSet<(IpAddr, u16)> = self
            .addrs
            .iter()
            .filter_map(|(h, p)| h.parse::<IpAddr>().ok().map(|ip| (ip.to_canonical(), *p)))
            .collect();
        resolved
            .into_iter()
            .any(|a| listed.contains(&(a.ip().to_canonical(), a.port())))
    }
}

/// How long a host of the URL that the cluster does not list has to say which node it is.
const SEED_ANSWER: std::time::Duration = std::time::Duration::from_secs(1);

impl Conn {
    /// Every host of the URL is a node of the cluster that node `asked` belongs to; the
    /// first that is not is refused (78, by name).
    pub(super) async fn check_seeds(&mut self, asked: usize) -> Result<(), Failure> {
        let command = redis::cmd("CLUSTER").arg("NODES").clone();
        let text: String = self
            .send_on(asked, &Request::Command(&command, None), false)
            .await
            .map_err(Failure::Redis)?;
        let asked_host = self.nodes[asked].addr.clone().unwrap_or_default().0;
        let members = Members::parse(&text, &asked_host);
        for index in 0..self.seeds {
            let Some((host, port)) = self.nodes[index].addr.clone() else {
                continue;
            };
            if index == asked || members.lists(&host, port).await {
                continue;
            }
            let command = redis::cmd("CLUSTER").arg("MYID").clone();
            let asked = tokio::time::timeout(
                SEED_ANSWER,
                self.send_on::<String>(index, &Request::Command(&command, None), false),
            )
            .await;
            let answer = match asked {
                Ok(answer) => answer,
                // Silent (its packets dropped, a stopped process): it cannot take locks
                // either way, and must not use up the call's time.
                Err(_) => {
                    self.drop_connection(index);
                    continue;
                }
            };
            let why = match answer {
                Ok(id) if members.ids.contains(&id) => continue,
                Ok(_) => "a node of another cluster".to_owned(),
                // Not answering: it cannot take locks either way.
                Err(e) if unreachable(&e) => continue,
                Err(e) if e.to_string().contains("cluster support disabled") => {
                    "a standalone server (cluster_enabled:0)".to_owned()
                }
                Err(e) if e.to_string().contains("unknown command") => {
                    "not a cluster node: a Redis Sentinel?".to_owned()
                }
                Err(e) => format!("not a cluster node: {e}"),
            };
            return Err(Failure::Refused(Error::Config(format!(
                "{}: {} is {why}, not a node of the Redis Cluster the other hosts belong to; \
                 a URL with several hosts names nodes of one cluster",
                self.setup.display(),
                join_host_port(&host, port)
            ))));
        }
        Ok(())
    }
}

fn unreachable(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.kind() == ErrorKind::Io
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_give_ids_and_addresses() {
        let text = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                    b2 :7001@17001 master - 0 0 2 connected\n\
                    c3 ::1:7002@17002,node-c slave a1 0 0 1 connected\n";
        let members = Members::parse(text, "10.0.0.1");
        assert!(members.ids.contains("b2") && members.ids.len() == 3);
        assert!(members.addrs.contains(&("127.0.0.1".to_owned(), 7000)));
        assert!(members.addrs.contains(&("10.0.0.1".to_owned(), 7001)));
        assert!(members.addrs.contains(&("::1".to_owned(), 7002)));
        assert!(members.addrs.contains(&("node-c".to_owned(), 7002)));
    }
}
