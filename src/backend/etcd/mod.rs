//! The etcd v3 backend: the `concurrency` recipe (lease + one key per waiter + lowest create
//! revision owns + watch the predecessor), with dlock's own lease keeper.
//!
//! Layout: a lock is the key prefix `<prefix>/<encoded name>/`; each waiter or holder is the key
//! `<prefix>/<encoded name>/<hold lease id in hex>`, valued with the holder metadata (JSON).
//! This is exactly what `etcdctl lock <prefix>/<encoded name>` uses, so the two exclude each
//! other. An encoded name never contains `/`, so no lock's prefix is a prefix of another
//! lock's keys (`a` is `dlock/a/`, `a/b` is `dlock/a%2Fb/`).
//!
//! Two leases. The *hold lease* has the `--ttl`; it is granted first (etcd picks its id) and
//! the keeper keeps it alive from then on, waiting included. A holder's key lives on it. A
//! waiter's key lives on a *waiter lease* of its own instead (2 s, etcd's minimum, renewed
//! while it waits), so that a waiter killed with SIGKILL, which cannot clean up, keeps its
//! place in the queue for 2 s and not for its `--ttl`. Its value says `"waiting": true`, which
//! is how `status` tells such a key at the head of the queue from a holder.
//!
//! Acquire: one transaction takes a lock that has no key at all: our key, on the hold lease.
//! Otherwise dlock grants the waiter lease, and one transaction creates our key on it (if
//! absent: a retry after a lost reply finds it) and reads the newest keys under the prefix.
//! We hold the lock when fewer than `--limit` keys are older than ours. A waiter then moves
//! its key to the hold lease, before its command starts: a Put with the hold lease on
//! condition that the key still has its create revision. A Put to an existing key keeps its
//! create revision, so the place in the queue and the fencing token (our key's create
//! revision) stay what they were; if the key went (the waiter lease died), the Put does not
//! happen and the command does not start. The waiter lease is kept alive until that Put is
//! acknowledged, and revoked after, off the hand-off path. Deletion-only watches do not see
//! the Put.
//!
//! Waiting with `--limit 1`: the waiter watches its predecessor and the key before that, in
//! one watch that also covers its own key (`Target::Line`). The predecessor's deletion when
//! it was the holder's means the lock is ours, with no further read: etcd delivers a watch's
//! events in revision order and drops none, so our own key's deletion (our lease died while we
//! waited) would have come first, or in the same response (a DeleteRange that removed both).
//! Any other wake-up is followed by a linearizable re-check that also verifies our own key
//! still exists; the common one — the key before the predecessor deleted, because the
//! predecessor just took the lock — happens while the predecessor runs its command, off the
//! hand-off path. With `--limit N > 1`, a waiter watches its predecessor (the head of the
//! queue watches the prefix for deletions, and every waiter that gets the lock rewrites its
//! value (the Put that moves its key to the hold lease), which wakes the one behind it) and
//! re-checks after every wake-up. Release and cancel revoke the leases, which deletes the key
//! in the same step.
//!
//! `--wait` bounds every request of an acquisition, connecting included: a cluster that
//! does not answer in time is unavailable (69), a lock that stays busy is 75.
//!
//! etcd-client does not fail over between endpoints by itself, so `Conn` talks to one
//! endpoint at a time and moves to the next after a transport failure or a timeout.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType,
    WatchOptions, WatchStream,
};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError};
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, HolderStatus, Lease, LockName,
    LockStatus, Lost, Wait,
};
pub mod target;

pub use target::EtcdTarget;

use crate::backend::url::join_host_port;

/// Bound for reaching the cluster and for one operation outside the keeper.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound for one attempt on one endpoint.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// TTL of a waiter's lease, in seconds: etcd's minimum with default settings. A waiter
/// killed while it waits (SIGKILL: no chance to clean up) keeps its place no longer.
const WAITER_TTL_S: i64 = 2;
/// The least time a server gets to answer while dlock queues, however short `--wait` is.
const MIN_ANSWER: Duration = Duration::from_secs(1);
/// Bound for reading who is ahead, for the message once `--wait` is over.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound for revoking our leases once `--wait` is over; what is left expires by itself.
const LATE_CLEANUP: Duration = Duration::from_secs(1);

pub struct EtcdBackend {
    target: EtcdTarget,
    prefix: String,
    display: String,
}

impl EtcdBackend {
    pub fn new(target: &EtcdTarget, prefix: &str, display: &str) -> EtcdBackend {
        if target.tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        EtcdBackend {
            target: target.clone(),
            prefix: prefix.trim_end_matches('/').to_owned(),
            display: display.to_owned(),
        }
    }

    fn lock_prefix(&self, name: &LockName) -> String {
        format!("{}/{}/", self.prefix, name.encoded())
    }

    fn conn(&self) -> Result<Conn, Error> {
        Conn::new(&self.target, &self.display)
    }

    /// The keys of a lock, oldest first.
    async fn read_queue(&self, conn: &mut Conn, name: &LockName) -> Result<Queue, Error> {
        let pfx = self.lock_prefix(name);
        let range = conn
            .call(OP_TIMEOUT, |mut c| {
                let pfx = pfx.clone();
                async move {
                    c.get(
                        pfx,
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(SortTarget::Create, SortOrder::Ascend),
                        ),
                    )
                    .await
                }
            })
            .await?;
        let kvs = range.kvs();
        let limit = kvs
            .first()
            .and_then(|kv| serde_json::from_slice::<Meta>(kv.value()).ok())
            .map_or(1, |m| m.limit.max(1)) as usize;
        let entries = kvs
            .iter()
            .enumerate()
            .map(|(position, kv)| {
                let meta = serde_json::from_slice::<Meta>(kv.value()).ok();
                let waiting = meta.as_ref().is_some_and(|m| m.waiting);
                let mut holder = meta.map(|m| m.holder).unwrap_or_else(|| Holder {
                    name: name.to_string(),
                    command: "(foreign holder: etcdctl lock or another client)".into(),
                    ..Holder::default()
                });
                holder.token = u64::try_from(kv.create_revision()).unwrap_or(0);
                Entry {
                    key: kv.key().to_vec(),
                    lease: kv.lease(),
                    holder,
                    // Among the first `limit`, a key still on its waiter lease is a waiter
                    // between the grant and the re-attach, or one that died there.
                    holds: position < limit && !waiting,
                }
            })
            .collect();
        Ok(Queue { entries })
    }

    /// Holders and waiters of a lock.
    async fn status_with(&self, conn: &mut Conn, name: &LockName) -> Result<LockStatus, Error> {
        let queue = self.read_queue(conn, name).await?;
        let mut holders = Vec::new();
        let mut waiting = Vec::new();
        for entry in queue.entries {
            if !entry.holds {
                waiting.push(HolderStatus {
                    holder: entry.holder,
                    ttl_left_ms: None,
                    session: None,
                });
                continue;
            }
            let lease = entry.lease;
            let ttl_left_ms = if lease == 0 {
                None
            } else {
                conn.call(OP_TIMEOUT, |mut c| async move {
                    c.lease_time_to_live(lease, None).await
                })
                .await
                .ok()
                .and_then(|r| u64::try_from(r.ttl()).ok())
                .map(|s| s * 1000)
            };
            holders.push(HolderStatus {
                holder: entry.holder,
                ttl_left_ms,
                session: None,
            });
        }
        Ok(LockStatus {
            name: name.to_string(),
            held: !holders.is_empty(),
            waiters: Some(waiting.len() as u64),
            queue: waiting,
            holders,
            last_token: None,
        })
    }

    /// Why a waiter whose key is `own` (none: not queued) cannot have the lock, for a
    /// message: "is held by pid N on host since T" or "is free, N waiting ahead". Bounded:
    /// it runs after `--wait` is over.
    async fn why_busy(&self, conn: &mut Conn, name: &LockName, own: Option<&str>) -> String {
        let read = tokio::time::timeout(REPORT_TIMEOUT, self.read_queue(conn, name)).await;
        let Ok(Ok(queue)) = read else {
            return "is held".into();
        };
        queue.why_busy(own.map(str::as_bytes))
    }
}

/// The keys of a lock, oldest first.
struct Queue {
    entries: Vec<Entry>,
}

/// One key of a lock.
struct Entry {
    key: Vec<u8>,
    lease: i64,
    holder: Holder,
    /// Among the first `--limit` keys and on its holder's lease (or foreign): a holder.
    holds: bool,
}

impl Queue {
    /// See [`EtcdBackend::why_busy`].
    fn why_busy(self, own: Option<&[u8]>) -> String {
        let ahead = self
            .entries
            .into_iter()
            .take_while(|e| Some(e.key.as_slice()) != own);
        let (holders, waiting): (Vec<Entry>, Vec<Entry>) = ahead.partition(|e| e.holds);
        let waiting = waiting.len();
        if holders.is_empty() {
            return if waiting > 0 {
                // The first waiter is taking the lock right now, or it was killed while it
                // waited and its key goes with its waiter lease.
                format!("is free, {waiting} waiting ahead")
            } else {
                "was held a moment ago".into()
            };
        }
        let held = LockStatus {
            name: String::new(),
            held: true,
            holders: holders
                .into_iter()
                .map(|e| HolderStatus {
                    holder: e.holder,
                    ttl_left_ms: None,
                    session: None,
                })
                .collect(),
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
}

/// What a key's value holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    #[serde(flatten)]
    holder: Holder,
    #[serde(default)]
    limit: u32,
    /// The key is on its waiter's lease: a place in the queue, not (yet) a hold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    waiting: bool,
}

/// One connection to the cluster, to one endpoint at a time. A clone shares the connection.
#[derive(Clone)]
struct Conn {
    urls: Vec<String>,
    index: usize,
    options: ConnectOptions,
    client: Option<Client>,
    display: String,
    tls: bool,
    has_client_cert: bool,
}

/// Why a call failed.
enum Failure {
    Etcd(etcd_client::Error),
    Timeout,
}

impl Conn {
    fn new(target: &EtcdTarget, display: &str) -> Result<Conn, Error> {
        let scheme = if target.tls { "https" } else { "http" };
        let urls = target
            .endpoints
            .iter()
            .map(|(host, port)| format!("{scheme}://{}", join_host_port(host, *port)))
            .collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(ATTEMPT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(false)
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let (Some(user), Some(password)) = (&target.user, &target.password) {
            options = options.with_user(user, password.expose());
        }
        if target.tls {
            let read = |path: &std::path::PathBuf| {
                std::fs::read(path)
                    .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))
            };
            let mut tls = etcd_client::TlsOptions::new().timeout(ATTEMPT_TIMEOUT);
            tls = match &target.tls_files.ca_file {
                Some(ca) => tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?)),
                None => tls.with_native_roots(),
            };
            if let (Some(cert), Some(key)) =
                (&target.tls_files.cert_file, &target.tls_files.key_file)
            {
                tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            options = options.with_tls(tls);
        }
        Ok(Conn {
            urls,
            index: 0,
            options,
            client: None,
            display: display.to_owned(),
            tls: target.tls,
            has_client_cert: target.tls_files.cert_file.is_some(),
        })
    }

    fn rotate(&mut self) {
        self.client = None;
        self.index = (self.index + 1) % self.urls.len().max(1);
    }

    async fn client(&mut self) -> Result<Client, etcd_client::Error> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let url = self.urls[self.index % self.urls.len()].clone();
        let client = Client::connect([url], Some(self.options.clone())).await?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Run `op` on the current endpoint; after a transport failure or a timeout move to the
    /// next endpoint and try again, until `budget` is spent. Other errors return at once.
    async fn call<T, F, Fut>(&mut self, budget: Duration, op: F) -> Result<T, Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = BootInstant::now() + budget;
        let attempts = (2 * self.urls.len()).max(2);
        let mut last = Failure::Timeout;
        for attempt in 0..attempts {
            let left = deadline.remaining();
            if left.is_zero() {
                break;
            }
            let step = async {
                let client = self.client().await?;
                op(client).await
            };
            match tokio::time::timeout(left.min(ATTEMPT_TIMEOUT), step).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if is_transport(&e) => {
                    tracing::debug!(
                        "etcd endpoint {} failed: {e}",
                        self.urls[self.index % self.urls.len()]
                    );
                    last = Failure::Etcd(e);
                    self.rotate();
                    tokio::time::sleep(Duration::from_millis(20 * (attempt as u64 + 1))).await;
                }
                Ok(Err(e)) => return Err(self.classify(&e)),
                Err(_) => {
                    last = Failure::Timeout;
                    self.rotate();
                }
            }
        }
        Err(match last {
            Failure::Etcd(e) => self.classify(&e),
            Failure::Timeout => Error::Unavailable(format!(
                "no etcd endpoint of {} answered within {}",
                self.display,
                humantime::format_duration(budget)
            )),
        })
    }

    /// Map an etcd-client error to dlock's error kinds (exit statuses).
    fn classify(&self, e: &etcd_client::Error) -> Error {
        use tonic::Code;
        let display = &self.display;
        let text = e.to_string();
        if is_tls_error(e) {
            return Error::Config(format!("TLS with {display} failed: {text}"));
        }
        match e {
            etcd_client::Error::GRpcStatus(status) => {
                let message = status.message();
                match status.code() {
                    Code::InvalidArgument | Code::Unauthenticated
                        if message.contains("authentication failed")
                            || message.contains("user name is empty")
                            || message.contains("auth token") =>
                    {
                        Error::Permission(format!(
                            "{display} refused authentication: {message} (user in the URL, password in the URL, \
                             DLOCK_PASSWORD or password_file)"
                        ))
                    }
                    Code::FailedPrecondition if message.contains("authentication is not enabled") => {
                        Error::Permission(format!("{display}: a user was given but etcd has authentication off"))
                    }
                    Code::PermissionDenied => Error::Permission(format!(
                        "{display}: permission denied (the etcd role needs read/write on the lock prefix): {message}"
                    )),
                    Code::ResourceExhausted => Error::Unavailable(format!(
                        "{display} is out of space (NOSPACE alarm): compact, defragment, then disarm the alarm: {message}"
                    )),
                    // A server that demands a client certificate closes the connection right
                    // after the handshake; tonic reports that as cancelled or as a bare
                    // "transport error".
                    Code::Cancelled | Code::Unknown
                        if self.tls
                            && !self.has_client_cert
                            && (message.contains("canceled") || message.contains("transport error")) =>
                    {
                        Error::Config(format!(
                        "{display} closed the TLS connection; it may require a client certificate \
                         (cert_file/key_file in the [etcd] table): {message}"
                        ))
                    }
                    _ => Error::Unavailable(format!("cannot use {display}: {message}")),
                }
            }
            etcd_client::Error::TransportError(_)
                if text.contains("Keys") || text.contains("key") =>
            {
                Error::Config(format!("cannot set up TLS for {display}: {text}"))
            }
            _ => Error::Unavailable(format!("cannot reach {display}: {text}")),
        }
    }
}

/// Worth trying another endpoint: the transport, not the request, failed.
fn is_transport(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Internal
            ) || (status.code() == Code::Cancelled
                && status.message().contains("operation was canceled"))
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => !is_tls_error(e),
        _ => false,
    }
}

fn is_tls_error(e: &etcd_client::Error) -> bool {
    if crate::error::caused_by_tls(e) {
        return true;
    }
    let text = format!("{e} {e:?}");
    text.contains("invalid peer certificate")
        || text.contains("UnknownIssuer")
        || text.contains("InvalidCertificate")
}

/// The newest `n` keys under `pfx` created before `before` (all keys when `before` is None).
fn older_keys(before: Option<i64>, n: usize) -> GetOptions {
    let mut options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(n as i64)
        .with_keys_only();
    if let Some(rev) = before {
        options = options.with_max_create_revision(rev - 1);
    }
    options
}

/// Why a waiter stopped waiting.
enum Wake {
    /// Something before us changed: re-check.
    Changed,
    /// Already re-checked (keys before ours, revision read at): nothing to wait for on this
    /// watch any more.
    Rechecked(Vec<Vec<u8>>, i64),
    /// The holder's key was deleted (at this revision) while ours still existed: the lock is
    /// ours. The watch, which covers our own key, goes on with the lease.
    Head(Box<WatchStream>, i64),
    /// `--wait` ran out.
    TimedOut,
}

/// A waiter's place in the queue, for re-checks while it waits.
struct Place<'a> {
    key: &'a str,
    pfx: &'a str,
    my_rev: i64,
    limit: usize,
    /// The revision the keys before ours were read at.
    read_at: i64,
}

/// What the waiter waits for.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// `--limit 1`: the key just before ours, and the one before that (`ahead`) unless `pred`
    /// is the holder's. Watched for deletion together with our own key, in one watch; see
    /// [`Target::watch`] for why that lets the waiter start without a re-check.
    Line {
        pred: Vec<u8>,
        ahead: Option<Vec<u8>>,
    },
    /// `--limit > 1`: the key just before ours (its deletion or rewrite).
    Key(Vec<u8>),
    /// `--limit > 1`, head of the queue: any deletion under the lock's prefix.
    AnyDeletion,
}

/// What an event on `key` (a deletion; with `Target::Key` also a rewrite) means to a waiter.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Our own key: our lease died while we waited.
    Own,
    /// The holder's key, ours still there: the lock is ours.
    Holder,
    /// A key we wait on, but not known to be the holder's: re-check.
    Watched,
    /// Another key that happens to be in the watched range.
    Other,
}

impl Target {
    /// For a waiter with `older` (newest first, at most limit+1) before it.
    fn for_waiter(older: &[Vec<u8>], limit: usize) -> Target {
        match older.first() {
            Some(pred) if limit == 1 => Target::Line {
                pred: pred.clone(),
                ahead: older.get(1).cloned(),
            },
            Some(key) if older.len() > limit => Target::Key(key.clone()),
            _ => Target::AnyDeletion,
        }
    }

    /// Whether a watch set up for `self` also serves `next`, read later.
    fn covers(&self, next: &Target) -> bool {
        match (self, next) {
            (
                Target::Line { pred, ahead },
                Target::Line {
                    pred: next_pred,
                    ahead: next_ahead,
                },
            ) => pred == next_pred && (next_ahead.is_none() || next_ahead == ahead),
            _ => self == next,
        }
    }

    /// The key range to watch and the options, for a waiter whose key is `own`.
    ///
    /// A `Line` waiter watches one range, from the smallest to the largest of its own key,
    /// `pred` and `ahead`. etcd delivers the events of one watch in revision order and drops
    /// none, so when `pred`'s deletion arrives without our own key's before it or in the same
    /// response (see `wait_for`), our key existed at that revision; if `pred` was the holder
    /// (nothing else before us when we last read, and no key can be created before ours
    /// later), the lock became ours right then, with no further read. Keys are named by lease id, and etcd gives out lease ids in
    /// increasing order, so neighbours in the queue are usually neighbours in the range too;
    /// other keys that fall in it are ignored. `ahead`'s deletion usually means `pred` just
    /// took the lock: the waiter re-checks then, while `pred` runs its command, so that the
    /// re-check is off the hand-off path.
    fn watch(&self, own: &[u8], pfx: &str) -> (Vec<u8>, WatchOptions) {
        let deletions = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        match self {
            Target::Line { pred, ahead } => {
                let keys = [Some(own), Some(pred.as_slice()), ahead.as_deref()];
                let first = keys.iter().flatten().min().copied().unwrap_or(own);
                let last = keys.iter().flatten().max().copied().unwrap_or(own);
                let mut end = last.to_vec();
                end.push(0);
                (first.to_vec(), deletions.with_range(end))
            }
            Target::Key(key) => (key.clone(), WatchOptions::new()),
            Target::AnyDeletion => (pfx.as_bytes().to_vec(), deletions.with_prefix()),
        }
    }

    /// What an event on `key` means to a waiter whose own key is `own` (`Line` tells them
    /// apart; a semaphore waiter re-checks on any event).
    fn seen(&self, key: &[u8], own: &[u8]) -> Seen {
        match self {
            _ if key == own => Seen::Own,
            Target::Line { pred, ahead: None } if key == pred.as_slice() => Seen::Holder,
            Target::Line { pred, ahead }
                if key == pred.as_slice() || ahead.as_deref() == Some(key) =>
            {
                Seen::Watched
            }
            Target::Line { .. } => Seen::Other,
            Target::Key(_) | Target::AnyDeletion => Seen::Watched,
        }
    }
}

/// Our key is gone: the lease that kept our place died while we waited.
fn place_lost() -> Error {
    Error::Unavailable(
        "our place in the etcd queue was lost while waiting (its lease expired or was revoked); \
         the command was not started"
            .into(),
    )
}

/// Our key's value: the holder metadata, and whether it is a place in the queue only.
fn meta_json(request: &AcquireRequest, waiting: bool) -> Result<String, Error> {
    serde_json::to_string(&Meta {
        holder: request.holder.clone(),
        limit: request.limit,
        waiting,
    })
    .map_err(|e| Error::Internal(e.to_string()))
}

/// The oldest key under a prefix, with its value.
fn oldest_key() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// A usage error when the oldest key says its holders use another `--limit` than ours.
fn same_limit(oldest: &[etcd_client::KeyValue], request: &AcquireRequest) -> Result<(), Error> {
    let theirs = oldest
        .first()
        .and_then(|kv| serde_json::from_slice::<Meta>(kv.value()).ok())
        .map(|m| m.limit);
    match theirs {
        Some(theirs) if theirs != 0 && theirs != request.limit => Err(Error::Usage(format!(
            "lock '{}' is held with --limit {theirs}; all holders must use the same --limit",
            request.name
        ))),
        _ => Ok(()),
    }
}

/// `--wait` over every request of an acquisition: a server that accepts connections and
/// never answers must not keep dlock longer than asked.
struct Before<'a> {
    /// The end of `--wait`.
    deadline: Option<BootInstant>,
    /// The end of `--wait`, but at least [`MIN_ANSWER`] from the start: a healthy server gets
    /// the time to answer, so that a short `--wait` still takes a free lock.
    answer_by: Option<BootInstant>,
    wait: Wait,
    display: &'a str,
}

impl<'a> Before<'a> {
    fn new(wait: Wait, display: &'a str) -> Before<'a> {
        let now = BootInstant::now();
        let deadline = match wait {
            Wait::For(d) => Some(now + d),
            Wait::No | Wait::Forever => None,
        };
        Before {
            deadline,
            answer_by: deadline.map(|d| d.max(now + MIN_ANSWER)),
            wait,
            display,
        }
    }

    fn is_over(&self) -> bool {
        self.deadline.is_some_and(|d| BootInstant::now() >= d)
    }

    /// `--wait`'s duration, for messages.
    fn waited(&self) -> String {
        match self.wait {
            Wait::For(d) => humantime::format_duration(d).to_string(),
            Wait::No | Wait::Forever => String::new(),
        }
    }

    /// `step`, unless a cancel comes first (an error) or `--wait` runs out (`None`).
    async fn bounded<T>(
        &self,
        cancel: &mut Cancel,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<Option<T>, Error> {
        self.bounded_by(self.deadline, cancel, step).await
    }

    async fn bounded_by<T>(
        &self,
        deadline: Option<BootInstant>,
        cancel: &mut Cancel,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<Option<T>, Error> {
        let over = async {
            match deadline {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::Cancelled),
            result = step => result.map(Some),
            _ = over => Ok(None),
        }
    }

    /// A request whose answer dlock needs before it can wait at all: no answer by the end
    /// of `--wait` means the cluster is unavailable.
    async fn answer<T>(
        &self,
        cancel: &mut Cancel,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.bounded_by(self.answer_by, cancel, step)
            .await?
            .ok_or_else(|| match self.wait {
                Wait::For(d) if d < MIN_ANSWER => Error::Unavailable(format!(
                    "no answer from {} within {} (--wait {})",
                    self.display,
                    humantime::format_duration(MIN_ANSWER),
                    self.waited()
                )),
                _ => Error::Unavailable(format!(
                    "no answer from {} within --wait {}",
                    self.display,
                    self.waited()
                )),
            })
    }
}

/// A waiter's own short lease, which holds its place in the queue while it waits (module
/// docs). It is renewed until stopped, and failed renewals are retried with no deadline:
/// nothing relies on this lease being alive, because the re-attach at the grant only
/// succeeds while our key (with its create revision) still exists.
struct WaiterLease {
    id: i64,
    /// Turns true when etcd says the lease is gone (and our key with it).
    gone: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl WaiterLease {
    fn start(conn: Conn, id: i64, granted: Duration) -> WaiterLease {
        let (gone_tx, gone) = watch::channel(false);
        let renewer = Renewer {
            conn,
            id,
            granted,
            stream: None,
            in_flight: false,
        };
        let task = tokio::spawn(keep_waiting(renewer, gone_tx));
        WaiterLease { id, gone, task }
    }

    /// Stop renewing and revoke the lease, off the hand-off path: it holds no key any more.
    fn retire(self, conn: &Conn) -> JoinHandle<()> {
        self.task.abort();
        let (mut conn, id) = (conn.clone(), self.id);
        tokio::spawn(async move {
            let revoke = conn
                .call(OP_TIMEOUT, |mut c| async move { c.lease_revoke(id).await })
                .await;
            if let Err(e) = revoke {
                tracing::debug!(
                    "could not revoke the waiter lease {id:x} ({e}); it expires by itself"
                );
            }
        })
    }
}

impl Drop for WaiterLease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Resolves when etcd says the waiter lease is gone; never without one. Cancel-safe.
async fn waiter_gone(waiter: &mut Option<WaiterLease>) {
    if let Some(waiter) = waiter {
        if waiter.gone.wait_for(|gone| *gone).await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// Renew a waiter lease every quarter of its TTL, retrying failures soon, until aborted. A
/// slow reply gets up to half the TTL: a reply that comes in time still keeps the place.
async fn keep_waiting(mut renewer: Renewer, gone: watch::Sender<bool>) {
    let every = (renewer.granted / 4).max(Duration::from_millis(250));
    let attempt = renewer.granted / 2;
    let mut pause = every;
    loop {
        tokio::time::sleep(pause).await;
        pause = match tokio::time::timeout(attempt, renewer.renew()).await {
            Ok(Ok(_)) => every,
            Ok(Err(RenewError::Gone(_))) => {
                gone.send_replace(true);
                return;
            }
            Ok(Err(RenewError::Failed(reason))) => {
                tracing::debug!("waiter lease keep-alive failed: {reason}");
                Duration::from_millis(100)
            }
            Err(_) => {
                tracing::debug!("waiter lease keep-alive timed out");
                Duration::from_millis(100)
            }
        };
    }
}

impl Backend for EtcdBackend {
    type Lease = EtcdLease;

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<EtcdLease, Error> {
        let before = Before::new(request.wait, &self.display);
        let mut conn = self.conn()?;
        let ttl_s = request.ttl.as_secs_f64().ceil().max(1.0) as i64;
        let sent = BootInstant::now();
        // The hold's lease, granted up front and kept alive while waiting, so that a grant
        // costs one write (the re-attach) and the keeper's deadline counts from here. It
        // holds no key while waiting: a waiter killed now leaves nothing in anyone's way.
        // etcd picks the id: its ids increase with every grant on a member, which keeps the
        // keys of neighbours in the queue next to each other (see `Target::Line`). A grant
        // retried after a lost reply leaves the first lease unused; it expires by its TTL.
        let grant = before
            .answer(
                &mut cancel,
                conn.call(OP_TIMEOUT, |mut c| async move {
                    c.lease_grant(ttl_s, None).await
                }),
            )
            .await?;
        let (id, granted_s) = (grant.id(), grant.ttl());
        if granted_s != ttl_s {
            tracing::warn!(
                "etcd granted a {granted_s}s lease for --ttl {ttl_s}s; using {granted_s}s"
            );
        }
        let granted = Duration::from_secs(u64::try_from(granted_s).unwrap_or(1));
        let renewer = Renewer {
            conn: self.conn()?,
            id,
            granted,
            stream: None,
            in_flight: false,
        };
        let mut keeper = Keeper::start(renewer, sent, granted, request.kill_after);
        let mut waiter = None;
        let outcome = self
            .queue_and_wait(
                &mut conn,
                request,
                id,
                &mut keeper,
                &mut waiter,
                &mut cancel,
                &before,
            )
            .await;
        match outcome {
            Ok((token, own)) => Ok(EtcdLease {
                keeper,
                token,
                id,
                // Our key is on the hold's lease now; the waiter lease has none left.
                waiter_revoke: waiter.map(|w| w.retire(&conn)),
                conn,
                ttl: granted,
                own,
            }),
            Err(error) => {
                drop(keeper.stop().await);
                // Revoking the leases deletes our key too: nothing is left behind. Once
                // `--wait` is over, the server gets a short while only: what it does not
                // revoke expires by itself.
                let budget = if before.is_over() {
                    LATE_CLEANUP
                } else {
                    OP_TIMEOUT
                };
                let mut leases = vec![(id, granted_s)];
                if let Some(waiter) = waiter {
                    leases.insert(0, (waiter.id, WAITER_TTL_S));
                }
                let cleanup = async {
                    for (lease, ttl) in leases {
                        let revoke = conn
                            .call(budget, |mut c| async move { c.lease_revoke(lease).await })
                            .await;
                        if let Err(e) = revoke {
                            tracing::warn!("could not revoke lease {lease:x} ({e}); it expires by itself within {ttl}s");
                        }
                    }
                };
                if tokio::time::timeout(budget, cleanup).await.is_err() {
                    tracing::warn!("etcd did not confirm the clean-up in time; our leases expire by themselves (--ttl)");
                }
                Err(error)
            }
        }
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let mut conn = self.conn()?;
        self.status_with(&mut conn, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        let mut conn = self.conn()?;
        let root = format!("{}/", self.prefix);
        let range = conn
            .call(OP_TIMEOUT, |mut c| {
                let root = root.clone();
                async move {
                    c.get(root, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                }
            })
            .await?;
        let mut names: Vec<LockName> = Vec::new();
        for kv in range.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            let Some(component) = key
                .strip_prefix(&root)
                .and_then(|rest| rest.split_once('/'))
                .map(|(c, _)| c)
            else {
                continue;
            };
            let Some(name) =
                crate::lock::decode_component(component).and_then(|n| LockName::new(&n).ok())
            else {
                continue;
            };
            // Only canonical encodings are dlock's (etcdctl could have used any prefix).
            if name.encoded() == component && !names.contains(&name) {
                names.push(name);
            }
        }
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut held = Vec::new();
        for name in names {
            let status = self.status_with(&mut conn, &name).await?;
            if status.held {
                held.push(status);
            }
        }
        Ok(held)
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let mut conn = self.conn()?;
        let queue = self.read_queue(&mut conn, name).await?;
        let (holders, waiting): (Vec<Entry>, Vec<Entry>) =
            queue.entries.into_iter().partition(|e| e.holds);
        if holders.is_empty() && !waiting.is_empty() {
            // Removing a waiter's key would only cost a live waiter its place: a killed
            // waiter's key goes with its waiter lease within seconds anyway.
            tracing::warn!(
                "'{name}' has no holder, but {} waiting; waiters' keys are left alone (a killed \
                 waiter's key expires with its {WAITER_TTL_S}s waiter lease)",
                waiting.len()
            );
        }
        for entry in &holders {
            let lease = entry.lease;
            if lease != 0 {
                // Revoke, not delete: the holder then finds its lease gone at its next renewal.
                let revoked = conn
                    .call(
                        OP_TIMEOUT,
                        |mut c| async move { c.lease_revoke(lease).await },
                    )
                    .await;
                if let Err(e) = revoked {
                    if !e.to_string().contains("not found") {
                        return Err(e);
                    }
                }
            } else {
                conn.call(OP_TIMEOUT, |mut c| {
                    let key = entry.key.clone();
                    async move { c.delete(key, None).await }
                })
                .await?;
            }
        }
        Ok(holders.into_iter().map(|e| e.holder).collect())
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        let mut conn = self.conn()?;
        let started = BootInstant::now();
        let server = conn
            .call(OP_TIMEOUT, |mut c| async move { c.status().await })
            .await?;
        let connect_time = BootInstant::now().saturating_since(started);
        let members = conn
            .call(OP_TIMEOUT, |mut c| async move { c.member_list().await })
            .await?;
        let probe_root = format!("{}/!check", self.prefix);
        let mut round_trips = Vec::new();
        for _ in 0..5 {
            let sent = BootInstant::now();
            conn.call(OP_TIMEOUT, |mut c| {
                let key = probe_root.clone();
                async move { c.get(key, Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
            round_trips.push(BootInstant::now().saturating_since(sent));
        }
        round_trips.sort();
        // Create and delete a test entry under the prefix (`!` never occurs in a lock's name).
        let grant = conn
            .call(
                OP_TIMEOUT,
                |mut c| async move { c.lease_grant(2, None).await },
            )
            .await?;
        let id = grant.id();
        let key = format!("{probe_root}/{id:x}");
        conn.call(OP_TIMEOUT, |mut c| {
            let key = key.clone();
            async move {
                c.put(key, "check", Some(PutOptions::new().with_lease(id)))
                    .await
            }
        })
        .await?;
        conn.call(OP_TIMEOUT, |mut c| async move { c.lease_revoke(id).await })
            .await?;
        let mut warnings = Vec::new();
        let count = members.members().len();
        if count % 2 == 0 {
            warnings.push(format!("the cluster has {count} members; an odd number tolerates the same failures with fewer"));
        }
        let names: Vec<String> = members
            .members()
            .iter()
            .map(|m| format!("{} {}", m.name(), m.client_urls().join(",")))
            .collect();
        let median = round_trips
            .get(round_trips.len() / 2)
            .copied()
            .unwrap_or_default();
        Ok(CheckReport {
            backend: "etcd".into(),
            location: self.display.clone(),
            version: server.version().to_owned(),
            round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
            warnings,
            details: vec![
                ("members".into(), names.join("; ")),
                ("leader".into(), format!("{:x}", server.leader())),
                (
                    "connect".into(),
                    humantime::format_duration(Duration::from_micros(
                        connect_time.as_micros() as u64
                    ))
                    .to_string(),
                ),
                (
                    "lease".into(),
                    format!("a 2s test lease was granted {}s", grant.ttl()),
                ),
            ],
        })
    }
}

impl EtcdBackend {
    /// Put our key in the queue and wait until it is among the first `limit`. Returns the
    /// fencing token (our key's create revision) and the watch on our key for the holder.
    /// `waiter` is the waiter lease, once there is one (for the caller to clean up).
    #[allow(clippy::too_many_arguments)]
    async fn queue_and_wait(
        &self,
        conn: &mut Conn,
        request: &AcquireRequest,
        id: i64,
        keeper: &mut Keeper<Renewer>,
        waiter: &mut Option<WaiterLease>,
        cancel: &mut Cancel,
        before: &Before<'_>,
    ) -> Result<(u64, OwnKey), Error> {
        let limit = request.limit.max(1) as usize;
        let pfx = self.lock_prefix(&request.name);
        let key = format!("{pfx}{id:x}");
        let held_meta = meta_json(request, false)?;
        // A lock without any key is taken in one step, with our key on the hold's lease.
        // (etcd compares every key of a range; an empty range compares as create revision 0.)
        let take_free = Txn::new()
            .when([Compare::create_revision(pfx.clone(), CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put(
                key.clone(),
                held_meta.clone(),
                Some(PutOptions::new().with_lease(id)),
            )])
            .or_else([
                // A retry after a lost reply finds our key.
                TxnOp::get(key.clone(), Some(GetOptions::new().with_keys_only())),
                TxnOp::get(pfx.clone(), Some(oldest_key())),
            ]);
        let response = before
            .answer(
                cancel,
                conn.call(OP_TIMEOUT, |mut c| {
                    let t = take_free.clone();
                    async move { c.txn(t).await }
                }),
            )
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let ours = match response.op_responses().first() {
            Some(TxnOpResponse::Get(range)) => range
                .kvs()
                .first()
                .map(|kv| (kv.create_revision(), kv.lease() == id)),
            _ => None,
        };
        if let Some(TxnOpResponse::Get(oldest)) = response.op_responses().get(1) {
            same_limit(oldest.kvs(), request)?;
        }
        // Whether our key is on the hold's lease (else on the waiter lease).
        let attached;
        let (my_rev, mut older, mut read_at) = if response.succeeded() {
            attached = true;
            (revision, Vec::new(), revision)
        } else if let Some((my_rev, on_hold_lease)) = ours {
            attached = on_hold_lease;
            let (older, at) = before
                .answer(cancel, self.recheck(conn, &key, &pfx, my_rev, limit))
                .await?;
            (my_rev, older, at)
        } else if request.wait == Wait::No && limit == 1 {
            // Someone is ahead: no need to queue to know that.
            let why = self.why_busy(conn, &request.name, None).await;
            return Err(Error::Busy(format!(
                "lock '{}' {why}; not waiting (--no-wait)",
                request.name
            )));
        } else {
            attached = false;
            self.enqueue(conn, request, &key, waiter, cancel, before)
                .await?
        };
        let mut watching = None;
        loop {
            if older.len() < limit {
                if !attached {
                    // The waiter lease is kept alive until this is acknowledged. For
                    // --limit > 1 the rewrite also wakes the waiter behind us (module docs).
                    let reattach = Txn::new()
                        .when([Compare::create_revision(
                            key.clone(),
                            CompareOp::Equal,
                            my_rev,
                        )])
                        .and_then([TxnOp::put(
                            key.clone(),
                            held_meta.clone(),
                            Some(PutOptions::new().with_lease(id)),
                        )]);
                    let response = before
                        .answer(
                            cancel,
                            conn.call(OP_TIMEOUT, |mut c| {
                                let t = reattach.clone();
                                async move { c.txn(t).await }
                            }),
                        )
                        .await?;
                    if !response.succeeded() {
                        return Err(place_lost());
                    }
                }
                let token = u64::try_from(my_rev)
                    .map_err(|_| Error::Internal(format!("negative revision {my_rev}")))?;
                let own = OwnKey {
                    key,
                    stream: watching,
                    seen: read_at,
                    created: my_rev,
                    failures: 0,
                    retry_at: None,
                };
                return Ok((token, own));
            }
            if request.wait == Wait::No {
                let why = self.why_busy(conn, &request.name, Some(&key)).await;
                return Err(Error::Busy(format!(
                    "lock '{}' {why}; not waiting (--no-wait)",
                    request.name
                )));
            }
            let target = Target::for_waiter(&older, limit);
            let mut place = Place {
                key: &key,
                pfx: &pfx,
                my_rev,
                limit,
                read_at,
            };
            // Checked here too: every round of the loop could otherwise end before the timer.
            let woken = if before.is_over() {
                Wake::TimedOut
            } else {
                self.wait_for(
                    conn, &mut place, target, keeper, waiter, cancel, before, request,
                )
                .await?
            };
            let checked = match woken {
                Wake::Rechecked(next_older, at) => Some((next_older, at)),
                Wake::Head(stream, at) => {
                    older.clear();
                    read_at = at;
                    watching = Some(*stream);
                    continue;
                }
                Wake::TimedOut => None,
                Wake::Changed => {
                    before
                        .bounded(cancel, self.recheck(conn, &key, &pfx, my_rev, limit))
                        .await?
                }
            };
            let Some((next_older, at)) = checked else {
                let why = self.why_busy(conn, &request.name, Some(&key)).await;
                return Err(Error::Busy(format!(
                    "lock '{}' {why}; gave up after waiting {} (--wait)",
                    request.name,
                    before.waited()
                )));
            };
            older = next_older;
            read_at = at;
        }
    }

    /// Take a place in the queue: our key on a short waiter lease of its own (module docs).
    /// Returns our key's create revision, the keys before it (newest first, at most
    /// limit+1) and the revision they were read at.
    async fn enqueue(
        &self,
        conn: &mut Conn,
        request: &AcquireRequest,
        key: &str,
        waiter: &mut Option<WaiterLease>,
        cancel: &mut Cancel,
        before: &Before<'_>,
    ) -> Result<(i64, Vec<Vec<u8>>, i64), Error> {
        let limit = request.limit.max(1) as usize;
        let pfx = self.lock_prefix(&request.name);
        let grant = before
            .answer(
                cancel,
                conn.call(OP_TIMEOUT, |mut c| async move {
                    c.lease_grant(WAITER_TTL_S, None).await
                }),
            )
            .await?;
        let granted = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(1));
        let lease = waiter.insert(WaiterLease::start(conn.clone(), grant.id(), granted));
        // Create our key if absent (a retry after a lost reply finds it) and read the newest
        // limit+2 keys: ours and the limit+1 just before it (as `recheck` reads them).
        let create = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key,
                    meta_json(request, true)?,
                    Some(PutOptions::new().with_lease(lease.id)),
                ),
                TxnOp::get(pfx.clone(), Some(older_keys(None, limit + 2))),
                // The oldest key's value says which --limit the holders use.
                TxnOp::get(pfx.clone(), Some(oldest_key())),
            ])
            .or_else([TxnOp::get(key, None)]);
        let response = before
            .answer(
                cancel,
                conn.call(OP_TIMEOUT, |mut c| {
                    let t = create.clone();
                    async move { c.txn(t).await }
                }),
            )
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        if response.succeeded() {
            if let Some(TxnOpResponse::Get(oldest)) = response.op_responses().get(2) {
                same_limit(oldest.kvs(), request)?;
            }
            let older = match response.op_responses().get(1) {
                Some(TxnOpResponse::Get(range)) => range
                    .kvs()
                    .iter()
                    .filter(|kv| kv.create_revision() < revision)
                    .map(|kv| kv.key().to_vec())
                    .collect(),
                _ => Vec::new(),
            };
            return Ok((revision, older, revision));
        }
        let own = match response.op_responses().first() {
            Some(TxnOpResponse::Get(range)) => range.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        };
        let Some(my_rev) = own else {
            return Err(Error::Internal(
                "our etcd key vanished right after it was created".into(),
            ));
        };
        // Re-read what is before us.
        let (older, at) = before
            .answer(cancel, self.recheck(conn, key, &pfx, my_rev, limit))
            .await?;
        Ok((my_rev, older, at))
    }

    /// Linearizable re-check: our key must still be there (else our lease died while waiting:
    /// never start the command); returns the keys before ours (newest first, at most
    /// limit+1) and the revision read at.
    async fn recheck(
        &self,
        conn: &mut Conn,
        key: &str,
        pfx: &str,
        my_rev: i64,
        limit: usize,
    ) -> Result<(Vec<Vec<u8>>, i64), Error> {
        let check = Txn::new()
            .when([Compare::create_revision(
                key.to_owned(),
                CompareOp::Equal,
                my_rev,
            )])
            .and_then([TxnOp::get(
                pfx.to_owned(),
                Some(older_keys(Some(my_rev), limit + 1)),
            )])
            .or_else([TxnOp::get(
                key.to_owned(),
                Some(GetOptions::new().with_keys_only()),
            )]);
        let response = conn
            .call(OP_TIMEOUT, |mut c| {
                let t = check.clone();
                async move { c.txn(t).await }
            })
            .await?;
        if !response.succeeded() {
            return Err(place_lost());
        }
        let older = match response.op_responses().first() {
            Some(TxnOpResponse::Get(range)) => {
                range.kvs().iter().map(|kv| kv.key().to_vec()).collect()
            }
            _ => Vec::new(),
        };
        Ok((older, response.header().map_or(0, |h| h.revision())))
    }

    /// Wait for the target to change.
    ///
    /// The watch starts at the current revision, not at `place.read_at + 1`: etcd serves a
    /// watch that starts in the past from a catch-up loop that runs every 100 ms, which under
    /// contention (other waiters writing meanwhile) delayed hand-offs by up to 100 ms. If the
    /// store moved past `read_at` before the watch was set up (on a busy cluster it usually
    /// has: revisions are cluster-wide), a deletion may have fallen in between, so the waiter
    /// re-checks once, after the watch exists. If the watch still covers what the waiter
    /// waits for, it goes on waiting on it; events up to the re-check's revision are already
    /// counted in, and are skipped.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for(
        &self,
        conn: &mut Conn,
        place: &mut Place<'_>,
        mut target: Target,
        keeper: &mut Keeper<Renewer>,
        waiter: &mut Option<WaiterLease>,
        cancel: &mut Cancel,
        before: &Before<'_>,
        request: &AcquireRequest,
    ) -> Result<Wake, Error> {
        let deadline = before.deadline;
        let limit = place.limit;
        let pfx = place.pfx;
        let own = place.key.as_bytes();
        let (watch_key, options) = target.watch(own, pfx);
        // A semaphore waiter also re-checks every TTL, in case a wake-up was lost.
        let recheck_at = (limit > 1).then(|| BootInstant::now() + request.ttl);
        let open = conn.call(OP_TIMEOUT, |mut c| {
            let key = watch_key.clone();
            let options = options.clone();
            async move { c.watch(key, Some(options)).await }
        });
        let Some(mut stream) = before.bounded(cancel, open).await? else {
            return Ok(Wake::TimedOut);
        };
        let mut created = false;
        loop {
            let wake = sleep_until(match (deadline, recheck_at) {
                (Some(d), Some(r)) => d.min(r),
                (Some(d), None) => d,
                (None, Some(r)) => r,
                (None, None) => BootInstant::now() + Duration::from_secs(3600),
            });
            let response = tokio::select! {
                // A lease the keeper has given up on wins over an event that came with it.
                biased;
                lost = keeper.lost() => {
                    return Err(Error::Unavailable(format!(
                        "the etcd lease to hold the lock on was lost while waiting ({}); \
                         the command was not started",
                        lost.reason
                    )));
                }
                // Our key went with it.
                () = waiter_gone(waiter) => return Err(place_lost()),
                message = stream.message() => match message {
                    Ok(Some(response)) => response,
                    // The stream broke: re-check and watch again.
                    Ok(None) | Err(_) => return Ok(Wake::Changed),
                },
                _ = cancel.cancelled() => return Err(Error::Cancelled),
                _ = wake => {
                    if deadline.is_some_and(|d| BootInstant::now() >= d) {
                        return Ok(Wake::TimedOut);
                    }
                    if recheck_at.is_some_and(|r| BootInstant::now() >= r) {
                        return Ok(Wake::Changed);
                    }
                    continue;
                }
            };
            if response.canceled() {
                let reason = response.cancel_reason();
                if reason.contains("permission denied") || reason.contains("PermissionDenied") {
                    return Err(Error::Permission(format!(
                        "etcd refused to watch {pfx}: {reason}"
                    )));
                }
                return Ok(Wake::Changed);
            }
            let recheck = if response.created() {
                created = true;
                // The watch started after `read_at`: read again, now that it exists.
                response.header().map_or(0, |h| h.revision()) != place.read_at
            } else if !created {
                // etcd announces a watch before its events; anything else: start over.
                return Ok(Wake::Changed);
            } else {
                // Every event counts, and our own key's deletion wins: one revision can delete
                // `pred` and ours together (a DeleteRange over the lock's prefix), and etcd lists
                // its events in key order, so ours may come after `pred`'s.
                let mut seen = Seen::Other;
                // The revision of the first event that counts (the holder's deletion).
                let mut at = place.read_at;
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    if kv.mod_revision() <= place.read_at {
                        continue;
                    }
                    let this = target.seen(kv.key(), own);
                    tracing::debug!(
                        "event on {} at revision {}: {this:?}",
                        String::from_utf8_lossy(kv.key()),
                        kv.mod_revision()
                    );
                    if this == Seen::Own {
                        seen = Seen::Own;
                        break;
                    }
                    if seen == Seen::Other {
                        seen = this;
                        at = kv.mod_revision();
                    }
                }
                match seen {
                    Seen::Own => return Err(place_lost()),
                    // Our key existed at the holder's deletion (not necessarily at the
                    // response's header revision, which can be later).
                    Seen::Holder => return Ok(Wake::Head(Box::new(stream), at)),
                    Seen::Watched if limit > 1 => return Ok(Wake::Changed),
                    Seen::Watched => true,
                    Seen::Other => false,
                }
            };
            if !recheck {
                continue;
            }
            let checked = before
                .bounded(
                    cancel,
                    self.recheck(conn, place.key, pfx, place.my_rev, limit),
                )
                .await?;
            let Some((older, at)) = checked else {
                return Ok(Wake::TimedOut);
            };
            let next = Target::for_waiter(&older, limit);
            if older.len() < limit || !target.covers(&next) {
                return Ok(Wake::Rechecked(older, at));
            }
            target = next;
            place.read_at = at;
        }
    }
}

/// A held etcd lock. Release revokes the lease, which deletes the key and wakes the next
/// waiter in one step.
pub struct EtcdLease {
    keeper: Keeper<Renewer>,
    token: u64,
    id: i64,
    /// The revoke of the waiter lease we waited on, if we did.
    waiter_revoke: Option<JoinHandle<()>>,
    conn: Conn,
    ttl: Duration,
    own: OwnKey,
}

/// The holder's watch on its own key. The lease keeper notices a lease that expires, but not
/// a key deleted while its lease lives (`etcdctl del`), and a revoked lease only at the next
/// keep-alive: without this watch the command would run on while another holder has the lock.
struct OwnKey {
    /// Our key; its deletion ends the lock at once.
    key: String,
    /// A watch that covers our key; `None` until (re)opened.
    stream: Option<WatchStream>,
    /// Our key existed at this revision; events up to it are accounted for.
    seen: i64,
    /// Our key's create revision (the fencing token).
    created: i64,
    /// Failed attempts to watch in a row, for the back-off; a stream that broke counts too.
    failures: u32,
    /// When to try again after a failure.
    retry_at: Option<BootInstant>,
}

impl OwnKey {
    /// Wait until our key is deleted; returns why. Cancel-safe: the supervisor polls this
    /// afresh on every turn of its loop, and all state lives in `self`.
    async fn deleted(&mut self, conn: &mut Conn) -> String {
        let key = self.key.clone();
        let key = key.as_str();
        let gone = || {
            format!("our etcd key {key} was deleted (by `etcdctl del`, or its lease was revoked)")
        };
        loop {
            let Some(stream) = self.stream.as_mut() else {
                if let Some(at) = self.retry_at {
                    sleep_until(at).await;
                }
                if self.failures > 0 {
                    // Watch from now on, not from `seen`: etcd would replay every revision
                    // since, of the whole cluster, and history may be compacted. So first make
                    // sure the key is still ours.
                    match key_revision(conn, key).await {
                        Ok((Some(created), at)) if created == self.created => self.seen = at,
                        Ok(_) => return gone(),
                        Err(e) => {
                            self.failed(&format!("cannot read our etcd key: {e}"));
                            continue;
                        }
                    }
                }
                let options = WatchOptions::new()
                    .with_start_revision(self.seen + 1)
                    .with_filters([WatchFilterType::NoPut]);
                let open = conn.call(OP_TIMEOUT, |mut c| {
                    let options = options.clone();
                    async move { c.watch(key, Some(options)).await }
                });
                match open.await {
                    Ok(stream) => {
                        self.stream = Some(stream);
                        self.retry_at = None;
                    }
                    Err(e) => self.failed(&format!("cannot watch our etcd key: {e}")),
                }
                continue;
            };
            let response = match stream.message().await {
                Ok(Some(response)) if !response.canceled() => response,
                Ok(Some(response)) => {
                    let reason = response.cancel_reason().to_owned();
                    self.failed(&format!("etcd ended the watch on our key ({reason})"));
                    continue;
                }
                Ok(None) => {
                    self.failed("the watch on our etcd key ended");
                    continue;
                }
                Err(e) => {
                    self.failed(&format!("the watch on our etcd key broke: {e}"));
                    continue;
                }
            };
            if response.created() {
                // A watch that works again: the back-off starts over next time.
                self.failures = self.failures.min(1);
            }
            let deleted = response.events().iter().any(|event| {
                event.event_type() == EventType::Delete
                    && event.kv().is_some_and(|kv| {
                        kv.key() == key.as_bytes() && kv.mod_revision() > self.seen
                    })
            });
            if deleted {
                return gone();
            }
        }
    }

    /// Note a failure: drop the stream, wait 1 s, doubling up to 30 s while failures go on.
    /// The keeper still stops the command if the lease itself cannot be kept.
    fn failed(&mut self, what: &str) {
        self.stream = None;
        self.failures = self.failures.saturating_add(1);
        let delay = Duration::from_secs(1 << self.failures.min(6).saturating_sub(1))
            .min(Duration::from_secs(30));
        if self.failures == 3 {
            tracing::warn!(
                "{what}; a deletion of our key may go unnoticed until the watch works again"
            );
        } else {
            tracing::debug!("{what}");
        }
        self.retry_at = Some(BootInstant::now() + delay);
    }
}

/// Our key's create revision (None when it does not exist) and the revision read at.
async fn key_revision(conn: &mut Conn, key: &str) -> Result<(Option<i64>, i64), Error> {
    let response = conn
        .call(OP_TIMEOUT, |mut c| async move {
            c.get(key, Some(GetOptions::new().with_keys_only())).await
        })
        .await?;
    let at = response.header().map_or(0, |h| h.revision());
    Ok((response.kvs().first().map(|kv| kv.create_revision()), at))
}

impl Lease for EtcdLease {
    fn token(&self) -> u64 {
        self.token
    }

    async fn lost(&mut self) -> Lost {
        tokio::select! {
            biased;
            lost = self.keeper.lost() => lost,
            reason = self.own.deleted(&mut self.conn) => Lost {
                reason,
                // The lock is gone already: there is no later moment to protect.
                kill_by: None,
            },
        }
    }

    async fn release(self) -> Result<(), Error> {
        let EtcdLease {
            keeper,
            id,
            mut conn,
            ttl,
            own,
            waiter_revoke,
            ..
        } = self;
        drop(own);
        if let Some(revoke) = waiter_revoke {
            // Done long ago unless the command was very short; else it expires by itself.
            if tokio::time::timeout(Duration::from_millis(200), revoke)
                .await
                .is_err()
            {
                tracing::debug!("the waiter lease was not revoked yet; it expires by itself");
            }
        }
        // The revoke goes out first: the next waiter is waiting for it. A keep-alive that
        // crosses it is harmless.
        let revoke = conn.call(ttl.min(OP_TIMEOUT), |mut c| async move {
            c.lease_revoke(id).await
        });
        let (revoked, _) = tokio::join!(revoke, keeper.stop());
        match revoked {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("not found") => {
                tracing::warn!(
                    "the lock had already expired or been removed before it was released"
                );
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Keep-alive round trips for the [`Keeper`], on a stream opened at the first renewal.
struct Renewer {
    conn: Conn,
    id: i64,
    granted: Duration,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// An attempt was abandoned by the keeper's timeout: its reply could still arrive and be
    /// credited to a later send time, so that stream must not be used again.
    in_flight: bool,
}

const GONE: &str =
    "the etcd lease is gone: it expired, or was revoked (dlock release --force, etcdctl lease revoke)";

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        if std::mem::replace(&mut self.in_flight, true) && self.stream.take().is_some() {
            self.conn.rotate();
        }
        let result = self.renew_once().await;
        self.in_flight = false;
        result
    }
}

impl Renewer {
    async fn renew_once(&mut self) -> Result<Duration, RenewError> {
        if let Some((keeper, stream)) = self.stream.as_mut() {
            let reply = async {
                keeper.keep_alive().await?;
                stream.message().await
            }
            .await;
            return match reply {
                Ok(Some(response)) if response.ttl() > 0 => {
                    Ok(Duration::from_secs(response.ttl() as u64))
                }
                Ok(Some(_)) => Err(RenewError::Gone(GONE.into())),
                Ok(None) | Err(_) => {
                    self.stream = None;
                    self.conn.rotate();
                    Err(RenewError::Failed(
                        "the keep-alive stream broke; reopening".into(),
                    ))
                }
            };
        }
        let mut client = self.conn.client().await.map_err(|e| {
            self.conn.rotate();
            RenewError::Failed(e.to_string())
        })?;
        match client.lease_keep_alive(self.id).await {
            // Opening the stream is itself a renewal (the crate consumes the first reply).
            Ok(stream) => {
                self.stream = Some(stream);
                Ok(self.granted)
            }
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                Err(RenewError::Gone(GONE.into()))
            }
            Err(e) => {
                if is_transport(&e) {
                    self.conn.rotate();
                }
                Err(RenewError::Failed(e.to_string()))
            }
        }
    }
}
