//! The memcached backend (memcached ≥ 1.6, meta protocol): as safe as memcached allows, and
//! refusing where it does not.
//!
//! memcached has no notifications, no clock command, no durable counters, and it may evict
//! any item to make room. dlock uses it like this:
//!
//! - **Holding** is an item added only if absent (`ms … ME`, mode add) with a whole-second
//!   TTL, holding a random owner id and the holder's metadata; renewal at least every TTL/3 rewrites
//!   it with a compare-and-swap on its CAS value (only if still ours, `lease.rs`); release
//!   deletes it with the same compare. Loss = the item is gone or somebody else's.
//! - **Evictions** would break a hold silently, so a server whose `stats settings` say
//!   `evictions on` (memcached started without `-M`) is refused (78) by every acquisition and
//!   by `check`, unless the URL says `?allow-evictions=1`. So is a server without CAS values
//!   (`-C`), read from the same settings on every new connection; `check` warns of slab
//!   reassignment, which drops items even with `-M` (`admin.rs`).
//! - **Waiting** is polling with short jittered intervals (`wait.rs`); waiters are not FIFO.
//!   A waiter whose connection breaks once the server has answered (a restart) reconnects
//!   with backoff ([`RELINK_FIRST`] to [`RELINK_CAP`]) and waits on. With `--wait`, every
//!   exchange of an acquisition ends by `--wait` + [`WAIT_GRACE`] ([`exchange_limit`]).
//! - **Fencing tokens** come from a counter item advanced to `max(last + 1, now µs)` by
//!   compare-and-swap (`token.rs`, which also says what holds when clocks differ).
//! - **Several servers** are independent: each lock lives on one, chosen by a hash of its
//!   name over the servers' resolved addresses, whatever their spelling (`target.rs`).
//!
//! Items of a lock (`B = <prefix>:<encoded name>`, or `<prefix>:#<sha-256>` for long names):
//!
//! | key | TTL | content |
//! |---|---|---|
//! | `B:<i>`, i in `0..limit` | the lease | holder slot: JSON of owner id, holder metadata, token, `--limit` |
//! | `B:f` | none | `<last token> <--limit of its taker>` |
//! | `B:w<i>`, i in `0..64` | 3 s, refreshed | a waiter's owner id (only for the waiter count) |
//!
//! Acquisition: add a free slot (for `--limit 1`, slot 0, pipelined with a read of it, one
//! round trip); then take a token and rewrite the slot with it (compare-and-swap on the CAS
//! value the add returned). If the counter's previous taker used another `--limit`, the
//! holders are read before the counter is written: one with another limit means the slot is
//! given back and the run refused (64), without touching the counter (`token.rs` says why
//! that catches every disagreement).
//!
//! The parts: `client.rs` (the protocol), `keys.rs`, `token.rs`, `polling.rs` (the wait
//! between attempts), `wait.rs`, `lease.rs`,
//! `admin.rs` (status, list, release --force, check), [`target`] (URLs, server choice).

mod admin;
mod client;
mod keys;
pub mod kind;
mod lease;
mod polling;
pub mod target;
mod token;
mod wait;

use std::time::Duration;

use crate::budget::WaitBudget;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::backoff::Backoff;
use crate::lock::{
    limit_mismatch, AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus,
    Record,
};

use crate::kit::timeouts::OP_TIMEOUT;
use client::{mg, ms, Conn, Failure};
use keys::{Keys, Stored};
use lease::{expiry_for, Held, Hold};
use wait::Registration;

pub use lease::MemcachedLease;
pub use target::{McAddr, MemcachedTarget};

/// What an acquisition adds to `--wait` for the exchange in flight when the wait ends: that
/// exchange may still carry the grant, and an unanswering server is then given up within
/// `--wait` + 0.3 s, leaving 0.2 s of the promised `--wait` + 0.5 s for the process's own
/// start and exit on a loaded machine.
const WAIT_GRACE: Duration = Duration::from_millis(300);
/// The first pause before reconnecting after a waiter lost its connection: a restarting
/// server is not back sooner, and faster retries would only flood it as it comes up.
const RELINK_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between reconnection attempts: a server that is back is noticed within
/// 2 s, a delay a waiter without `--wait` does not feel, at one connection attempt per 2 s.
const RELINK_CAP: Duration = Duration::from_secs(2);
/// Bound for leaving the waiter registrations after a cancel or a failure: best effort only,
/// since a registration expires by itself within 3 s, so a stalled server must not hold up
/// the exit for longer than this.
const LEAVE_BUDGET: Duration = Duration::from_millis(500);

/// The bound of one exchange of an acquisition: [`OP_TIMEOUT`], and with `--wait` what is
/// left of it plus [`WAIT_GRACE`] ([`WaitBudget::share`]).
fn exchange_limit(budget: &WaitBudget) -> Duration {
    budget.share(OP_TIMEOUT, WAIT_GRACE)
}

/// Why an attempt failed: the link (a new connection may work) or the server's answer.
enum Failed {
    Link(Failure),
    Answer(Error),
}

impl Failed {
    fn of(failure: Failure, display: &str) -> Failed {
        if failure.is_link() {
            Failed::Link(failure)
        } else {
            Failed::Answer(failure.into_error(display))
        }
    }

    fn into_error(self, display: &str) -> Error {
        match self {
            Failed::Link(failure) => failure.into_error(display),
            Failed::Answer(error) => error,
        }
    }
}

pub struct MemcachedBackend {
    target: MemcachedTarget,
    prefix: String,
}

/// One acquisition: the lock, the item we add, and where.
struct Ctx<'a> {
    request: &'a AcquireRequest,
    keys: Keys,
    /// What we store in a slot until the token is known.
    stored: Stored,
    /// The whole-second expiry of a slot item.
    expiry: u64,
    display: String,
}

/// A slot that is ours.
struct Won {
    slot: u32,
    /// Its CAS value, from the add.
    cas: u64,
    /// When the add was sent: the lease runs from then.
    sent: BootInstant,
}

/// What one attempt found.
enum Attempt {
    Won(Won),
    /// Every slot is held (by these holders, where they could be read).
    Held(Vec<Stored>),
}

impl MemcachedBackend {
    pub fn new(target: &MemcachedTarget, prefix: &str) -> MemcachedBackend {
        MemcachedBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
        }
    }

    fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.prefix, name)
    }

    /// Try once to add a free holder slot.
    async fn attempt(
        &self,
        conn: &mut Conn,
        ctx: &Ctx<'_>,
        value: &[u8],
        backoff: &mut Backoff,
        budget: Duration,
    ) -> Result<Attempt, Failed> {
        let (keys, limit, display) = (&ctx.keys, ctx.request.limit, ctx.display.as_str());
        let add = format!("ME T{} c", ctx.expiry);
        let fail = |f: Failure| Failed::of(f, display);
        let answer = Failed::Answer;
        // Bounded: each round loses only to another client taking a slot.
        for _ in 0..100 {
            if limit == 1 {
                let key = keys.slot(0);
                let mut request = ms(&key, &add, value);
                request.extend(mg(&key, "v"));
                let sent = BootInstant::now();
                let replies = conn.meta(&request, 2, budget).await.map_err(fail)?;
                match (replies.first(), replies.get(1)) {
                    (Some(added), _) if added.is("HD") => {
                        let cas = cas_of(added, display).map_err(answer)?;
                        return Ok(Attempt::Won(Won { slot: 0, cas, sent }));
                    }
                    (_, Some(holder)) if holder.is("VA") => {
                        let holder = holder_in(holder, &key, display).map_err(answer)?;
                        return Ok(Attempt::Held(vec![holder]));
                    }
                    // Released between the add and the read: try again at once.
                    _ => continue,
                }
            }
            let mut request = Vec::new();
            for i in 0..limit {
                request.extend(mg(&keys.slot(i), "v"));
            }
            let replies = conn
                .meta(&request, limit as usize, budget)
                .await
                .map_err(fail)?;
            let free: Vec<u32> = (0..limit)
                .filter(|&i| replies.get(i as usize).is_some_and(|r| r.is("EN")))
                .collect();
            if free.is_empty() {
                let mut holders = Vec::new();
                for (i, reply) in (0..limit).zip(&replies) {
                    holders.push(holder_in(reply, &keys.slot(i), display).map_err(answer)?);
                }
                return Ok(Attempt::Held(holders));
            }
            let slot = free[backoff.random(free.len() as u64) as usize];
            let sent = BootInstant::now();
            let added = conn
                .one(&ms(&keys.slot(slot), &add, value), budget)
                .await
                .map_err(fail)?;
            if added.is("HD") {
                let cas = cas_of(&added, display).map_err(answer)?;
                return Ok(Attempt::Won(Won { slot, cas, sent }));
            }
        }
        Err(answer(Error::Unavailable(format!(
            "{display}: the slots of this lock changed under 100 attempts in a row"
        ))))
    }

    /// The slot is ours: take a token, write it into the slot, and check that the holders
    /// agree on `--limit`.
    async fn finish(
        &self,
        mut conn: Conn,
        ctx: Ctx<'_>,
        won: Won,
        budget: Duration,
    ) -> Result<MemcachedLease, Error> {
        let Won { slot, cas, sent } = won;
        let (keys, request, display) = (&ctx.keys, ctx.request, ctx.display.as_str());
        let stored = ctx.stored.clone();
        let (expiry, lease_ttl) = expiry_for(request.ttl);
        let mut held = Held {
            key: keys.slot(slot),
            value: Vec::new(),
            owner: stored.owner.clone(),
            cas,
            epoch: conn.epoch,
            expiry,
        };
        let owner = stored.owner.clone();
        let agree = async |conn: &mut Conn, theirs: u32| {
            let slots = theirs.max(request.limit);
            let others = self.holders_of(conn, keys, slots, display, budget).await?;
            match others
                .iter()
                .find(|h| h.owner != owner && h.record.limit != request.limit)
            {
                Some(other) => Err(limit_mismatch(&request.name, other.record.limit)),
                None => Ok(()),
            }
        };
        let taken = token::next(&mut conn, keys, request.limit, budget, display, agree).await;
        tracing::debug!(target: crate::logging::HANDOFF, "token-taken");
        let token = match taken {
            Ok(token) => token,
            Err(e) => {
                let _ = held.delete(&mut conn, budget).await;
                return Err(e);
            }
        };
        let mut record = stored.record;
        record.holder.token = token;
        record.holder.granted_now();
        held.value = Stored {
            owner: stored.owner,
            record,
        }
        .to_bytes();
        let touched = held.touch(&mut conn, budget).await;
        tracing::debug!(target: crate::logging::HANDOFF, "slot-written");
        match touched {
            Ok(lease::Ours::Yes) => {}
            Ok(lease::Ours::No(why)) => {
                return Err(Error::Unavailable(format!(
                    "{display}: the lock was lost right after it was taken: {why}"
                )))
            }
            Err(f) => {
                let _ = held.delete(&mut conn, budget).await;
                return Err(f.into_error(display));
            }
        }
        Ok(MemcachedLease::start(
            Hold { conn, held },
            token,
            display,
            sent,
            lease_ttl,
            request.kill_after,
        ))
    }

    /// Read the server's settings once per connection and refuse a server dlock cannot hold
    /// a lock on (evictions without the opt-in, CAS disabled).
    async fn settle(
        &self,
        conn: &mut Conn,
        settled: &mut u64,
        display: &str,
        budget: Duration,
    ) -> Result<(), Failed> {
        conn.ensure(budget)
            .await
            .map_err(|f| Failed::of(f, display))?;
        if *settled == conn.epoch {
            return Ok(());
        }
        let settings = conn
            .stats("settings", budget)
            .await
            .map_err(|f| Failed::of(f, display))?;
        if let Some(refusal) = admin::refusal(&settings, display, self.target.allow_evictions) {
            return Err(Failed::Answer(refusal));
        }
        *settled = conn.epoch;
        Ok(())
    }

    /// The holders in slots `0..limit` (one pipelined read).
    async fn holders_of(
        &self,
        conn: &mut Conn,
        keys: &Keys,
        limit: u32,
        display: &str,
        budget: Duration,
    ) -> Result<Vec<Stored>, Error> {
        let limit = limit.clamp(1, crate::lock::MAX_LIMIT);
        let mut request = Vec::new();
        for i in 0..limit {
            request.extend(mg(&keys.slot(i), "v"));
        }
        let replies = conn
            .meta(&request, limit as usize, budget)
            .await
            .map_err(|f| f.into_error(display))?;
        Ok(replies
            .iter()
            .filter_map(|r| r.value.as_deref().and_then(Stored::parse))
            .collect())
    }
}

/// The holder a slot item names; an item dlock did not write is an error naming its key.
fn holder_in(reply: &client::Reply, key: &str, display: &str) -> Result<Stored, Error> {
    reply
        .value
        .as_deref()
        .and_then(Stored::parse)
        .ok_or_else(|| {
            Error::Unavailable(format!(
                "{display}: the key '{key}' holds data dlock did not write; remove it or use \
             another --prefix"
            ))
        })
}

/// The CAS value a store returned; none (or 0, what a server started with `-C` returns) is
/// a server dlock cannot use (78).
fn cas_of(reply: &client::Reply, display: &str) -> Result<u64, Error> {
    reply
        .cas()
        .filter(|&cas| cas != 0)
        .ok_or_else(|| admin::cas_disabled(display))
}

impl Backend for MemcachedBackend {
    type Lease = MemcachedLease;

    /// Add a free slot, polling until one is free, `--wait` is over or `cancel` fires; then
    /// take a token (see the module doc).
    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<MemcachedLease, Error> {
        let budget = &request.budget;
        let server = self
            .target
            .server_for(&request.name, exchange_limit(budget))
            .await?;
        let display = server.display();
        let mut conn = Conn::new(&server.at);
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let mut holder = request.holder.clone();
        holder.token = 0;
        let ctx = Ctx {
            request,
            keys: self.keys(&request.name),
            stored: Stored {
                owner: owner.clone(),
                record: Record {
                    holder,
                    limit: request.limit,
                },
            },
            expiry: expiry_for(request.ttl).0,
            display,
        };
        let mut registration: Option<Registration> = None;
        let polled = self
            .poll(&mut conn, &ctx, &mut registration, &mut cancel)
            .await;
        // Every way out leaves the waiter count (nothing to do if this run never waited).
        match polled {
            Ok((won, waited)) => {
                wait::leave(&mut registration, &mut conn, &owner, exchange_limit(budget)).await;
                if waited {
                    tracing::debug!(target: crate::logging::HANDOFF, "unregistered");
                }
                self.finish(conn, ctx, won, exchange_limit(budget)).await
            }
            Err(err) => {
                wait::leave(&mut registration, &mut conn, &owner, LEAVE_BUDGET).await;
                Err(err)
            }
        }
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
