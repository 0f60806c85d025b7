//! The session as the lease: the [`Keeper`] re-verifies our node at least every TTL/3 (which also
//! touches the session) and declares the hold lost only when that failed for long enough that
//! the server might expire the session; a watch on our node reports a deleted node or an
//! ended session at once. Release deletes the node, which wakes the next waiter.
//! `--min-hold`'s finish ([`Lease::finished`]) rewrites the node's data only while our
//! session owns it, conditional on the version just read.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use zookeeper_client::{self as zk, Client, EventType, SessionState};

use super::conn::closed;
use super::nodes::Meta;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError};
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{Holder, Lease, Lost, Record};

/// Watch our node and the session: a deleted node or an expired session is a loss at once;
/// a disconnection is left to the keeper's deadline.
async fn monitor(client: Client, path: String, session: i64, lost: watch::Sender<Option<Lost>>) {
    let mut states = client.state_watcher();
    let gone = |reason: &str| Some(Lost::gone(reason));
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
    /// Our session, the owner of our node (for [`Lease::finished`]).
    session: i64,
    /// The `--limit` recorded in our node's data.
    limit: u32,
}

impl ZkLease {
    /// The lease of a session whose node `path` was granted the lock by a request sent at
    /// `acquired_sent`: its keeper and the watch on the node start now.
    pub(super) fn start(
        client: Client,
        path: String,
        token: u64,
        acquired_sent: BootInstant,
        granted: Duration,
        kill_after: Duration,
        limit: u32,
    ) -> ZkLease {
        let session = client.session_id().0;
        let renewer = Renewer {
            client: client.clone(),
            path: path.clone(),
            session,
            granted,
        };
        let keeper = Keeper::start(renewer, acquired_sent, granted, kill_after);
        let (events_tx, events) = watch::channel(None);
        let monitor = tokio::spawn(monitor(client.clone(), path.clone(), session, events_tx));
        ZkLease {
            keeper,
            monitor,
            events,
            token,
            client,
            path,
            ttl: granted,
            session,
            limit,
        }
    }
}

impl Lease for ZkLease {
    fn token(&self) -> u64 {
        self.token
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        tokio::select! {
            lost = self.keeper.lost() => lost,
            Ok(lost) = self.events.wait_for(Option::is_some) => {
                lost.clone().unwrap_or_else(|| Lost::gone("the lock was lost"))
            }
        }
    }

    /// Rewrite our node's data while the node is still ours: it must still be owned by our
    /// session, and the write is conditional on the version just read, so a node that was
    /// deleted, or written by someone else meanwhile, is left alone. Our node's path carries
    /// our GUID, so no other holder's node can be at it.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let data = serde_json::to_vec(&Meta {
            record: Record {
                holder: holder.clone(),
                limit: self.limit,
            },
            waiting: false,
        })
        .map_err(|e| Error::Internal(e.to_string()))?;
        let unavailable =
            |e: zk::Error| Error::Unavailable(format!("cannot rewrite {}: {e}", self.path));
        let stat = match self.client.check_stat(&self.path).await {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session => stat,
            Ok(_) | Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(unavailable(e)),
        };
        match self
            .client
            .set_data(&self.path, &data, Some(stat.version))
            .await
        {
            Ok(_) => Ok(true),
            Err(zk::Error::NoNode | zk::Error::BadVersion) => Ok(false),
            Err(e) => Err(unavailable(e)),
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
        let deleted = tokio::time::timeout(ttl.min(OP_TIMEOUT), delete).await;
        tracing::debug!(target: crate::logging::HANDOFF, "deleted");
        let result = match deleted {
            Ok(Ok(())) => Ok(()),
            Ok(Err(zk::Error::NoNode)) => {
                crate::lock::warn_gone_at_release(format_args!(
                    "the lock node was already gone when the lock was released"
                ));
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
        tracing::debug!(target: crate::logging::HANDOFF, "closed");
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
