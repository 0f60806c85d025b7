//! The lease of a held memcached lock: [`Keeper`] renews it through [`Renewer`], and release
//! deletes the item if it is still ours.
//!
//! "Still ours" is a compare-and-swap on the item's CAS value, which memcached changes on
//! every write. A CAS value is only trusted on the connection it was learnt on: memcached
//! numbers CAS values from 1 again after a restart, so after a restart (which closes every
//! connection) an old CAS value could match somebody else's new item. On a new connection
//! the item is first read and its owner (random per acquisition) compared; only then is its
//! CAS value used.
//!
//! Timing: memcached's clock ticks in whole seconds, so an item given `T<n>` lives between
//! n − 1 and n seconds. The item is written with n = the TTL rounded up to whole seconds, and
//! the keeper is told the lease is n − 1 seconds long, so the command is stopped before the
//! item can expire however the ticks fall.
//!
//! `--min-hold`'s finish ([`Lease::finished`]) is one more renewal with the new metadata
//! (the same compare-and-swap), on the connection the renewer uses.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError};
use crate::lock::{Holder, Lease, Lost};

use super::client::{md, mg, ms, Conn, Failure};
use super::keys::Stored;
use crate::kit::timeouts::OP_TIMEOUT;

/// The bound the keeper puts on a renewal is the only one: no budget of our own.
const NO_BUDGET: Duration = Duration::from_secs(3600);

/// The reason given when the item is gone.
const GONE: &str =
    "the lock's item is gone from memcached: it expired, was deleted (release --force), \
                    was evicted, or the server restarted";
/// The reason given when somebody else's item is in its place.
const TAKEN: &str =
    "the lock's item now belongs to another holder: it was removed (release --force, \
                     expiry, a server restart) and taken again";

/// The whole-second expiry written for `ttl`, and the lease the keeper may count on.
pub(super) fn expiry_for(ttl: Duration) -> (u64, Duration) {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    let seconds = seconds.max(2);
    (seconds, Duration::from_secs(seconds - 1))
}

/// One held slot item: where it is, what it holds, and its CAS value on the connection.
pub(super) struct Held {
    pub(super) key: String,
    pub(super) value: Vec<u8>,
    pub(super) owner: String,
    pub(super) cas: u64,
    /// The connection epoch `cas` was learnt on.
    pub(super) epoch: u64,
    pub(super) expiry: u64,
}

/// Whether the item is still ours.
pub(super) enum Ours {
    Yes,
    No(&'static str),
}

impl Held {
    /// Make `cas` valid on the current connection: on a new connection, read the item and
    /// compare its owner.
    async fn confirm(&mut self, conn: &mut Conn, budget: Duration) -> Result<Ours, Failure> {
        conn.ensure(budget).await?;
        if conn.epoch == self.epoch {
            return Ok(Ours::Yes);
        }
        self.reread(conn, budget).await
    }

    /// Read the item and take its CAS value if its owner is us.
    async fn reread(&mut self, conn: &mut Conn, budget: Duration) -> Result<Ours, Failure> {
        let reply = conn.one(&mg(&self.key, "v c"), budget).await?;
        if reply.is("EN") {
            return Ok(Ours::No(GONE));
        }
        let owner = reply
            .value
            .as_deref()
            .and_then(Stored::parse)
            .map(|s| s.owner);
        match (owner, reply.cas()) {
            (Some(owner), Some(cas)) if owner == self.owner => {
                self.cas = cas;
                self.epoch = conn.epoch;
                Ok(Ours::Yes)
            }
            _ => Ok(Ours::No(TAKEN)),
        }
    }

    /// Rewrite the item with a fresh expiry if it is still ours.
    pub(super) async fn touch(
        &mut self,
        conn: &mut Conn,
        budget: Duration,
    ) -> Result<Ours, Failure> {
        // Two rounds: an unexpected CAS value is read back once (it may be our own write
        // whose answer was lost) before the item counts as somebody else's.
        for round in 0..2 {
            if let Ours::No(why) = self.confirm(conn, budget).await? {
                return Ok(Ours::No(why));
            }
            let flags = format!("C{} T{} c", self.cas, self.expiry);
            let reply = conn
                .one(&ms(&self.key, &flags, &self.value), budget)
                .await?;
            match reply.code.as_str() {
                "HD" => {
                    if let Some(cas) = reply.cas() {
                        self.cas = cas;
                    } else {
                        // Without the new CAS value, read it back on the next round.
                        self.epoch = 0;
                    }
                    return Ok(Ours::Yes);
                }
                "NF" => return Ok(Ours::No(GONE)),
                _ if round == 0 => {
                    if let Ours::No(why) = self.reread(conn, budget).await? {
                        return Ok(Ours::No(why));
                    }
                }
                _ => {}
            }
        }
        Ok(Ours::No(TAKEN))
    }

    /// Delete the item if it is still ours; `Ours::No` if it was gone or somebody else's.
    pub(super) async fn delete(
        &mut self,
        conn: &mut Conn,
        budget: Duration,
    ) -> Result<Ours, Failure> {
        for round in 0..2 {
            if let Ours::No(why) = self.confirm(conn, budget).await? {
                return Ok(Ours::No(why));
            }
            let reply = conn
                .one(&md(&self.key, &format!("C{}", self.cas)), budget)
                .await?;
            match reply.code.as_str() {
                "HD" => return Ok(Ours::Yes),
                "NF" => return Ok(Ours::No(GONE)),
                _ if round == 0 => {
                    if let Ours::No(why) = self.reread(conn, budget).await? {
                        return Ok(Ours::No(why));
                    }
                }
                _ => {}
            }
        }
        Ok(Ours::No(TAKEN))
    }
}

/// The connection and the held item, shared by the renewer and the lease (which rewrites the
/// item once for [`Lease::finished`]); one exchange at a time.
pub(super) struct Hold {
    pub(super) conn: Conn,
    pub(super) held: Held,
}

/// One renewal round trip (two on a new connection), for the [`Keeper`].
struct Renewer {
    hold: Arc<Mutex<Hold>>,
    display: String,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let mut hold = self.hold.lock().await;
        let Hold { conn, held } = &mut *hold;
        match held.touch(conn, NO_BUDGET).await {
            Ok(Ours::Yes) => Ok(expiry_for(Duration::from_secs(held.expiry)).1),
            Ok(Ours::No(why)) => Err(RenewError::Gone(why.to_owned())),
            Err(failure) => Err(RenewError::Failed(format!(
                "{}: {}",
                self.display,
                failure.describe()
            ))),
        }
    }
}

/// A held memcached lock.
pub struct MemcachedLease {
    keeper: Keeper<Renewer>,
    hold: Arc<Mutex<Hold>>,
    token: u64,
    display: String,
}

impl MemcachedLease {
    /// Keep `hold` (taken by an add sent at `sent`, lasting `lease_ttl`) from now on.
    pub(super) fn start(
        hold: Hold,
        token: u64,
        display: &str,
        sent: BootInstant,
        lease_ttl: Duration,
        kill_after: Duration,
    ) -> MemcachedLease {
        let hold = Arc::new(Mutex::new(hold));
        let renewer = Renewer {
            hold: hold.clone(),
            display: display.to_owned(),
        };
        MemcachedLease {
            keeper: Keeper::start(renewer, sent, lease_ttl, kill_after),
            hold,
            token,
            display: display.to_owned(),
        }
    }
}

impl Lease for MemcachedLease {
    fn token(&self) -> u64 {
        self.token
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        self.keeper.lost().await
    }

    /// Rewrite the item with the new metadata as a renewal does: a compare-and-swap on the
    /// CAS value of an item that is still ours (confirmed by its owner on a new connection),
    /// so an item that is gone is not re-created and somebody else's is not touched. The
    /// renewals that follow write the same value.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let mut hold = self.hold.lock().await;
        let Hold { conn, held } = &mut *hold;
        let Some(mut stored) = Stored::parse(&held.value) else {
            return Err(Error::Internal(
                "our own item's value does not parse".into(),
            ));
        };
        stored.record.holder = holder.clone();
        held.value = stored.to_bytes();
        match held.touch(conn, OP_TIMEOUT).await {
            Ok(Ours::Yes) => Ok(true),
            Ok(Ours::No(_)) => Ok(false),
            Err(failure) => Err(failure.into_error(&self.display)),
        }
    }

    async fn release(self) -> Result<(), Error> {
        if self.keeper.stop().await.is_none() {
            return Err(Error::Internal(
                "the lease keeper ended unexpectedly".into(),
            ));
        }
        let mut hold = self.hold.lock().await;
        let Hold { conn, held } = &mut *hold;
        let mut last = None;
        // One retry on a fresh connection: a release that never arrives costs the next
        // holder up to a TTL.
        for _ in 0..2 {
            let deleted = held.delete(conn, OP_TIMEOUT).await;
            tracing::debug!(target: crate::logging::HANDOFF, "deleted");
            match deleted {
                Ok(Ours::Yes) => return Ok(()),
                Ok(Ours::No(why)) => {
                    crate::lock::warn_gone_at_release(format_args!(
                        "the lock was no longer ours when it was released: {why}"
                    ));
                    return Ok(());
                }
                Err(failure) => last = Some(failure),
            }
        }
        Err(last.map_or_else(
            || Error::Internal("release failed".into()),
            |f| f.into_error(&self.display),
        ))
    }
}
