//! Waiting for an S3 lock: S3 notifies nobody, so a waiter polls the lock object, with
//! jittered intervals growing from [`FIRST`] to [`CAP`]: a release is noticed within
//! [`CAP`], and a waiting process sends about 40 GETs a minute once its interval has grown
//! (each pause is drawn from 1 to 2 s with the 2 s cap: at most 60). The host-local queue lets `--limit` + 8 processes of a
//! host poll at once, the rest waiting on this host. Waiters are not served in arrival order:
//! the first poll after a release wins.
//!
//! So that `status` can count them, a waiter registers an object of its own
//! (`…/NAME/w/ID`, `keys.rs`), written when it starts waiting, again every [`REFRESH_EVERY`]
//! (each a PUT: [`REFRESH_EVERY`] sets their cost), and deleted when it stops; a registration
//! older than [`STALE_AFTER`] by the server's clock is a killed waiter's and not counted.

use std::time::Duration;

use crate::clock::BootInstant;
use crate::kit::backoff::Backoff;

use super::client::{Cond, Failure, S3};

/// The first polling interval: a lock held only briefly is taken soon.
const FIRST: Duration = Duration::from_millis(100);
/// The longest polling interval: S3 bills each GET, so a long wait polls at most every 2 s
/// (on average every 1.5 s: intervals are drawn from the upper half).
pub const CAP: Duration = Duration::from_secs(2);
/// How often a waiter rewrites its registration.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// How old (server seconds) a registration may be and still count.
pub const STALE_AFTER: u64 = 12;

/// Polling intervals: growing by half from [`FIRST`] to [`CAP`], jittered.
pub(super) fn polling() -> Backoff {
    Backoff::polling(FIRST, CAP)
}

/// A waiter's registration.
pub(super) struct Registration {
    key: String,
    written: BootInstant,
}

impl Registration {
    /// Register under `prefix` (the lock's waiters) as `id`; `None` if it could not be
    /// written (the waiter then waits uncounted).
    pub(super) async fn register(
        s3: &S3,
        prefix: &str,
        id: &str,
        limit: Duration,
    ) -> Option<Registration> {
        let key = format!("{prefix}{id}");
        let written = BootInstant::now();
        match s3.put(&key, Vec::new(), &Cond::Always, limit).await {
            Ok(_) => Some(Registration { key, written }),
            Err(e) => {
                tracing::debug!("cannot register as a waiter: {}", e.describe());
                None
            }
        }
    }

    /// Rewrite the registration when it is due.
    pub(super) async fn refresh(&mut self, s3: &S3, limit: Duration) {
        if BootInstant::now().saturating_since(self.written) < REFRESH_EVERY {
            return;
        }
        self.written = BootInstant::now();
        if let Err(e) = s3.put(&self.key, Vec::new(), &Cond::Always, limit).await {
            tracing::debug!("cannot refresh the waiter registration: {}", e.describe());
        }
    }

    /// Delete it (best effort: it goes stale by itself).
    pub(super) async fn leave(self, s3: &S3, limit: Duration) -> Result<(), Failure> {
        s3.delete(&self.key, limit).await
    }
}
