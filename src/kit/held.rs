//! What `list` and the not-acquired message say about held locks, the same on every backend.

use std::time::Duration;

use crate::error::Error;
use crate::kit::backoff::Backoff;
use crate::lock::{AcquireRequest, Holder, LockName, LockStatus};

/// The held locks among `names` (sorted, each once), as `list` shows them: `status` is asked
/// for each, and an error ends the listing. (A backend that can tell a lock with bad data from
/// a failing server reports the bad lock and answers "free" for it, so that one bad lock
/// never hides the others.)
pub async fn list_held(
    mut names: Vec<LockName>,
    mut status: impl AsyncFnMut(&LockName) -> Result<LockStatus, Error>,
) -> Result<Vec<LockStatus>, Error> {
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    let mut held = Vec::new();
    for name in &names {
        let lock = status(name).await?;
        if lock.held {
            held.push(lock);
        }
    }
    Ok(held)
}

/// Why a lock cannot be had, for the not-acquired message, from the queue ahead of the
/// waiter: `holders` (who holds it) and `waiting` (waiters ahead that do not hold it yet).
/// The words are [`crate::wording::busy_state`]'s, the same on every backend.
pub fn busy_reason(holders: Vec<Holder>, waiting: usize) -> String {
    crate::wording::busy_state(&holders, waiting)
}

/// A polling waiter's refusal of a lock held by `holders` (they are named) because `why_not`.
pub fn busy(name: &LockName, holders: Vec<Holder>, why_not: String) -> Error {
    Error::Busy(format!(
        "lock '{name}' {}; {why_not}",
        busy_reason(holders, 0)
    ))
}

/// For the backends whose waiters poll (the server notifies nobody): the refusal of a lock
/// held by `holders` that this run cannot wait for (`--no-wait`, `--wait` over), else the pause
/// before the next poll, no later than `--wait`'s end.
pub fn pause_before_next_poll(
    request: &AcquireRequest,
    holders: &[Holder],
    polls: &mut Backoff,
) -> Result<Duration, Error> {
    if request.budget.is_no_wait() {
        return Err(busy(
            &request.name,
            holders.to_vec(),
            "not waiting (--no-wait)".into(),
        ));
    }
    let mut pause = polls.next_delay();
    if let Some(left) = request.budget.left() {
        if left.is_zero() {
            let why = crate::wording::gave_up(request.budget.wait());
            return Err(busy(&request.name, holders.to_vec(), why));
        }
        pause = pause.min(left);
    }
    Ok(pause)
}
