//! Waiting in a lock's queue: creating our ephemeral sequential node (found again by its GUID
//! when the reply was lost), watching the node just ahead (or, at the head of a `--limit N`
//! queue, the children), the waiting mark of `--limit 1`, the `--limit` agreement, the
//! message saying who is ahead, and removing our node when the acquisition fails.

use std::time::Duration;

use zookeeper_client::{self as zk, Client, CreateMode, EventType, Stat};

use super::conn::{close, reread, timed, WaitEnd};
use super::nodes::{sort_queue, Entry, Meta};
use super::ZkBackend;
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::lock::{AcquireRequest, Cancel, LockName, LockStatus, Wait};

/// How often a create may find its parent missing (removed container) before giving up.
pub(super) const MAX_PARENT_RETRIES: usize = 5;
/// Bound for reading who holds a lock for a message, once `--wait` is over.
pub(super) const REPORT_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound for cleaning up once `--wait` is over; what is left goes with the session.
const LATE_CLEANUP: Duration = Duration::from_secs(1);

impl ZkBackend {
    /// Why a waiter whose node is `own` (none: not queued) cannot have the lock, for a
    /// message: "is held by pid N on host since T" or "is free, N waiting ahead". Bounded:
    /// it may run after `--wait` is over.
    pub(super) async fn why_busy(
        &self,
        client: &Client,
        name: &LockName,
        own: Option<&str>,
    ) -> String {
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
    pub(super) async fn enqueue(
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
    pub(super) async fn queue_and_wait(
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
    pub(super) async fn check_limit(
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

    pub(super) fn waiting_failed(&self, e: &zk::Error, path: &str) -> Error {
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

pub(super) fn lost_place() -> Error {
    Error::Unavailable(
        "our place in the ZooKeeper queue was lost (the session expired or the node was deleted); \
         the command was not started"
            .into(),
    )
}

/// A waiter's session and node, to clean up when the acquisition fails.
pub(super) struct Queue {
    pub(super) client: Client,
    pub(super) dir: String,
    pub(super) guid_prefix: String,
    pub(super) own: Option<String>,
}

impl Queue {
    /// Delete our node (found by its GUID if the create's reply was lost), then close the
    /// session. Both are awaited, so nothing of this waiter is left when this returns.
    pub(super) async fn cleanup(self) {
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

    /// Clean up after a failed acquisition. Once `--wait` is over, the server gets a short
    /// while only: our node goes with the session anyway.
    pub(super) async fn abandon(self, wait: Option<WaitEnd>) {
        if wait.is_some_and(|w| w.at.remaining().is_zero()) {
            if tokio::time::timeout(LATE_CLEANUP, self.cleanup())
                .await
                .is_err()
            {
                tracing::warn!("ZooKeeper did not confirm the clean-up in time; our node goes when the session expires");
            }
        } else {
            self.cleanup().await;
        }
    }
}
