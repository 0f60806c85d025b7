//! The lease of a held Azure lock: a blob lease the service keeps on its own clock. The
//! [`Keeper`] renews it through [`Renewer`] (`x-ms-lease-action: renew` with our lease id),
//! `--min-hold`'s finish rewrites the record under it, and release gives it back.
//!
//! Renewal is idempotent: a renewal whose answer was lost is simply renewed again, within the
//! keeper's deadline. The service renews even a lease that ran out, but only while nobody
//! else has leased or written the blob since, so a renewal that succeeds always means nobody
//! else held the lock meanwhile. A lease id that no longer matches, a lease broken by
//! `release --force` or a blob that is gone is a loss at once.

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError};
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{Holder, Lease, Lost, Record};

use super::blob::{Blobs, Failure};

/// The keeper bounds a renewal; the request itself gets no bound of its own.
const NO_BUDGET: Duration = Duration::from_secs(3600);

/// What a failed lease request means for the hold: the service says it is not ours.
pub(super) fn is_gone(failure: &Failure) -> bool {
    matches!(
        failure,
        Failure::Answer {
            status: 404 | 409 | 412,
            ..
        }
    )
}

/// The lock's blob and our lease on it.
#[derive(Clone)]
pub(super) struct Held {
    pub(super) blobs: Blobs,
    pub(super) blob: String,
    pub(super) lease_id: String,
    pub(super) token: u64,
    pub(super) record: Record,
}

impl Held {
    pub(super) fn lease_header(&self) -> Vec<(String, String)> {
        vec![("x-ms-lease-id".into(), self.lease_id.clone())]
    }

    /// Write `record` as the blob's body under the lease, with the token and the `--limit` in
    /// its metadata.
    pub(super) async fn write(&self, record: &Record, limit: Duration) -> Result<(), Failure> {
        let body = serde_json::to_vec(record).unwrap_or_default();
        let mut headers = self.lease_header();
        headers.push(("x-ms-meta-dlocklimit".into(), record.limit.to_string()));
        headers.push(("x-ms-meta-dlocktoken".into(), self.token.to_string()));
        self.blobs
            .put(&self.blob, headers, body, limit)
            .await
            .map(drop)
    }
}

/// One renewal round trip, for the [`Keeper`].
pub(super) struct Renewer {
    pub(super) held: Held,
    pub(super) ttl: Duration,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let held = &self.held;
        match held
            .blobs
            .lease(&held.blob, "renew", held.lease_header(), NO_BUDGET)
            .await
        {
            Ok(_) => Ok(self.ttl),
            Err(failure) if is_gone(&failure) => Err(RenewError::Gone(format!(
                "the lease on the lock's blob is gone ({}): it expired and was taken, or was \
                 broken (release --force)",
                failure.code().unwrap_or_default()
            ))),
            Err(failure) => Err(RenewError::Failed(format!(
                "{}: {}",
                held.blobs.display,
                failure.describe()
            ))),
        }
    }
}

/// A held Azure lock.
pub struct AzureLease {
    keeper: Keeper<Renewer>,
    held: Held,
}

impl AzureLease {
    /// Keep `renewer`'s hold, proven by a round trip sent at `since`.
    pub(super) fn start(renewer: Renewer, since: BootInstant, kill_after: Duration) -> AzureLease {
        let held = renewer.held.clone();
        let ttl = renewer.ttl;
        AzureLease {
            keeper: Keeper::start(renewer, since, ttl, kill_after),
            held,
        }
    }
}

impl Lease for AzureLease {
    fn token(&self) -> u64 {
        self.held.token
    }

    fn proven_until(&self) -> Option<BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        self.keeper.lost().await
    }

    /// Rewrite the record under the lease: only the lease's holder can, so a lock taken over
    /// meanwhile is left as it is.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let record = Record {
            holder: holder.clone(),
            limit: self.held.record.limit,
        };
        match self.held.write(&record, OP_TIMEOUT).await {
            Ok(()) => {
                self.held.record = record;
                Ok(true)
            }
            Err(failure) if is_gone(&failure) => Ok(false),
            Err(failure) => Err(failure.into_error(&self.held.blobs)),
        }
    }

    async fn release(self) -> Result<(), Error> {
        let AzureLease { keeper, held } = self;
        if keeper.stop().await.is_none() {
            return Err(Error::Internal(
                "the lease keeper ended unexpectedly".into(),
            ));
        }
        let mut last = None;
        // One retry: a release that never arrives costs the next holder up to a TTL.
        for _ in 0..2 {
            let released = held
                .blobs
                .lease(&held.blob, "release", held.lease_header(), OP_TIMEOUT)
                .await;
            tracing::debug!(target: crate::logging::HANDOFF, "lease-released");
            match released {
                Ok(_) => return Ok(()),
                Err(failure) if is_gone(&failure) => {
                    crate::lock::warn_gone_at_release(format_args!(
                        "the lock was no longer ours when it was released: its lease is gone ({})",
                        failure.code().unwrap_or_default()
                    ));
                    return Ok(());
                }
                Err(failure) => last = Some(failure),
            }
        }
        Err(last.map_or_else(
            || Error::Internal("release failed".into()),
            |f| f.into_error(&held.blobs),
        ))
    }
}
