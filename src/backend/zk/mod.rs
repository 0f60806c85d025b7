//! The ZooKeeper backend: the lock recipe of the ZooKeeper documentation (ephemeral sequential
//! nodes, lowest sequence owns, each waiter watches only its predecessor), with the session as
//! the lease and dlock's own lease keeper.
//!
//! Layout: a lock is the node `/<prefix>/<component>` (under the URL's chroot), where the
//! component is [`LockName::encoded`] with `.` and `..` (not allowed as ZooKeeper path
//! components) written `%2E` and `%2E%2E`; `encoded()` never produces `%2E`, so the mapping
//! stays injective. Each waiter or holder is the ephemeral sequential child
//! `_c_<uuid>-lock-<10-digit sequence>`, valued with the holder metadata (JSON). These are
//! Curator's "protected" lock node names, so Apache Curator's `InterProcessMutex` on the same
//! path and dlock exclude each other, and a create whose reply was lost is found again by its
//! GUID instead of leaving an orphan. Parents are created as container nodes (as Curator
//! does), which ZooKeeper removes once empty; a create that finds its parent gone makes it again.
//!
//! Acquire: one session per `dlock run`, with `--ttl` as the session timeout (the server
//! negotiates it into its bounds; dlock uses and reports the granted value). The create and the
//! listing of the lock's children are sent together (one round trip; session order guarantees
//! the listing sees our node). We hold the lock when our node is among the first `--limit`
//! children in sequence order; the fencing token is our node's czxid (a global zxid, which only
//! grows, unlike the per-parent 32-bit sequence). A waiter sets a data watch on the node just
//! before its own (for `--limit N > 1`, the head of the queue watches the children instead, and
//! every waiter that gets the lock rewrites its data, which wakes the one behind it). After
//! every wake-up it lists again instead of assuming, and a waiter whose own node is gone never
//! starts the command. Cancel and release delete our node before the session is closed.
//!
//! A waiter killed with SIGKILL cannot delete its node, which then lives as long as its
//! session: up to the negotiated session timeout. With `--limit 1` a waiter marks its node
//! (`"waiting": true` in its data) before it waits and unmarks it when it takes the lock (that
//! write is sent without waiting for its reply), so that a killed waiter's node at the head of
//! the queue shows as a waiter, not as a holder: the lock is "free, N waiting ahead". `--wait`
//! bounds connecting and queueing too: a server that does not answer in time is 69.
//!
//! The lease: the session. A connection loss is not an expiry: the [`Keeper`] keeps
//! re-verifying our node (`exists`, which also touches the session) and only declares the hold
//! lost when that has failed for long enough that the server might expire the session (design
//! §4). A session the server reports expired, or a deleted node, is lost at once (a watch on our
//! node reports both without waiting for the next renewal).

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use zookeeper_client::{self as zk, Acls, Client, CreateMode, EventType, SessionState, Stat};

use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError};
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, HolderStatus, Lease, LockName,
    LockStatus, Lost, Wait,
};
pub mod target;

pub use target::ZkTarget;

use crate::backend::url::join_host_port;

/// Bound for reaching the ensemble and for one operation outside the keeper.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a create may find its parent missing (removed container) before giving up.
const MAX_PARENT_RETRIES: usize = 5;
/// Bound for closing the session after a release or a cancel.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// The least time a server gets to answer while dlock queues, however short `--wait` is.
const MIN_ANSWER: Duration = Duration::from_secs(1);
/// Bound for reading who holds a lock for a message, once `--wait` is over.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long after the end of `--wait` a waiter may still be finishing (a re-check, the
/// report of who is ahead) before it counts as a server that stopped answering.
const WAIT_BACKSTOP: Duration = Duration::from_secs(2);
/// Bound for cleaning up once `--wait` is over; what is left goes with the session.
const LATE_CLEANUP: Duration = Duration::from_secs(1);

/// The end of `--wait`: when, and the duration asked for (for messages).
#[derive(Clone, Copy)]
struct WaitEnd {
    at: BootInstant,
    /// `at`, but at least [`MIN_ANSWER`] from the start: a healthy server gets the time to
    /// answer, so that a short `--wait` still takes a free lock.
    answer_by: BootInstant,
    wait: Duration,
}

impl WaitEnd {
    fn of(wait: Wait) -> Option<WaitEnd> {
        let now = BootInstant::now();
        match wait {
            Wait::For(d) => Some(WaitEnd {
                at: now + d,
                answer_by: (now + d).max(now + MIN_ANSWER),
                wait: d,
            }),
            Wait::No | Wait::Forever => None,
        }
    }
}

pub struct ZkBackend {
    target: ZkTarget,
    prefix: String,
    display: String,
    ttl: Duration,
}

/// What a lock node's data holds (the same JSON as etcd's values).
#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    #[serde(flatten)]
    holder: Holder,
    #[serde(default)]
    limit: u32,
    /// A waiter's mark (`--limit 1`): a place in the queue, not (yet) a hold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    waiting: bool,
}

/// One child of a lock's node.
struct Entry {
    child: String,
    status: HolderStatus,
    /// Among the first `--limit` and not marked waiting (or foreign): a holder.
    holds: bool,
}

/// The path component of a lock name.
pub fn zk_component(name: &LockName) -> String {
    match name.encoded().as_str() {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        other => other.to_owned(),
    }
}

/// The name a path component stands for, if dlock could have written it.
fn name_of_component(component: &str) -> Option<LockName> {
    let raw = match component {
        "%2E" => ".".to_owned(),
        "%2E%2E" => "..".to_owned(),
        other => crate::lock::decode_component(other)?,
    };
    let name = LockName::new(&raw).ok()?;
    (zk_component(&name) == component).then_some(name)
}

/// Curator's sort key: what follows the last `lock-` (the sequence), else the whole name.
fn sequence_key(child: &str) -> &str {
    child
        .rfind("lock-")
        .map_or(child, |i| &child[i + "lock-".len()..])
}

fn sort_queue(children: &mut [String]) {
    children.sort_by(|a, b| sequence_key(a).cmp(sequence_key(b)).then_with(|| a.cmp(b)));
}

impl ZkBackend {
    pub fn new(target: &ZkTarget, prefix: &str, display: &str, ttl: Duration) -> ZkBackend {
        ZkBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
            display: display.to_owned(),
            ttl,
        }
    }

    /// `h1:p1,[v6]:p2/chroot`, without credentials.
    fn connect_string(&self) -> String {
        let hosts: Vec<String> = self
            .target
            .endpoints
            .iter()
            .map(|(host, port)| join_host_port(host, *port))
            .collect();
        format!(
            "{}{}",
            hosts.join(","),
            self.target.chroot.as_deref().unwrap_or("")
        )
    }

    /// `/<prefix>`: the prefix's `/`-separated parts as path components.
    fn root(&self) -> Result<String, Error> {
        let parts: Vec<&str> = self.prefix.split('/').filter(|p| !p.is_empty()).collect();
        if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") {
            return Err(Error::Usage(format!(
                "--prefix: '{}' cannot be a ZooKeeper path (it needs a name other than '.' and '..')",
                self.prefix
            )));
        }
        if parts[0] == "zookeeper" {
            return Err(Error::Usage(format!(
                "--prefix: '{}' would put locks under /zookeeper, which ZooKeeper reserves for itself",
                self.prefix
            )));
        }
        Ok(format!("/{}", parts.join("/")))
    }

    /// The lock's node, parent of its waiters and holders.
    fn dir(&self, name: &LockName) -> Result<String, Error> {
        Ok(format!("{}/{}", self.root()?, zk_component(name)))
    }

    /// With digest authentication, nodes are readable and writable by their creator only (the
    /// same user); without it, by anyone (as Curator does).
    fn acls(&self) -> Acls<'static> {
        if self.target.user.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// Create `path` and its missing parents as container nodes (ZooKeeper removes them once
    /// empty). A missing chroot is the user's to create.
    async fn make_parents(&self, client: &Client, path: &str) -> Result<(), Error> {
        let options = CreateMode::Container.with_acls(self.acls());
        match timed(client.mkdir(path, &options)).await {
            Ok(()) => Ok(()),
            Err(zk::Error::NoNode) => Err(Error::Config(format!(
                "the chroot {} does not exist on {}; create it first",
                self.target.chroot.as_deref().unwrap_or("/"),
                self.display
            ))),
            Err(e) => Err(self.classify(&e, &format!("creating {path}"))),
        }
    }

    /// Open a session, bounded by [`OP_TIMEOUT`].
    async fn connect(&self, session_timeout: Duration) -> Result<Client, Error> {
        self.connect_by(session_timeout, None).await
    }

    /// Open a session, bounded by [`OP_TIMEOUT`] and by the end of `--wait`, if any.
    async fn connect_by(
        &self,
        session_timeout: Duration,
        wait: Option<WaitEnd>,
    ) -> Result<Client, Error> {
        let budget = wait.map_or(OP_TIMEOUT, |w| w.answer_by.remaining().min(OP_TIMEOUT));
        let mut connector = Client::connector()
            .with_session_timeout(session_timeout)
            .with_fail_eagerly();
        if let (Some(user), Some(password)) = (&self.target.user, &self.target.password) {
            connector =
                connector.with_auth("digest", format!("{user}:{}", password.expose()).as_bytes());
        }
        match tokio::time::timeout(budget, connector.connect(&self.connect_string())).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(self.classify(&e, "connecting")),
            Err(_) if budget < OP_TIMEOUT => Err(self.no_answer(wait)),
            Err(_) => Err(Error::Unavailable(format!(
                "no ZooKeeper server of {} answered within {}",
                self.display,
                humantime::format_duration(OP_TIMEOUT)
            ))),
        }
    }

    /// The error for a server that did not answer before `--wait` ran out.
    fn no_answer(&self, wait: Option<WaitEnd>) -> Error {
        let display = &self.display;
        match wait {
            Some(w) if w.wait < MIN_ANSWER => Error::Unavailable(format!(
                "no answer from {display} within {} (--wait {})",
                humantime::format_duration(MIN_ANSWER),
                humantime::format_duration(w.wait)
            )),
            Some(w) => Error::Unavailable(format!(
                "no answer from {display} within --wait {}",
                humantime::format_duration(w.wait)
            )),
            None => Error::Unavailable(format!(
                "no answer from {display} within {}",
                humantime::format_duration(OP_TIMEOUT)
            )),
        }
    }

    /// Map a client error to dlock's error kinds (exit statuses); `what` names the operation.
    fn classify(&self, e: &zk::Error, what: &str) -> Error {
        let display = &self.display;
        match e {
            zk::Error::NoAuth | zk::Error::AuthFailed => Error::Permission(format!(
                "{display} refused access ({what}: {e}); check the digest user and password (URL, \
                 DLOCK_PASSWORD or password_file) and the ACLs of the prefix's nodes"
            )),
            zk::Error::InvalidAcl => Error::Config(format!("{display}: {what}: {e}")),
            zk::Error::BadArguments(_) => Error::Usage(format!("{what}: {e}")),
            zk::Error::NoChildrenForEphemerals => Error::Config(format!(
                "{display}: {what}: the prefix is an ephemeral node; choose another --prefix"
            )),
            zk::Error::NotReadOnly => Error::Config(format!(
                "{display} is a read-only server; dlock needs a quorum member"
            )),
            zk::Error::Timeout => Error::Unavailable(format!(
                "{display} did not answer within {} ({what})",
                humantime::format_duration(OP_TIMEOUT)
            )),
            _ => Error::Unavailable(format!("cannot use {display} ({what}): {e}")),
        }
    }

    /// The children of a lock in queue order, with their data; `holds` marks the holders.
    async fn read_queue(&self, client: &Client, name: &LockName) -> Result<Vec<Entry>, Error> {
        let dir = self.dir(name)?;
        let mut children = match timed(client.list_children(&dir)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(self.classify(&e, &format!("listing {dir}"))),
        };
        sort_queue(&mut children);
        // Every read is sent before the first reply is awaited: one round trip.
        let reads: Vec<_> = children
            .iter()
            .map(|child| client.get_data(&format!("{dir}/{child}")))
            .collect();
        let mut nodes = Vec::new();
        for (child, read) in children.into_iter().zip(reads) {
            match timed(read).await {
                Ok((data, stat)) => nodes.push((child, data, stat)),
                // Released between the listing and the read.
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.classify(&e, &format!("reading {dir}"))),
            }
        }
        let limit = nodes
            .first()
            .and_then(|(_, data, _)| serde_json::from_slice::<Meta>(data).ok())
            .map_or(1, |m| m.limit.max(1)) as usize;
        let entries = nodes
            .into_iter()
            .enumerate()
            .map(|(position, (child, data, stat))| {
                let meta = serde_json::from_slice::<Meta>(&data).ok();
                let waiting = meta.as_ref().is_some_and(|m| m.waiting);
                let mut holder = meta.map(|m| m.holder).unwrap_or_else(|| Holder {
                    name: name.to_string(),
                    // Curator stores the client's IP address as the node's data.
                    host: String::from_utf8_lossy(&data)
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(64)
                        .collect(),
                    command: "(foreign holder: Curator or another client)".into(),
                    ..Holder::default()
                });
                holder.token = u64::try_from(stat.czxid).unwrap_or(0);
                Entry {
                    child,
                    status: HolderStatus {
                        holder,
                        ttl_left_ms: None,
                        session: Some(format!("ZooKeeper session 0x{:x}", stat.ephemeral_owner)),
                    },
                    // At the head, a node still marked waiting is a waiter between the grant
                    // and its rewrite, or one that died there (its session not expired yet).
                    holds: position < limit && !waiting,
                }
            })
            .collect();
        Ok(entries)
    }

    /// Holders and waiters of a lock.
    async fn status_with(&self, client: &Client, name: &LockName) -> Result<LockStatus, Error> {
        let (holders, queue): (Vec<Entry>, Vec<Entry>) = self
            .read_queue(client, name)
            .await?
            .into_iter()
            .partition(|e| e.holds);
        Ok(LockStatus {
            name: name.to_string(),
            held: !holders.is_empty(),
            waiters: Some(queue.len() as u64),
            queue: queue.into_iter().map(|e| e.status).collect(),
            holders: holders.into_iter().map(|e| e.status).collect(),
            last_token: None,
        })
    }

    /// Why a waiter whose node is `own` (none: not queued) cannot have the lock, for a
    /// message: "is held by pid N on host since T" or "is free, N waiting ahead". Bounded:
    /// it may run after `--wait` is over.
    async fn why_busy(&self, client: &Client, name: &LockName, own: Option<&str>) -> String {
        let read = tokio::time::timeout(REPORT_TIMEOUT, self.read_queue(client, name)).await;
        let Ok(Ok(entries)) = read else {
            return "is held".into();
        };
        let ahead = entries
            .into_iter()
            .take_while(|e| Some(e.child.as_str()) != own);
        let (holders, waiting): (Vec<Entry>, Vec<Entry>) = ahead.partition(|e| e.holds);
        let waiting = waiting.len();
        if holders.is_empty() {
            return if waiting > 0 {
                format!("is free, {waiting} waiting ahead")
            } else {
                "was held a moment ago".into()
            };
        }
        let held = LockStatus {
            name: name.to_string(),
            held: true,
            holders: holders.into_iter().map(|e| e.status).collect(),
            waiters: None,
            queue: Vec::new(),
            last_token: None,
        };
        let more = if waiting > 0 {
            format!(", {waiting} waiting ahead")
        } else {
            String::new()
        };
        format!("is held{}{more}", held.held_by())
    }

    /// Create our node (making the parents as needed) and list the queue in the same round
    /// trip. Returns our node's name and stat, the children, and when the listing was sent.
    async fn enqueue(
        &self,
        client: &Client,
        dir: &str,
        guid_prefix: &str,
        meta: &[u8],
    ) -> Result<(String, Stat, Vec<String>, BootInstant), Error> {
        let base = format!("{dir}/{guid_prefix}lock-");
        let acls = self.acls();
        let options = CreateMode::EphemeralSequential.with_acls(acls);
        for _ in 0..MAX_PARENT_RETRIES {
            let sent = BootInstant::now();
            let create = client.create(&base, meta, &options);
            let list = client.list_children(dir);
            let created = timed(create).await;
            let listed = timed(list).await;
            match created {
                Ok((stat, sequence)) => {
                    let own = format!("{guid_prefix}lock-{sequence}");
                    return match listed {
                        Ok(children) => Ok((own, stat, children, sent)),
                        Err(e) => Err(self.classify(&e, &format!("listing {dir}"))),
                    };
                }
                Err(zk::Error::NoNode) => {
                    // The lock's node (or the prefix) does not exist yet, or was an empty
                    // container that ZooKeeper removed: make it and try again.
                    self.make_parents(client, dir).await?;
                }
                Err(zk::Error::ConnectionLoss) => {
                    // The create may have happened with its reply lost: look for our GUID
                    // (Curator's protected mode) before creating again.
                    let sent = BootInstant::now();
                    match timed(client.list_children(dir)).await {
                        Ok(children) => {
                            if let Some(own) = children
                                .iter()
                                .find(|c| c.starts_with(guid_prefix))
                                .cloned()
                            {
                                let path = format!("{dir}/{own}");
                                return match timed(client.check_stat(&path)).await {
                                    Ok(Some(stat)) => Ok((own, stat, children, sent)),
                                    Ok(None) => Err(lost_place()),
                                    Err(e) => Err(self.classify(&e, &format!("reading {path}"))),
                                };
                            }
                        }
                        Err(zk::Error::NoNode) => {}
                        Err(e) => return Err(self.classify(&e, &format!("listing {dir}"))),
                    }
                }
                Err(e) => return Err(self.classify(&e, &format!("creating a node in {dir}"))),
            }
        }
        Err(Error::Unavailable(format!(
            "{dir} kept disappearing while dlock created its node in it ({MAX_PARENT_RETRIES} tries)"
        )))
    }

    /// Put our node in the queue and wait until it is among the first `limit`. Returns the
    /// fencing token (our node's czxid) and the send time of the request that proved it.
    async fn queue_and_wait(
        &self,
        queue: &mut Queue,
        request: &AcquireRequest,
        wait: Option<WaitEnd>,
        cancel: &mut Cancel,
    ) -> Result<(u64, BootInstant), Error> {
        let client = queue.client.clone();
        let dir = queue.dir.clone();
        let limit = request.limit.max(1) as usize;
        let meta_of = |waiting| {
            serde_json::to_vec(&Meta {
                holder: request.holder.clone(),
                limit: request.limit,
                waiting,
            })
            .map_err(|e| Error::Internal(e.to_string()))
        };
        let (meta, waiting_meta) = (meta_of(false)?, meta_of(true)?);
        // Whether our node's data marks it as a waiter's (`--limit 1`).
        let mut marked = false;
        let deadline = wait.map(|w| w.at);
        let guid_prefix = queue.guid_prefix.clone();
        let queued_by = async {
            match wait.map(|w| w.answer_by) {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let (own, stat, mut children, mut listed_sent) = tokio::select! {
            r = self.enqueue(&client, &dir, &guid_prefix, &meta) => r?,
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            () = queued_by => return Err(self.no_answer(wait)),
        };
        let own_path = format!("{dir}/{own}");
        queue.own = Some(own_path.clone());
        let token = u64::try_from(stat.czxid)
            .map_err(|_| Error::Internal(format!("negative czxid {}", stat.czxid)))?;
        let mut limit_checked = false;
        loop {
            sort_queue(&mut children);
            let Some(index) = children.iter().position(|c| *c == own) else {
                return Err(lost_place());
            };
            // Anyone ahead of us must use the same --limit (checked once, before any wait). A
            // --limit 1 waiter reads its predecessor's data anyway when it sets its watch, and
            // checks that instead of asking for the first node's.
            if index > 0 && !limit_checked && (limit > 1 || request.wait == Wait::No) {
                self.check_limit(&client, &dir, &children[0], request)
                    .await?;
                limit_checked = true;
            }
            if index < limit {
                if limit > 1 {
                    // Rewrite our data: the waiter behind us watches it (see the module docs).
                    timed(client.set_data(&own_path, &meta, None))
                        .await
                        .map_err(|e| self.classify(&e, &format!("writing {own_path}")))?;
                } else if marked {
                    // Our node is a hold now, for `status`. The request goes out as it is
                    // made; nothing waits for its reply (the command starts at once).
                    drop(client.set_data(&own_path, &meta, None));
                }
                return Ok((token, listed_sent));
            }
            if request.wait == Wait::No {
                let why = self.why_busy(&client, &request.name, Some(&own)).await;
                return Err(Error::Busy(format!(
                    "lock '{}' {why}; not waiting (--no-wait)",
                    request.name
                )));
            }
            if limit == 1 && !marked {
                // Mark our node as a waiter's: should it reach the head of the queue with us
                // killed (its session lives on until it expires), `status` and the others'
                // messages say the lock is free with a waiter ahead, not held.
                match timed(client.set_data(&own_path, &waiting_meta, None)).await {
                    Ok(_) => marked = true,
                    Err(zk::Error::NoNode) => return Err(lost_place()),
                    Err(e) => return Err(self.waiting_failed(&e, &own_path)),
                }
            }
            let watcher = if limit == 1 || index > limit {
                let predecessor = format!("{dir}/{}", children[index - 1]);
                match reread(|| client.get_and_watch_data(&predecessor)).await {
                    // For --limit > 1, a predecessor that already rewrote its data holds the
                    // lock: we are the head of the queue now, which watches differently.
                    Ok((_, stat, _)) if limit > 1 && stat.version > 0 => None,
                    Ok((data, _, watcher)) => {
                        if !limit_checked {
                            same_limit(&data, request)?;
                            limit_checked = true;
                        }
                        Some(watcher)
                    }
                    // Gone already: look again at once.
                    Err(zk::Error::NoNode) => None,
                    Err(e) => return Err(self.waiting_failed(&e, &predecessor)),
                }
            } else {
                match reread(|| client.get_and_watch_children(&dir)).await {
                    Ok((now, _, watcher)) => {
                        let mut now = now;
                        sort_queue(&mut now);
                        if now
                            .iter()
                            .position(|c| *c == own)
                            .is_some_and(|i| i < limit)
                        {
                            None
                        } else {
                            Some(watcher)
                        }
                    }
                    Err(zk::Error::NoNode) => return Err(lost_place()),
                    Err(e) => return Err(self.waiting_failed(&e, &dir)),
                }
            };
            if let Some(watcher) = watcher {
                // A semaphore waiter also looks again every TTL, in case a wake-up was missed.
                let recheck_at = (limit > 1).then(|| BootInstant::now() + request.ttl);
                let wake = match (deadline, recheck_at) {
                    (Some(d), Some(r)) => Some(d.min(r)),
                    (d, r) => d.or(r),
                };
                let wake = async {
                    match wake {
                        Some(at) => sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    event = watcher.changed() => {
                        if event.event_type == EventType::Session && event.session_state.is_terminated() {
                            return Err(Error::Unavailable(format!(
                                "the ZooKeeper session ended while waiting ({}); the command was not started",
                                event.session_state
                            )));
                        }
                    }
                    _ = cancel.cancelled() => return Err(Error::Cancelled),
                    _ = wake => {
                        if deadline.is_some_and(|d| BootInstant::now() >= d) {
                            let why = self.why_busy(&client, &request.name, Some(&own)).await;
                            let waited = match request.wait {
                                Wait::For(d) => humantime::format_duration(d).to_string(),
                                _ => String::new(),
                            };
                            return Err(Error::Busy(format!(
                                "lock '{}' {why}; gave up after waiting {waited} (--wait)",
                                request.name
                            )));
                        }
                    }
                }
            }
            listed_sent = BootInstant::now();
            children = tokio::select! {
                r = reread(|| client.list_children(&dir)) => match r {
                    Ok(children) => children,
                    Err(zk::Error::NoNode) => return Err(lost_place()),
                    Err(e) => return Err(self.waiting_failed(&e, &dir)),
                },
                _ = cancel.cancelled() => return Err(Error::Cancelled),
            };
        }
    }

    /// All holders must agree on `--limit`: the first node's data says which one they use.
    async fn check_limit(
        &self,
        client: &Client,
        dir: &str,
        first: &str,
        request: &AcquireRequest,
    ) -> Result<(), Error> {
        let path = format!("{dir}/{first}");
        match timed(client.get_data(&path)).await {
            Ok((data, _)) => same_limit(&data, request),
            Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(self.classify(&e, &format!("reading {path}"))),
        }
    }

    fn waiting_failed(&self, e: &zk::Error, path: &str) -> Error {
        match e {
            zk::Error::SessionExpired | zk::Error::ClientClosed => Error::Unavailable(format!(
                "the ZooKeeper session ended while waiting ({e}); the command was not started"
            )),
            _ => self.classify(e, &format!("watching {path}")),
        }
    }
}

/// A usage error when a node's data says it uses another `--limit` than ours (foreign data,
/// or none recorded, says nothing).
fn same_limit(data: &[u8], request: &AcquireRequest) -> Result<(), Error> {
    match serde_json::from_slice::<Meta>(data).ok().map(|m| m.limit) {
        Some(theirs) if theirs != 0 && theirs != request.limit => Err(Error::Usage(format!(
            "lock '{}' is held with --limit {theirs}; all holders must use the same --limit",
            request.name
        ))),
        _ => Ok(()),
    }
}

fn lost_place() -> Error {
    Error::Unavailable(
        "our place in the ZooKeeper queue was lost (the session expired or the node was deleted); \
         the command was not started"
            .into(),
    )
}

/// Await a request, bounded by [`OP_TIMEOUT`].
async fn timed<T>(request: impl Future<Output = Result<T, zk::Error>>) -> Result<T, zk::Error> {
    tokio::time::timeout(OP_TIMEOUT, request)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
}

/// A read while waiting: after a connection loss (a member stopped, a leader election) the
/// client reconnects to another member and the session lives on, so ask again a few times
/// before giving up. An expired session ends this at once (`SessionExpired`).
async fn reread<T, F, Fut>(read: F) -> Result<T, zk::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let mut result = timed(read()).await;
    for attempt in 1..=3u64 {
        match result {
            Err(zk::Error::ConnectionLoss | zk::Error::Timeout) => {
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                result = timed(read()).await;
            }
            _ => break,
        }
    }
    result
}

/// Close the session (which also removes any ephemeral node left) and wait, bounded, until
/// the server confirmed it.
async fn close(client: Client) {
    let states = client.state_watcher();
    drop(client);
    closed(states).await;
}

/// Wait, bounded, until the session of a dropped client is closed.
async fn closed(mut states: zk::StateWatcher) {
    let closed = async {
        while !states.peek_state().is_terminated() {
            states.changed().await;
        }
    };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, closed).await;
}

/// A waiter's session and node, to clean up when the acquisition fails.
struct Queue {
    client: Client,
    dir: String,
    guid_prefix: String,
    own: Option<String>,
}

impl Queue {
    /// Delete our node (found by its GUID if the create's reply was lost), then close the
    /// session. Both are awaited, so nothing of this waiter is left when this returns.
    async fn cleanup(self) {
        let own = match self.own {
            Some(own) => Some(own),
            None => match timed(self.client.list_children(&self.dir)).await {
                Ok(children) => children
                    .into_iter()
                    .find(|c| c.starts_with(&self.guid_prefix))
                    .map(|c| format!("{}/{c}", self.dir)),
                Err(_) => None,
            },
        };
        if let Some(own) = own {
            match timed(self.client.delete(&own, None)).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => tracing::warn!(
                    "could not delete {own} ({e}); ZooKeeper removes it when the session ends"
                ),
            }
        }
        close(self.client).await;
    }
}

impl Backend for ZkBackend {
    type Lease = ZkLease;

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<ZkLease, Error> {
        let dir = self.dir(&request.name)?;
        let wait = WaitEnd::of(request.wait);
        let client = tokio::select! {
            c = self.connect_by(request.ttl, wait) => c?,
            _ = cancel.cancelled() => return Err(Error::Cancelled),
        };
        let granted = client.session_timeout();
        if granted != request.ttl {
            tracing::warn!(
                "ZooKeeper negotiated a {} session timeout for --ttl {}; using {}",
                humantime::format_duration(granted),
                humantime::format_duration(request.ttl),
                humantime::format_duration(granted)
            );
        }
        let mut queue = Queue {
            client: client.clone(),
            dir,
            guid_prefix: format!("_c_{}-", uuid::Uuid::new_v4()),
            own: None,
        };
        // `--wait` bounds queueing (in `queue_and_wait`) and waiting; this is the backstop for a
        // server that stops answering while dlock waits.
        let outcome = match wait {
            Some(w) => {
                let backstop = sleep_until(w.answer_by + WAIT_BACKSTOP);
                tokio::select! {
                    outcome = self.queue_and_wait(&mut queue, request, wait, &mut cancel) => outcome,
                    () = backstop => Err(self.no_answer(wait)),
                }
            }
            None => {
                self.queue_and_wait(&mut queue, request, wait, &mut cancel)
                    .await
            }
        };
        match outcome {
            Ok((token, acquired_sent)) => {
                let path = queue.own.clone().unwrap_or_default();
                let session = client.session_id().0;
                let renewer = Renewer {
                    client: client.clone(),
                    path: path.clone(),
                    session,
                    granted,
                };
                let keeper = Keeper::start(renewer, acquired_sent, granted, request.kill_after);
                let (events_tx, events) = watch::channel(None);
                let monitor =
                    tokio::spawn(monitor(client.clone(), path.clone(), session, events_tx));
                Ok(ZkLease {
                    keeper,
                    monitor,
                    events,
                    token,
                    client,
                    path,
                    ttl: granted,
                })
            }
            Err(error) => {
                drop(client);
                // Once `--wait` is over, the server gets a short while only: our node goes
                // with the session anyway.
                if wait.is_some_and(|w| w.at.remaining().is_zero()) {
                    if tokio::time::timeout(LATE_CLEANUP, queue.cleanup())
                        .await
                        .is_err()
                    {
                        tracing::warn!("ZooKeeper did not confirm the clean-up in time; our node goes when the session expires");
                    }
                } else {
                    queue.cleanup().await;
                }
                Err(error)
            }
        }
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        self.dir(name)?;
        let client = self.connect(self.ttl).await?;
        let status = self.status_with(&client, name).await;
        close(client).await;
        status
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        let root = self.root()?;
        let client = self.connect(self.ttl).await?;
        let result = async {
            let children = match timed(client.list_children(&root)).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => Vec::new(),
                Err(e) => return Err(self.classify(&e, &format!("listing {root}"))),
            };
            let mut names: Vec<LockName> = children
                .iter()
                .filter_map(|c| name_of_component(c))
                .collect();
            names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            let mut held = Vec::new();
            for name in names {
                let status = self.status_with(&client, &name).await?;
                if status.held {
                    held.push(status);
                }
            }
            Ok(held)
        }
        .await;
        close(client).await;
        result
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let dir = self.dir(name)?;
        let client = self.connect(self.ttl).await?;
        let result = async {
            let entries = self.read_queue(&client, name).await?;
            let (holders, waiting): (Vec<Entry>, Vec<Entry>) =
                entries.into_iter().partition(|e| e.holds);
            if holders.is_empty() && !waiting.is_empty() {
                tracing::warn!(
                    "'{name}' has no holder, but {} waiting; waiters' nodes are left alone (a \
                     killed waiter's node goes when its session expires)",
                    waiting.len()
                );
            }
            for entry in &holders {
                let path = format!("{dir}/{}", entry.child);
                match timed(client.delete(&path, None)).await {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(self.classify(&e, &format!("deleting {path}"))),
                }
            }
            Ok(holders.into_iter().map(|e| e.status.holder).collect())
        }
        .await;
        close(client).await;
        result
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        let root = self.root()?;
        let started = BootInstant::now();
        let client = self.connect(self.ttl).await?;
        let connect_time = BootInstant::now().saturating_since(started);
        let result = self.check_with(&client, &root, connect_time).await;
        close(client).await;
        result
    }
}

impl ZkBackend {
    async fn check_with(
        &self,
        client: &Client,
        root: &str,
        connect_time: Duration,
    ) -> Result<CheckReport, Error> {
        let mut round_trips = Vec::new();
        for _ in 0..5 {
            let sent = BootInstant::now();
            timed(client.check_stat("/"))
                .await
                .map_err(|e| self.classify(&e, "reading /"))?;
            round_trips.push(BootInstant::now().saturating_since(sent));
        }
        round_trips.sort();
        // Create and delete a test node under the prefix (`!` never starts a lock's component).
        let acls = self.acls();
        self.make_parents(client, root).await?;
        let probe = format!("{root}/!check-{}", uuid::Uuid::new_v4());
        let probe_options = CreateMode::Ephemeral.with_acls(acls);
        timed(client.create(&probe, b"check", &probe_options))
            .await
            .map_err(|e| self.classify(&e, &format!("creating {probe}")))?;
        timed(client.delete(&probe, None))
            .await
            .map_err(|e| self.classify(&e, &format!("deleting {probe}")))?;
        let mut warnings = Vec::new();
        let members = self.target.endpoints.len();
        if members > 1 && members.is_multiple_of(2) {
            warnings.push(format!(
                "the URL names {members} servers; an odd-sized ensemble tolerates the same failures with fewer"
            ));
        }
        let granted = client.session_timeout();
        if granted != self.ttl {
            warnings.push(format!(
                "the server negotiated a {} session timeout for --ttl {}; dlock run would use {}",
                humantime::format_duration(granted),
                humantime::format_duration(self.ttl),
                humantime::format_duration(granted)
            ));
        }
        let (version, mode) = server_info(&self.target.endpoints).await;
        let median = round_trips
            .get(round_trips.len() / 2)
            .copied()
            .unwrap_or_default();
        Ok(CheckReport {
            backend: "zk".into(),
            location: self.display.clone(),
            version,
            round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
            warnings,
            details: vec![
                ("mode".into(), mode),
                (
                    "members".into(),
                    self.target
                        .endpoints
                        .iter()
                        .map(|(h, p)| format!("{h}:{p}"))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                (
                    "chroot".into(),
                    self.target.chroot.clone().unwrap_or_else(|| "/".into()),
                ),
                (
                    "auth".into(),
                    self.target
                        .user
                        .as_ref()
                        .map_or_else(|| "none".into(), |u| format!("digest user {u}")),
                ),
                (
                    "session".into(),
                    format!(
                        "{:x}, timeout {} (requested {})",
                        client.session_id().0,
                        humantime::format_duration(granted),
                        humantime::format_duration(self.ttl)
                    ),
                ),
                (
                    "connect".into(),
                    humantime::format_duration(Duration::from_micros(
                        u64::try_from(connect_time.as_micros()).unwrap_or(u64::MAX),
                    ))
                    .to_string(),
                ),
            ],
        })
    }
}

/// The server version and mode from the `srvr` four-letter word of the first member that
/// answers it (servers only answer it when it is in `4lw.commands.whitelist`).
async fn server_info(endpoints: &[(String, u16)]) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for (host, port) in endpoints {
        let ask = async {
            let mut stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            stream.write_all(b"srvr").await?;
            let mut reply = String::new();
            stream.read_to_string(&mut reply).await?;
            Ok::<String, std::io::Error>(reply)
        };
        let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(2), ask).await else {
            continue;
        };
        let field = |key: &str| {
            reply
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
        };
        if let Some(version) = field("Zookeeper version:") {
            // "3.8.0-<git id>, built on …": the release is what matters.
            let version = version
                .split([',', '-'])
                .next()
                .unwrap_or(&version)
                .to_owned();
            let mode = field("Mode:").unwrap_or_else(|| "unknown".into());
            return (version, format!("{mode} ({host}:{port})"));
        }
    }
    let unknown = "unknown (the srvr four-letter word is not whitelisted)".to_owned();
    (unknown.clone(), unknown)
}

/// Watch our node and the session: a deleted node or an expired session is a loss at once;
/// a disconnection is left to the keeper's deadline.
async fn monitor(client: Client, path: String, session: i64, lost: watch::Sender<Option<Lost>>) {
    let mut states = client.state_watcher();
    let gone = |reason: &str| {
        Some(Lost {
            reason: reason.to_owned(),
            kill_by: None,
        })
    };
    const DELETED: &str = "the lock node was deleted (dlock release --force, or another client)";
    loop {
        let watcher = match client.get_and_watch_data(&path).await {
            Ok((_, stat, _)) if stat.ephemeral_owner != session => {
                lost.send_replace(gone("the lock node belongs to another session now"));
                return;
            }
            Ok((_, _, watcher)) => watcher,
            Err(zk::Error::NoNode) => {
                lost.send_replace(gone(DELETED));
                return;
            }
            Err(zk::Error::SessionExpired) => {
                lost.send_replace(gone("the ZooKeeper session expired"));
                return;
            }
            // Disconnected: the keeper decides by the deadline; try again soon.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let changed = watcher.changed();
        tokio::pin!(changed);
        loop {
            tokio::select! {
                event = &mut changed => {
                    match event.event_type {
                        EventType::NodeDeleted => {
                            lost.send_replace(gone(DELETED));
                            return;
                        }
                        EventType::Session if event.session_state.is_terminated() => {
                            lost.send_replace(gone(&format!("the ZooKeeper session ended ({})", event.session_state)));
                            return;
                        }
                        _ => break,
                    }
                }
                state = states.changed() => match state {
                    SessionState::Expired | SessionState::AuthFailed | SessionState::Closed => {
                        lost.send_replace(gone(&format!("the ZooKeeper session ended ({state})")));
                        return;
                    }
                    SessionState::Disconnected => tracing::warn!(
                        "disconnected from ZooKeeper; the lock is kept only if the session is re-verified in time"
                    ),
                    _ => tracing::info!("ZooKeeper session state: {state}"),
                },
            }
        }
    }
}

/// A held ZooKeeper lock. Release deletes the node, which wakes the next waiter.
pub struct ZkLease {
    keeper: Keeper<Renewer>,
    monitor: JoinHandle<()>,
    events: watch::Receiver<Option<Lost>>,
    token: u64,
    client: Client,
    path: String,
    ttl: Duration,
}

impl Lease for ZkLease {
    fn token(&self) -> u64 {
        self.token
    }

    async fn lost(&mut self) -> Lost {
        tokio::select! {
            lost = self.keeper.lost() => lost,
            Ok(lost) = self.events.wait_for(Option::is_some) => {
                lost.clone().unwrap_or_else(|| Lost { reason: "the lock was lost".into(), kill_by: None })
            }
        }
    }

    async fn release(self) -> Result<(), Error> {
        let ZkLease {
            keeper,
            monitor,
            client,
            path,
            ttl,
            ..
        } = self;
        drop(keeper.stop().await);
        monitor.abort();
        let _ = monitor.await;
        // The delete and the close go out back to back (one round trip; the server handles
        // them in order): the next waiter wakes on the delete.
        let delete = client.delete(&path, None);
        let states = client.state_watcher();
        drop(client);
        let result = match tokio::time::timeout(ttl.min(OP_TIMEOUT), delete).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(zk::Error::NoNode)) => {
                tracing::warn!("the lock node was already gone when the lock was released");
                Ok(())
            }
            Ok(Err(e)) => Err(Error::Unavailable(format!(
                "could not delete {path} ({e}); it goes away when the session expires"
            ))),
            Err(_) => Err(Error::Unavailable(format!(
                "deleting {path} timed out; it goes away when the session expires"
            ))),
        };
        closed(states).await;
        result
    }
}

/// Re-verifies our node for the [`Keeper`]; every request also touches the session.
struct Renewer {
    client: Client,
    path: String,
    session: i64,
    granted: Duration,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        match self.client.check_stat(&self.path).await {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session => Ok(self.granted),
            Ok(_) => Err(RenewError::Gone(
                "the lock node was deleted (dlock release --force, or another client)".into(),
            )),
            Err(zk::Error::SessionExpired | zk::Error::SessionMoved) => {
                Err(RenewError::Gone("the ZooKeeper session expired".into()))
            }
            Err(e) => Err(RenewError::Failed(format!("ZooKeeper: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_names_become_valid_distinct_components() {
        let names = [".", "..", "%2E", "a", "a.b", "..."];
        let components: Vec<String> = names
            .iter()
            .map(|n| zk_component(&LockName::new(n).expect("name")))
            .collect();
        assert_eq!(components[0], "%2E");
        assert_eq!(components[1], "%2E%2E");
        let unique: std::collections::HashSet<&String> = components.iter().collect();
        assert_eq!(unique.len(), names.len(), "{components:?}");
        for (name, component) in names.iter().zip(&components) {
            assert_eq!(
                name_of_component(component).as_ref().map(LockName::as_str),
                Some(*name)
            );
        }
        assert!(name_of_component("!check-x").is_none());
    }

    #[test]
    fn queue_sorts_by_sequence_like_curator() {
        let mut children = vec![
            "_c_bbb-lock-0000000003".to_owned(),
            "_c_aaa-lock-0000000010".to_owned(),
            "_c_ccc-lock-0000000001".to_owned(),
        ];
        sort_queue(&mut children);
        assert_eq!(
            children,
            [
                "_c_ccc-lock-0000000001",
                "_c_bbb-lock-0000000003",
                "_c_aaa-lock-0000000010"
            ]
        );
    }
}
