//! The host-local queue (README: "Many waiters on one host"): `dlock run`s on one host that
//! wait for the same remote lock first queue on this host, so that only the head of the
//! host's queue holds a server connection. A thousand waiters on one host then cost the
//! server two connections instead of a thousand, and a server's connection limit
//! (PostgreSQL `max_connections`, ZooKeeper `maxClientCnxns`) is no longer a limit on the
//! number of waiters.
//!
//! How: [`LocalQueued`] wraps any remote [`Backend`]. Its `acquire` first takes a ticket in
//! this host's queue (`tickets.rs`: numbered ticket files, first come first served, each waiter
//! blocked in the kernel on one file, freed the moment its dlock dies) and waits until at most
//! `--limit` + [`DEPTH`] processes of this host are at the server and those with earlier
//! tickets have queued there; then it takes the remote lock. Its lease gives back the remote
//! lock first, then the ticket. More than `--limit` are admitted so that a release hands over
//! at the server's speed: the next waiters have already connected and queued when a holder is
//! done.
//!
//! - Where: the file backend's default directory (`kit::lock_dir::default_dir`, one per user
//!   whatever the session, private to the user and checked as the file backend checks it), in a
//!   sub-directory named after a digest of the remote backend's identity and prefix. Another
//!   user has another directory: users do not share a queue, and nobody else can block or
//!   break it. The last waiter to leave removes the directory (`tickets.rs`). A queue that
//!   cannot be used (a directory someone else planted) is skipped with a warning: the remote
//!   lock is taken directly, as without the queue.
//! - When: for every remote backend when the run may wait. `--no-wait` goes to the server at
//!   once (it never waits, so it would gain nothing), and `--local-queue off`
//!   (`DLOCK_LOCAL_QUEUE`, `local_queue` in the config file) turns the queue off.
//! - `--wait` is one deadline over both queues; a signal while in the local queue cancels it
//!   as a signal while waiting at the server does.
//! - Reentrancy needs no slot: a nested run of a held lock is recognised by `status` before
//!   `acquire` is called, and `status` goes straight to the server.
//! - Order: first come first served on the host (ticket order), then the server's own queue
//!   (FIFO on every remote backend but memcached). The runs of a host reach the server's queue
//!   in ticket order whatever the load: an admitted ticket also waits until every earlier
//!   ticket has its place there or is gone (`tickets.rs`). The remote backend says where it
//!   queues by calling [`crate::lock::queued`]; the request's [`OnQueued`] hook, set here, then
//!   unlocks this ticket's `.queuing` file. A remote `acquire` that returns (holding, past the
//!   queue, or failed) counts as queued too; a ticket that is gone (released, its run given
//!   up, cancelled or dead) holds up nobody. A capacity refusal being waited out is not
//!   queued: the next run waits, as it would be refused too. A backend without a queue
//!   (memcached polls) calls `queued` when it starts polling.
//! - Fairness across hosts: the server's queue has at most `--limit` + [`DEPTH`] entries per
//!   host: a host with a thousand waiters no longer fills it ahead of another host. A shared
//!   run (`--shared`) counts [`SHARED_AT_ONCE`] in place of `--limit`, so that the shared runs
//!   of a host hold together.
//!
//! - A hint for the backend: when the ticket just before ours is still in use, a process of
//!   this host is at the server ahead of us, so the lock is most likely held
//!   ([`AcquireRequest::likely_held`]); etcd then queues without first trying to take the lock
//!   free, one request less per hand-off.
//!
//! Capacity refusals ([`super::capacity`]) are waited out here too, around the remote
//! `acquire`, so a backend only has to recognise its server's refusal.

mod tickets;

use std::time::Duration;

use sha2::Digest;

use self::tickets::{LocalQueue, Ticket};
use crate::budget::{Wait, WaitBudget};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::{capacity, lock_dir};
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, Lease, LockName, LockStatus, Lost,
    OnQueued, Waiter,
};

/// How many processes of a host wait at the server besides the `--limit` holders. More than
/// one, so that the next waiter has connected and queued before the holder releases even when
/// connecting takes longer than the command (a PostgreSQL backend start is ~6 ms of CPU), and
/// so that small queues (up to this many waiters) are exactly the server's queue, in arrival
/// order (the contract's FIFO test queues five). Not yet tuned by measurement: the hand-off
/// benchmark with a release build is still to be run.
pub const DEPTH: u64 = 8;

/// How many shared runs of a host may hold a lock at once through the queue (each at the
/// server with a connection of its own), in place of `--limit`: shared holders need no turn,
/// so the runs of a host take a shared lock together, not in waves of `--limit` + [`DEPTH`].
/// Bounded so that with the waiters behind them they stay within a server's connections per
/// client host (ZooKeeper's `maxClientCnxns` is 60 by default).
pub const SHARED_AT_ONCE: u64 = 32;

/// Time in the local queue that the remote acquire's `--wait` may ignore (it then gets the
/// user's wait, so its deadline is later by at most this and its messages name that wait).
const QUEUE_SLACK: Duration = Duration::from_millis(100);

/// How long the message of a wait that ran out in the local queue may take to name the holder.
const DESCRIBE_TIMEOUT: Duration = Duration::from_millis(500);

/// A remote backend whose waiters on one host queue locally first (see the module doc).
pub struct LocalQueued<B> {
    remote: B,
    /// This user's queue for the remote backend's namespace; `None` when turned off.
    queue: Option<LocalQueue>,
}

impl<B: Backend> LocalQueued<B> {
    /// `remote`, queueing on this host first in the queue of the remote namespace `identity`
    /// (`Common::identity`: the server and the prefix); `None` when `--local-queue` turned the
    /// queue off.
    pub fn new(remote: B, identity: Option<String>) -> LocalQueued<B> {
        LocalQueued {
            remote,
            queue: identity.as_deref().map(queue_for),
        }
    }

    /// Take a place in the local queue and wait for our turn to go to the server. `Ok(None)`:
    /// the queue cannot be used; go to the server directly.
    async fn join_local(
        &self,
        queue: &LocalQueue,
        request: &AcquireRequest,
        deadline: Option<BootInstant>,
        cancel: &mut Cancel,
    ) -> Result<Option<Ticket>, Error> {
        let holders = if request.mode.is_shared() {
            SHARED_AT_ONCE
        } else {
            u64::from(request.limit)
        };
        let admitted = holders + DEPTH;
        // What `status` shows of this waiter: its command line masked as a holder's is, or
        // nothing when the run records no command line (`--record-command off`).
        let command = if request.holder.command.is_empty() {
            String::new()
        } else {
            crate::secrets::own_command_line(Holder::MAX_COMMAND)
        };
        match queue
            .enter(&request.name, &command, admitted, deadline, cancel)
            .await
        {
            Ok(ticket) => Ok(Some(ticket)),
            Err(Error::Cancelled) => Err(Error::Cancelled),
            Err(Error::Busy(_)) => Err(self.gave_up(request).await),
            Err(e) => {
                tracing::warn!(
                    "cannot queue for '{}' on this host ({e}); waiting at the server directly",
                    request.name
                );
                Ok(None)
            }
        }
    }

    /// The not-acquired error of a `--wait` that ran out in the local queue, naming the
    /// holder where the server says quickly who it is.
    async fn gave_up(&self, request: &AcquireRequest) -> Error {
        let holders =
            match tokio::time::timeout(DESCRIBE_TIMEOUT, self.remote.status(&request.name)).await {
                Ok(Ok(status)) => status.held_by(),
                _ => String::new(),
            };
        Error::Busy(format!(
            "lock '{}' is held{holders}; {} behind other runs on this host",
            request.name,
            crate::wording::gave_up(request.budget.wait())
        ))
    }
}

/// This user's local queue for the remote namespace `identity`: a sub-directory of dlock's
/// own directory (the file backend's default), named after a digest of the identity.
fn queue_for(identity: &str) -> LocalQueue {
    let digest = sha2::Sha256::digest(identity.as_bytes());
    let short: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    LocalQueue::new(&lock_dir::default_dir(), format!("queue-{short}"))
}

impl<B: Backend> Backend for LocalQueued<B> {
    type Lease = QueuedLease<B::Lease>;

    /// The remote's, from a start up to [`QUEUE_SLACK`] after ours: a run admitted at once
    /// gives the remote the user's whole `--wait`. A remote started later, with what the local
    /// queue left of the wait, has its time to answer counted from at most the end of the
    /// wait, so its own overrun covers it.
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        self.remote.finish_after_answer(request) + QUEUE_SLACK
    }

    /// A slot in the local queue (unless `--no-wait` or turned off), then the remote lock,
    /// with capacity refusals waited out; one `--wait` deadline for all of it.
    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<QueuedLease<B::Lease>, Error> {
        let (wait, deadline) = (request.budget.wait(), request.budget.deadline());
        let started = BootInstant::now();
        let local = match (&self.queue, wait) {
            (Some(queue), Wait::For(_) | Wait::Forever) => {
                self.join_local(queue, request, deadline, &mut cancel)
                    .await?
            }
            _ => None,
        };
        let queued_for = BootInstant::now().saturating_since(started);
        // Admitted without waiting behind another run: the time spent here was bookkeeping
        // (long only on a busy machine), not a wait that --wait should be charged for.
        let admitted_at_once = !local.as_ref().is_some_and(|t| t.waited);
        let mut first_try = true;
        let remote_cancel = cancel.clone();
        let remote = capacity::wait_out(&request.budget, &mut cancel, async |left| {
            let mut remote_request = request.clone();
            remote_request.likely_held = local.as_ref().is_some_and(|t| t.peer_ahead);
            if let Some(ticket) = &local {
                remote_request.on_queued = OnQueued::new(ticket.on_queued());
            }
            let at_once = std::mem::take(&mut first_try) && admitted_at_once;
            // The remote acquisition starts now, with a budget of its own.
            remote_request.budget = match left {
                // Admitted at once: the backend's deadline is the user's, to a few
                // milliseconds (to the queue's bookkeeping on a busy machine), and its
                // messages name the --wait the user gave.
                Wait::For(_)
                    if at_once || BootInstant::now().saturating_since(started) < QUEUE_SLACK =>
                {
                    WaitBudget::start(wait)
                }
                // What the local queue (or a capacity refusal) left of the wait.
                _ => request.budget.rest_from_now(),
            };
            self.remote
                .acquire(&remote_request, remote_cancel.clone())
                .await
        })
        .await;
        // Holding (past the server's queue without needing it) or leaving: either way the
        // next run of this host may go to the server.
        if let Some(ticket) = &local {
            ticket.queued();
        }
        let remote = match remote {
            // Only a run that waited behind another of this host says so: a slow admission
            // (a busy machine's bookkeeping) is no wait in the queue.
            Err(Error::Busy(why)) if !admitted_at_once && queued_for >= QUEUE_SLACK => {
                return Err(Error::Busy(format!(
                    "{why}, after {} in this host's queue",
                    humantime::format_duration(
                        Duration::from_millis(queued_for.as_millis() as u64)
                    )
                )))
            }
            other => other?,
        };
        if let Some(ticket) = &local {
            ticket.granted();
        }
        Ok(QueuedLease { remote, local })
    }

    /// The server's view, with the processes waiting in this host's queue added to its waiters
    /// (they are not at the server yet; the local slots' holders are the ones that are), and
    /// this host's waiters, since when each waits.
    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let mut status = self.remote.status(name).await?;
        let Some(queue) = &self.queue else {
            return Ok(status);
        };
        let tickets = match queue.in_use(name) {
            Ok(tickets) => tickets,
            Err(e) => {
                tracing::debug!("cannot see this host's waiters: {e}");
                return Ok(status);
            }
        };
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        let holds = |pid: u32| {
            status
                .holders
                .iter()
                .any(|h| h.holder.pid == pid && h.holder.host == host)
        };
        let mut waiting_here = Vec::new();
        let mut blocked = 0;
        for ticket in tickets {
            if ticket.blocked {
                blocked += 1;
            } else if ticket.granted || holds(ticket.pid) {
                // A holder, or one whose hold was lost or broken, stopping its command.
                continue;
            }
            let stage = if ticket.blocked {
                "host queue"
            } else {
                "server"
            };
            waiting_here.push(Waiter {
                command: ticket.command,
                ..Waiter::new(ticket.pid, ticket.since, stage)
            });
        }
        status.waiters = status.waiters.map(|waiters| waiters + blocked);
        status.waiting_here = waiting_here;
        Ok(status)
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        self.remote.list().await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        self.remote.force_release(name).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        let mut report = self.remote.check().await?;
        let queue = self
            .queue
            .as_ref()
            .map_or_else(|| "off".to_owned(), |q| q.path().display().to_string());
        report.details.push(("local queue".into(), queue));
        Ok(report)
    }
}

/// A remote hold and the local slot that led to it.
pub struct QueuedLease<L> {
    remote: L,
    /// Dropped after the remote release, which lets the next process of this host go to the
    /// server.
    local: Option<Ticket>,
}

impl<L: Lease> Lease for QueuedLease<L> {
    fn token(&self) -> u64 {
        self.remote.token()
    }

    /// Only the remote hold counts: losing the local slot (its file deleted) costs nothing but
    /// a second process of this host at the server.
    async fn lost(&mut self) -> Lost {
        self.remote.lost().await
    }

    async fn release(self) -> Result<(), Error> {
        let released = self.remote.release().await;
        drop(self.local);
        released
    }

    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        self.remote.finished(holder).await
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        self.remote.proven_until()
    }
}
