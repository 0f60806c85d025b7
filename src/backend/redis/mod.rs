//! The Redis backend (Redis ≥ 6): one server-side script per step, owner tokens, a fencing
//! counter, and a FIFO queue of waiters that are woken one at a time.
//!
//! Key layout — every key of a lock shares the hash tag `{<encoded name>}`, so one lock lives in
//! one Cluster slot and distinct names never share a key (`B = <prefix>:{<encoded name>}`):
//!
//! | key | type | content |
//! |---|---|---|
//! | `B:fence` | string, no TTL | fencing counter: one more than before (`INCR`, exact up to 2^63-1), never less than the server's `TIME` in µs |
//! | `B:owners` | sorted set, TTL ≥ longest lease | holder token → lease deadline (server ms); a holder whose deadline passed is gone |
//! | `B:hold` | hash, TTL ≥ longest lease | per holder `<tok>:fence`, `<tok>:meta` (holder JSON), `<tok>:since`, `<tok>:ttl`, `<tok>:limit` |
//! | `B:queue` | sorted set | waiter token → ticket (arrival order) |
//! | `B:qdl` | sorted set | waiter token → heartbeat deadline (server ms); stale waiters are purged |
//! | `B:w:<tok>` | list | a waiter's private wake-up mailbox (`BLPOP` target) |
//!
//! Every key a script touches is in its KEYS (Redis Cluster requires it): a holder's data are
//! fields of the fixed `B:owners` and `B:hold`, checked against the deadline by the scripts
//! instead of expiring on their own. The mailboxes are the only per-token keys; a script that
//! admits a waiter returns its token and the caller pushes into its mailbox (`wake.lua`).
//!
//! Protocol: `acquire.lua` grants when `live holders + my rank < limit` (no overtaking), else
//! queues the caller with a ticket. The waiter blocks in `BLPOP` on its own mailbox; a release
//! (`release.lua`) names exactly the waiter its leaving admits, and the releasing dlock pushes
//! into that one's mailbox, so one release wakes one waiter. A grant names the waiter then
//! first in line; the holder's release declares that one's mailbox too and, when it is the
//! waiter to admit (the common case), pushes into it in the same script: one round trip on
//! the hand-off's path instead of two. The `BLPOP` times out every `WAITER_HEARTBEAT` (at most
//! TTL/3): a heartbeat that keeps the waiter's place, and a re-check that covers a missed
//! wake-up. A waiter that stops heartbeating (killed) drops out `WAITER_LEASE` after its
//! last one, whatever `--ttl` is. The head of the queue also re-checks when the holder's lease
//! would expire (a crashed holder). The owner token is random per acquisition, so a retry after
//! a lost reply finds its own hold, and renew/release only ever touch keys named by their own
//! token. Renewal (`renew.lua`) goes through [`Keeper`](crate::keeper::Keeper), which owns the
//! deadline arithmetic.
//!
//! Shared locks (`--shared`, always `--limit 1`): the mode is part of the owner token (a shared
//! run's starts with `s:`, [`keys::owner_token`]), so every entry in `B:queue` and `B:owners`
//! carries it and the scripts share one set of rules (`scripts/modes.lua`). A shared run is
//! granted when no exclusive holder is live and no exclusive waiter is ahead of it in line
//! (readers ahead of it are admitted beside it; a reader behind a waiting writer waits for it);
//! an exclusive run as before (`live holders + my rank < 1`). A leaving wakes exactly the
//! waiters it admits: those that fit once it has left and did not fit before, which after an
//! exclusive holder is the whole run of shared waiters at the head of the line (the one named
//! at the grant in the release script, the others with `wake.lua`). Every grant, shared or
//! not, takes a new fencing token; a shared holder renews, loses and is forced out through the
//! same scripts and the same keeper as an exclusive one, and a dead reader's share ends with
//! its lease, as a dead waiter's place ends with its heartbeat.
//!
//! Every script first checks that the lock's keys hold what dlock keeps there; a key someone
//! else overwrote is reported by name (exit 69), never as an internal error, and `list` skips
//! (and names) such a lock instead of failing for all of them.
//!
//! The parts, from the bottom: `topology/` (where a call goes: the slot of a key and the
//! cluster's slot table, and the master a majority of the sentinels name), `setup.rs`
//! (credentials and TLS for opening a node), `invocation.rs` (a script call on the wire),
//! `failure.rs` (error classes), `conn.rs` (connecting, bounded calls), `keys.rs`
//! (the key layout), `scripts.rs` (the scripts and what their replies say), `wait.rs` (the
//! waiting protocol of one acquisition), `lease.rs` (the held lock and its renewer), `admin.rs`
//! (status, list, release --force, check), `role.rs` (refusing a replica or a Sentinel given as
//! `redis://`), [`target`] (the URL), `cluster/` (Redis Cluster:
//! routing each call to its slot's master), [`sentinel`] (Redis behind Sentinel: the master
//! located through the sentinels at every connect and confirmed at every renewal). `conn.rs`
//! keeps the slot table and the Sentinel locator (`topology/`) as data and imports neither
//! `cluster/` nor `sentinel/`: those import it. Routing a call (`cluster/route.rs`) and
//! explaining a refusal (`role.rs`) are methods of `Conn` written in those files.

mod admin;
mod cluster;
mod conn;
mod failure;
mod invocation;
mod keys;
pub mod kind;
mod lease;
mod role;
mod scripts;
pub mod sentinel;
mod setup;
pub mod target;
mod topology;
mod wait;

use crate::error::Error;
use crate::lock::{AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus};

use conn::Conn;
use keys::Keys;
use scripts::Step;
use wait::Waiter;

pub use lease::RedisLease;
pub use target::{RedisAddr, RedisTarget};

pub struct RedisBackend {
    target: RedisTarget,
    prefix: String,
    display: String,
}

impl RedisBackend {
    pub fn new(target: &RedisTarget, prefix: &str, display: &str) -> RedisBackend {
        if matches!(target.addr, RedisAddr::Tls { .. }) {
            // Also `rediss-sentinel://` (its `addr` is the first sentinel, over TLS).
            crate::kit::tls::install_tls_provider();
        }
        RedisBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
            display: display.to_owned(),
        }
    }

    async fn connect(&self) -> Result<Conn, Error> {
        let mut conn = Conn::new(&self.target, &self.display)?;
        conn.ensure()
            .await
            .map_err(|f| f.into_error(&self.display))?;
        Ok(conn)
    }

    fn keys(&self, name: &LockName, tok: &str) -> Keys {
        Keys::new(&self.prefix, name, tok)
    }
}

impl Backend for RedisBackend {
    type Lease = RedisLease;

    /// Every call ends by the server's time to answer (`--wait`, but at least
    /// [`crate::budget::MIN_ANSWER`]) and [`wait::OVERRUN`], then a grant older than a renewal
    /// attempt is checked ([`crate::keeper::confirm_if_old`]), and one that did not count is
    /// given back ([`wait::LEAVE_TIMEOUT`]).
    fn finish_after_answer(&self, request: &AcquireRequest) -> std::time::Duration {
        crate::keeper::confirm_bound(request.ttl) + wait::LEAVE_TIMEOUT
    }

    /// Ask `acquire.lua` until it grants: each "not yet" queues us (or keeps our place) and
    /// we wait for our turn; a refusal, a failure, the `--wait` deadline or a cancel ends it
    /// with our token's entries given back, here, on the one way out.
    async fn acquire(&self, request: &AcquireRequest, cancel: Cancel) -> Result<RedisLease, Error> {
        let (waiter, conn) = Waiter::start(self, request)?;
        // On the way out the connection is closed (ending a server-side BLPOP) before our
        // place is given back.
        let outcome = take_turns(&waiter, conn, request, cancel).await;
        waiter.owed.settle(outcome, || waiter.leave()).await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        admin::status(self, name).await
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

/// The steps of one acquisition, each saying in `waiter.owed` what the server may hold for
/// our token afterwards (a grant, or our place in line).
async fn take_turns(
    waiter: &Waiter<'_>,
    mut conn: Conn,
    request: &AcquireRequest,
    mut cancel: Cancel,
) -> Result<RedisLease, Error> {
    // Behind Sentinel, the checks of the sentinels end with the server's time to answer too
    // (`--wait`, but at least `MIN_ANSWER`).
    sentinel::bound(&mut conn, request.budget.answer_by());
    let mut ticket: i64 = 0;
    loop {
        let (reply, sent) = waiter.call(&mut conn, ticket, &mut cancel).await?;
        let step = Step::parse(&reply);
        waiter.owed.set(match &step {
            Some(Step::Granted { .. }) => true,
            Some(Step::Waiting { ticket: theirs, .. }) => *theirs != 0 || ticket != 0,
            _ => ticket != 0,
        });
        let granted = matches!(step, Some(Step::Granted { .. }));
        if granted {
            tracing::debug!(target: crate::logging::HANDOFF, "granted");
        }
        if master_moved(waiter, &mut conn, granted).await? {
            continue;
        }
        let (hint, ahead, live) = match step {
            Some(Step::Granted {
                fence,
                ttl_ms,
                next,
            }) => return waiter.granted(conn, &fence, ttl_ms, sent, next).await,
            Some(Step::Waiting {
                hint,
                ahead,
                ticket: theirs,
                live,
            }) => {
                if ticket == 0 {
                    // Our first place in line: woken by a release from now on.
                    crate::lock::queued(request);
                }
                if theirs != 0 {
                    ticket = theirs;
                }
                waiter.saw(live, ahead);
                (hint, ahead, live)
            }
            refused => return Err(waiter.refusal(refused, &reply)),
        };
        if request.budget.is_no_wait() {
            return Err(not_waiting(waiter, &mut conn, request, live, ahead).await);
        }
        waiter
            .wait_turn(&mut conn, hint, live, ahead, &mut cancel)
            .await?;
    }
}

/// Behind Sentinel, whether the master moved since the step: a grant or a place in line on
/// a master that the sentinels no longer name counts for nothing, so the step is taken again
/// on the new one (a grant on the old one given back first). When the sentinels cannot say,
/// the acquisition fails (and our token's entries are given back on the way out).
async fn master_moved(waiter: &Waiter<'_>, conn: &mut Conn, granted: bool) -> Result<bool, Error> {
    match sentinel::follow(conn, granted).await {
        Ok(false) => Ok(false),
        Ok(true) => {
            if granted {
                waiter.leave().await;
            }
            Ok(true)
        }
        Err(error) => {
            waiter.owed.set(true);
            Err(error)
        }
    }
}

/// The refusal of `--no-wait` when the lock is held: who holds it, and how many wait.
async fn not_waiting(
    waiter: &Waiter<'_>,
    conn: &mut Conn,
    request: &AcquireRequest,
    live: i64,
    ahead: i64,
) -> Error {
    let reason = waiter.busy_reason(conn, live, ahead).await;
    crate::wording::not_acquired(&request.name, &reason, request.budget.wait())
}
