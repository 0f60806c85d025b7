//! The lease of a held Redis lock: [`Keeper`] renews it through [`Renewer`] (`renew.lua`, one
//! compare-and-renew round trip on the connection that took the lock), and release gives it
//! back and wakes the next waiter.

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{self, Keeper, Renew, RenewError, Schedule};
use crate::lock::{Holder, Lease, Lost};

use super::conn::Conn;
use super::keys::Keys;
use super::scripts::{bad_data, release_call, Released, FINISH, RENEW};
use super::sentinel::watch::SwitchWatch;
use super::RedisTarget;
use crate::kit::timeouts::OP_TIMEOUT;

/// A held Redis lock: the keeper renews it; release gives it back and wakes the next waiter.
pub struct RedisLease {
    pub(super) keeper: Keeper<Renewer>,
    /// Where the lock is, for [`Lease::finished`] (the keeper owns the lease's connection).
    pub(super) target: RedisTarget,
    pub(super) token: u64,
    pub(super) keys: Keys,
    pub(super) limit: u32,
    pub(super) display: String,
    /// Behind Sentinel: `+switch-master` looks at the new master at once.
    pub(super) switch: Option<SwitchWatch>,
    /// The waiter first in line at our grant: the release wakes it in the same script.
    pub(super) next: Option<String>,
}

impl Lease for RedisLease {
    fn token(&self) -> u64 {
        self.token
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        match &mut self.switch {
            None => self.keeper.lost().await,
            Some(switch) => tokio::select! {
                lost = self.keeper.lost() => lost,
                lost = switch.lost() => lost,
            },
        }
    }

    /// Rewrite our holder metadata (`finish.lua`), only while the hold is still ours; on a
    /// connection of its own (behind Sentinel: to the master the sentinels name now).
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let meta = serde_json::to_string(holder).map_err(|e| Error::Internal(e.to_string()))?;
        let mut conn = super::conn::Conn::new(&self.target, &self.display)?;
        let mut invocation = FINISH.prepare_invoke();
        invocation
            .key(&self.keys.owners)
            .key(&self.keys.hold)
            .arg(&self.keys.tok)
            .arg(meta);
        let recorded: i64 = conn
            .invoke(&invocation, OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        Ok(recorded == 1)
    }

    async fn release(self) -> Result<(), Error> {
        drop(self.switch);
        let Some(mut renewer) = self.keeper.stop().await else {
            return Err(Error::Internal(
                "the lease keeper ended unexpectedly".into(),
            ));
        };
        let mut last = None;
        // One retry on a fresh connection: a release that never arrives costs the next
        // waiter up to a TTL.
        for _ in 0..2 {
            match release_call(
                &mut renewer.conn,
                &self.keys,
                self.limit,
                "holder",
                OP_TIMEOUT,
                self.next.as_deref(),
            )
            .await
            {
                Ok(Released::Done { held }) => {
                    if !held {
                        crate::lock::warn_gone_at_release(format_args!(
                            "the lock had already expired or been removed before it was released"
                        ));
                    }
                    return Ok(());
                }
                Ok(Released::BadData { key, what }) => {
                    return Err(bad_data(&self.display, &key, &what));
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

/// One compare-and-renew round trip, for the [`Keeper`].
pub(super) struct Renewer {
    pub(super) conn: Conn,
    pub(super) keys: Keys,
    pub(super) ttl_ms: String,
    pub(super) display: String,
}

impl Renewer {
    /// Before the command starts: a grant older than the keeper's attempt timeout (a slow
    /// round trip, a `WAIT` for replicas, a stopped process) may be near the end of its lease,
    /// or past it, which the keeper, counting from the grant, would find out only after the
    /// command started. Such a grant is confirmed by one renewal (behind Sentinel: a majority
    /// of the sentinels names its master, then `renew.lua`), retried within the keeper's rule
    /// ([`keeper::confirm_if_old`]), and the lease dates from that renewal. Returns when the lease
    /// dates from and its TTL, or why the grant does not count.
    pub(super) async fn confirm_grant(
        &mut self,
        sent: BootInstant,
        ttl: Duration,
        kill_after: Duration,
    ) -> Result<(BootInstant, Duration), String> {
        let since = keeper::confirm_if_old(self, Schedule::new(ttl, kill_after), sent).await?;
        Ok((since, ttl))
    }
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        // Behind Sentinel, only on the master the sentinels name now (it may have moved).
        super::sentinel::confirm(&mut self.conn)
            .await
            .map_err(RenewError::Failed)?;
        let mut invocation = RENEW.prepare_invoke();
        invocation
            .key(&self.keys.owners)
            .key(&self.keys.hold)
            .arg(&self.keys.tok)
            .arg(&self.ttl_ms);
        // The keeper bounds the call; no timeout of our own.
        match self.conn.invoke::<i64>(&invocation, Duration::from_secs(3600)).await {
            Ok(ms) if ms >= 0 => Ok(Duration::from_millis(ms as u64)),
            Ok(-3) => Err(RenewError::Gone(format!(
                "a key of the lock ('{}' or '{}') was overwritten with data dlock did not write",
                self.keys.owners, self.keys.hold
            ))),
            Ok(_) => Err(RenewError::Gone(
                "the lock entry is gone from Redis: it expired, was deleted (release --force, DEL, FLUSHALL), \
                 was evicted, or the server restarted without persistence"
                    .into(),
            )),
            Err(failure) => Err(RenewError::Failed(failure.into_error(&self.display).to_string())),
        }
    }
}
