//! Redis behind Sentinel: where the master is, asked of the sentinels at every connect and at
//! every renewal, so that a hold is only ever taken and renewed on the master that a majority
//! of the sentinels name now.
//!
//! Why not only at connect (the client guideline) and `ROLE`: after `SENTINEL FAILOVER` the old
//! master keeps answering `ROLE` with `master` and keeps accepting writes for seconds (about
//! 10 s measured with Redis 7.0.15 on loopback) until the sentinels reconfigure it. A holder
//! that kept renewing there would see its renewals succeed while its hold runs out on the new
//! master, where the waiters now are: two holders. And why a majority, not the one sentinel
//! that answers: a sentinel cut off with the old master (a partition, a stopped process) goes
//! on naming it, and a client that reaches only that sentinel would take the lock there while
//! another client holds it on the new master. So:
//!
//! - the distinct sentinels of the URL are asked at once (`SENTINEL MASTER <name>`, each
//!   bounded by [`ASK_TIMEOUT`](super::topology::ASK_TIMEOUT)); entries whose names resolve to a common address
//!   (IPv4-mapped IPv6 counted as IPv4) are one sentinel, asked once and counted once, and
//!   answers with one run id (`SENTINEL MYID`: one sentinel reached at `127.0.0.1` and at
//!   `::1`) are one vote;
//! - the group is as large as the sentinels know it (`num-other-sentinels` + 1, the largest
//!   any of them reports), and never smaller than the URL's distinct sentinels. When the URL
//!   lists fewer than a majority of it (one sentinel, say), the others the answers name
//!   (`SENTINEL SENTINELS <name>`) are asked too, in that round and the next ones: a URL that
//!   lists a majority is the user's choice of whom to ask, one that lists fewer could never
//!   reach one. A master counts only when a majority of that group names it ([`Round::agreed`](super::topology::Round::agreed)). The asking stops
//!   as soon as one does (a black-holed sentinel costs nothing then); fewer is "unavailable"
//!   (69), for a grant and for a renewal alike;
//! - a connection goes to that master, which must answer `ROLE` with `master`;
//! - a renewal ([`Locator::confirm`](super::topology::Locator::confirm), run by the lease's renewer before `renew.lua`) counts
//!   only when a majority names the master this connection is on. When they name another one,
//!   the connection moves there and the renewal runs on the new master: a hold that the
//!   failover carried over (it was replicated in time; `?replicas=N` makes sure) is kept, one
//!   that it lost is gone and the command is stopped (124), as on any loss;
//! - while a lock is held, a `+switch-master` subscription ([`watch`]) looks at the new
//!   master at once instead of at the next renewal;
//! - a waiter asks again at least every [`WAITER_RECHECK`], and before a grant counts: a place
//!   in line or a grant on a master the sentinels no longer name is taken again on the new
//!   one (a hold that the failover lost is then granted there once, not twice).
//!
//! The sentinels are never used for locks, nor are replicas: only master-side commands go to
//! the master.
//!
//! The asking itself (the sentinels, one round of answers, the connection to the master they
//! name) is the `Locator` in `topology/`, which a `Conn` keeps and asks at every connect; this
//! folder acts on a `Conn` from above: a renewal's and a waiter's checks, `+switch-master`,
//! `?replicas=N` and `check`.

pub(super) mod check;
pub(super) mod replicas;
pub(super) mod watch;

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;

use super::conn::Conn;

/// How often a waiter asks the sentinels whether the master moved.
pub(super) const WAITER_RECHECK: Duration = Duration::from_secs(1);
/// A grant counts without asking again when a majority of the sentinels named its master
/// this recently. Asking again could only tell something new if a majority had learnt of a
/// failover meanwhile, and a sentinel learns of one from the others' hello messages, which
/// they send every 2 s: 100 ms is far inside that, and it saves every uncontended run a
/// second round to the sentinels.
pub(super) const FRESH: Duration = Duration::from_millis(100);

/// Before a renewal on `conn`: confirm that the sentinels name its master now, or move it to
/// the one they name (the renewal then finds there whether the hold survived the failover).
/// Nothing to do when `conn` is not behind Sentinel.
pub(super) async fn confirm(conn: &mut Conn) -> Result<(), String> {
    moved(conn, Duration::ZERO).await.map(drop)
}

/// A waiter's checks of the sentinels on `conn` end by `deadline` (its server's time to
/// answer: `--wait`, but at least [`crate::budget::MIN_ANSWER`]).
pub(super) fn bound(conn: &mut Conn, deadline: Option<BootInstant>) {
    if let Some(locator) = conn.sentinel.as_mut() {
        locator.deadline = deadline;
    }
}

/// For a waiter, after each acquire step (`granted`: the step granted the lock): has the
/// master moved? A grant is checked unless a majority named its master within [`FRESH`], a
/// place in line every [`WAITER_RECHECK`].
pub(super) async fn follow(conn: &mut Conn, granted: bool) -> Result<bool, Error> {
    let max_age = if granted { FRESH } else { WAITER_RECHECK };
    let moved = moved(conn, max_age).await.map_err(Error::Unavailable)?;
    if granted && !moved {
        // The wait is over: from now on this connection keeps a hold, on the keeper's budget.
        bound(conn, None);
    }
    Ok(moved)
}

/// Has the master moved since the sentinels were last asked for `conn`? They are asked again
/// unless that was less than `max_age` ago; when it moved, `conn` reconnects to the new one.
/// `Ok(false)` when `conn` is not behind Sentinel.
pub(super) async fn moved(conn: &mut Conn, max_age: Duration) -> Result<bool, String> {
    let Some(locator) = conn.sentinel.as_mut() else {
        return Ok(false);
    };
    if !max_age.is_zero()
        && locator
            .asked
            .is_some_and(|at| BootInstant::now().saturating_since(at) < max_age)
    {
        return Ok(false);
    }
    let moved = locator.confirm().await?;
    if moved {
        conn.reconnect();
    }
    Ok(moved)
}
