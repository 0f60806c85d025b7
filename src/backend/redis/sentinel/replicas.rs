//! `?replicas=N`: before the command starts, `WAIT` until N replicas have the hold, so that a
//! failover to one of them keeps it. Asynchronous replication otherwise gives no such promise:
//! a hold taken just before the master fails may never reach the replica that is promoted, and
//! a waiter may then be granted the lock there while the first holder runs (until its next
//! renewal finds the hold missing, see docs/backends/redis-sentinel.md).
//!
//! The `WAIT` lasts at most the lease's safety margin ([`Schedule::margin`], max(500 ms,
//! TTL/10)), whatever `replicas-timeout` says: a lease is counted from the moment the grant
//! was asked for, and time spent waiting for replicas is time the lease runs out while no
//! command runs. A grant that is old by the time the replicas acknowledged is confirmed by one
//! renewal before the command starts (`Renewer::confirm_grant`), as every grant is.

use std::time::Duration;

use crate::error::Error;
use crate::keeper::Schedule;

use super::super::conn::Conn;
use super::super::topology::ASK_TIMEOUT;

/// How long `WAIT` may block for a lease of `ttl`: `replicas-timeout`, capped at the lease's
/// safety margin.
pub(in crate::backend::redis) fn wait_for(replicas_timeout: Duration, ttl: Duration) -> Duration {
    replicas_timeout.min(Schedule::new(ttl, Duration::ZERO).margin())
}

/// After a grant on `conn` (the connection that ran the acquire script: `WAIT` counts the
/// writes of this connection) of a lease of `ttl`: wait for the replicas the URL asks for. An
/// error means the command must not start; the caller gives the lock back.
pub(in crate::backend::redis) async fn acknowledged(
    conn: &mut Conn,
    ttl: Duration,
) -> Result<(), Error> {
    let Some(locator) = conn.sentinel.as_ref() else {
        return Ok(());
    };
    let wanted = locator.replicas;
    if wanted == 0 {
        return Ok(());
    }
    let timeout = wait_for(locator.replicas_timeout, ttl);
    let capped = if timeout < locator.replicas_timeout {
        format!(
            " (replicas-timeout={} capped at the lease's safety margin, max(500ms, --ttl/10))",
            humantime::format_duration(locator.replicas_timeout)
        )
    } else {
        String::new()
    };
    let display = locator.display.clone();
    let mut command = redis::cmd("WAIT");
    command.arg(wanted).arg(timeout.as_millis() as u64);
    let budget = timeout + ASK_TIMEOUT;
    let acknowledged: i64 = conn
        .query(&command, budget)
        .await
        .map_err(|f| f.into_error(&display))?;
    if acknowledged < i64::from(wanted) {
        return Err(Error::Unavailable(format!(
            "{display}: only {acknowledged} of the {wanted} replicas asked for (replicas={wanted}) \
             acknowledged the hold within {}{capped}; the lock was given back and the command \
             not started (a failover could lose this hold)",
            humantime::format_duration(timeout)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_for_replicas_never_outlasts_the_lease_margin() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(wait_for(s(1), s(30)), s(1));
        assert_eq!(wait_for(s(5), s(30)), s(3));
        assert_eq!(wait_for(s(5), s(2)), ms(500));
        assert_eq!(wait_for(ms(200), s(2)), ms(200));
    }
}
