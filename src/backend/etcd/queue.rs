//! Taking a place in a lock's queue and waiting there until it is among the first
//! `--limit`, like etcd's `mutex.go`: creating our key, the linearizable re-check (in
//! `recheck`), the re-attach at the grant that moves our key from the waiter lease to the
//! hold lease, and the wait itself (in `waiting`) on the watch that `watch` chooses.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchStream,
};

use super::attach::{Attach, Move};
use super::conn::Conn;
use super::key::{is_reader, older_keys, oldest_key, same_limit, value_json, why_busy};
use super::lease::{place_lost, Renewer, WaiterLease, WAITER_TTL_S};
use super::own_key::OwnKey;
use super::readers;
use super::recheck::{reader_page, recheck, Waits};
use super::watch::{Target, Wake};
use crate::budget::WaitBudget;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::Keeper;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{AcquireRequest, Cancel};

mod waiting;

/// One acquisition: our key in the lock's queue, and everything it needs while it waits.
pub(super) struct Acquisition<'a> {
    pub(super) conn: &'a mut Conn,
    pub(super) request: &'a AcquireRequest,
    /// The lock's key prefix.
    pub(super) pfx: String,
    /// Our key: the prefix and the hold lease's id.
    pub(super) key: String,
    /// The hold lease.
    pub(super) hold: i64,
    /// `--limit`, at least 1.
    pub(super) limit: usize,
    /// The keeper of the hold lease: losing it while waiting ends the wait.
    pub(super) keeper: &'a mut Keeper<Renewer>,
    /// The waiter lease, once there is one (for the caller to clean up).
    pub(super) waiter: &'a mut Option<WaiterLease>,
    pub(super) cancel: &'a mut Cancel,
    /// The cluster, for messages.
    pub(super) display: &'a str,
}

/// What a holder takes over from its acquisition.
pub(super) struct Taken {
    /// Our key's create revision: the fencing token.
    pub(super) token: u64,
    /// The watch on our key.
    pub(super) own: OwnKey,
    /// The move of our key to the hold lease, when it runs beside the command.
    pub(super) attach: Option<Attach>,
}

/// Where our key stands in the queue.
struct Place {
    /// Our key's create revision (the fencing token).
    my_rev: i64,
    /// The keys before ours, newest first, at most limit+1.
    older: Vec<Vec<u8>>,
    /// The revision `older` was read at.
    read_at: i64,
    /// Our key is on the hold's lease (else on the waiter lease).
    attached: bool,
    /// A watch that covers our key, when the wait ended on one.
    watching: Option<WatchStream>,
}

impl Acquisition<'_> {
    /// Put our key in the queue and wait until it is among the first `limit`.
    pub(super) async fn queue_and_wait(mut self) -> Result<Taken, Error> {
        let held = value_json(self.request, false)?;
        let mut place = self.join(&held).await?;
        loop {
            if place.older.len() < self.limit {
                return self.take(place).await;
            }
            if self.request.budget.is_no_wait() {
                return Err(self.busy(true, "not waiting (--no-wait)").await);
            }
            let target = Target::for_waiter(&place.older, self.limit);
            // Checked here too: every round of the loop could otherwise end before the timer.
            let woken = if self.request.budget.is_over() {
                Wake::TimedOut
            } else {
                self.wait_for(place.my_rev, place.read_at, target).await?
            };
            let checked = match woken {
                Wake::Rechecked(older, at) => Some((older, at)),
                Wake::Head(stream, at) => {
                    place.older.clear();
                    place.read_at = at;
                    place.watching = Some(*stream);
                    continue;
                }
                Wake::TimedOut => None,
                Wake::Changed => {
                    let reread =
                        recheck(self.conn, &self.key, &self.pfx, place.my_rev, self.waits());
                    bounded(&self.request.budget, self.cancel, reread).await?
                }
            };
            let Some((older, at)) = checked else {
                let waited = crate::wording::gave_up(self.request.budget.wait());
                return Err(self.busy(true, &waited).await);
            };
            place.older = older;
            place.read_at = at;
        }
    }

    /// Take the lock if it has no key at all, or find our key (a retry after a lost reply),
    /// or take a place in the queue (at once, when the lock is [likely held](AcquireRequest::likely_held)).
    async fn join(&mut self, held: &str) -> Result<Place, Error> {
        if self.request.likely_held && !self.request.budget.is_no_wait() {
            // Another process of this host is at the server ahead of us: the lock is taken,
            // and trying to take it free would cost etcd a request for nothing. If it is
            // free after all, our key is the oldest and we hold it all the same.
            return self.enqueue().await;
        }
        // A lock without any key is taken in one step, with our key on the hold's lease.
        // (etcd compares every key of a range; an empty range compares as create revision 0.)
        let take_free = Txn::new()
            .when([Compare::create_revision(self.pfx.clone(), CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put(
                self.key.clone(),
                held,
                Some(PutOptions::new().with_lease(self.hold)),
            )])
            .or_else([
                // A retry after a lost reply finds our key.
                TxnOp::get(self.key.clone(), Some(GetOptions::new().with_keys_only())),
                TxnOp::get(self.pfx.clone(), Some(oldest_key())),
            ]);
        let response = self.txn(take_free).await?;
        let revision = response.header().map_or(0, |h| h.revision());
        if response.succeeded() {
            return Ok(Place::new(revision, Vec::new(), revision, true));
        }
        let ours = match response.op_responses().first() {
            Some(TxnOpResponse::Get(range)) => range
                .kvs()
                .first()
                .map(|kv| (kv.create_revision(), kv.lease() == self.hold)),
            _ => None,
        };
        let mut writer_holds = true;
        if let Some(TxnOpResponse::Get(oldest)) = response.op_responses().get(1) {
            same_limit(oldest.kvs(), self.request)?;
            writer_holds = oldest.kvs().first().is_none_or(|kv| !is_reader(kv.value()));
        }
        if let Some((my_rev, on_hold_lease)) = ours {
            let reread = recheck(self.conn, &self.key, &self.pfx, my_rev, self.waits());
            let (older, at) =
                answer(&self.request.budget, self.display, self.cancel, reread).await?;
            return Ok(Place::new(my_rev, older, at, on_hold_lease));
        }
        if self.request.budget.is_no_wait()
            && self.limit == 1
            && (writer_holds || !self.request.mode.is_shared())
        {
            // Someone is ahead: no need to queue to know that. (A reader ahead of a reader
            // may leave room for it: only the keys before ours can tell, unless a writer's
            // key is the oldest.)
            return Err(self.busy(false, "not waiting (--no-wait)").await);
        }
        self.enqueue().await
    }

    /// Take a place in the queue: our key on a short waiter lease of its own (module docs).
    async fn enqueue(&mut self) -> Result<Place, Error> {
        let sent = BootInstant::now();
        let grant = self.conn.call(OP_TIMEOUT, |mut c| async move {
            c.lease_grant(WAITER_TTL_S, None).await
        });
        let grant = answer(&self.request.budget, self.display, self.cancel, grant).await?;
        let granted = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(1));
        let lease = WaiterLease::start(self.conn.clone(), grant.id(), granted, sent);
        let lease = self.waiter.insert(lease).id;
        // Create our key if absent (a retry after a lost reply finds it) and read the newest
        // limit+2 keys: ours and the limit+1 just before it (as `recheck` reads them); a
        // reader reads a page of them with their values (`readers`).
        let key = self.key.as_str();
        let newest = match self.waits() {
            Waits::Any(limit) => older_keys(None, limit + 2),
            Waits::Writers => readers::older_with_values(None, 1),
        };
        let create = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key,
                    value_json(self.request, true)?,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(self.pfx.clone(), Some(newest)),
                // The oldest key's value says which --limit the holders use.
                TxnOp::get(self.pfx.clone(), Some(oldest_key())),
            ])
            .or_else([TxnOp::get(key, None)]);
        let response = self.txn(create).await?;
        let revision = response.header().map_or(0, |h| h.revision());
        if response.succeeded() {
            if let Some(TxnOpResponse::Get(oldest)) = response.op_responses().get(2) {
                same_limit(oldest.kvs(), self.request)?;
            }
            if self.waits() == Waits::Writers {
                return self.place_reader(&response, revision).await;
            }
            let older = match response.op_responses().get(1) {
                Some(TxnOpResponse::Get(range)) => range
                    .kvs()
                    .iter()
                    .filter(|kv| kv.create_revision() < revision)
                    .map(|kv| kv.key().to_vec())
                    .collect(),
                _ => Vec::new(),
            };
            return Ok(Place::new(revision, older, revision, false));
        }
        let own = match response.op_responses().first() {
            Some(TxnOpResponse::Get(range)) => range.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        };
        let Some(my_rev) = own else {
            return Err(Error::Internal(
                "our etcd key vanished right after it was created".into(),
            ));
        };
        // Re-read what is before us.
        let reread = recheck(self.conn, &self.key, &self.pfx, my_rev, self.waits());
        let (older, at) = answer(&self.request.budget, self.display, self.cancel, reread).await?;
        Ok(Place::new(my_rev, older, at, false))
    }

    /// Where a reader whose key was just created at `revision` stands, from the answer of
    /// [`Acquisition::enqueue`]'s transaction (its second and third operations).
    async fn place_reader(&mut self, created: &TxnResponse, revision: i64) -> Result<Place, Error> {
        let (first, oldest) = reader_page(created, 1, revision)?;
        let more =
            readers::nearest_writer(self.conn, &self.pfx, revision, first, oldest.as_deref());
        let (older, at) = match answer(&self.request.budget, self.display, self.cancel, more).await
        {
            Ok(older) => (older, revision),
            // The pages after the first could not be read at the first one's revision.
            Err(e) if readers::compacted(&e) => {
                let reread = recheck(self.conn, &self.key, &self.pfx, revision, Waits::Writers);
                answer(&self.request.budget, self.display, self.cancel, reread).await?
            }
            Err(e) => return Err(e),
        };
        Ok(Place::new(revision, older, at, false))
    }

    /// Which keys before ours keep us waiting.
    fn waits(&self) -> Waits {
        if self.request.mode.is_shared() {
            Waits::Writers
        } else {
            Waits::Any(self.limit)
        }
    }

    /// Our key is among the first `limit`: move it to the hold's lease if it is still on the
    /// waiter lease (while the command starts, where the waiter lease leaves room for it:
    /// [`super::attach`]), and hand over the token and the watch on our key.
    async fn take(self, place: Place) -> Result<Taken, Error> {
        let my_rev = place.my_rev;
        let token = u64::try_from(my_rev)
            .map_err(|_| Error::Internal(format!("negative revision {my_rev}")))?;
        let mut attach = None;
        if !place.attached {
            // For --limit > 1 the rewrite also wakes the waiter behind us (module docs).
            let target = Move {
                key: self.key.clone(),
                created: my_rev,
                hold: self.hold,
                value: value_json(self.request, false)?,
            };
            let waiter = self.waiter.take().ok_or_else(|| {
                Error::Internal("a waiting etcd key without its waiter lease".into())
            })?;
            match Attach::start(self.conn.clone(), target.clone(), waiter) {
                Ok(started) => attach = Some(started),
                Err(waiter) => {
                    // The waiter lease is kept alive until this is acknowledged. The lock is
                    // ours already: the move is bounded by the request's own bound and by the
                    // waiter lease (after it, the move finds our key gone), not by `--wait`,
                    // whose end must not throw a grant away.
                    *self.waiter = Some(waiter);
                    let moved = tokio::select! {
                        biased;
                        () = self.cancel.cancelled() => return Err(Error::Cancelled),
                        moved = target.once(self.conn) => moved?,
                    };
                    if !moved {
                        return Err(place_lost());
                    }
                    tracing::debug!(target: crate::logging::HANDOFF, "attached");
                }
            }
        }
        let own = OwnKey::new(self.key, place.watching, place.read_at, my_rev);
        Ok(Taken { token, own, attach })
    }

    /// A transaction whose answer dlock needs before it can go on ([`answer`]).
    async fn txn(&mut self, txn: Txn) -> Result<TxnResponse, Error> {
        let call = self.conn.call(OP_TIMEOUT, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        });
        answer(&self.request.budget, self.display, self.cancel, call).await
    }

    /// The lock stayed busy: who has it, as seen from our key (`queued`) or from outside,
    /// and `why_not` we did not wait (longer).
    async fn busy(&mut self, queued: bool, why_not: &str) -> Error {
        let own = queued.then_some(self.key.as_str());
        let why = why_busy(self.conn, &self.pfx, &self.request.name, own).await;
        Error::Busy(format!("lock '{}' {why}; {why_not}", self.request.name))
    }
}

/// `step`, unless a cancel comes first (an error) or `--wait` runs out (`None`).
pub(super) async fn bounded<T>(
    budget: &WaitBudget,
    cancel: &mut Cancel,
    step: impl Future<Output = Result<T, Error>>,
) -> Result<Option<T>, Error> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::Cancelled),
        result = budget.bounded(step) => result.transpose(),
    }
}

/// A request whose answer dlock needs before it can wait at all, unless a cancel comes
/// first: no answer within the server's time to answer means the cluster is unavailable.
pub(super) async fn answer<T>(
    budget: &WaitBudget,
    display: &str,
    cancel: &mut Cancel,
    step: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::Cancelled),
        result = budget.answer(step) => {
            result.unwrap_or_else(|| Err(crate::wording::no_answer(display, None, budget)))
        }
    }
}

impl Place {
    fn new(my_rev: i64, older: Vec<Vec<u8>>, read_at: i64, attached: bool) -> Place {
        Place {
            my_rev,
            older,
            read_at,
            attached,
            watching: None,
        }
    }
}
