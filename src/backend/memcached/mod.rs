//! The memcached backend (memcached ≥ 1.6, meta protocol): as safe as memcached allows, and
//! refusing where it does not.
//!
//! memcached has no notifications, no clock command, no durable counters, and it may evict
//! any item to make room. dlock uses it like this:
//!
//! - **Holding** is an item added only if absent (`ms … ME`, mode add) with a whole-second
//!   TTL, holding a random owner id and the holder's metadata; renewal every TTL/3 rewrites
//!   it with a compare-and-swap on its CAS value (only if still ours, `lease.rs`); release
//!   deletes it with the same compare. Loss = the item is gone or somebody else's.
//! - **Evictions** would break a hold silently, so a server whose `stats settings` say
//!   `evictions on` (memcached started without `-M`) is refused (78) by every acquisition and
//!   by `check`, unless the URL says `?allow-evictions=1`.
//! - **Waiting** is polling with short jittered intervals (`wait.rs`); waiters are not FIFO.
//! - **Fencing tokens** come from a counter item advanced to `max(last + 1, now µs)` by
//!   compare-and-swap (`token.rs`, which also says what holds when clocks differ).
//! - **Several servers** are independent: each lock lives on one, chosen by a hash of its
//!   name (`target.rs`).
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
//! The parts: `client.rs` (the protocol), `keys.rs`, `token.rs`, `wait.rs`, `lease.rs`,
//! `admin.rs` (status, list, release --force, check), [`target`] (URLs, server choice).

mod admin;
mod client;
mod keys;
mod lease;
pub mod target;
mod token;
mod wait;

use crate::backend::busy_reason;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::lock::{
    limit_mismatch, AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus,
    Record, Wait,
};

use client::{mg, ms, Conn, OP_TIMEOUT};
use keys::{Keys, Stored};
use lease::{expiry_for, Held, Hold};
use wait::{Backoff, Registration};

pub use lease::MemcachedLease;
pub use target::{McAddr, MemcachedTarget};

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
    ) -> Result<Attempt, Error> {
        let (keys, limit, display) = (&ctx.keys, ctx.request.limit, ctx.display.as_str());
        let add = format!("ME T{} c", ctx.expiry);
        let fail = |f: client::Failure| f.into_error(display);
        // Bounded: each round loses only to another client taking a slot.
        for _ in 0..100 {
            if limit == 1 {
                let key = keys.slot(0);
                let mut request = ms(&key, &add, value);
                request.extend(mg(&key, "v"));
                let sent = BootInstant::now();
                let replies = conn.meta(&request, 2, OP_TIMEOUT).await.map_err(fail)?;
                match (replies.first(), replies.get(1)) {
                    (Some(added), _) if added.is("HD") => {
                        let cas = added.cas().ok_or_else(|| no_cas(display))?;
                        return Ok(Attempt::Won(Won { slot: 0, cas, sent }));
                    }
                    (_, Some(holder)) if holder.is("VA") => {
                        let holder = holder_in(holder, &key, display)?;
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
                .meta(&request, limit as usize, OP_TIMEOUT)
                .await
                .map_err(fail)?;
            let free: Vec<u32> = (0..limit)
                .filter(|&i| replies.get(i as usize).is_some_and(|r| r.is("EN")))
                .collect();
            if free.is_empty() {
                let mut holders = Vec::new();
                for (i, reply) in (0..limit).zip(&replies) {
                    holders.push(holder_in(reply, &keys.slot(i), display)?);
                }
                return Ok(Attempt::Held(holders));
            }
            let slot = free[backoff.random(free.len() as u64) as usize];
            let sent = BootInstant::now();
            let added = conn
                .one(&ms(&keys.slot(slot), &add, value), OP_TIMEOUT)
                .await
                .map_err(fail)?;
            if added.is("HD") {
                let cas = added.cas().ok_or_else(|| no_cas(display))?;
                return Ok(Attempt::Won(Won { slot, cas, sent }));
            }
        }
        Err(Error::Unavailable(format!(
            "{display}: the slots of this lock changed under 100 attempts in a row"
        )))
    }

    /// The slot is ours: take a token, write it into the slot, and check that the holders
    /// agree on `--limit`.
    async fn finish(
        &self,
        mut conn: Conn,
        ctx: Ctx<'_>,
        won: Won,
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
            let others = self.holders_of(conn, keys, slots, display).await?;
            match others
                .iter()
                .find(|h| h.owner != owner && h.record.limit != request.limit)
            {
                Some(other) => Err(limit_mismatch(&request.name, other.record.limit)),
                None => Ok(()),
            }
        };
        let taken = token::next(&mut conn, keys, request.limit, OP_TIMEOUT, display, agree).await;
        tracing::debug!(target: crate::logging::HANDOFF, "token-taken");
        let token = match taken {
            Ok(token) => token,
            Err(e) => {
                let _ = held.delete(&mut conn, OP_TIMEOUT).await;
                return Err(e);
            }
        };
        let mut record = stored.record;
        record.holder.token = token;
        held.value = Stored {
            owner: stored.owner,
            record,
        }
        .to_bytes();
        let touched = held.touch(&mut conn, OP_TIMEOUT).await;
        tracing::debug!(target: crate::logging::HANDOFF, "slot-written");
        match touched {
            Ok(lease::Ours::Yes) => {}
            Ok(lease::Ours::No(why)) => {
                return Err(Error::Unavailable(format!(
                    "{display}: the lock was lost right after it was taken: {why}"
                )))
            }
            Err(f) => {
                let _ = held.delete(&mut conn, OP_TIMEOUT).await;
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

    /// The holders in slots `0..limit` (one pipelined read).
    async fn holders_of(
        &self,
        conn: &mut Conn,
        keys: &Keys,
        limit: u32,
        display: &str,
    ) -> Result<Vec<Stored>, Error> {
        let limit = limit.clamp(1, crate::lock::MAX_LIMIT);
        let mut request = Vec::new();
        for i in 0..limit {
            request.extend(mg(&keys.slot(i), "v"));
        }
        let replies = conn
            .meta(&request, limit as usize, OP_TIMEOUT)
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

fn no_cas(display: &str) -> Error {
    Error::Unavailable(format!(
        "{display} returned no CAS value; dlock needs CAS enabled (do not run memcached with -C)"
    ))
}

/// The not-acquired message: who holds it.
fn busy(name: &LockName, holders: &[Stored], why_not: String) -> Error {
    let holders: Vec<Holder> = holders.iter().map(|s| s.record.holder.clone()).collect();
    Error::Busy(format!(
        "lock '{name}' {}; {why_not}",
        busy_reason(holders, 0)
    ))
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
        let addr = self.target.server_for(&request.name);
        let display = addr.display();
        let mut conn = Conn::new(addr);
        if !self.target.allow_evictions {
            admin::refuse_evictions(&mut conn, &display).await?;
        }
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
        let value = ctx.stored.to_bytes();
        let deadline = request.wait.deadline();
        let mut backoff = Backoff::new();
        let mut registration: Option<Registration> = None;
        let mut waited = false;
        loop {
            let attempt = self.attempt(&mut conn, &ctx, &value, &mut backoff).await;
            let holders = match attempt {
                Ok(Attempt::Won(won)) => {
                    if waited {
                        // A poll found the lock free: memcached tells a waiter nothing sooner.
                        tracing::debug!(target: crate::logging::HANDOFF, "woken");
                    }
                    wait::leave(&mut registration, &mut conn, &owner, OP_TIMEOUT).await;
                    if waited {
                        tracing::debug!(target: crate::logging::HANDOFF, "unregistered");
                    }
                    return self.finish(conn, ctx, won).await;
                }
                Ok(Attempt::Held(holders)) => holders,
                Err(e) => {
                    wait::leave(&mut registration, &mut conn, &owner, OP_TIMEOUT).await;
                    return Err(e);
                }
            };
            if let Some(other) = holders
                .iter()
                .find(|h| h.record.limit != 0 && h.record.limit != request.limit)
            {
                wait::leave(&mut registration, &mut conn, &owner, OP_TIMEOUT).await;
                return Err(limit_mismatch(&request.name, other.record.limit));
            }
            if request.wait == Wait::No {
                return Err(busy(
                    &request.name,
                    &holders,
                    "not waiting (--no-wait)".into(),
                ));
            }
            let mut pause = backoff.next_delay();
            if let Some(deadline) = deadline {
                let left = deadline.remaining();
                if left.is_zero() {
                    wait::leave(&mut registration, &mut conn, &owner, OP_TIMEOUT).await;
                    let why = format!("gave up after waiting {} (--wait)", request.wait.describe());
                    return Err(busy(&request.name, &holders, why));
                }
                pause = pause.min(left);
            }
            // Registering is for the waiter count only; a failure here shows on the next
            // attempt.
            registration = match registration {
                None => {
                    let start = backoff.random(keys::WAITER_SLOTS as u64) as usize;
                    wait::register(&mut conn, &ctx.keys, &owner, start, OP_TIMEOUT)
                        .await
                        .unwrap_or(None)
                }
                Some(r) => r
                    .refresh(&mut conn, &ctx.keys, &owner, OP_TIMEOUT)
                    .await
                    .unwrap_or(None),
            };
            if !waited {
                // Polling from now on: the next free poll after a release wins.
                tracing::debug!(target: crate::logging::HANDOFF, "queued");
            }
            tokio::select! {
                () = cancel.cancelled() => {
                    wait::leave(&mut registration, &mut conn, &owner, OP_TIMEOUT).await;
                    return Err(Error::Cancelled);
                }
                () = tokio::time::sleep(pause) => {}
            }
            waited = true;
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
