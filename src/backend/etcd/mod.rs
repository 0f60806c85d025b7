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
//! its key to the hold lease: a Put with the hold lease on condition that the key still has
//! its create revision. A Put to an existing key keeps its create revision, so the place in
//! the queue and the fencing token (our key's create revision) stay what they were; if the
//! key went (the waiter lease died), the Put does not happen. The move runs while the command
//! starts, the waiter lease's deadline standing in for the hold's until it is confirmed
//! (`attach`: why that is safe); a waiter lease too close to its deadline makes the command
//! wait for the move, and a failed move stops it. The waiter lease is kept alive until the
//! Put is acknowledged, then left to expire (it holds no key, and a revoke would cost etcd
//! one more request per hand-off). Deletion-only watches do not see the Put.
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
//! Shared locks (`--shared`): a reader's key is in the same queue, its value says
//! `"mode": "shared"`. A reader waits for the nearest older *writer's* key (any key whose
//! value is not a reader's: an exclusive dlock's, `etcdctl lock`'s) instead of its
//! predecessor's, so that the readers at the head of the queue hold together, and a reader
//! that arrives while a writer waits queues behind it; a writer waits for its predecessor,
//! whatever its mode, as above. Finding that writer reads the keys before ours with their
//! values, a page at a time (`readers`); the wait itself is the same `Target::Line`, on that
//! writer and a key before it, with the same re-check of our own key. `etcdctl lock` sees
//! every dlock key as a lock holder's or waiter's, and dlock sees its keys as a writer's, so
//! the two still exclude each other. The token is still our key's create revision.
//!
//! `--wait` bounds every request of an acquisition, connecting included: a cluster that
//! does not answer in time is unavailable (69), a lock that stays busy is 75.
//!
//! etcd-client does not fail over between endpoints by itself, so `Conn` talks to one
//! endpoint at a time and moves to the next after a transport failure or a timeout.
//!
//! The parts, after etcd's `client/v3/concurrency`: `conn` (endpoints, failover, bounded
//! calls, errors → exit classes), `lease` (the two leases and their keep-alives, its
//! `session.go`), `attach` (the move to the hold lease beside the command), `key` (the keys
//! and their values, its `key.go`), `queue` (taking a place, waiting, the re-attach at the
//! grant: its `mutex.go`; every request bounded by the request's `--wait` budget),
//! `readers` (what a shared run waits for), `watch` (what a waiter watches and what an
//! event means), `own_key` (the holder's watch on its key), `admin` (status, list, release
//! --force, check), `target` (the URL).

mod admin;
mod attach;
mod conn;
mod key;
pub mod kind;
mod lease;
mod own_key;
mod queue;
mod readers;
mod recheck;
pub mod target;
mod watch;

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::Keeper;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::kit::tls::install_tls_provider;
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, Lease, LockName, LockStatus, Lost,
};
use attach::Attach;
use conn::Conn;
use lease::{revoke_all, Renewer};
use own_key::OwnKey;
use queue::{answer, Acquisition, Taken};

pub use target::EtcdTarget;

pub struct EtcdBackend {
    target: EtcdTarget,
    prefix: String,
    display: String,
}

impl EtcdBackend {
    pub fn new(target: &EtcdTarget, prefix: &str, display: &str) -> EtcdBackend {
        if target.tls {
            install_tls_provider();
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
}

impl Backend for EtcdBackend {
    type Lease = EtcdLease;

    /// After the server's time to answer: at most the waiter lease's TTL (a grant whose key
    /// must move to the hold lease before the command starts waits for the move no longer
    /// than the waiter lease surely lives, [`attach`]), then revoking our leases
    /// ([`lease::LATE_CLEANUP`]).
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        let _ = request;
        Duration::from_secs(lease::WAITER_TTL_S.unsigned_abs()) + lease::LATE_CLEANUP
    }

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<EtcdLease, Error> {
        let mut conn = self.conn()?;
        let ttl_s = request.ttl.as_secs_f64().ceil().max(1.0) as i64;
        let sent = BootInstant::now();
        // The hold's lease, granted up front and kept alive while waiting, so that a grant
        // costs one write (the re-attach) and the keeper's deadline counts from here. It
        // holds no key while waiting: a waiter killed now leaves nothing in anyone's way.
        // etcd picks the id: its ids increase with every grant on a member, which keeps the
        // keys of neighbours in the queue next to each other (see `watch::Target::Line`). A
        // grant retried after a lost reply leaves the first lease unused; it expires by its
        // TTL.
        let grant = conn.call(OP_TIMEOUT, |mut c| async move {
            c.lease_grant(ttl_s, None).await
        });
        let grant = answer(&request.budget, &self.display, &mut cancel, grant).await?;
        let (id, granted_s) = (grant.id(), grant.ttl());
        if granted_s != ttl_s {
            tracing::warn!(
                "etcd granted a {granted_s}s lease for --ttl {ttl_s}s; using {granted_s}s"
            );
        }
        let granted = Duration::from_secs(u64::try_from(granted_s).unwrap_or(1));
        let renewer = Renewer::new(self.conn()?, id, granted);
        let mut keeper = Keeper::start(renewer, sent, granted, request.kill_after);
        let mut waiter = None;
        let pfx = self.lock_prefix(&request.name);
        let key = format!("{pfx}{id:x}");
        let acquisition = Acquisition {
            conn: &mut conn,
            request,
            key: key.clone(),
            pfx,
            hold: id,
            limit: request.limit.max(1) as usize,
            keeper: &mut keeper,
            waiter: &mut waiter,
            cancel: &mut cancel,
            display: &self.display,
        };
        match acquisition.queue_and_wait().await {
            Ok(Taken { token, own, attach }) => {
                // Our key is on the hold's lease now (or moving there: `attach` keeps the
                // waiter lease until it is); the waiter lease has none left.
                if let Some(waiter) = waiter {
                    waiter.retire();
                }
                Ok(EtcdLease {
                    keeper,
                    token,
                    id,
                    conn,
                    ttl: granted,
                    own,
                    attach,
                    key,
                    limit: request.limit,
                })
            }
            Err(error) => {
                drop(keeper.stop().await);
                // Revoking the leases deletes our key too: nothing is left behind.
                revoke_all(&mut conn, (id, granted_s), waiter, &request.budget).await;
                Err(error)
            }
        }
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let mut conn = self.conn()?;
        admin::status(self, &mut conn, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        admin::list(self).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        admin::force_release(self, name).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        admin::check(self).await
    }
}

/// Resolves when the move of our key is over (never without one). Cancel-safe.
async fn attached(attach: &mut Option<Attach>) -> Result<(), Lost> {
    match attach {
        Some(attach) => attach.done().await,
        None => std::future::pending().await,
    }
}

/// A held etcd lock. Release revokes the lease, which deletes the key and wakes the next
/// waiter in one step.
pub struct EtcdLease {
    keeper: Keeper<Renewer>,
    token: u64,
    id: i64,
    conn: Conn,
    ttl: Duration,
    own: OwnKey,
    /// The move of our key to the hold lease, while it is under way ([`attach`]).
    attach: Option<Attach>,
    /// Our key and the `--limit` recorded in its value (for [`Lease::finished`]).
    key: String,
    limit: u32,
}

impl Lease for EtcdLease {
    fn token(&self) -> u64 {
        self.token
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        loop {
            tokio::select! {
                biased;
                lost = self.keeper.lost() => return lost,
                // The lock is gone already: there is no later moment to protect.
                reason = self.own.deleted(&mut self.conn) => return Lost::gone(reason),
                moved = attached(&mut self.attach) => match moved {
                    Ok(()) => {
                        if let Some(attach) = self.attach.take() {
                            attach.retire();
                        }
                    }
                    Err(lost) => return lost,
                },
            }
        }
    }

    /// Rewrite our key's value while it is still ours (the same create revision, which is
    /// the token); the watch on our key ignores puts.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        // A move still under way would write the value without the mark after ours.
        if let Some(mut attach) = self.attach.take() {
            if attach.done().await.is_err() {
                return Ok(false);
            }
            attach.retire();
        }
        let target = attach::Move {
            key: self.key.clone(),
            created: i64::try_from(self.token).unwrap_or(i64::MAX),
            hold: self.id,
            value: key::held_value_json(holder, self.limit)?,
        };
        target.once(&mut self.conn).await
    }

    async fn release(self) -> Result<(), Error> {
        let EtcdLease {
            keeper,
            id,
            mut conn,
            ttl,
            own,
            attach,
            ..
        } = self;
        drop(own);
        // A move of our key still under way: our key is on one of the two leases, so both
        // are revoked (a move that reaches etcd after either revoke finds its lease or our
        // key gone, and does nothing).
        let waiter = match attach {
            Some(mut attach) => match tokio::time::timeout(Duration::ZERO, attach.done()).await {
                Ok(Ok(())) => {
                    attach.retire();
                    None
                }
                _ => Some((attach.waiter_id(), attach)),
            },
            None => None,
        };
        let mut other = conn.clone();
        let revoke_waiter = async move {
            if let Some((waiter, attach)) = waiter {
                drop(attach);
                if let Err(e) = other.revoke(waiter, OP_TIMEOUT).await {
                    tracing::debug!("could not revoke the waiter lease {waiter:x}: {e}");
                }
            }
        };
        // The revoke goes out first: the next waiter is waiting for it. A keep-alive that
        // crosses it is harmless.
        let revoke = conn.revoke(id, ttl.min(OP_TIMEOUT));
        let (revoked, _, ()) = tokio::join!(revoke, keeper.stop(), revoke_waiter);
        if !revoked? {
            crate::lock::warn_gone_at_release(format_args!(
                "the lock had already expired or been removed before it was released"
            ));
        }
        Ok(())
    }
}
