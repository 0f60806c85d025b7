//! Where Sentinel meets the connection: a `Conn` behind Sentinel has one node, the master the
//! sentinels name, and it is located anew whenever that node has no connection (the first
//! call, or after an error, an abandoned call, or a renewal that found the master moved).
//! Nothing here runs for other targets.

use redis::{Client, ConnectionAddr};

use crate::error::Error;

use super::super::conn::{Conn, Failure, Node, Setup};
use super::super::{RedisAddr, RedisTarget};

impl Conn {
    /// Drop the connection: the next call connects again (behind Sentinel, to the master the
    /// sentinels name then).
    pub(in crate::backend::redis) fn reconnect(&mut self) {
        self.drop_connections();
    }

    /// Behind Sentinel, a connection about to be opened goes to the master the sentinels name
    /// now, checked with `ROLE`; it becomes the only node, and every call goes there.
    pub(in crate::backend::redis) async fn locate(&mut self) -> Result<(), Failure> {
        let Some(locator) = &mut self.sentinel else {
            return Ok(());
        };
        if self.nodes.first().is_some_and(|n| n.connection.is_some()) {
            return Ok(());
        }
        let (client, connection) = locator.locate().await.map_err(Failure::Sentinel)?;
        let mut node = Node::new(locator.current.clone().unwrap_or_default(), client);
        node.connection = Some(connection);
        self.nodes = vec![node];
        self.seeds = 1;
        self.home = 0;
        self.cluster = None;
        Ok(())
    }

    /// A client for the server `target.addr` (nothing is connected yet), with that target's
    /// credentials, database and TLS files: a sentinel, or the master one names.
    pub(in crate::backend::redis) fn client_for(
        target: &RedisTarget,
        display: &str,
    ) -> Result<Client, Error> {
        let addr = match &target.addr {
            RedisAddr::Tcp { host, port } | RedisAddr::Tls { host, port } => {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
            RedisAddr::Unix { path } => ConnectionAddr::Unix(path.clone()),
        };
        Setup::new(target, display)?.client(addr)
    }
}
