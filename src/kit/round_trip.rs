//! `check`'s measurement of a server's round trip, the same on every network backend.

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;

/// The median of `count` timed round trips of `probe` (for `check`).
pub async fn median_round_trip(
    count: usize,
    mut probe: impl AsyncFnMut() -> Result<(), Error>,
) -> Result<Duration, Error> {
    let mut times = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let sent = BootInstant::now();
        probe().await?;
        times.push(BootInstant::now().saturating_since(sent));
    }
    times.sort();
    Ok(times[times.len() / 2])
}
