//! The memory of a round that found no majority, so that a connect right after it (the acquire
//! call's retries, the withdrawal after it) fails the same way at once instead of waiting on the
//! silent sentinels again.

use crate::clock::BootInstant;
use crate::error::Error;

use super::ASK_TIMEOUT;

/// The last time no majority of a set of sentinels named a master while connecting: the key
/// ([`Locator::key`](super::Locator::key)), when, and what was said.
static NO_MAJORITY: std::sync::Mutex<Option<(String, BootInstant, String)>> =
    std::sync::Mutex::new(None);

/// A connect within [`ASK_TIMEOUT`] of a round that found no majority (the acquire call's
/// retries, the withdrawal after it) fails the same way at once instead of asking again:
/// the round itself waited up to [`ASK_TIMEOUT`] for the silent sentinels, and asking them
/// again at once would only make the run take that long again, past `--wait`.
pub(super) fn recent_failure(key: &str) -> Option<Error> {
    let last = NO_MAJORITY.lock().ok()?;
    match last.as_ref() {
        Some((k, at, message))
            if k == key && BootInstant::now().saturating_since(*at) < ASK_TIMEOUT =>
        {
            Some(Error::Unavailable(message.clone()))
        }
        _ => None,
    }
}

/// Remembers a round that did not finish (dropped by its caller's timeout) as one that found
/// no majority: the key and what to say.
pub(super) struct CutOff(pub(super) Option<(String, String)>);

impl Drop for CutOff {
    fn drop(&mut self) {
        if let Some((key, message)) = self.0.take() {
            remember_failure(key, &Error::Unavailable(message));
        }
    }
}

pub(super) fn remember_failure(key: String, error: &Error) {
    if let (Error::Unavailable(message), Ok(mut last)) = (error, NO_MAJORITY.lock()) {
        *last = Some((key, BootInstant::now(), message.clone()));
    }
}
