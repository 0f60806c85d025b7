//! One connection to Redis and the calls made on it: connecting (TCP, TLS, a Unix socket;
//! AUTH and SELECT) and every call bounded by its own budget (what a failure means is in
//! `failure.rs`).
//!
//! A `Conn` may hold connections to several nodes of a Redis Cluster: every call names the
//! slot it is for (a script's first key, a `BLPOP`'s key) and goes to that slot's master,
//! following `MOVED` and `ASK` ([`super::cluster`] has the routing). Against a standalone
//! server nothing of that costs anything: one node, no discovery.
//!
//! Behind Sentinel a `Conn` has one node, the master, and where it is is asked of the
//! sentinels at every (re)connect (its `Locator`, `topology/`), whenever that node has no
//! connection: the first call, or after an error, an abandoned call, or a renewal that found
//! the master moved ([`super::sentinel`]). Cluster routing never applies there.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ErrorKind, FromRedisValue, RedisError,
    ServerErrorKind,
};

use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::timeouts::{CONNECT_TIMEOUT, OP_TIMEOUT};

pub(super) use super::failure::Failure;

use super::invocation::Invocation;
use super::setup::Setup;
use super::topology::{slot_of, Locator, NodeAddr, SlotMap};
use super::{RedisAddr, RedisTarget};

/// One node and its connection (opened on first use).
pub(super) struct Node {
    /// `None` for a Unix socket (never a cluster node).
    pub(super) addr: Option<NodeAddr>,
    pub(super) client: Client,
    pub(super) connection: Option<MultiplexedConnection>,
}

impl Node {
    pub(super) fn new(addr: NodeAddr, client: Client) -> Node {
        Node {
            addr: Some(addr),
            client,
            connection: None,
        }
    }
}

/// What to send: a script (routed by its first key), or a command and the slot it is for.
pub(super) enum Request<'a> {
    Script(&'a Invocation<'a>),
    Command(&'a redis::Cmd, Option<u16>),
}

impl Request<'_> {
    pub(super) fn slot(&self) -> Option<u16> {
        match self {
            Request::Script(invocation) => invocation.slot(),
            Request::Command(_, slot) => *slot,
        }
    }
}

/// How long a connect to one of the URL's hosts has before the next host is tried beside it.
const SEED_STAGGER: Duration = Duration::from_millis(250);

/// Connections to Redis (one node, or the masters of a cluster), re-opened after an error or
/// an abandoned call.
///
/// No response timeout is configured on the connections themselves: a `BLPOP` blocks for as
/// long as it was asked to, and every call is bounded here instead. A call abandoned by a
/// timeout leaves the connections "dirty" (its reply may still arrive, or never), so the next
/// call starts on fresh sockets rather than queueing behind it.
pub(super) struct Conn {
    pub(super) setup: Setup,
    /// The URL's hosts first, then the nodes a cluster named.
    pub(super) nodes: Vec<Node>,
    /// How many of `nodes` the URL named.
    pub(super) seeds: usize,
    /// Where calls go that are for no slot, or for a slot whose master is not known.
    pub(super) home: usize,
    /// `Some` once the server turned out to be a cluster node (or several hosts were given
    /// and `CLUSTER SLOTS` answered).
    pub(super) cluster: Option<SlotMap>,
    /// Every host of the URL was found to be a node of that cluster.
    pub(super) seeds_checked: bool,
    /// Why the current call is waiting for the cluster to settle (reported if time runs out).
    pub(super) settling: Option<RedisError>,
    dirty: bool,
    /// A call has been answered: the server is Redis, and a later failure is an outage or a
    /// restart, never a URL pointed at another kind of server.
    answered: bool,
    /// When the current call last sent its request (a redirected or settling call sends it
    /// more than once): its reply describes the server after this instant.
    pub(super) last_send: Option<BootInstant>,
    /// Behind Sentinel: where to connect is asked anew at every (re)connect (node 0 is then
    /// the master they named, never one of the URL's hosts, which are the sentinels).
    pub(super) sentinel: Option<Locator>,
}

impl Conn {
    pub(super) fn new(target: &RedisTarget, display: &str) -> Result<Conn, Error> {
        let setup = Setup::new(target, display)?;
        let mut nodes = Vec::with_capacity(1 + target.more_hosts.len());
        let first = match &target.addr {
            RedisAddr::Tcp { host, port } | RedisAddr::Tls { host, port } => (
                Some((host.clone(), *port)),
                ConnectionAddr::Tcp(host.clone(), *port),
            ),
            RedisAddr::Unix { path } => (None, ConnectionAddr::Unix(path.clone())),
        };
        let seeds = std::iter::once(first).chain(target.more_hosts.iter().map(|(host, port)| {
            (
                Some((host.clone(), *port)),
                ConnectionAddr::Tcp(host.clone(), *port),
            )
        }));
        for (addr, connect) in seeds {
            nodes.push(Node {
                addr,
                client: setup.client(connect)?,
                connection: None,
            });
        }
        Ok(Conn {
            seeds: nodes.len(),
            setup,
            nodes,
            home: 0,
            cluster: None,
            seeds_checked: false,
            settling: None,
            dirty: false,
            answered: false,
            last_send: None,
            sentinel: Locator::new(target, display)?,
        })
    }

    /// A connection to the first of the URL's hosts that answers, (re)connecting if needed.
    pub(super) async fn ensure(&mut self) -> Result<&mut MultiplexedConnection, Failure> {
        if std::mem::take(&mut self.dirty) {
            self.drop_connections();
        }
        self.locate().await?;
        let home_connected = self
            .nodes
            .get(self.home)
            .is_some_and(|n| n.connection.is_some());
        if !home_connected && self.sentinel.is_none() && self.seeds > 1 {
            let order: Vec<usize> = (self.home..self.seeds).chain(0..self.home).collect();
            self.home = self
                .first_to_connect(&order)
                .await
                .map_err(Failure::Redis)?;
        }
        self.open(self.home).await.map_err(Failure::Redis)
    }

    /// Connect to the nodes `order` names, in that order, the next one as soon as one fails
    /// or [`SEED_STAGGER`] after the last start, whichever comes first (as RFC 8305's Happy
    /// Eyeballs does for addresses): a node whose packets are dropped costs the others a
    /// moment, not the whole connect timeout. Keeps the first connection made and returns its
    /// index; the last error when none connects.
    pub(super) async fn first_to_connect(&mut self, order: &[usize]) -> Result<usize, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None);
        let clients: Vec<(usize, Client)> = order
            .iter()
            .filter_map(|&index| Some((index, self.nodes.get(index)?.client.clone())))
            .collect();
        let mut order = clients.into_iter();
        let mut tries = tokio::task::JoinSet::new();
        let launch = |tries: &mut tokio::task::JoinSet<_>, (index, client): (usize, Client)| {
            let config = config.clone();
            tries.spawn(async move {
                let connected = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await;
                (index, connected)
            });
        };
        let mut more = true;
        let mut last = RedisError::from((ErrorKind::Io, "no host to connect to"));
        // Bounded: each host is started once, and each try ends within the connect timeout.
        while more || !tries.is_empty() {
            if tries.is_empty() {
                match order.next() {
                    Some(next) => launch(&mut tries, next),
                    None => more = false,
                }
                continue;
            }
            let done = tokio::select! {
                done = tries.join_next() => done,
                _ = tokio::time::sleep(SEED_STAGGER), if more => {
                    match order.next() {
                        Some(next) => launch(&mut tries, next),
                        None => more = false,
                    }
                    continue;
                }
            };
            match done {
                Some(Ok((index, Ok(connection)))) => {
                    if let Some(node) = self.nodes.get_mut(index) {
                        node.connection = Some(connection);
                        return Ok(index);
                    }
                }
                Some(Ok((_, Err(e)))) => last = e,
                Some(Err(e)) => {
                    last = RedisError::from((ErrorKind::Io, "a connect failed", e.to_string()))
                }
                None => {}
            }
        }
        Err(last)
    }

    /// The connection to node `index`, connecting first if need be.
    pub(super) async fn open(
        &mut self,
        index: usize,
    ) -> Result<&mut MultiplexedConnection, RedisError> {
        let missing = || RedisError::from((ErrorKind::Io, "no connection"));
        let node = self.nodes.get_mut(index).ok_or_else(missing)?;
        if node.connection.is_none() && self.sentinel.is_some() {
            // Only `locate` connects behind Sentinel: the URL's hosts are the sentinels.
            return Err(missing());
        }
        if node.connection.is_none() {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(None);
            node.connection = Some(
                node.client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            );
        }
        node.connection.as_mut().ok_or_else(missing)
    }

    /// Forget node `index`'s connection (it failed).
    pub(super) fn drop_connection(&mut self, index: usize) {
        if let Some(node) = self.nodes.get_mut(index) {
            node.connection = None;
        }
    }

    pub(super) fn drop_connections(&mut self) {
        for node in &mut self.nodes {
            node.connection = None;
        }
    }

    /// Drop the connection: the next call connects again (behind Sentinel, to the master the
    /// sentinels name then).
    pub(super) fn reconnect(&mut self) {
        self.drop_connections();
    }

    /// Behind Sentinel, a connection about to be opened goes to the master the sentinels name
    /// now, checked with `ROLE`; it becomes the only node, and every call goes there.
    pub(super) async fn locate(&mut self) -> Result<(), Failure> {
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

    /// Send `request` to node `index` (after `ASKING` when a migration redirected it there):
    /// a script by its hash, and by its text when the node does not know it yet.
    pub(super) async fn send_on<T: FromRedisValue>(
        &mut self,
        index: usize,
        request: &Request<'_>,
        asking: bool,
    ) -> Result<T, RedisError> {
        self.open(index).await?;
        // After connecting: a call that never got a connection sent nothing, so nothing of
        // it can have run on the server (and the instant is still no later than the send).
        self.last_send = Some(BootInstant::now());
        let connection = self.open(index).await?;
        let result = match request {
            Request::Command(command, _) => send(connection, command, asking).await,
            Request::Script(invocation) => {
                match send(connection, &invocation.evalsha(), asking).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        send(connection, &invocation.eval(), asking).await
                    }
                    result => result,
                }
            }
        };
        if let Err(e) = &result {
            if e.is_io_error() || e.is_unrecoverable_error() || e.is_connection_dropped() {
                self.drop_connection(index);
            }
        }
        result
    }

    /// Start a call: connections left dirty by an abandoned call are replaced, and this one
    /// counts as dirty until its reply is in (the future may be dropped by a caller's timeout).
    fn begin(&mut self) {
        self.settling = None;
        self.last_send = None;
        if std::mem::replace(&mut self.dirty, true) {
            self.drop_connections();
        }
    }

    fn finish<T>(
        &mut self,
        outcome: Result<Result<T, Failure>, tokio::time::error::Elapsed>,
        budget: Duration,
    ) -> Result<T, Failure> {
        match outcome {
            Ok(Ok(value)) => {
                self.dirty = false;
                self.answered = true;
                Ok(value)
            }
            Ok(Err(failure)) => {
                // A server error leaves the connection usable; a transport error was dealt
                // with where it happened.
                self.dirty = false;
                Err(failure)
            }
            // Out of time while the cluster settles: what it said is the better message.
            Err(_) => Err(self
                .settling
                .take()
                .map_or(Failure::Timeout(budget), Failure::Redis)),
        }
    }

    /// Run a script (EVALSHA, EVAL when the server does not know it) on its slot's master.
    pub(super) async fn invoke<T: FromRedisValue>(
        &mut self,
        invocation: &Invocation<'_>,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.call(Request::Script(invocation), budget).await
    }

    /// A command for no slot in particular (the node at hand).
    pub(super) async fn query<T: FromRedisValue>(
        &mut self,
        command: &redis::Cmd,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.call(Request::Command(command, None), budget).await
    }

    /// One request within `budget`, connecting (and following the cluster) first if need be.
    pub(super) async fn call<T: FromRedisValue>(
        &mut self,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.begin();
        let started = BootInstant::now();
        let outcome = tokio::time::timeout(budget, async {
            self.locate().await?;
            self.send_routed(&request).await
        })
        .await;
        match self.finish(outcome, budget) {
            Err(failure) => {
                let left = budget.saturating_sub(BootInstant::now().saturating_since(started));
                Err(self.explain(failure, left).await)
            }
            done => done,
        }
    }

    /// One command on node `index` only (no redirections), within `budget`.
    pub(super) async fn query_on<T: FromRedisValue>(
        &mut self,
        index: usize,
        command: &redis::Cmd,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.begin();
        let request = Request::Command(command, None);
        let outcome = tokio::time::timeout(budget, async {
            self.locate().await?;
            self.send_on(index, &request, false)
                .await
                .map_err(Failure::Redis)
        })
        .await;
        self.finish(outcome, budget)
    }

    /// Block until our mailbox gets a wake-up (true) or `block` passes (false).
    pub(super) async fn blpop(&mut self, key: &str, block: Duration) -> Result<bool, Failure> {
        let mut command = redis::cmd("BLPOP");
        command.arg(key).arg(format!("{:.3}", block.as_secs_f64()));
        let request = Request::Command(&command, Some(slot_of(key.as_bytes())));
        self.call::<Option<(String, String)>>(request, block + OP_TIMEOUT)
            .await
            .map(|popped| popped.is_some())
    }
}

impl Conn {
    /// A call that failed the way a server of another kind makes a Redis client fail (the
    /// connection closed or reset at the first command, an answer that is not Redis's):
    /// when another kind of server answers at the node's address, that is the message.
    /// `left`: what is left of the call's budget for asking.
    pub(super) async fn not_redis(&self, failure: &Failure, left: Duration) -> Option<Error> {
        let Failure::Redis(e) = failure else {
            return None;
        };
        let confused = e.kind() == ErrorKind::Parse
            || e.is_connection_dropped()
            || (e.is_io_error() && !e.is_timeout() && !e.is_connection_refusal());
        if !confused
            || self.answered
            || self.sentinel.is_some()
            || left.is_zero()
            || crate::wording::refused_in(e)
        {
            return None;
        }
        let (host, port) = self.nodes.get(self.home)?.addr.as_ref()?;
        let what = crate::sniff::other_than(host, *port, left, &super::kind::KIND).await?;
        Some(crate::wording::not_a(
            &crate::kit::url::join_host_port(host, *port),
            &super::failure::SERVER,
            &format!("it answers like {what}"),
        ))
    }
}

/// One command, after `ASKING` when a slot migration sent it here.
async fn send<T: FromRedisValue>(
    connection: &mut MultiplexedConnection,
    command: &redis::Cmd,
    asking: bool,
) -> Result<T, RedisError> {
    if !asking {
        return command.query_async(connection).await;
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().add_command(command.clone());
    let (value,): (T,) = pipe.query_async(connection).await?;
    Ok(value)
}
