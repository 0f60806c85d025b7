//! The Azure Blob backend (`az://CONTAINER[/FOLDER]`): a lock is a blob lease, which the
//! service grants to one client at a time and lets lapse on its own clock unless renewed.
//!
//! One blob per lock name (`target.rs`: `FOLDER/PREFIX/NAME`), in a container that exists
//! already (dlock never creates one). Its body is the holder's record (the JSON every
//! backend stores); its metadata `dlocktoken` is the fencing counter.
//!
//! Acquisition ([`AzureBackend::acquire`]):
//! 1. *Lease* the blob (`acquire`, the `--ttl` in whole seconds, a lease id of ours
//!    proposed). A blob that does not exist yet is created first (`If-None-Match: *`, token
//!    0; another client creating it at the same time is fine) and the lease asked again: the
//!    common case, an existing blob, costs no read before the lease.
//! 2. Held by another (`LeaseAlreadyPresent`): poll with jittered backoff
//!    (`wait.rs`); the service has no notification and no queue, so waiters are not FIFO,
//!    and the host-local queue lets `--limit` + 8 processes of a host poll at once.
//! 3. Ours: read the token from the blob's properties and write the record with the token + 1
//!    under the lease. Only the lease's holder can write the blob, and the service renews a
//!    lapsed lease only if nobody leased or wrote it since, so the counter increases by one
//!    per grant whoever held it before, across releases, expiries and breaks.
//!
//! An uncontended `dlock run` is four requests: lease, read, write, release (six the first
//! time a name is used: the lease's 404 and the creation). A lease request whose answer was
//! lost is asked again with the same lease id, which the service grants again to its holder;
//! an acquisition that ends without the lock gives back a lease it may hold
//! ([`crate::kit::owed`]).
//!
//! Leases last 15 to 60 s (the service's bounds), so `--ttl` outside them is refused before
//! anything is contacted (`kind.rs`); the keeper renews at its usual times.
//!
//! `--limit N` above 1 leases one of N slot blobs instead, the counter staying in the lock's
//! blob (`slots.rs`).
//!
//! The parts: `account.rs` (settings), `sign.rs` (Shared Key), `blob.rs` (the requests and
//! their failures), `listing.rs` (blob listings), `wait.rs` (polling, and the waiters'
//! registrations `status` counts), `slots.rs` (`--limit`), `lease.rs`, `admin.rs` (status,
//! list, release --force, check), `target.rs` (the URL), `kind.rs`.

mod account;
mod admin;
mod blob;
pub mod kind;
mod lease;
mod listing;
mod sign;
mod slots;
pub mod target;
mod wait;

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{confirm_if_old, GrantBudget, Schedule};
use crate::kit::owed::Owed;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus, Record,
};

use blob::{number, Blobs, Failure};
use lease::{Held, Renewer};

pub use lease::AzureLease;
pub use target::AzureTarget;

/// The shortest and longest lease the service grants.
pub const MIN_TTL: Duration = Duration::from_secs(15);
pub const MAX_TTL: Duration = Duration::from_secs(60);

/// What an acquisition adds to `--wait` for the request in flight when the wait ends: that
/// request may still carry the grant.
const WAIT_GRACE: Duration = Duration::from_millis(300);
/// Bound for giving back a lease an acquisition may hold when it ends without the lock:
/// best effort, since the lease lapses by itself within the TTL.
const LEAVE_BUDGET: Duration = Duration::from_millis(1000);
/// How many times in a row the lock's blob may vanish between its creation and the lease.
const MAX_CREATIONS: u32 = 5;

/// The bound of one request of an acquisition: [`OP_TIMEOUT`], and with `--wait` what is
/// left of it plus [`WAIT_GRACE`].
fn request_limit(request: &AcquireRequest) -> Duration {
    request.budget.share(OP_TIMEOUT, WAIT_GRACE)
}

/// The lease length for `ttl`: whole seconds, never longer than asked.
fn lease_seconds(ttl: Duration) -> u64 {
    ttl.as_secs().clamp(MIN_TTL.as_secs(), MAX_TTL.as_secs())
}

pub struct AzureBackend {
    target: AzureTarget,
    prefix: String,
}

/// One acquisition: the lock's blob, our proposed lease id, and the lease the service may
/// hold for us (on the lock's blob, or on a slot's with `--limit`).
struct Ctx<'a> {
    request: &'a AcquireRequest,
    blobs: Blobs,
    /// The lock's own blob (with `--limit` above 1, its counter).
    blob: String,
    lease_id: String,
    owed: Owed,
    /// The blob our lease is on, when [`Ctx::owed`] says there may be one.
    leased: std::cell::RefCell<String>,
}

impl Ctx<'_> {
    /// The service may now hold a lease of ours on `blob`.
    fn owe(&self, blob: &str) {
        self.owed.set(true);
        blob.clone_into(&mut self.leased.borrow_mut());
    }
}

impl AzureBackend {
    pub fn new(target: &AzureTarget, prefix: &str) -> AzureBackend {
        AzureBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
        }
    }

    fn blob(&self, name: &LockName) -> String {
        self.target.blob(&self.prefix, name)
    }

    /// Create `blob` (the lock's or a slot's) if it does not exist: token 0, no holder.
    /// Another client's creation in between is fine.
    async fn create(&self, ctx: &Ctx<'_>, blob: &str) -> Result<(), Failure> {
        let headers = vec![
            ("If-None-Match".to_owned(), "*".to_owned()),
            ("x-ms-meta-dlocktoken".to_owned(), "0".to_owned()),
        ];
        match ctx
            .blobs
            .put(blob, headers, Vec::new(), request_limit(ctx.request))
            .await
        {
            Ok(_)
            | Err(Failure::Answer {
                status: 409 | 412, ..
            }) => Ok(()),
            Err(failure) => Err(failure),
        }
    }

    /// One lease request on `blob`: `Ok(sent)` when the lease is ours (sent at `sent`),
    /// `Ok(None)` when another client holds it.
    async fn try_lease(&self, ctx: &Ctx<'_>, blob: &str) -> Result<Option<BootInstant>, Failure> {
        let seconds = lease_seconds(ctx.request.ttl).to_string();
        for _ in 0..MAX_CREATIONS {
            let headers = vec![
                ("x-ms-lease-duration".to_owned(), seconds.clone()),
                ("x-ms-proposed-lease-id".to_owned(), ctx.lease_id.clone()),
            ];
            let sent = BootInstant::now();
            let leased = ctx
                .blobs
                .lease(blob, "acquire", headers, request_limit(ctx.request))
                .await;
            match leased {
                Ok(_) => {
                    ctx.owe(blob);
                    return Ok(Some(sent));
                }
                Err(failure) => {
                    // A lease whose answer was lost may be ours: given back if it stays so.
                    if matches!(failure, Failure::Unknown(_)) {
                        ctx.owe(blob);
                    }
                    match failure.code() {
                        Some("LeaseAlreadyPresent") => return Ok(None),
                        Some("BlobNotFound") => self.create(ctx, blob).await?,
                        _ => return Err(failure),
                    }
                }
            }
        }
        Err(Failure::Answer {
            status: 404,
            code: "BlobNotFound".into(),
        })
    }

    /// The lease is ours (asked at `sent`): take the next token and write the record with it.
    async fn finish(&self, ctx: &Ctx<'_>, sent: BootInstant) -> Result<AzureLease, Error> {
        let request = ctx.request;
        let ttl = Duration::from_secs(lease_seconds(request.ttl));
        let schedule = Schedule::new(ttl, request.kill_after);
        let budget = GrantBudget::new(schedule, sent);
        let fail = |failure: Failure| grant_error(failure, &ctx.blobs, &budget);
        let properties = self
            .retried(&budget, || ctx.blobs.head(&ctx.blob, budget.left()))
            .await
            .map_err(fail)?;
        let last = match properties.header("x-ms-meta-dlocktoken") {
            None => 0,
            Some(text) => text.trim().parse::<u64>().map_err(|_| {
                Error::Unavailable(format!(
                    "{}: the blob '{}' has a dlocktoken that is not a number; it was not \
                     written by dlock: remove it or use another --prefix",
                    ctx.blobs.display, ctx.blob
                ))
            })?,
        };
        if let Some(theirs) = number(&properties, "x-ms-meta-dlocklimit").filter(|&l| l != 1) {
            // Taken last with another --limit: its holders, if any are left, decide.
            let theirs = u32::try_from(theirs).unwrap_or(u32::MAX);
            slots::agree_with_slots(ctx, None, theirs).await?;
        }
        tracing::debug!(target: crate::logging::HANDOFF, "token-read");
        let token = last.checked_add(1).ok_or_else(|| {
            Error::Unavailable(format!(
                "{}: the lock's token counter is exhausted",
                ctx.blobs.display
            ))
        })?;
        let mut holder = request.holder.clone();
        holder.token = token;
        holder.granted_now();
        let held = Held {
            blobs: ctx.blobs.clone(),
            blob: ctx.blob.clone(),
            lease_id: ctx.lease_id.clone(),
            token,
            record: Record {
                holder,
                limit: request.limit,
            },
        };
        self.hold(ctx, held, ttl, schedule, &budget, sent).await
    }

    /// Write `held`'s record under the lease (the same record again is harmless, so it is
    /// retried when unanswered) and keep the lease: a grant already old is confirmed by a
    /// renewal first.
    async fn hold(
        &self,
        ctx: &Ctx<'_>,
        held: Held,
        ttl: Duration,
        schedule: Schedule,
        budget: &GrantBudget,
        sent: BootInstant,
    ) -> Result<AzureLease, Error> {
        let fail = |failure: Failure| grant_error(failure, &ctx.blobs, budget);
        self.retried(budget, || held.write(&held.record, budget.left()))
            .await
            .map_err(fail)?;
        tracing::debug!(target: crate::logging::HANDOFF, "record-written");
        let mut renewer = Renewer { held, ttl };
        let since = confirm_if_old(&mut renewer, schedule, sent)
            .await
            .map_err(|why| {
                Error::Unavailable(format!(
                    "{}: the lock was granted but could not be confirmed: {why}",
                    ctx.blobs.display
                ))
            })?;
        Ok(AzureLease::start(renewer, since, ctx.request.kill_after))
    }

    /// `attempt` until it succeeds, fails for good, or `budget` is spent (bounded: a few
    /// tries of a request whose answer was lost or that the service was too busy for).
    async fn retried<T, F>(
        &self,
        budget: &GrantBudget,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, Failure>
    where
        F: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match attempt().await {
                Err(failure) if failure.is_transient() && tries < 4 && !budget.is_spent() => {
                    tracing::debug!("azure: {}; asking again", failure.describe());
                }
                other => return other,
            }
        }
    }
}

/// A grant that could not be finished: a lease that went away, or the request's failure.
fn grant_error(failure: Failure, blobs: &Blobs, budget: &GrantBudget) -> Error {
    if lease::is_gone(&failure) {
        return Error::Unavailable(format!(
            "{}: the lock was lost right after it was taken ({})",
            blobs.display,
            failure.code().unwrap_or_default()
        ));
    }
    if budget.is_spent() {
        return Error::Unavailable(format!(
            "{}: the lock was granted but could not be confirmed: {}",
            blobs.display,
            budget.ran_out()
        ));
    }
    failure.into_error(blobs)
}

impl Backend for AzureBackend {
    type Lease = AzureLease;

    /// Lease the name's blob, polling while another client holds it, until `--wait` is over
    /// or `cancel` fires; then take a token (see the module doc).
    async fn acquire(&self, request: &AcquireRequest, cancel: Cancel) -> Result<AzureLease, Error> {
        let ctx = Ctx {
            request,
            blobs: Blobs::new(&self.target)?,
            blob: self.blob(&request.name),
            lease_id: uuid::Uuid::new_v4().hyphenated().to_string(),
            owed: Owed::new(),
            leased: std::cell::RefCell::new(String::new()),
        };
        let outcome = if request.limit > 1 {
            match self.poll_slots(&ctx, cancel).await {
                Ok((slot, sent)) => self.finish_slot(&ctx, slot, sent).await,
                Err(err) => Err(err),
            }
        } else {
            match self.poll(&ctx, cancel).await {
                Ok(sent) => self.finish(&ctx, sent).await,
                Err(err) => Err(err),
            }
        };
        ctx.owed
            .settle(outcome, || async {
                let headers = vec![("x-ms-lease-id".to_owned(), ctx.lease_id.clone())];
                let blob = ctx.leased.borrow().clone();
                let _ = ctx
                    .blobs
                    .lease(&blob, "release", headers, LEAVE_BUDGET)
                    .await;
            })
            .await
    }

    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        // The read and the write after a grant, each within the grant's budget.
        Schedule::new(
            Duration::from_secs(lease_seconds(request.ttl)),
            request.kill_after,
        )
        .hold_for()
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
