//! The two leases of an acquisition (module docs of `etcd`), like etcd's `session.go`: the
//! *hold lease* with the `--ttl`, kept alive by dlock's [`crate::keeper`] through
//! [`Renewer`], and a waiter's 2 s *waiter lease*, kept alive by a task of its own while the
//! waiter waits. Revoking a lease deletes the key on it in the same step.

use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::conn::{is_transport, Conn};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{Proof, Renew, RenewError, Schedule};
use crate::kit::timeouts::OP_TIMEOUT;

/// TTL of a waiter's lease, in seconds: etcd's minimum with default settings. A waiter
/// killed while it waits (SIGKILL: no chance to clean up) keeps its place no longer.
pub(super) const WAITER_TTL_S: i64 = 2;
/// Bound for revoking our leases once `--wait` is over; what is left expires by itself.
pub(super) const LATE_CLEANUP: Duration = Duration::from_secs(1);

/// Keep-alive round trips for the [`crate::keeper::Keeper`], on a stream opened at the first
/// renewal.
pub(super) struct Renewer {
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

impl Renewer {
    /// Renewals of lease `id`, granted for `granted`, over a connection of its own.
    pub(super) fn new(conn: Conn, id: i64, granted: Duration) -> Renewer {
        Renewer {
            conn,
            id,
            granted,
            stream: None,
            in_flight: false,
        }
    }

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

/// A waiter's own short lease, which holds its place in the queue while it waits (module
/// docs). It is renewed until stopped, and failed renewals are retried with no deadline:
/// nothing relies on this lease being alive, except a command started before the re-attach
/// is confirmed ([`super::attach`]), and that one relies only on [`WaiterLease::proof`],
/// the keeper's reading of the last acknowledged renewal.
pub(super) struct WaiterLease {
    pub(super) id: i64,
    /// What the keep-alives have shown so far.
    state: watch::Receiver<Kept>,
    task: JoinHandle<()>,
}

/// What a waiter lease's keep-alives have shown.
#[derive(Clone, Copy, Debug)]
struct Kept {
    /// etcd said the lease is gone (and our key with it).
    gone: bool,
    /// The send time of the last acknowledged request, which the keeper's rule turns into
    /// the deadline until which the lease is surely alive.
    proof: Proof,
}

impl WaiterLease {
    /// Keep lease `id` alive, granted for `granted` by a request sent at `sent`.
    pub(super) fn start(conn: Conn, id: i64, granted: Duration, sent: BootInstant) -> WaiterLease {
        let (state_tx, state) = watch::channel(Kept {
            gone: false,
            proof: Proof::new(Schedule::new(granted, Duration::ZERO), sent),
        });
        let renewer = Renewer::new(conn, id, granted);
        let task = tokio::spawn(keep_waiting(renewer, state_tx));
        WaiterLease { id, state, task }
    }

    /// What the keep-alives have proved of the lease (and so of our key on it): until when
    /// it is surely alive ([`Proof::kill_by`]); `None` once etcd said it is gone.
    pub(super) fn proof(&self) -> Option<Proof> {
        let kept = *self.state.borrow();
        (!kept.gone).then_some(kept.proof)
    }

    /// Resolves when the deadline [`WaiterLease::proof`] gives may have moved, or the lease
    /// is gone. Cancel-safe.
    pub(super) async fn changed(&mut self) {
        if self.state.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Stop renewing once our key is on the hold lease. The waiter lease holds no key any
    /// more and expires within its 2 s TTL; revoking it would cost etcd one more request per
    /// hand-off for nothing.
    pub(super) fn retire(self) {
        self.task.abort();
    }
}

impl Drop for WaiterLease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Our key is gone: the lease that kept our place died while we waited.
pub(super) fn place_lost() -> Error {
    Error::Unavailable(
        "our place in the etcd queue was lost while waiting (its lease expired or was revoked); \
         the command was not started"
            .into(),
    )
}

/// Resolves when etcd says the waiter lease is gone; never without one. Cancel-safe.
pub(super) async fn waiter_gone(waiter: &mut Option<WaiterLease>) {
    if let Some(waiter) = waiter {
        if waiter.state.wait_for(|kept| kept.gone).await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// Renew a waiter lease every quarter of its TTL, retrying failures soon, until aborted. A
/// slow reply gets up to half the TTL: a reply that comes in time still keeps the place.
async fn keep_waiting(mut renewer: Renewer, state: watch::Sender<Kept>) {
    let every = (renewer.granted / 4).max(Duration::from_millis(250));
    let attempt = renewer.granted / 2;
    let mut pause = every;
    loop {
        tokio::time::sleep(pause).await;
        let sent = BootInstant::now();
        pause = match tokio::time::timeout(attempt, renewer.renew()).await {
            Ok(Ok(_)) => {
                state.send_modify(|kept| kept.proof.acked(sent));
                every
            }
            Ok(Err(RenewError::Gone(_))) => {
                state.send_modify(|kept| kept.gone = true);
                return;
            }
            Ok(Err(RenewError::Failed(reason))) => {
                tracing::debug!("waiter lease keep-alive failed: {reason}");
                // Soon, but not in a tight loop against a failing connection; a pause, not a
                // deadline: only the proof (the last acknowledged send) decides anything.
                Duration::from_millis(100)
            }
            Err(_) => {
                tracing::debug!("waiter lease keep-alive timed out");
                Duration::from_millis(100)
            }
        };
    }
}

/// After a failed acquisition: revoke the waiter lease (if any) and the hold lease
/// (`(id, granted TTL in s)`), which deletes our key too, so that nothing is left behind.
/// The server gets what is left of its time to answer within `--wait`, and at least
/// [`LATE_CLEANUP`] (no more than that once `--wait` is over): what it does not revoke
/// expires by itself, so a server that stopped answering (the reason the acquisition
/// failed, often) does not keep the run past its `--wait`.
pub(super) async fn revoke_all(
    conn: &mut Conn,
    hold: (i64, i64),
    waiter: Option<WaiterLease>,
    wait: &crate::budget::WaitBudget,
) {
    let budget = wait.call_limit(OP_TIMEOUT).max(LATE_CLEANUP);
    let mut leases = vec![hold];
    if let Some(waiter) = waiter {
        leases.insert(0, (waiter.id, WAITER_TTL_S));
    }
    let cleanup = async {
        for (lease, ttl) in leases {
            let revoke = conn
                .call(budget, |mut c| async move { c.lease_revoke(lease).await })
                .await;
            if let Err(e) = revoke {
                tracing::warn!(
                    "could not revoke lease {lease:x} ({e}); it expires by itself within {ttl}s"
                );
            }
        }
    };
    if tokio::time::timeout(budget, cleanup).await.is_err() {
        tracing::warn!(
            "etcd did not confirm the clean-up in time; our leases expire by themselves (--ttl)"
        );
    }
}
