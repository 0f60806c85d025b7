//! Waiting in the queue: on the watch that [`Target`] describes, until something before our
//! key changes, the hold's lease or our place is lost, `--wait` runs out or a cancel comes.

use std::ops::ControlFlow;
use std::time::Duration;

use etcd_client::{WatchResponse, WatchStream};

use super::{bounded, Acquisition};
use crate::backend::etcd::lease::{place_lost, waiter_gone};
use crate::backend::etcd::recheck::recheck;
use crate::backend::etcd::watch::{Seen, Target, Wake};
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;

/// Waiting: on the watch that [`Target`] describes, until something before us changes.
impl Acquisition<'_> {
    /// Wait for the target to change.
    ///
    /// The watch starts at the current revision, not at `read_at + 1`: etcd serves a watch
    /// that starts in the past from a catch-up loop that runs every 100 ms, which under
    /// contention (other waiters writing meanwhile) delayed hand-offs by up to 100 ms. If the
    /// store moved past `read_at` before the watch was set up (on a busy cluster it usually
    /// has: revisions are cluster-wide), a deletion may have fallen in between, so the waiter
    /// re-checks once, after the watch exists. If the watch still covers what the waiter
    /// waits for, it goes on waiting on it; events up to the re-check's revision are already
    /// counted in, and are skipped.
    pub(super) async fn wait_for(
        &mut self,
        my_rev: i64,
        mut read_at: i64,
        mut target: Target,
    ) -> Result<Wake, Error> {
        let own = self.key.clone().into_bytes();
        // A semaphore waiter also re-checks every TTL, in case a wake-up was lost.
        let recheck_at = (self.limit > 1).then(|| BootInstant::now() + self.request.ttl);
        let Some(mut stream) = self.open_watch(&target).await? else {
            return Ok(Wake::TimedOut);
        };
        let mut created = false;
        loop {
            let response = match self.next_response(&mut stream, recheck_at).await? {
                ControlFlow::Continue(response) => response,
                ControlFlow::Break(wake) => return Ok(wake),
            };
            if response.canceled() {
                let reason = response.cancel_reason();
                if reason.contains("permission denied") || reason.contains("PermissionDenied") {
                    return Err(Error::Permission(format!(
                        "etcd refused to watch {}: {reason}",
                        self.pfx
                    )));
                }
                return Ok(Wake::Changed);
            }
            let reread = if response.created() {
                created = true;
                crate::lock::queued(self.request);
                // The watch started after `read_at`: read again, now that it exists.
                response.header().map_or(0, |h| h.revision()) != read_at
            } else if !created {
                // etcd announces a watch before its events; anything else: start over.
                return Ok(Wake::Changed);
            } else {
                match target.first_event(&response, &own, read_at) {
                    (Seen::Own, _) => return Err(place_lost()),
                    // Our key existed at the holder's deletion (not necessarily at the
                    // response's header revision, which can be later).
                    (Seen::Holder, at) => {
                        tracing::debug!(target: crate::logging::HANDOFF, "woken");
                        return Ok(Wake::Head(Box::new(stream), at));
                    }
                    (Seen::Watched, _) if self.limit > 1 => return Ok(Wake::Changed),
                    (Seen::Watched, _) => true,
                    (Seen::Other, _) => false,
                }
            };
            if !reread {
                continue;
            }
            let reread = recheck(self.conn, &self.key, &self.pfx, my_rev, self.waits());
            let Some((older, at)) = bounded(&self.request.budget, self.cancel, reread).await?
            else {
                return Ok(Wake::TimedOut);
            };
            let next = Target::for_waiter(&older, self.limit);
            if older.len() < self.limit || !target.covers(&next) {
                return Ok(Wake::Rechecked(older, at));
            }
            target = next;
            read_at = at;
        }
    }

    /// Open the watch for `target` (`None`: `--wait` ran out first).
    async fn open_watch(&mut self, target: &Target) -> Result<Option<WatchStream>, Error> {
        let (watch_key, options) = target.watch(self.key.as_bytes(), &self.pfx);
        let open = self.conn.call(OP_TIMEOUT, |mut c| {
            let key = watch_key.clone();
            let options = options.clone();
            async move { c.watch(key, Some(options)).await }
        });
        bounded(&self.request.budget, self.cancel, open).await
    }

    /// The next response on the watch (`Break`: a reason to stop waiting came first).
    async fn next_response(
        &mut self,
        stream: &mut WatchStream,
        recheck_at: Option<BootInstant>,
    ) -> Result<ControlFlow<Wake, WatchResponse>, Error> {
        let deadline = self.request.budget.deadline();
        loop {
            let wake = sleep_until(match (deadline, recheck_at) {
                (Some(d), Some(r)) => d.min(r),
                (Some(d), None) => d,
                (None, Some(r)) => r,
                (None, None) => BootInstant::now() + Duration::from_secs(3600),
            });
            tokio::select! {
                // A lease the keeper has given up on wins over an event that came with it.
                biased;
                lost = self.keeper.lost() => {
                    return Err(Error::Unavailable(format!(
                        "the etcd lease to hold the lock on was lost while waiting ({}); \
                         the command was not started",
                        lost.reason
                    )));
                }
                // Our key went with it.
                () = waiter_gone(self.waiter) => return Err(place_lost()),
                message = stream.message() => return Ok(match message {
                    Ok(Some(response)) => ControlFlow::Continue(response),
                    // The stream broke: re-check and watch again.
                    Ok(None) | Err(_) => ControlFlow::Break(Wake::Changed),
                }),
                _ = self.cancel.cancelled() => return Err(Error::Cancelled),
                _ = wake => {
                    if deadline.is_some_and(|d| BootInstant::now() >= d) {
                        return Ok(ControlFlow::Break(Wake::TimedOut));
                    }
                    if recheck_at.is_some_and(|r| BootInstant::now() >= r) {
                        return Ok(ControlFlow::Break(Wake::Changed));
                    }
                }
            }
        }
    }
}
