//! `--limit N` above 1: N slot blobs (`NAME~0` … `NAME~N-1`), each leased by one holder, and
//! the token counter in the lock's own blob, which no such holder leases: it is advanced by a
//! conditional write (`If-Match` on the ETag just read; the service gives every write a new
//! ETag, so an old one never matches), and retried when another taker wrote first.
//!
//! A poll lists the lock's blobs (one request: the lease state and the `--limit` of every
//! slot are in the listing) and asks for the lease of a free slot, at random.
//!
//! All holders agree on `--limit` (`lock::limit_mismatch`, 64), as on memcached: the lock's
//! blob records the `--limit` of the last taker beside the counter, and each slot holder's
//! `--limit` is written into its slot before the taker touches the counter. A taker whose
//! `--limit` is not the recorded one looks at the slots before writing the counter; the
//! writes of the counter are ordered by their ETags, so of two takers that disagree, the
//! later one sees the earlier one's slot. A `--limit 1` holder leases the lock's blob
//! itself, which keeps a slot taker from writing the counter until it is gone (and the
//! slot taker then sees it, and refuses), and it reads the recorded `--limit` under its
//! lease (`mod.rs`).

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{GrantBudget, Schedule};
use crate::kit::limit;
use crate::lock::{limit_mismatch, Cancel, Record};

use super::blob::{number, Failure};
use super::lease::Held;
use super::listing::{listed, slot, slot_of, Listed};
use super::wait::{poll_until, Tried};
use super::{grant_error, lease_seconds, request_limit, AzureBackend, AzureLease, Ctx};

/// How many times in a row the counter may be written by others first.
const MAX_COUNTER_ROUNDS: u32 = 50;

/// The lock's own blob and its slots, as one listing shows them.
struct Lock {
    /// The lock's own blob is leased: a `--limit 1` holder has it.
    own_leased: bool,
    /// The leased slots (index, its `--limit`).
    leased: Vec<(u32, Option<u32>)>,
}

async fn read_lock(ctx: &Ctx<'_>, limit: Duration) -> Result<Lock, Failure> {
    let all: Vec<Listed> = listed(&ctx.blobs, &ctx.blob, limit).await?;
    Ok(Lock {
        own_leased: all.iter().any(|b| b.name == ctx.blob && b.leased),
        leased: all
            .iter()
            .filter(|b| b.leased)
            .filter_map(|b| Some((slot_of(&ctx.blob, &b.name)?, b.limit)))
            .collect(),
    })
}

/// Refuse (64) when a leased slot other than `ours` was taken with another `--limit` than
/// this request's (`recorded`: the `--limit` the lock's blob names, for a slot that does not
/// say).
pub(super) async fn agree_with_slots(
    ctx: &Ctx<'_>,
    ours: Option<u32>,
    recorded: u32,
) -> Result<(), Error> {
    let lock = read_lock(ctx, request_limit(ctx.request))
        .await
        .map_err(|f| f.into_error(&ctx.blobs))?;
    for (index, theirs) in lock.leased {
        if Some(index) != ours {
            limit::agrees(
                &ctx.request.name,
                ctx.request.limit,
                theirs.unwrap_or(recorded),
            )?;
        }
    }
    Ok(())
}

impl AzureBackend {
    /// Lease a free slot, polling while all are held: the slot and when its lease was asked.
    pub(super) async fn poll_slots(
        &self,
        ctx: &Ctx<'_>,
        cancel: Cancel,
    ) -> Result<(u32, BootInstant), Error> {
        let n = ctx.request.limit;
        let mut rng = crate::kit::backoff::Backoff::new(Duration::ZERO, Duration::ZERO);
        let mut held_slots: Vec<u32> = Vec::new();
        let attempt = async || {
            let lock = match read_lock(ctx, request_limit(ctx.request)).await {
                Ok(lock) => lock,
                Err(failure) => return Tried::Failed(failure),
            };
            if lock.own_leased {
                return Tried::Refused(limit_mismatch(&ctx.request.name, 1));
            }
            for (_, theirs) in &lock.leased {
                if let Err(err) = limit::agrees(&ctx.request.name, n, theirs.unwrap_or(0)) {
                    return Tried::Refused(err);
                }
            }
            held_slots = lock.leased.iter().map(|(i, _)| *i).collect();
            let free: Vec<u32> = (0..n).filter(|i| !held_slots.contains(i)).collect();
            let start = rng.random(free.len() as u64) as usize;
            for k in 0..free.len() {
                let index = free[(start + k) % free.len()];
                match self.try_lease(ctx, &slot(&ctx.blob, index)).await {
                    Ok(Some(sent)) => return Tried::Won((index, sent)),
                    Ok(None) => held_slots.push(index),
                    Err(failure) => return Tried::Failed(failure),
                }
            }
            Tried::Held
        };
        let holders = async || {
            let mut holders = Vec::new();
            for index in 0..n {
                let blob = slot(&ctx.blob, index);
                let Ok(answer) = ctx.blobs.get(&blob, request_limit(ctx.request)).await else {
                    continue;
                };
                if answer.header("x-ms-lease-state") != Some("leased") {
                    continue;
                }
                if let Ok(record) = serde_json::from_slice::<Record>(&answer.body) {
                    holders.push(record.holder);
                }
            }
            holders
        };
        poll_until(ctx, cancel, attempt, holders).await
    }

    /// The slot `index` is ours (asked at `sent`): record our `--limit` in it, advance the
    /// counter, and write the record with the token.
    pub(super) async fn finish_slot(
        &self,
        ctx: &Ctx<'_>,
        index: u32,
        sent: BootInstant,
    ) -> Result<AzureLease, Error> {
        let request = ctx.request;
        let ttl = Duration::from_secs(lease_seconds(request.ttl));
        let schedule = Schedule::new(ttl, request.kill_after);
        let budget = GrantBudget::new(schedule, sent);
        let fail = |failure: Failure| grant_error(failure, &ctx.blobs, &budget);
        let mut holder = request.holder.clone();
        holder.token = 0;
        holder.granted_now();
        let mut held = Held {
            blobs: ctx.blobs.clone(),
            blob: slot(&ctx.blob, index),
            lease_id: ctx.lease_id.clone(),
            token: 0,
            record: Record {
                holder,
                limit: request.limit,
            },
        };
        self.retried(&budget, || held.write(&held.record, budget.left()))
            .await
            .map_err(fail)?;
        let token = self.advance_counter(ctx, index, &budget).await?;
        tracing::debug!(target: crate::logging::HANDOFF, "token-taken");
        held.token = token;
        held.record.holder.token = token;
        self.hold(ctx, held, ttl, schedule, &budget, sent).await
    }

    /// Write the counter in the lock's blob one up, conditionally on the version read, after
    /// checking that the holders agree on `--limit`; the new token.
    async fn advance_counter(
        &self,
        ctx: &Ctx<'_>,
        ours: u32,
        budget: &GrantBudget,
    ) -> Result<u64, Error> {
        let n = ctx.request.limit;
        let fail = |failure: Failure| grant_error(failure, &ctx.blobs, budget);
        for _ in 0..MAX_COUNTER_ROUNDS {
            let properties = match ctx.blobs.head(&ctx.blob, budget.left()).await {
                Ok(properties) => properties,
                Err(failure) if failure.code() == Some("BlobNotFound") => {
                    self.create(ctx, &ctx.blob).await.map_err(fail)?;
                    continue;
                }
                Err(failure) => return Err(fail(failure)),
            };
            if properties.header("x-ms-lease-state") == Some("leased") {
                // Only a --limit 1 holder leases the lock's own blob.
                return Err(limit_mismatch(&ctx.request.name, 1));
            }
            let recorded = number(&properties, "x-ms-meta-dlocklimit")
                .map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX));
            if recorded != n {
                agree_with_slots(ctx, Some(ours), recorded).await?;
            }
            let last = number(&properties, "x-ms-meta-dlocktoken").unwrap_or(0);
            let token = last.checked_add(1).ok_or_else(|| {
                Error::Unavailable(format!(
                    "{}: the lock's token counter is exhausted",
                    ctx.blobs.display
                ))
            })?;
            let Some(etag) = properties.header("etag").map(str::to_owned) else {
                return Err(Error::Unavailable(format!(
                    "{} answered a read of the lock's blob without an ETag",
                    ctx.blobs.display
                )));
            };
            let headers = vec![
                ("If-Match".to_owned(), etag),
                ("x-ms-meta-dlocklimit".to_owned(), n.to_string()),
                ("x-ms-meta-dlocktoken".to_owned(), token.to_string()),
            ];
            match ctx
                .blobs
                .put(&ctx.blob, headers, Vec::new(), budget.left())
                .await
            {
                Ok(_) => return Ok(token),
                // Written by another taker first, or leased meanwhile: read it again.
                Err(Failure::Answer { status: 412, .. }) => {}
                Err(failure) => return Err(fail(failure)),
            }
            if budget.is_spent() {
                break;
            }
        }
        Err(Error::Unavailable(format!(
            "{}: the lock's counter was changed by others {MAX_COUNTER_ROUNDS} times in a row, \
             or the grant ran out of time",
            ctx.blobs.display
        )))
    }
}
