//! A held NATS lock: the slot's key, renewed by writing it again at the revision we hold with
//! the key's TTL ([`Keeper`] schedules it), released by a purge that expects that revision,
//! and `--min-hold`'s finish as one more write.
//!
//! Every write changes the key's revision: the lease carries the newest, and the token stays
//! the revision the command was given. A write that finds another revision (wrong last
//! sequence) is ours only if the key still holds our acquisition's id (a write of ours whose
//! answer was lost took effect): then its revision is taken and the write repeated. Anything
//! else means the key expired and was taken, or was removed by `release --force`: the hold is
//! gone.
//!
//! The holder also watches its key while the command runs, from a second after the grant: a
//! marker or another run's value there (`release --force`, a key removed by hand) ends the
//! hold at once, not at the next renewal. A watch that fails is opened again; meanwhile the keeper's rule still stops the
//! command in time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch, Mutex};
use tokio::task::JoinHandle;

use super::conn::{Conn, Write, CLOSE_LIMIT};
use super::keys::Stored;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{confirm_if_old, Keeper, Renew, RenewError, Schedule};
use crate::kit::backoff::Backoff;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{Holder, Lease, LockName, Lost};

/// The bound the keeper puts on a renewal is the only one.
const NO_BUDGET: Duration = Duration::from_secs(3600);
/// How long a release may take once the keeper has given the hold up: the key expires by
/// itself then, so an unanswering server does not keep the run from ending.
const GIVEN_UP: Duration = Duration::from_secs(1);

const GONE: &str = "the lock's key no longer holds this run: it expired and was taken, or \
                    was released by force";
/// How long after the grant the holder starts to watch its key (until then a removal is
/// noticed at the next renewal).
const OWN_WATCH_AFTER: Duration = Duration::from_secs(1);
const REMOVED: &str = "the lock's key was removed or taken (dlock release --force, or by hand)";

/// What the holder last wrote.
pub(super) struct Held {
    pub(super) conn: Conn,
    pub(super) key: String,
    pub(super) revision: u64,
    pub(super) value: Stored,
    pub(super) ttl: Duration,
}

impl Held {
    /// Write our value again at our revision; `Ok(false)` when the key is no longer ours.
    async fn rewrite(&mut self, limit: Duration) -> Result<bool, Error> {
        for _ in 0..2 {
            let written = self
                .conn
                .write(&self.key, self.revision, self.ttl, &self.value, limit)
                .await?;
            match written {
                Write::Done(revision) => {
                    self.revision = revision;
                    return Ok(true);
                }
                Write::Conflict => {
                    if !self.adopt(limit).await? {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(false)
    }

    /// After a conflict: take the key's revision if it still holds our id.
    async fn adopt(&mut self, limit: Duration) -> Result<bool, Error> {
        match self.conn.last(&self.key, limit).await? {
            Some(found) if found.live => {
                let ours = found.value.is_some_and(|v| v.id == self.value.id);
                if ours {
                    self.revision = found.revision;
                }
                Ok(ours)
            }
            _ => Ok(false),
        }
    }

    /// Purge the key at our revision; `Ok(false)` when it was no longer ours.
    async fn remove(&mut self, limit: Duration) -> Result<bool, Error> {
        for _ in 0..2 {
            match self
                .conn
                .remove(&self.key, Some(self.revision), limit)
                .await?
            {
                Write::Done(_) => return Ok(true),
                Write::Conflict => {
                    if !self.adopt(limit).await? {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(false)
    }
}

/// One renewal: our value written again at our revision.
struct Renewer {
    held: Arc<Mutex<Held>>,
    ttl: Duration,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let mut held = self.held.lock().await;
        match held.rewrite(NO_BUDGET).await {
            Ok(true) => Ok(self.ttl),
            Ok(false) => Err(RenewError::Gone(GONE.into())),
            Err(e) => Err(RenewError::Failed(e.to_string())),
        }
    }
}

/// A held NATS lock.
pub struct NatsLease {
    keeper: Keeper<Renewer>,
    held: Arc<Mutex<Held>>,
    token: u64,
    display: String,
    /// Why our key is no longer ours, once the watch on it saw so.
    removed: watch::Receiver<Option<String>>,
    /// The watch on our key (ended with the lease), and what stops it.
    watching: AbortOnDrop,
    stop_watching: oneshot::Sender<()>,
}

/// A task that ends with its owner.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watch `key` until it holds no value of acquisition `id` (a marker, another's value), then
/// say so on `removed`; until `stop` fires, when the watch's consumer is deleted. A failed
/// watch is opened again after a pause.
async fn watch_own(
    conn: Conn,
    key: String,
    id: String,
    removed: watch::Sender<Option<String>>,
    mut stop: oneshot::Receiver<()>,
) {
    // A command that ends within a second never pays for the watch: opening it beside the
    // command's start slowed hand-offs by a fifth (a consumer made on the server as the
    // next waiter's grant is written).
    tokio::select! {
        () = tokio::time::sleep(OWN_WATCH_AFTER) => {}
        _ = &mut stop => return,
    }
    let mut pauses = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let opened = tokio::select! {
            opened = conn.watch(&key, OP_TIMEOUT) => opened,
            _ = &mut stop => return,
        };
        if let Ok(mut own) = opened {
            if own.pending == 0 {
                // Not even a marker: the key was removed and its marker has expired.
                removed.send_replace(Some(REMOVED.to_owned()));
                let _ = (&mut stop).await;
                own.close().await;
                return;
            }
            loop {
                let found = tokio::select! {
                    found = own.next() => found,
                    _ = &mut stop => {
                        own.close().await;
                        return;
                    }
                };
                match found {
                    Ok(found) if found.live && found.value.as_ref().is_some_and(|v| v.id == id) => {
                    }
                    Ok(_) => {
                        removed.send_replace(Some(REMOVED.to_owned()));
                        let _ = (&mut stop).await;
                        own.close().await;
                        return;
                    }
                    Err(_) => {
                        tokio::spawn(own.close());
                        break;
                    }
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(pauses.next_delay()) => {}
            _ = &mut stop => return,
        }
    }
}

impl NatsLease {
    /// Keep `held` (created by a write sent at `sent`) from now on. A grant older than a
    /// renewal attempt when it gets here is first confirmed by a renewal, within the
    /// keeper's rule ([`confirm_if_old`]); one that cannot be is given back (best effort: it
    /// expires by itself) and the command is not started.
    pub(super) async fn grant(
        held: Held,
        name: &LockName,
        sent: BootInstant,
        kill_after: Duration,
    ) -> Result<NatsLease, Error> {
        let display = held.conn.display.clone();
        let token = held.value.holder.token;
        let ttl = held.ttl;
        let held = Arc::new(Mutex::new(held));
        let mut renewer = Renewer {
            held: held.clone(),
            ttl,
        };
        let since = match confirm_if_old(&mut renewer, Schedule::new(ttl, kill_after), sent).await {
            Ok(since) => since,
            Err(why) => {
                let _ = held.lock().await.remove(GIVEN_UP).await;
                return Err(Error::Unavailable(format!(
                    "'{name}' was granted but could not be confirmed: {why}; the command was \
                     not started"
                )));
            }
        };
        let (conn, key, id) = {
            let held = held.lock().await;
            (held.conn.clone(), held.key.clone(), held.value.id.clone())
        };
        let (tell, removed) = watch::channel(None);
        let (stop_watching, stop) = oneshot::channel();
        let watching = AbortOnDrop(tokio::spawn(watch_own(conn, key, id, tell, stop)));
        Ok(NatsLease {
            keeper: Keeper::start(renewer, since, ttl, kill_after),
            held,
            token,
            display,
            removed,
            watching,
            stop_watching,
        })
    }
}

impl Lease for NatsLease {
    fn token(&self) -> u64 {
        self.token
    }

    fn proven_until(&self) -> Option<BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        let removed = async {
            match self.removed.wait_for(Option::is_some).await {
                Ok(why) => why.clone().unwrap_or_default(),
                // The watch ended without a word (it never does): the keeper decides.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            lost = self.keeper.lost() => lost,
            why = removed => Lost::gone(why),
        }
    }

    /// Write our value with the new metadata, as a renewal does (only while it is ours).
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let mut held = self.held.lock().await;
        let before = held.value.holder.clone();
        held.value.holder = Holder {
            token: before.token,
            limit: before.limit,
            ..holder.clone()
        };
        held.rewrite(OP_TIMEOUT).await
    }

    /// Purge the key at our revision: the next waiter sees the marker at once. Bounded by
    /// [`OP_TIMEOUT`], by [`GIVEN_UP`] when the keeper has given the hold up already.
    async fn release(self) -> Result<(), Error> {
        let given_up = BootInstant::now() >= self.keeper.proven_until();
        let _ = self.stop_watching.send(());
        if self.keeper.stop().await.is_none() {
            return Err(Error::Internal(
                "the lease keeper ended unexpectedly".into(),
            ));
        }
        let bound = if given_up { GIVEN_UP } else { OP_TIMEOUT };
        let mut held = self.held.lock().await;
        let removed = tokio::time::timeout(bound, held.remove(bound)).await;
        tracing::debug!(target: crate::logging::HANDOFF, "purged");
        // The watch on our key deletes its consumer (the next holder was told by the purge).
        let mut watching = self.watching;
        let _ = tokio::time::timeout(CLOSE_LIMIT, &mut watching.0).await;
        match removed {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => {
                crate::lock::warn_gone_at_release(format_args!(
                    "the lock was no longer ours when it was released: {GONE}"
                ));
                Ok(())
            }
            Ok(Err(_)) | Err(_) if given_up => {
                crate::lock::warn_gone_at_release(format_args!(
                    "{}: the release was not answered; the lease had run out already",
                    self.display
                ));
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(crate::wording::no_answer_in(&self.display, bound)),
        }
    }
}
