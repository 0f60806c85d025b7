//! `?replicas=N`: before the command starts, `WAIT` until N replicas have the hold, so that a
//! failover to one of them keeps it. Asynchronous replication otherwise gives no such promise:
//! a hold taken just before the master fails may never reach the replica that is promoted, and
//! a waiter may then be granted the lock there while the first holder runs (until its next
//! renewal finds the hold missing, see the README's Sentinel section).

use crate::error::Error;

use super::super::conn::Conn;

/// After a grant on `conn` (the connection that ran the acquire script: `WAIT` counts the
/// writes of this connection): wait for the replicas the URL asks for. An error means the
/// command must not start; the caller gives the lock back.
pub(in crate::backend::redis) async fn acknowledged(conn: &mut Conn) -> Result<(), Error> {
    let Some(locator) = conn.sentinel.as_ref() else {
        return Ok(());
    };
    let (wanted, timeout) = (locator.replicas, locator.replicas_timeout);
    if wanted == 0 {
        return Ok(());
    }
    let display = locator.display.clone();
    let mut command = redis::cmd("WAIT");
    command.arg(wanted).arg(timeout.as_millis() as u64);
    let budget = timeout + super::ASK_TIMEOUT;
    let acknowledged: i64 = conn
        .query(&command, budget)
        .await
        .map_err(|f| f.into_error(&display))?;
    if acknowledged < i64::from(wanted) {
        return Err(Error::Unavailable(format!(
            "{display}: only {acknowledged} of the {wanted} replicas asked for (replicas={wanted}) \
             acknowledged the hold within {}; the lock was given back and the command not \
             started (a failover could lose this hold)",
            humantime::format_duration(timeout)
        )));
    }
    Ok(())
}
