//! Waiting for our turn: the place of our node in the queue, the watch on the node we wait
//! for (an exclusive waiter: the node just ahead, or, at the head of a `--limit N` queue, the
//! children; a shared waiter: the nearest exclusive node ahead), the waiting mark of
//! `--limit 1` and `--shared`, the `--limit` agreement, and the message saying who is ahead.

use std::time::Duration;

use zookeeper_client::{self as zk, Client, EventType, OneshotWatcher};

use super::conn::{reread, timed};
use super::nodes::{has_turn, mode_of, sort_queue, Entry, Meta, EXCLUSIVE_MARK, READ_MARK};
use super::queue::{lost_place, Queue};
use super::ZkBackend;
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::kit::limit;
use crate::lock::{AcquireRequest, Cancel, Holder, LockName, Mode, Record};

/// Bound for reading who holds a lock for a message, once `--wait` is over.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);

impl ZkBackend {
    /// Put our node in the queue and wait for its turn: among the first `limit` with no
    /// shared node ahead (exclusive), or no exclusive node ahead (`--shared`). Returns the
    /// fencing token (our node's czxid) and the send time of the request that proved it.
    pub(super) async fn queue_and_wait(
        &self,
        queue: &mut Queue,
        request: &AcquireRequest,
        cancel: &mut Cancel,
    ) -> Result<(u64, BootInstant), Error> {
        let mut holder = request.holder.clone();
        holder.mode = request.mode;
        let (holding, waiting) = (
            node_data(&holder, request.limit, false)?,
            node_data(&holder, request.limit, true)?,
        );
        let queued_by = async {
            match request.budget.answer_by() {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let mark = match request.mode {
            Mode::Shared => READ_MARK,
            Mode::Exclusive => EXCLUSIVE_MARK,
        };
        let (own, stat, mut children, mut listed_sent) = tokio::select! {
            r = self.enqueue(&queue.client, &queue.dir, &queue.guid_prefix, mark, &holding) => r?,
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            () = queued_by => return Err(self.no_answer(&request.budget)),
        };
        let own_path = format!("{}/{own}", queue.dir);
        queue.own = Some(own_path.clone());
        let token = u64::try_from(stat.czxid)
            .map_err(|_| Error::Internal(format!("negative czxid {}", stat.czxid)))?;
        let mut waiter = Waiter {
            backend: self,
            request,
            client: queue.client.clone(),
            dir: queue.dir.clone(),
            own,
            own_path,
            limit: request.limit.max(1) as usize,
            holder,
            waiting,
            marked: false,
            limit_checked: false,
        };
        loop {
            let index = waiter.place(&mut children).await?;
            if has_turn(&children, index, waiter.limit) {
                waiter.take().await?;
                return Ok((token, listed_sent));
            }
            if request.budget.is_no_wait() {
                return Err(waiter.busy("not waiting (--no-wait)").await);
            }
            waiter.mark().await?;
            if let Some((mut watcher, watched)) = waiter.watch_ahead(index, &children).await? {
                crate::lock::queued(request);
                // `--limit 1` and `--shared`: the node we wait for rewrote its data (it took
                // the lock and dropped its waiting mark, or recorded its finish) and is still
                // there, so only its deletion can make our turn: watch it again instead of
                // listing the queue, which would cost a read, and at a hand-off a second one.
                while let (Some(EventType::NodeDataChanged), Some(node), 1) =
                    (waiter.sleep(watcher, cancel).await?, watched, waiter.limit)
                {
                    match waiter.watch_predecessor(node).await? {
                        Some(again) => watcher = again,
                        None => break,
                    }
                }
            }
            listed_sent = BootInstant::now();
            children = tokio::select! {
                r = waiter.list() => r?,
                _ = cancel.cancelled() => return Err(Error::Cancelled),
            };
            tracing::debug!(target: crate::logging::HANDOFF, "children-read");
        }
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
        crate::kit::held::busy_reason(
            holders.into_iter().map(|e| e.status.holder).collect(),
            waiting.len(),
        )
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

/// Our node in a lock's queue, from its creation to the grant: what every turn of the wait
/// needs.
struct Waiter<'a> {
    backend: &'a ZkBackend,
    request: &'a AcquireRequest,
    client: Client,
    dir: String,
    /// Our node's name among the lock's children, and its path.
    own: String,
    own_path: String,
    /// `--limit`, at least 1: how many hold at once.
    limit: usize,
    /// Our metadata, and our node's data as a marked waiter's.
    holder: Holder,
    waiting: Vec<u8>,
    /// Whether our node's data marks it as a waiter's (`--limit 1`).
    marked: bool,
    /// Whether the `--limit` of those ahead was checked (once, before any wait).
    limit_checked: bool,
}

impl Waiter<'_> {
    /// Our place in the queue `children` (sorted here); an error if our node is gone.
    async fn place(&mut self, children: &mut [String]) -> Result<usize, Error> {
        sort_queue(children);
        let Some(index) = children.iter().position(|c| *c == self.own) else {
            return Err(lost_place());
        };
        // Anyone ahead of us must use the same --limit (checked once, before any wait). A
        // --limit 1 waiter reads its predecessor's data anyway when it sets its watch, and
        // checks that instead of asking for the first node's.
        if index > 0 && !self.limit_checked && (self.limit > 1 || self.request.budget.is_no_wait())
        {
            self.backend
                .check_limit(&self.client, &self.dir, &children[0], self.request)
                .await?;
            tracing::debug!(target: crate::logging::HANDOFF, "limit-checked");
            self.limit_checked = true;
        }
        Ok(index)
    }

    /// Our node has its turn: make its data say it holds.
    async fn take(&self) -> Result<(), Error> {
        // Written at the grant, our data says the hold started now (`since`).
        let holding = || {
            let mut holder = self.holder.clone();
            holder.granted_now();
            node_data(&holder, self.request.limit, false)
        };
        if self.limit > 1 {
            // Rewrite our data: the waiter behind us watches it (see the docs of `zk`).
            timed(self.client.set_data(&self.own_path, &holding()?, None))
                .await
                .map_err(|e| {
                    self.backend
                        .classify(&e, &format!("writing {}", self.own_path))
                })?;
            tracing::debug!(target: crate::logging::HANDOFF, "data-written");
        } else if self.marked {
            // Our node is a hold now, for `status`. The request goes out as it is
            // made; nothing waits for its reply (the command starts at once).
            drop(self.client.set_data(&self.own_path, &holding()?, None));
        }
        Ok(())
    }

    /// The lock stays held: who holds it (or how many wait ahead), and `giving_up`.
    async fn busy(&self, giving_up: &str) -> Error {
        let name = &self.request.name;
        let why = self
            .backend
            .why_busy(&self.client, name, Some(&self.own))
            .await;
        Error::Busy(format!("lock '{name}' {why}; {giving_up}"))
    }

    /// Mark our node as a waiter's (`--limit 1` and `--shared`, once before the first wait):
    /// should its turn come with us killed (its session lives on until it expires), `status`
    /// and the others' messages say the lock is free with a waiter ahead, not held.
    async fn mark(&mut self) -> Result<(), Error> {
        if self.limit > 1 || self.marked {
            return Ok(());
        }
        match timed(self.client.set_data(&self.own_path, &self.waiting, None)).await {
            Ok(_) => {
                self.marked = true;
                Ok(())
            }
            Err(zk::Error::NoNode) => Err(lost_place()),
            Err(e) => Err(self.backend.waiting_failed(&e, &self.own_path)),
        }
    }

    /// A watch that fires when our turn may have come (`index` is our place in `children`,
    /// not our turn yet), and the child it watches (none: the children): a shared waiter
    /// watches the nearest exclusive node ahead (the shared nodes between it and ours hold or
    /// wait beside us); an exclusive one the node just ahead of ours, or, at the head of a
    /// `--limit N` queue, the children. `None`: our turn may have come already; look again at
    /// once.
    async fn watch_ahead<'c>(
        &mut self,
        index: usize,
        children: &'c [String],
    ) -> Result<Option<(OneshotWatcher, Option<&'c str>)>, Error> {
        let ahead = &children[..index];
        let watched = match self.request.mode {
            Mode::Shared => ahead
                .iter()
                .rev()
                .find(|c| !mode_of(c).is_shared())
                .map(String::as_str),
            Mode::Exclusive if self.limit == 1 || index > self.limit => {
                ahead.last().map(String::as_str)
            }
            Mode::Exclusive => {
                return Ok(self.watch_children().await?.map(|w| (w, None)));
            }
        };
        // Nothing to wait for: look again (not reached: `has_turn` said otherwise).
        let Some(watched) = watched else {
            return Ok(None);
        };
        Ok(self
            .watch_predecessor(watched)
            .await?
            .map(|w| (w, Some(watched))))
    }

    async fn watch_predecessor(&mut self, child: &str) -> Result<Option<OneshotWatcher>, Error> {
        let predecessor = format!("{}/{child}", self.dir);
        match reread(|| self.client.get_and_watch_data(&predecessor)).await {
            // For --limit > 1, a predecessor that already rewrote its data holds the
            // lock: we are the head of the queue now, which watches differently.
            Ok((_, stat, _)) if self.limit > 1 && stat.version > 0 => Ok(None),
            Ok((data, _, watcher)) => {
                if !self.limit_checked {
                    same_limit(&data, self.request)?;
                    self.limit_checked = true;
                }
                Ok(Some(watcher))
            }
            // Gone already: look again at once.
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.backend.waiting_failed(&e, &predecessor)),
        }
    }

    async fn watch_children(&self) -> Result<Option<OneshotWatcher>, Error> {
        match reread(|| self.client.get_and_watch_children(&self.dir)).await {
            Ok((mut now, _, watcher)) => {
                sort_queue(&mut now);
                let our_turn = now
                    .iter()
                    .position(|c| *c == self.own)
                    .is_some_and(|i| has_turn(&now, i, self.limit));
                Ok((!our_turn).then_some(watcher))
            }
            Err(zk::Error::NoNode) => Err(lost_place()),
            Err(e) => Err(self.backend.waiting_failed(&e, &self.dir)),
        }
    }

    /// Sleep until `watcher` fires (returns what happened to the node it watched) or
    /// `cancel` does; give up at the end of `--wait` with who holds the lock. `None`: a
    /// semaphore waiter's periodic look.
    async fn sleep(
        &self,
        watcher: OneshotWatcher,
        cancel: &mut Cancel,
    ) -> Result<Option<EventType>, Error> {
        let deadline = self.request.budget.deadline();
        // A semaphore waiter also looks again every TTL, in case a wake-up was missed.
        let recheck_at = (self.limit > 1).then(|| BootInstant::now() + self.request.ttl);
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
                tracing::debug!(target: crate::logging::HANDOFF, "woken");
                if event.event_type == EventType::Session && event.session_state.is_terminated() {
                    return Err(Error::Unavailable(format!(
                        "the ZooKeeper session ended while waiting ({}); the command was not started",
                        event.session_state
                    )));
                }
                return Ok(Some(event.event_type));
            }
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            _ = wake => {
                if self.request.budget.is_over() {
                    let waited = crate::wording::gave_up(self.request.budget.wait());
                    return Err(self.busy(&waited).await);
                }
            }
        }
        Ok(None)
    }

    /// The queue again after a wake-up: never assume, look.
    async fn list(&self) -> Result<Vec<String>, Error> {
        match reread(|| self.client.list_children(&self.dir)).await {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Err(lost_place()),
            Err(e) => Err(self.backend.waiting_failed(&e, &self.dir)),
        }
    }
}

/// A usage error when a node's data says it uses another `--limit` than ours (foreign data,
/// or none recorded, says nothing).
fn same_limit(data: &[u8], request: &AcquireRequest) -> Result<(), Error> {
    match serde_json::from_slice::<Meta>(data) {
        Ok(meta) => limit::agrees(&request.name, request.limit, meta.record.limit),
        Err(_) => Ok(()),
    }
}

/// A node's data: the holder's metadata and limit, marked as a waiter's or not.
fn node_data(holder: &Holder, limit: u32, waiting: bool) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(&Meta {
        record: Record {
            holder: holder.clone(),
            limit,
        },
        waiting,
    })
    .map_err(|e| Error::Internal(e.to_string()))
}
