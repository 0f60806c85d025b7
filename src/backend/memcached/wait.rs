//! Waiting for a memcached lock: memcached notifies nobody, so a waiter polls.
//!
//! The intervals are short, jittered and adaptive: the first retry comes after about
//! [`FIRST`], each next one half again as late, up to [`CAP`], and each is drawn uniformly
//! from its upper half so that waiters started together spread out. A release is noticed
//! within one interval (at most [`CAP`], far below a fixed 100 ms poll), and with several
//! waiters the first of them to poll after the release gets the lock. Waiters are therefore
//! **not served in arrival order** (no FIFO): a queue kept in memcached would need its own
//! heartbeats and clean-up of killed waiters, for nothing a short poll does not already give.
//!
//! So that `status` can say how many are waiting, each waiter registers in one of
//! [`WAITER_SLOTS`] items (`B:w<i>`, value = its owner id) that lives [`REGISTRATION_TTL`]
//! and is refreshed every [`REFRESH_EVERY`]: a killed waiter is counted for at most that
//! long, and waiters beyond the slots are not counted (they still wait).

use std::time::Duration;

use crate::clock::BootInstant;
use crate::kit::backoff::Backoff;

use super::client::{md, mg, ms, Conn, Failure};
use super::keys::{Keys, WAITER_SLOTS};

/// The first polling interval. Polling intervals are periods, not deadlines: `--wait` ends
/// the wait, and a busy machine only makes a poll later, never an acquisition fail. They
/// trade a hand-off's delay against requests to the server; a waiter has no lease yet to
/// derive them from.
const FIRST: Duration = Duration::from_millis(2);
/// The longest polling interval.
const CAP: Duration = Duration::from_millis(25);
/// How long a waiter's registration lives without a refresh (whole seconds: memcached's).
const REGISTRATION_TTL: u64 = 3;
/// How often a waiter refreshes its registration.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Polling intervals: growing by half from [`FIRST`] to [`CAP`], jittered.
pub(super) fn polling() -> Backoff {
    Backoff::polling(FIRST, CAP)
}

/// A waiter's registration (for the count `status` shows).
pub(super) struct Registration {
    key: String,
    cas: Option<u64>,
    epoch: u64,
    refreshed: BootInstant,
}

/// Register as a waiter of `keys`, starting at a random slot; `None` when every slot is
/// taken (the waiter then waits uncounted). Failures are the caller's to report.
pub(super) async fn register(
    conn: &mut Conn,
    keys: &Keys,
    owner: &str,
    start: usize,
    budget: Duration,
) -> Result<Option<Registration>, Failure> {
    let flags = format!("ME T{REGISTRATION_TTL} c");
    for n in 0..WAITER_SLOTS {
        let key = keys.waiter((start + n) % WAITER_SLOTS);
        let sent = BootInstant::now();
        let reply = conn
            .one(&ms(&key, &flags, owner.as_bytes()), budget)
            .await?;
        if reply.is("HD") {
            return Ok(Some(Registration {
                key,
                cas: reply.cas(),
                epoch: conn.epoch,
                refreshed: sent,
            }));
        }
    }
    Ok(None)
}

impl Registration {
    /// Keep the registration alive (when due): touch it, and register again if it expired or
    /// is somebody else's now. Returns the registration to keep.
    pub(super) async fn refresh(
        self,
        conn: &mut Conn,
        keys: &Keys,
        owner: &str,
        budget: Duration,
    ) -> Result<Option<Registration>, Failure> {
        if BootInstant::now().saturating_since(self.refreshed) < REFRESH_EVERY {
            return Ok(Some(self));
        }
        let sent = BootInstant::now();
        let reply = conn
            .one(&mg(&self.key, &format!("v c T{REGISTRATION_TTL}")), budget)
            .await?;
        if reply.value.as_deref() == Some(owner.as_bytes()) {
            return Ok(Some(Registration {
                cas: reply.cas(),
                epoch: conn.epoch,
                refreshed: sent,
                ..self
            }));
        }
        register(conn, keys, owner, 0, budget).await
    }

    /// Remove the registration (best effort: it expires by itself otherwise).
    pub(super) async fn leave(self, conn: &mut Conn, owner: &str, budget: Duration) {
        let cas = match self.cas {
            Some(cas) if self.epoch == conn.epoch => Some(cas),
            _ => match conn.one(&mg(&self.key, "v c"), budget).await {
                Ok(reply) if reply.value.as_deref() == Some(owner.as_bytes()) => reply.cas(),
                _ => None,
            },
        };
        if let Some(cas) = cas {
            let _ = conn.one(&md(&self.key, &format!("C{cas}")), budget).await;
        }
    }
}

/// Leave `registration` if there is one.
pub(super) async fn leave(
    registration: &mut Option<Registration>,
    conn: &mut Conn,
    owner: &str,
    budget: Duration,
) {
    if let Some(registration) = registration.take() {
        registration.leave(conn, owner, budget).await;
    }
}
