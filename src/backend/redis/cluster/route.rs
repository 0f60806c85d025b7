//! Routing a call to its slot's master: the slot table (`CLUSTER SLOTS`, fetched only when the
//! URL names several hosts or a listing needs every master), `MOVED` (the slot has a new
//! master: remember it), `ASK` (the slot is being migrated: this one call goes to the
//! importing node, after `ASKING`), `TRYAGAIN` / `CLUSTERDOWN` (a migration or a failover is
//! under way: wait a little and ask again), and a master that stopped answering (ask the
//! other nodes who serves the slot now). Every loop is bounded in count; the caller's budget
//! bounds it in time.

use std::time::Duration;

use redis::{ConnectionAddr, ErrorKind, FromRedisValue, RedisError, ServerErrorKind, Value};

use crate::error::Error;

use crate::backend::redis::conn::{Conn, Failure, Node, Request};
use crate::backend::redis::failure::in_transition;
use crate::backend::redis::topology::{parse_node, NodeAddr, SlotMap};

/// Redirections one call follows in a row before it pauses as for a migration: a slot moves
/// once per migration, so more in a row means the nodes disagree for a moment (between the
/// `SETSLOT … NODE` of a migration's last step, or an `ASK` answered by `TRYAGAIN`).
const MAX_REDIRECTS: u32 = 16;
/// Pauses within one call while a migration or failover settles (the call's budget bounds
/// them in time: `--wait`, the keeper's attempt, or `OP_TIMEOUT`).
const MAX_SETTLE: u32 = 1000;
/// The first pause before asking again while a migration or a failover settles; it doubles up
/// to [`SETTLE_PAUSE_MAX`]. Not derived from the lease: it only spaces out questions to a
/// cluster that has said "not now", and the call's budget (which is derived) ends the wait.
const SETTLE_PAUSE_FIRST: Duration = Duration::from_millis(20);
/// The longest pause between two questions while the cluster settles: once the migration
/// ends, a waiter or a release gets through within this (a hand-off is late by at most this),
/// and a cluster that keeps saying "not now" for seconds is asked 5 times a second.
const SETTLE_PAUSE_MAX: Duration = Duration::from_millis(200);
/// How long a node asked for the slot table has to answer before the next one is asked
/// (the last one asked has what is left of the call).
const NODE_ANSWER: Duration = Duration::from_secs(1);

impl Conn {
    /// Send `request` to its slot's master, following the cluster.
    pub(in crate::backend::redis) async fn send_routed<T: FromRedisValue>(
        &mut self,
        request: &Request<'_>,
    ) -> Result<T, Failure> {
        let slot = request.slot();
        let (mut redirects, mut settles) = (0, 0);
        let mut pause = SETTLE_PAUSE_FIRST;
        let mut ask: Option<usize> = None;
        loop {
            let asking = ask.is_some();
            let index = match ask.take() {
                Some(index) => index,
                None => self.node_for(slot).await?,
            };
            let error = match self.send_on(index, request, asking).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let redirect = error
                .redirect_node()
                .and_then(|(node, s)| parse_node(node).map(|node| (node, s)));
            let settle = match (error.kind(), redirect) {
                (
                    ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask)),
                    Some((node, s)),
                ) => {
                    let target = self.index_of(&node).map_err(Failure::Refused)?;
                    let map = self.cluster.get_or_insert_with(SlotMap::default);
                    if kind == ServerErrorKind::Moved {
                        map.learn(s, node);
                    } else {
                        ask = Some(target);
                    }
                    redirects += 1;
                    // Redirected back and forth: the nodes disagree while a migration
                    // finishes; ask again after a pause.
                    redirects > MAX_REDIRECTS
                }
                _ if in_transition(&error) => true,
                _ if self.cluster.is_some() && lost_node(&error) => {
                    // The master died or is being replaced: ask the others who serves it now.
                    tracing::debug!(
                        "cluster node did not answer ({error}); re-reading the slot table"
                    );
                    if let (Some(slot), Some(map)) = (slot, self.cluster.as_mut()) {
                        map.forget(slot);
                    }
                    self.settle(error, &mut pause).await;
                    let _ = self.discover(Some(index)).await;
                    settles += 1;
                    if settles >= MAX_SETTLE {
                        return Err(self.settled_out());
                    }
                    continue;
                }
                _ => return Err(Failure::Redis(error)),
            };
            if settle {
                if settles >= MAX_SETTLE {
                    return Err(Failure::Redis(error));
                }
                settles += 1;
                redirects = 0;
                ask = None;
                self.settle(error, &mut pause).await;
            }
        }
    }

    /// Wait out a migration or a failover (`error`: what the cluster said, reported if the
    /// call runs out of time): one pause, each twice as long as the one before, up to
    /// [`SETTLE_PAUSE_MAX`].
    async fn settle(&mut self, error: RedisError, pause: &mut Duration) {
        self.settling = Some(error);
        tokio::time::sleep(*pause).await;
        *pause = (*pause * 2).min(SETTLE_PAUSE_MAX);
    }

    /// The call gave up after [`MAX_SETTLE`] pauses: what the cluster said last.
    fn settled_out(&mut self) -> Failure {
        self.settling.take().map_or_else(
            || {
                Failure::Redis(RedisError::from((
                    ErrorKind::Io,
                    "no cluster node answered",
                )))
            },
            Failure::Redis,
        )
    }

    /// The node for `slot`: its master when known, else the node at hand. With several hosts
    /// in the URL, the slot table is read first (which also proves they are a cluster).
    async fn node_for(&mut self, slot: Option<u16>) -> Result<usize, Failure> {
        if self.cluster.is_none() && self.seeds > 1 {
            self.discover(None).await?;
        }
        let master = match (slot, &self.cluster) {
            (Some(slot), Some(map)) => map.master_of(slot).cloned(),
            _ => None,
        };
        match master {
            Some(node) => self.index_of(&node).map_err(Failure::Refused),
            None => Ok(self.home),
        }
    }

    /// Read the slot table from the first node that answers (`avoid`: one that just failed,
    /// asked last). A node that is not in cluster mode is refused when the URL named several
    /// hosts; with one host, `Ok(false)` says it is a standalone server.
    pub(in crate::backend::redis) async fn discover(
        &mut self,
        avoid: Option<usize>,
    ) -> Result<bool, Failure> {
        // The node we are connected to first, then the others, the one that just failed
        // last; when none is connected, whichever connects first ([`Conn::first_to_connect`]),
        // so that a node whose packets are dropped does not use up the call's time.
        let connected = |conn: &Self, i: usize| conn.nodes[i].connection.is_some();
        let mut order: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| Some(i) != avoid)
            .collect();
        order.sort_by_key(|&i| (!connected(self, i), i != self.home));
        order.extend(avoid);
        if !order.first().is_some_and(|&i| connected(self, i)) && order.len() > 1 {
            if let Ok(first) = self.first_to_connect(&order).await {
                order.retain(|&i| i != first);
                order.insert(0, first);
            }
        }
        let command = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let request = Request::Command(&command, None);
        let mut last = None;
        let final_ask = order.len().saturating_sub(1);
        for (place, index) in order.into_iter().enumerate() {
            // Each node but the last gets a moment to answer (a node whose process is stopped
            // accepts connections and never answers); the last, what is left of the call.
            let asked = if place < final_ask {
                tokio::time::timeout(NODE_ANSWER, self.send_on::<Value>(index, &request, false))
                    .await
            } else {
                Ok(self.send_on::<Value>(index, &request, false).await)
            };
            let Ok(answer) = asked else {
                self.drop_connection(index);
                last = Some(RedisError::from((
                    ErrorKind::Io,
                    "no answer to CLUSTER SLOTS",
                )));
                continue;
            };
            match answer {
                Ok(reply) => {
                    let asked = self.nodes[index].addr.clone().unwrap_or_default().0;
                    let map = SlotMap::parse(&reply, &asked).ok_or_else(|| {
                        Failure::Refused(Error::Unavailable(format!(
                            "{}: unexpected reply to CLUSTER SLOTS: {reply:?}",
                            self.setup_display()
                        )))
                    })?;
                    self.cluster = Some(map);
                    self.home = index;
                    if self.seeds > 1 && !self.seeds_checked {
                        self.check_seeds(index).await?;
                        self.seeds_checked = true;
                    }
                    return Ok(true);
                }
                // One host whose answer is an error (an ACL that denies CLUSTER, say): it is
                // used as a standalone server, as before Cluster support.
                Err(e) if standalone(&e) || (self.seeds == 1 && e.code().is_some()) => {
                    if self.seeds > 1 {
                        return Err(Failure::Refused(not_a_cluster(
                            self.nodes[index].addr.as_ref(),
                            &self.setup_display(),
                        )));
                    }
                    return Ok(false);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(Failure::Redis(last.unwrap_or_else(|| {
            RedisError::from((ErrorKind::Io, "no cluster node to ask"))
        })))
    }

    /// The index of `node` in the pool, added (not yet connected) if new.
    pub(in crate::backend::redis) fn index_of(&mut self, node: &NodeAddr) -> Result<usize, Error> {
        if let Some(index) = self
            .nodes
            .iter()
            .position(|n| n.addr.as_ref() == Some(node))
        {
            return Ok(index);
        }
        let client = self
            .setup
            .client(ConnectionAddr::Tcp(node.0.clone(), node.1))?;
        self.nodes.push(Node::new(node.clone(), client));
        Ok(self.nodes.len() - 1)
    }

    fn setup_display(&self) -> String {
        self.setup.display().to_owned()
    }
}

/// The node says it runs without cluster support.
fn standalone(e: &RedisError) -> bool {
    e.to_string().contains("cluster support disabled")
}

fn not_a_cluster(node: Option<&NodeAddr>, display: &str) -> Error {
    let node = node.map_or_else(String::new, |(h, p)| format!(" ({h}:{p})"));
    Error::Config(format!(
        "{display}: a node{node} is not part of a Redis Cluster (cluster_enabled:0); a URL with \
         several hosts names nodes of one cluster (give a standalone server as one host)"
    ))
}

/// The node itself is gone (refused, reset, closed), not the request.
fn lost_node(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}
