//! Fencing tokens from memcached, which has neither a clock command nor durable counters.
//!
//! The lock's counter item `B:f` (no TTL) holds the last token handed out. The next token is
//! `max(last + 1, now in µs since 1970 on the taker's clock)`, written with a
//! compare-and-swap on the item's CAS value, so two takers never get the same token and each
//! token is larger than every earlier one *while the item lives*. The token is taken after the
//! holder slot is won, so a holder's token is larger than that of whoever held the slot
//! before it (who took its token before releasing).
//!
//! When the counter is gone (a server restart, a flush, an eviction on a server run without
//! `-M`), the next token is the taker's clock in µs. It is still larger than the tokens before
//! the restart provided the taker's clock is ahead of the clocks of the earlier takers at the
//! time they took theirs: with clocks synchronised (NTP) to within the time the restart took,
//! tokens keep increasing. Clocks further apart than that can make the first token after a
//! restart smaller than the last one before it. While the counter lives, clock differences
//! do not matter: a client whose clock is behind gets `last + 1`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Error;

use super::client::{mg, ms, Conn};
use super::keys::{fence_value, parse_fence, Keys};

/// Compare-and-swap attempts before giving up (each loses only to another taker's success).
const ATTEMPTS: usize = 1000;

/// The client's clock in µs since 1970 (0 before 1970).
pub(super) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The next fencing token of the lock, recording `limit` beside it. When the previous taker
/// used another `--limit`, `agree(conn, theirs)` is asked first (it fails if holders with
/// that limit remain): a taker that does not agree never writes the counter, so the counter
/// always shows the limit of the holders, and a later taker with another limit checks.
pub(super) async fn next(
    conn: &mut Conn,
    keys: &Keys,
    limit: u32,
    budget: Duration,
    display: &str,
    mut agree: impl AsyncFnMut(&mut Conn, u32) -> Result<(), Error>,
) -> Result<u64, Error> {
    let key = keys.fence();
    for _ in 0..ATTEMPTS {
        let current = conn
            .one(&mg(&key, "v c"), budget)
            .await
            .map_err(|f| f.into_error(display))?;
        let now = now_micros();
        let request = if current.is("EN") {
            // No counter (never taken, or the server restarted): seed it from the clock.
            let token = now.max(1);
            (token, ms(&key, "ME T0", &fence_value(token, limit)))
        } else {
            let value = current.value.as_deref().unwrap_or_default();
            let Some((last, theirs)) = parse_fence(value) else {
                return Err(Error::Unavailable(format!(
                    "{display}: the key '{key}' holds data dlock did not write; remove it or use \
                     another --prefix"
                )));
            };
            let Some(cas) = current.cas() else {
                return Err(Error::Unavailable(format!(
                    "{display} returned no CAS value; dlock needs CAS enabled (do not run memcached with -C)"
                )));
            };
            let Some(token) = last.checked_add(1).map(|t| t.max(now)) else {
                return Err(Error::Unavailable(format!(
                    "{display}: the fencing counter '{key}' is exhausted"
                )));
            };
            if theirs != limit {
                agree(conn, theirs).await?;
            }
            (
                token,
                ms(&key, &format!("C{cas} T0"), &fence_value(token, limit)),
            )
        };
        let (token, request) = request;
        let stored = conn
            .one(&request, budget)
            .await
            .map_err(|f| f.into_error(display))?;
        if stored.is("HD") {
            return Ok(token);
        }
        // NS / EX / NF: another taker got in between; read again.
    }
    Err(Error::Unavailable(format!(
        "{display}: the fencing counter of this lock changed under {ATTEMPTS} attempts in a row"
    )))
}
