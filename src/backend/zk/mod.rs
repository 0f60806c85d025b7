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
//! starts the command; the one exception is a `--limit 1` waiter whose predecessor's data
//! changed (it took the lock and dropped its waiting mark): that node is still there, so the
//! waiter only watches it again. Cancel and release delete our node before the session is
//! closed.
//!
//! Shared locks (`--shared`): Curator's `InterProcessReadWriteLock` recipe. A shared run's node
//! is `_c_<uuid>-__READ__<sequence>`, as Curator's read lock names it; an exclusive run's stays
//! the mutex's `-lock-` node, and a Curator write lock's `__WRIT__` node is exclusive too. All
//! children of the lock's node share one sequence counter, so one queue orders them all: an
//! exclusive node has its turn when no node is ahead of it, a shared node when no exclusive
//! node is ahead of it ([`nodes::has_turn`]). So a shared run that arrives while an exclusive
//! one waits queues behind it (no writer starvation). A shared waiter watches the nearest
//! exclusive node ahead of its own (an exclusive waiter, as always, the node just ahead), and
//! lists again after every wake-up, since an exclusive waiter further ahead may still be
//! there. Every hold's token is its node's czxid: a node has its turn only once every node
//! created before it that could exclude it is gone, so a later grant never has a smaller
//! czxid than an earlier one.
//!
//! A waiter killed with SIGKILL cannot delete its node, which then lives as long as its
//! session: up to the negotiated session timeout. With `--limit 1` a waiter marks its node
//! (`"waiting": true` in its data) before it waits and unmarks it when it takes the lock (that
//! write is sent without waiting for its reply), so that a killed waiter's node at the head of
//! the queue shows as a waiter, not as a holder: the lock is "free, N waiting ahead" (a
//! `--shared` waiter marks its node the same way). `--wait`
//! bounds connecting and queueing too: a server that does not answer in time is 69.
//!
//! The lease: the session. A connection loss is not an expiry: the
//! [`Keeper`](crate::keeper::Keeper) keeps re-verifying our node (`exists`, which also touches
//! the session) and only declares the hold lost when that has failed for long enough that the
//! server might expire the session (docs/guide.md: "Signals", lock loss). A session the server reports expired, or a
//! deleted node, is lost at once (a watch on our node reports both without waiting for the next
//! renewal).
//!
//! The parts: `conn` (sessions, bounds, error classes), `nodes` (paths and node data),
//! `queue` (our node in, and out again on failure), `wait` (waiting for our turn), `lease`
//! (the session as lease), `admin` (status, list, release --force, check), `target` (the URL).

use std::time::Duration;

use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::lock::{AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus};

mod admin;
mod conn;
pub mod kind;
mod lease;
mod nodes;
mod queue;
pub mod target;
mod wait;

pub use lease::ZkLease;
pub use nodes::zk_component;
pub use target::ZkTarget;

use conn::close;
use queue::Queue;

/// Locks in a ZooKeeper ensemble under `--prefix`; `ttl` is the session timeout asked for
/// by the commands other than `run` (which asks for the request's).
pub struct ZkBackend {
    target: ZkTarget,
    prefix: String,
    display: String,
    ttl: Duration,
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
}

impl Backend for ZkBackend {
    type Lease = ZkLease;

    /// After the server's time to answer: a waiter finishing after it (a re-check, a grant that
    /// came at the end) for up to a session timeout, the TTL asked for (the backstop in
    /// `acquire`), and then taking our node out ([`queue::LATE_CLEANUP`]).
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        request.ttl + queue::LATE_CLEANUP
    }

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<ZkLease, Error> {
        let dir = self.dir(&request.name)?;
        let client = tokio::select! {
            c = self.connect_by(request.ttl, Some(&request.budget)) => c?,
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
        let mut queue = Queue::new(client.clone(), dir);
        // `--wait` bounds queueing (in `queue_and_wait`) and waiting; this is the backstop for a
        // server that stops answering while dlock waits. A waiter may still be finishing after
        // `--wait` (a re-check, a grant that came at the end, the report of who is ahead) on a
        // busy machine; only a server silent for a whole session timeout past it has stopped
        // answering (by then it has expired our session by its own rule).
        let outcome = match request.budget.answer_by() {
            Some(answer_by) => {
                let backstop = sleep_until(answer_by + granted);
                tokio::select! {
                    outcome = self.queue_and_wait(&mut queue, request, &mut cancel) => outcome,
                    () = backstop => Err(self.no_answer(&request.budget)),
                }
            }
            None => self.queue_and_wait(&mut queue, request, &mut cancel).await,
        };
        match outcome {
            Ok((token, acquired_sent)) => {
                let path = queue.own.clone().unwrap_or_default();
                Ok(ZkLease::start(
                    client,
                    path,
                    token,
                    acquired_sent,
                    granted,
                    request.kill_after,
                    request.limit,
                ))
            }
            Err(error) => {
                drop(client);
                queue.abandon(&request.budget).await;
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
        let result = self.list_with(&client, &root).await;
        close(client).await;
        result
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let dir = self.dir(name)?;
        let client = self.connect(self.ttl).await?;
        let result = self.force_release_with(&client, name, &dir).await;
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
