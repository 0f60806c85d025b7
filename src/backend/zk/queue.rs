//! Joining and leaving a lock's queue: creating our ephemeral sequential node (making the
//! parents as needed, and finding it again by its GUID when the reply was lost), and removing
//! it, with the session, when the acquisition fails.

use std::time::Duration;

use zookeeper_client::{self as zk, Client, CreateMode, Stat};

use super::conn::{close, timed};
use super::ZkBackend;
use crate::budget::WaitBudget;
use crate::clock::BootInstant;
use crate::error::Error;

/// How often a create may find its parent missing (removed container) before giving up.
const MAX_PARENT_RETRIES: usize = 5;
/// Bound for cleaning up once `--wait` is over; what is left goes with the session.
pub(super) const LATE_CLEANUP: Duration = Duration::from_secs(1);

impl ZkBackend {
    /// Create our node (making the parents as needed) and list the queue in the same round
    /// trip; `mark` (`lock-` or `__READ__`) says how it holds. Returns our node's name and
    /// stat, the children, and when the listing was sent.
    pub(super) async fn enqueue(
        &self,
        client: &Client,
        dir: &str,
        guid_prefix: &str,
        mark: &str,
        meta: &[u8],
    ) -> Result<(String, Stat, Vec<String>, BootInstant), Error> {
        let base = format!("{dir}/{guid_prefix}{mark}");
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
                    let own = format!("{guid_prefix}{mark}{sequence}");
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
}

/// The error of a waiter whose node is gone: it never starts the command.
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
    /// The queue of the lock whose node is `dir`, for a waiter with a GUID of its own.
    pub(super) fn new(client: Client, dir: String) -> Queue {
        Queue {
            client,
            dir,
            guid_prefix: format!("_c_{}-", uuid::Uuid::new_v4()),
            own: None,
        }
    }

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

    /// Clean up after a failed acquisition. Once `--wait` is over, the server gets a short
    /// while only: our node goes with the session anyway.
    pub(super) async fn abandon(self, budget: &WaitBudget) {
        if budget.is_over() {
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
