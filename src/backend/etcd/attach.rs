//! The re-attach at the grant, off the hand-off path: a waiter whose turn came moves its key
//! from the waiter lease to the hold lease (module docs of `etcd`) while its command starts,
//! instead of before.
//!
//! Why that is safe: at the grant our key is the oldest (etcd delivered the holder's deletion
//! in revision order, with our key still there), and it lives on the waiter lease, which is
//! surely alive until the deadline of [`WaiterLease::proof`] (the keeper's rule for a hold,
//! from the send time of the last acknowledged keep-alive). Until the re-attach is confirmed,
//! that is the hold's deadline: the waiter lease is kept alive meanwhile, and if the re-attach
//! is not confirmed [`MARGIN`] before it, the hold is lost with that deadline, so the
//! supervisor has stopped the command by the time the key could go. A re-attach that finds
//! our key gone, or the hold lease gone, loses the hold at once. A grant whose waiter lease is
//! not surely alive for [`MARGIN`] more waits for the re-attach before the command starts, as
//! every grant did before.
//!
//! Why it matters: the re-attach is a raft write (a disk sync on every member). Before, every
//! hand-off waited for it; now it runs while the command starts, and a hand-off costs etcd one
//! write (the holder's revoke), as it did before waiter leases.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::task::JoinHandle;

use super::conn::{lease_not_found, Conn};
use super::lease::WaiterLease;
use crate::clock::sleep_until;
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::Lost;

/// The re-attach must be confirmed this long before the waiter lease's deadline; a grant
/// that leaves less waits for the re-attach before the command starts.
///
/// Not a bound on the move's answer: the waiter lease is renewed meanwhile, and every
/// acknowledged keep-alive moves its deadline (and this point) on, so a slow move on a busy
/// machine only costs a lost hold if the waiter lease itself can no longer be renewed. It is
/// the command's room between SIGTERM and that deadline, which already has the keeper's
/// safety margin ε taken off; the keeper's grace for the 2 s waiter lease would be at most
/// 0.48 s (`Schedule::new`), and more room would only declare the loss earlier.
pub(super) const MARGIN: Duration = Duration::from_millis(300);

/// Where our key goes at the grant.
#[derive(Clone)]
pub(super) struct Move {
    pub(super) key: String,
    /// The key's create revision (the fencing token), which the move keeps.
    pub(super) created: i64,
    pub(super) hold: i64,
    /// The holder's value for the key.
    pub(super) value: String,
}

impl Move {
    /// One attempt. `Ok(false)`: our key is gone (the waiter lease died); an error saying the
    /// lease is not found: the hold lease is gone.
    pub(super) async fn once(&self, conn: &mut Conn) -> Result<bool, Error> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.created,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                self.value.clone(),
                Some(PutOptions::new().with_lease(self.hold)),
            )]);
        let reply = conn
            .call(OP_TIMEOUT, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(reply.succeeded())
    }
}

/// A re-attach under way while the command runs; the waiter lease is kept alive until it is
/// confirmed.
pub(super) struct Attach {
    task: Task,
    waiter: WaiterLease,
    /// How it ended, once it has: asked again, [`Attach::done`] says the same.
    ended: Option<Result<(), Lost>>,
}

/// The task that moves our key; aborted when dropped.
struct Task(JoinHandle<Result<(), String>>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

const KEY_GONE: &str = "our etcd key was deleted before it could move to the hold lease \
     (its waiter lease expired or was revoked)";

impl Attach {
    /// Start moving our key, if the waiter lease leaves room for it ([`MARGIN`]); else hand
    /// the waiter lease back, for the caller to wait for the move.
    pub(super) fn start(
        conn: Conn,
        target: Move,
        waiter: WaiterLease,
    ) -> Result<Attach, WaiterLease> {
        match waiter.proof() {
            Some(proof) if proof.leaves(MARGIN) => Ok(Attach {
                task: Task(tokio::spawn(move_until_done(conn, target))),
                waiter,
                ended: None,
            }),
            _ => Err(waiter),
        }
    }

    /// The waiter lease, for a release that has to revoke it (the move may not have
    /// happened).
    pub(super) fn waiter_id(&self) -> i64 {
        self.waiter.id
    }

    /// Resolves when the move is confirmed (`Ok`; the waiter lease is retired) or the hold is
    /// lost. Cancel-safe: polled afresh by the supervisor's loop.
    pub(super) async fn done(&mut self) -> Result<(), Lost> {
        if let Some(ended) = &self.ended {
            return ended.clone();
        }
        let ended = self.outcome().await;
        self.ended = Some(ended.clone());
        ended
    }

    async fn outcome(&mut self) -> Result<(), Lost> {
        loop {
            let Some(proof) = self.waiter.proof() else {
                return Err(Lost::gone(KEY_GONE));
            };
            tokio::select! {
                biased;
                moved = &mut self.task.0 => return match moved {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(reason)) => Err(Lost::gone(reason)),
                    Err(e) => Err(Lost::gone(format!("the re-attach task failed: {e}"))),
                },
                () = self.waiter.changed() => {}
                () = sleep_until(proof.give_up_at(MARGIN)) => {
                    // Unless a keep-alive was acknowledged meanwhile, which moves the deadline.
                    if self.waiter.proof() == Some(proof) {
                        self.task.0.abort();
                        return Err(proof.lost(
                            "etcd did not confirm the move of our key to the hold lease in time"
                                .into(),
                        ));
                    }
                }
            }
        }
    }

    /// Stop renewing the waiter lease: it holds no key any more (module docs of `lease`).
    pub(super) fn retire(self) {
        drop(self.task);
        self.waiter.retire();
    }
}

/// Try the move until it is confirmed or refused; [`Attach::done`] bounds it in time.
async fn move_until_done(mut conn: Conn, target: Move) -> Result<(), String> {
    loop {
        match target.once(&mut conn).await {
            Ok(true) => {
                tracing::debug!(target: crate::logging::HANDOFF, "attached");
                return Ok(());
            }
            Ok(false) => return Err(KEY_GONE.into()),
            Err(e) if lease_not_found(&e) => {
                return Err(format!("the etcd lease to hold the lock on is gone ({e})"))
            }
            Err(e) => {
                tracing::debug!("moving our key to the hold lease failed ({e}); retrying");
                // A pause between tries, not a deadline: the waiter lease's deadline (less
                // [`MARGIN`]) ends them, so a busy machine only makes a try later.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
