//! Taking a lock: a free slot taken in one write, else a place in line and a watch.
//!
//! - **One write** when the lock looks free (`--limit 1`, and no process of this host ahead
//!   at the server): create the slot's key, only if it has no live value.
//! - **A place in line**: the waiter's key `P.NAME.w.ID`, created with a short TTL
//!   ([`WAITER_TTL`]) and rewritten every [`WAITER_RENEW`] while it waits, so that a killed
//!   waiter's key expires within seconds; its place is the revision of its first write (kept
//!   in its value across rewrites). The keys of a lock are watched (the last entry of each,
//!   then every change, in the stream's order): once the watch has delivered our own key, it
//!   has delivered every key written before it, so the waiters ahead of us are exactly the
//!   older waiters' keys it shows. A waiter with fewer waiters ahead than free slots creates
//!   a free slot's key (conditional on the revision it saw: two waiters never both take one).
//! - Markers: a release purges the slot's key and an expired key leaves the server's marker;
//!   the watch delivers both, and a waiter decides again. A re-read every
//!   [`RE_READ`] of silence is the backstop for a marker that never came (a bucket whose
//!   markers were turned off after dlock checked it).

use std::collections::BTreeMap;
use std::time::Duration;

use super::conn::{Conn, Found, Watch, Write};
use super::keys::{Keys, Role, Stored};
use super::lease::{Held, NatsLease};
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::kit::backoff::Backoff;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{AcquireRequest, Cancel, Holder, LockName};

/// A waiter's key expires this long after its last rewrite (whole seconds: the server's
/// per-key TTLs are).
pub(super) const WAITER_TTL: Duration = Duration::from_secs(2);
/// How often a waiter rewrites its key: four times per TTL, so one lost rewrite never
/// costs it its place.
const WAITER_RENEW: Duration = Duration::from_millis(500);
/// The longest a waiter trusts its watch without news before it reads the keys again.
const RE_READ: Duration = Duration::from_secs(5);
/// How long a waiter that did not get the lock tries to remove its key (else it expires
/// within [`WAITER_TTL`]).
const GIVE_BACK: Duration = Duration::from_secs(1);
/// What an exchange at the very end of `--wait` may add to it.
pub(super) const WAIT_GRACE: Duration = Duration::from_millis(300);

/// A lock's keys as one read (or a watch so far) shows them.
#[derive(Default)]
pub(super) struct View {
    /// Each key's last entry, markers included (their revisions are what a create expects).
    pub(super) entries: BTreeMap<String, Found>,
}

impl View {
    /// A key's entry, unless a later one of it is known already (a read that completed a
    /// watch's first delivery may be ahead of the watch).
    pub(super) fn add(&mut self, found: Found) {
        match self.entries.get(&found.key) {
            Some(known) if known.revision > found.revision => {}
            _ => {
                self.entries.insert(found.key.clone(), found);
            }
        }
    }

    /// The live slots: slot, revision, value.
    pub(super) fn holders<'a>(
        &'a self,
        keys: &'a Keys,
    ) -> impl Iterator<Item = (u32, &'a Found, &'a Stored)> + 'a {
        self.entries.values().filter_map(move |found| {
            let (_, Role::Slot(slot)) = keys.parse(&found.key)? else {
                return None;
            };
            let value = found.value.as_ref().filter(|_| found.live)?;
            Some((slot, found, value))
        })
    }

    /// The live waiters that hold no slot, in arrival order: arrival, value.
    pub(super) fn waiters<'a>(&'a self, keys: &'a Keys) -> Vec<(u64, &'a Stored)> {
        let holding: Vec<&str> = self.holders(keys).map(|(_, _, v)| v.id.as_str()).collect();
        let mut waiters: Vec<(u64, &Stored)> = self
            .entries
            .values()
            .filter_map(|found| {
                let (_, Role::Waiter(_)) = keys.parse(&found.key)? else {
                    return None;
                };
                let value = found.value.as_ref().filter(|_| found.live)?;
                let arrival = if value.arrival == 0 {
                    found.revision
                } else {
                    value.arrival
                };
                Some((arrival, value))
            })
            .filter(|(_, value)| !holding.contains(&value.id.as_str()))
            .collect();
        waiters.sort_by_key(|(arrival, _)| *arrival);
        waiters
    }

    /// The holders as `status` and the busy line name them, each with its token.
    pub(super) fn holder_list(&self, keys: &Keys) -> Vec<Holder> {
        self.holders(keys)
            .map(|(_, found, value)| holder_of(found, value))
            .collect()
    }
}

/// A slot's holder with its token: the revision of the slot's creation, which the holder
/// writes into its value at its first renewal (until then the key's revision is it).
pub(super) fn holder_of(found: &Found, value: &Stored) -> Holder {
    let mut holder = value.holder.clone();
    if holder.token == 0 {
        holder.token = found.revision;
    }
    holder
}

/// One acquisition.
pub(super) struct Acquisition<'a> {
    pub(super) conn: &'a Conn,
    pub(super) keys: &'a Keys,
    pub(super) request: &'a AcquireRequest,
    pub(super) id: String,
}

impl Acquisition<'_> {
    fn name(&self) -> &LockName {
        &self.request.name
    }

    /// What this run writes into a slot or its waiter's key.
    fn value(&self, arrival: u64) -> Stored {
        let mut holder = self.request.holder.clone();
        holder.limit = self.request.limit;
        holder.token = 0;
        Stored {
            holder,
            id: self.id.clone(),
            arrival,
        }
    }

    /// The time one exchange may take while waiting (at most until `--wait` + a grace).
    fn call(&self) -> Duration {
        self.request.budget.share(OP_TIMEOUT, WAIT_GRACE)
    }

    /// Try to take `slot` (its key last seen at `hint`): the lease, or `None` when someone
    /// else has it.
    async fn take(&self, slot: u32, hint: u64) -> Result<Option<NatsLease>, Error> {
        let key = self.keys.slot(self.name(), slot);
        let mut value = self.value(0);
        value.holder.granted_now();
        let sent = BootInstant::now();
        let ttl = self.request.ttl;
        match self
            .conn
            .create(&key, hint, ttl, &value, self.call())
            .await?
        {
            Write::Conflict => Ok(None),
            Write::Done(revision) => {
                tracing::debug!(target: crate::logging::HANDOFF, "granted");
                value.holder.token = revision;
                let held = Held {
                    conn: self.conn.clone(),
                    key,
                    revision,
                    value,
                    ttl,
                };
                let lease =
                    NatsLease::grant(held, self.name(), sent, self.request.kill_after).await?;
                Ok(Some(lease))
            }
        }
    }

    /// The whole acquisition.
    pub(super) async fn run(&self, mut cancel: Cancel) -> Result<NatsLease, Error> {
        let budget = &self.request.budget;
        if self.request.limit == 1 && !self.request.likely_held {
            if let Some(lease) = self.take(0, 0).await? {
                return Ok(lease);
            }
        }
        if budget.is_no_wait() {
            let view = self.read().await?;
            if let Some(lease) = self.try_free(&view, None).await? {
                return Ok(lease);
            }
            return Err(self.busy(&view, None));
        }
        let waiter_key = self.keys.waiter(self.name(), &self.id);
        let arrival = match self
            .conn
            .create(&waiter_key, 0, WAITER_TTL, &self.value(0), self.call())
            .await?
        {
            Write::Done(revision) => revision,
            Write::Conflict => {
                return Err(Error::Internal(
                    "a new waiter's key was taken already".into(),
                ))
            }
        };
        let keeper = tokio::spawn(keep_waiting(
            self.conn.clone(),
            waiter_key.clone(),
            self.value(arrival),
            arrival,
        ));
        crate::lock::queued(self.request);
        let outcome = tokio::select! {
            outcome = self.wait(arrival) => outcome,
            () = cancel.cancelled() => Err(Error::Cancelled),
        };
        keeper.abort();
        // The waiter's key goes at once (a grant's too, beside the command's start); a
        // removal that fails leaves it to its TTL.
        let conn = self.conn.clone();
        let leave = async move {
            let _ = conn.remove(&waiter_key, None, GIVE_BACK).await;
        };
        match outcome {
            Ok(lease) => {
                tokio::spawn(leave);
                Ok(lease)
            }
            Err(e) => {
                leave.await;
                Err(e)
            }
        }
    }

    /// Read the lock's keys once.
    async fn read(&self) -> Result<View, Error> {
        let mut view = View::default();
        for found in self
            .conn
            .read(&self.keys.of_lock(self.name()), self.call())
            .await?
        {
            view.add(found);
        }
        Ok(view)
    }

    /// The holders agree on `--limit`; a slot is ours to try when fewer waiters are ahead
    /// (`arrival`: ours; `None`: not in line, so every waiter is ahead) than slots are free.
    async fn try_free(
        &self,
        view: &View,
        arrival: Option<u64>,
    ) -> Result<Option<NatsLease>, Error> {
        for (_, _, value) in view.holders(self.keys) {
            crate::kit::limit::agrees(self.name(), self.request.limit, value.holder.limit)?;
        }
        let taken: Vec<u32> = view.holders(self.keys).map(|(slot, _, _)| slot).collect();
        let free: Vec<u32> = (0..self.request.limit)
            .filter(|slot| !taken.contains(slot))
            .collect();
        let ahead = view
            .waiters(self.keys)
            .iter()
            .filter(|(their, value)| {
                value.id != self.id && arrival.is_none_or(|ours| *their < ours)
            })
            .count();
        let Some(&slot) = free.get(ahead) else {
            return Ok(None);
        };
        let hint = view
            .entries
            .get(&self.keys.slot(self.name(), slot))
            .map_or(0, |found| found.revision);
        self.take(slot, hint).await
    }

    /// The busy error: who holds it, how many wait ahead.
    fn busy(&self, view: &View, arrival: Option<u64>) -> Error {
        let holders = view.holder_list(self.keys);
        let ahead = view
            .waiters(self.keys)
            .iter()
            .filter(|(their, value)| {
                value.id != self.id && arrival.is_none_or(|ours| *their < ours)
            })
            .count();
        let state = crate::wording::busy_state(&holders, ahead);
        crate::wording::not_acquired(self.name(), &state, self.request.budget.wait())
    }

    /// Wait in line (our key written at `arrival`) until a slot is ours or `--wait` ends.
    async fn wait(&self, arrival: u64) -> Result<NatsLease, Error> {
        let budget = &self.request.budget;
        let mut retries = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut view = View::default();
        loop {
            let mut watch = match self
                .conn
                .watch(&self.keys.of_lock(self.name()), self.call())
                .await
            {
                Ok(watch) => watch,
                Err(e @ Error::Unavailable(_)) => {
                    self.pause_after(e, &view, arrival, &mut retries).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            view = View::default();
            let followed = self.follow(&mut watch, &mut view).await;
            match followed {
                Ok(Some(lease)) => {
                    // Beside the command's start.
                    tokio::spawn(watch.close());
                    return Ok(lease);
                }
                Ok(None) => watch.close().await,
                Err(e @ Error::Unavailable(_)) => {
                    watch.close().await;
                    self.pause_after(e, &view, arrival, &mut retries).await?
                }
                Err(e) => {
                    watch.close().await;
                    return Err(e);
                }
            }
            if budget.is_over() {
                return Err(self.busy(&view, Some(arrival)));
            }
        }
    }

    /// After a failed watch: the failure once `--wait` is over, else a pause.
    async fn pause_after(
        &self,
        e: Error,
        view: &View,
        arrival: u64,
        retries: &mut Backoff,
    ) -> Result<(), Error> {
        let budget = &self.request.budget;
        if budget.is_over() {
            if view.entries.is_empty() {
                return Err(e);
            }
            return Err(self.busy(view, Some(arrival)));
        }
        tracing::debug!("the watch failed, watching again: {e}");
        let mut pause = retries.next_delay();
        if let Some(left) = budget.left() {
            pause = pause.min(left);
        }
        tokio::time::sleep(pause).await;
        Ok(())
    }

    /// Follow one watch: decide at every change once our key was seen; `None` when the
    /// watch was quiet for [`RE_READ`] or `--wait` ended.
    async fn follow(&self, watch: &mut Watch, view: &mut View) -> Result<Option<NatsLease>, Error> {
        let budget = &self.request.budget;
        let own = self.keys.waiter(self.name(), &self.id);
        let filter = self.keys.of_lock(self.name());
        let mut completed = false;
        loop {
            if watch.pending == 0 && !completed {
                // What the first delivery may have left out (`Conn::complete`).
                let mut found: Vec<Found> = view.entries.values().cloned().collect();
                let known = found.len();
                self.conn.complete(&filter, &mut found, self.call()).await?;
                for entry in found.drain(known..) {
                    view.add(entry);
                }
                completed = true;
            }
            // Our place as the watch shows it (a key rewritten after it expired has a later
            // one than the first).
            let ours = view.entries.get(&own).and_then(|found| {
                let value = found.value.as_ref().filter(|_| found.live)?;
                Some(if value.arrival == 0 {
                    found.revision
                } else {
                    value.arrival
                })
            });
            if let (0, Some(ours)) = (watch.pending, ours) {
                if let Some(lease) = self.try_free(view, Some(ours)).await? {
                    return Ok(Some(lease));
                }
            }
            let quiet = BootInstant::now() + RE_READ;
            let end = budget.deadline().map_or(quiet, |d| d.min(quiet));
            tokio::select! {
                found = watch.next() => {
                    let found = found?;
                    if watch.pending == 0 && ours.is_some() && !found.live {
                        tracing::debug!(target: crate::logging::HANDOFF, "woken");
                    }
                    view.add(found);
                }
                () = sleep_until(end) => return Ok(None),
            }
        }
    }
}

/// Rewrite a waiter's key every [`WAITER_RENEW`] so that it does not expire while the waiter
/// lives (aborted when the wait ends). A key found gone (the waiter was stopped past its
/// TTL) is written again: a new place at the end of the line.
async fn keep_waiting(conn: Conn, key: String, mut value: Stored, mut revision: u64) {
    loop {
        tokio::time::sleep(WAITER_RENEW).await;
        match conn
            .write(&key, revision, WAITER_TTL, &value, OP_TIMEOUT)
            .await
        {
            Ok(Write::Done(next)) => revision = next,
            Ok(Write::Conflict) => match conn.last(&key, OP_TIMEOUT).await {
                // A rewrite of ours whose answer was lost took effect.
                Ok(Some(found)) if found.live => revision = found.revision,
                Ok(_) => {
                    value.arrival = 0;
                    if let Ok(Write::Done(next)) =
                        conn.create(&key, 0, WAITER_TTL, &value, OP_TIMEOUT).await
                    {
                        value.arrival = next;
                        revision = next;
                    }
                }
                Err(e) => tracing::debug!("a waiter's key could not be read: {e}"),
            },
            Err(e) => tracing::debug!("a waiter's rewrite failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: String, revision: u64, value: Option<(&str, u64)>) -> Found {
        Found {
            key,
            revision,
            live: value.is_some(),
            value: value.map(|(id, arrival)| Stored {
                holder: Holder::default(),
                id: id.to_owned(),
                arrival,
            }),
        }
    }

    /// Waiters are in the order of their first write (kept across rewrites), a waiter that
    /// holds a slot already is no longer waiting, and markers count for nobody.
    #[test]
    fn waiters_line_up_by_their_first_revision() {
        let keys = Keys::new("p");
        let name = LockName::new("job").unwrap();
        let mut view = View::default();
        view.add(entry(keys.slot(&name, 0), 40, Some(("a", 0))));
        view.add(entry(keys.slot(&name, 1), 45, None));
        view.add(entry(keys.waiter(&name, "a"), 12, Some(("a", 0))));
        // b wrote first at 20 and was rewritten at 50.
        view.add(entry(keys.waiter(&name, "b"), 50, Some(("b", 20))));
        view.add(entry(keys.waiter(&name, "c"), 30, Some(("c", 0))));
        view.add(entry(keys.waiter(&name, "d"), 35, None));
        let holders: Vec<u32> = view.holders(&keys).map(|(slot, _, _)| slot).collect();
        assert_eq!(holders, vec![0]);
        let waiters: Vec<(u64, &str)> = view
            .waiters(&keys)
            .into_iter()
            .map(|(arrival, value)| (arrival, value.id.as_str()))
            .collect();
        assert_eq!(waiters, vec![(20, "b"), (30, "c")]);
    }

    /// A holder's token is the revision of its slot's creation: the key's revision until its
    /// first renewal writes the token into its value.
    #[test]
    fn a_holders_token_is_its_slots_first_revision() {
        let found = entry("p.job.h.0".into(), 70, Some(("a", 0)));
        let Some(value) = found.value.clone() else {
            panic!()
        };
        assert_eq!(holder_of(&found, &value).token, 70);
        let mut renewed = value;
        renewed.holder.token = 70;
        let later = entry("p.job.h.0".into(), 90, Some(("a", 0)));
        assert_eq!(holder_of(&later, &renewed).token, 70);
    }
}
