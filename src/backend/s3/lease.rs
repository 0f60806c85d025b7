//! A held S3 lock: the holder's last write (body and ETag), renewed by rewriting the object
//! with `If-Match` on that ETag ([`Keeper`] schedules it, `Renewer`), released by rewriting
//! it without our entry (the token counter stays), and `--min-hold`'s finish as one more
//! rewrite.
//!
//! A write whose answer did not come (a timeout, a broken connection) may or may not have
//! happened: the next write first reads the object, and the write took if the object carries
//! its nonce. Either way the next write is a new one: a renewal counts only from the send of
//! a write answered in the same attempt, never from one whose answer was lost.
//! Somebody else's write in between (another holder of a `--limit`, a waiter dropping an
//! expired holder) fails our `If-Match` (412, or 409 for a concurrent one): the object is read
//! again, and rewritten if our entry is still there and live by the server's clock; if it is
//! not, the hold is gone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{confirm_if_old, Keeper, Renew, RenewError, Schedule};
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{Holder, Lease, LockName, Lost};

use super::client::{Cond, Failure, Got, Put, S3};
use super::record::{nonce, Body};

/// The bound the keeper puts on a renewal is the only one: no budget of our own.
const NO_BUDGET: Duration = Duration::from_secs(3600);
/// How long a release may take once the keeper has given the hold up: the entry expires on
/// the server by itself, so an unanswering server does not keep the run from ending.
const GIVEN_UP: Duration = Duration::from_secs(1);
/// Writes lost to other writers in a row before a rewrite gives up (each one a write that
/// succeeded for somebody else).
const ROUNDS: usize = 20;

const GONE: &str = "the lock object no longer names this holder: it expired by the server's \
                    clock and was taken, or was released by force";

/// The holder's last write.
pub(super) struct Held {
    pub(super) s3: S3,
    pub(super) key: String,
    /// This acquisition's id in the holders.
    pub(super) id: String,
    /// The body as we last wrote (or read) it.
    pub(super) body: Body,
    /// Its ETag: the condition of our next write.
    pub(super) etag: String,
    /// A write was sent and not answered: the next write reads first.
    pub(super) uncertain: bool,
    /// The nonce of the write last sent.
    pub(super) sent_nonce: String,
}

/// Whether the hold is still ours.
pub(super) enum Ours {
    Yes,
    No(String),
}

impl Held {
    /// Write the object with `change` made to the body (and our entry's stamp the write's
    /// own), on the ETag of our last write; re-read on a lost condition or an unknown
    /// outcome. `Ours::No` when our entry is gone.
    pub(super) async fn write(
        &mut self,
        change: &(dyn Fn(&mut Body, &str) + Sync),
        limit: Duration,
    ) -> Result<Ours, Failure> {
        for _ in 0..ROUNDS {
            if self.uncertain {
                if let Ours::No(why) = self.reread(limit).await? {
                    return Ok(Ours::No(why));
                }
            }
            let mut body = self.body.clone();
            body.nonce = nonce();
            for entry in body.holders.iter_mut().filter(|e| e.id == self.id) {
                entry.renewed = None;
            }
            change(&mut body, &self.id);
            self.sent_nonce = body.nonce.clone();
            self.uncertain = true;
            let put = self
                .s3
                .put(
                    &self.key,
                    body.to_bytes(),
                    &Cond::Matches(self.etag.clone()),
                    limit,
                )
                .await;
            match put {
                Ok(Put::Done(etag)) => {
                    self.uncertain = false;
                    self.body = body;
                    self.etag = etag;
                    return Ok(Ours::Yes);
                }
                Ok(Put::Lost) => {
                    self.uncertain = false;
                    if let Ours::No(why) = self.reread(limit).await? {
                        return Ok(Ours::No(why));
                    }
                }
                Err(failure) => {
                    if matches!(failure, Failure::NotSent(_)) {
                        self.uncertain = false;
                    }
                    return Err(failure);
                }
            }
        }
        Err(Failure::Retry(format!(
            "the lock object changed under {ROUNDS} writes in a row"
        )))
    }

    /// Read the object: ours if it carries our entry, live by the server's clock (then its
    /// body, prepared for our next write, and its ETag are what we write on next).
    async fn reread(&mut self, limit: Duration) -> Result<Ours, Failure> {
        let object = match self.s3.get(&self.key, limit).await? {
            Got::Missing { .. } => return Ok(Ours::No(GONE.to_owned())),
            Got::Found(object) => object,
        };
        self.uncertain = false;
        let Some(mut body) = Body::parse(&object.body) else {
            return Ok(Ours::No(GONE.to_owned()));
        };
        let live = body
            .holders
            .iter()
            .any(|e| e.id == self.id && !e.expired(object.last_modified, object.date));
        if !live {
            return Ok(Ours::No(GONE.to_owned()));
        }
        body.prepare(object.last_modified, object.date);
        self.body = body;
        self.etag = object.etag;
        Ok(Ours::Yes)
    }
}

/// One renewal: the rewrite with our entry stamped by this write.
struct Renewer {
    held: Arc<Mutex<Held>>,
    ttl: Duration,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let mut held = self.held.lock().await;
        let display = held.s3.display.clone();
        match held.write(&|_, _| {}, NO_BUDGET).await {
            Ok(Ours::Yes) => Ok(self.ttl),
            Ok(Ours::No(why)) => Err(RenewError::Gone(why)),
            Err(failure) => Err(RenewError::Failed(format!(
                "{display}: {}",
                failure.describe()
            ))),
        }
    }
}

/// A held S3 lock.
pub struct S3Lease {
    keeper: Keeper<Renewer>,
    held: Arc<Mutex<Held>>,
    token: u64,
    display: String,
}

impl S3Lease {
    /// Keep `held` (taken by a write sent at `sent`, lasting `ttl`) from now on. A grant older
    /// than a renewal attempt when it gets here (a slow answer, the checks of a new object,
    /// a stopped process) is first confirmed by a renewal, within the keeper's rule
    /// ([`confirm_if_old`]), and the lease dates from that; one that cannot be is given back
    /// (best effort: it expires by itself) and the command is not started.
    pub(super) async fn grant(
        held: Held,
        name: &LockName,
        token: u64,
        sent: BootInstant,
        ttl: Duration,
        kill_after: Duration,
    ) -> Result<S3Lease, Error> {
        let display = held.s3.display.clone();
        let held = Arc::new(Mutex::new(held));
        let mut renewer = Renewer {
            held: held.clone(),
            ttl,
        };
        let since = match confirm_if_old(&mut renewer, Schedule::new(ttl, kill_after), sent).await {
            Ok(since) => since,
            Err(why) => {
                let remove = |body: &mut Body, id: &str| body.holders.retain(|e| e.id != id);
                let _ = held.lock().await.write(&remove, GIVEN_UP).await;
                return Err(Error::Unavailable(format!(
                    "'{name}' was granted but could not be confirmed: {why}; the command was \
                     not started"
                )));
            }
        };
        Ok(S3Lease {
            keeper: Keeper::start(renewer, since, ttl, kill_after),
            held,
            token,
            display,
        })
    }
}

impl Lease for S3Lease {
    fn token(&self) -> u64 {
        self.token
    }

    fn proven_until(&self) -> Option<BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        self.keeper.lost().await
    }

    /// Rewrite our entry with the new metadata, as a renewal does (only while it is ours).
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let mut held = self.held.lock().await;
        let change = |body: &mut Body, id: &str| {
            for entry in body.holders.iter_mut().filter(|e| e.id == id) {
                entry.record.holder = holder.clone();
            }
        };
        match held.write(&change, OP_TIMEOUT).await {
            Ok(Ours::Yes) => Ok(true),
            Ok(Ours::No(_)) => Ok(false),
            Err(failure) => Err(failure.into_error(&self.display)),
        }
    }

    /// Rewrite the object without our entry: the lock is free for the next poll, and the
    /// token counter stays. Bounded as a whole by [`OP_TIMEOUT`], by [`GIVEN_UP`] when the
    /// keeper has given the hold up already (the entry expires by itself then).
    async fn release(self) -> Result<(), Error> {
        let given_up = BootInstant::now() >= self.keeper.proven_until();
        if self.keeper.stop().await.is_none() {
            return Err(Error::Internal(
                "the lease keeper ended unexpectedly".into(),
            ));
        }
        let mut held = self.held.lock().await;
        let remove = |body: &mut Body, id: &str| body.holders.retain(|e| e.id != id);
        let bound = if given_up { GIVEN_UP } else { OP_TIMEOUT };
        let attempts = async {
            let mut last = None;
            // One retry: a release that never arrives costs the next holder up to a TTL.
            for _ in 0..2 {
                let removed = held.write(&remove, bound).await;
                tracing::debug!(target: crate::logging::HANDOFF, "rewritten");
                match removed {
                    Ok(ours) => return Ok(ours),
                    Err(failure) => last = Some(failure),
                }
            }
            Err(last)
        };
        match tokio::time::timeout(bound, attempts).await {
            Ok(Ok(Ours::Yes)) => Ok(()),
            Ok(Ok(Ours::No(why))) => {
                crate::lock::warn_gone_at_release(format_args!(
                    "the lock was no longer ours when it was released: {why}"
                ));
                Ok(())
            }
            Ok(Err(Some(failure))) => Err(failure.into_error(&self.display)),
            Ok(Err(None)) => Err(Error::Internal("release failed".into())),
            Err(_) if given_up => {
                crate::lock::warn_gone_at_release(format_args!(
                    "{}: the release was not answered; the lease had run out already",
                    self.display
                ));
                Ok(())
            }
            Err(_) => Err(crate::wording::no_answer_in(&self.display, bound)),
        }
    }
}
