//! `--limit N > 1`: waiters queue on the turnstile key (the server's FIFO lock queue); its
//! holder, the head of the queue, takes the first free slot, and a released slot wakes it by
//! NOTIFY (else it looks again every second at most).

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};

use super::claim::claim_sql;
use super::conn::{classify, Session};
use super::holders::{holder_label, metadata_comment};
use super::keys::{channel, others_key, slot_key, turnstile_key};
use super::limit::{limit_key, other_limit, other_limit_sql};
use super::token::{token_sql, Granted};
use super::wait::{backstop, lock_timeout_sql, within};
use super::{PgBackend, CANCEL_TIMEOUT};
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::lock::{limit_mismatch, AcquireRequest, Cancel, Mode};
use crate::wording::not_acquired;

impl PgBackend {
    /// `--limit N > 1`: queue on the turnstile, then take the first free slot; a released slot
    /// wakes the head of the queue by NOTIFY. Returns the grant and the slot's key.
    pub(super) async fn acquire_slot(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        cancel: &mut Cancel,
    ) -> Result<(Granted, i64), Error> {
        let name = request.name.as_str();
        let slots: Vec<i64> = (0..request.limit)
            .map(|i| slot_key(&self.prefix, name, i))
            .collect();
        let try_sql = self.try_slot_sql(request, &slots);
        if !request.budget.is_no_wait() {
            self.queue(session, request, cancel).await?;
        }
        let recheck = (request.ttl / 3).min(Duration::from_secs(1));
        for _ in 0..u32::MAX {
            let sent = BootInstant::now();
            if let Some(key) = self.try_slots(session, request, &try_sql, &slots).await? {
                let token = self.take_slot(session, request, key).await?;
                return Ok((Granted { token, sent }, key));
            }
            if request.budget.is_no_wait() {
                let state = self.describe_holders(session, &request.name).await;
                return Err(not_acquired(&request.name, &state, request.budget.wait()));
            }
            self.wait_for_slot(session, request, recheck, cancel)
                .await?;
        }
        Err(Error::Internal("slot wait loop ended".into()))
    }

    /// Our `--limit`, recorded in shared mode (see [`limit_key`]), and the [`others_key`] that
    /// tells `--limit 1` runs to look for it, held before we can take a slot: by the
    /// turnstile statement when we queue, else by the slot statement. (A `--limit 1` run
    /// holds the others' key only for an instant, so taking it waits no longer than that.)
    fn mark_sql(&self, request: &AcquireRequest) -> String {
        let name = request.name.as_str();
        format!(
            "pg_advisory_lock_shared({})::text || pg_advisory_lock_shared({})::text AS mark",
            limit_key(&self.prefix, name, request.limit),
            others_key(&self.prefix, name),
        )
    }

    /// The statement that claims the session and takes the first free slot, unless a holder
    /// records another `--limit`.
    fn try_slot_sql(&self, request: &AcquireRequest, slots: &[i64]) -> String {
        let other = other_limit_sql(&self.prefix, request.name.as_str(), request.limit);
        format!(
            "{} SELECT {}, o.other, CASE WHEN o.other IS NULL THEN {} END \
             FROM (SELECT {other} AS other{} OFFSET 0) o",
            metadata_comment(&request.holder),
            claim_sql("$1"),
            try_slots_sql(slots),
            if request.budget.is_no_wait() {
                format!(", {}", self.mark_sql(request))
            } else {
                String::new()
            },
        )
    }

    /// Listen for released slots, then wait on the turnstile until we head the queue.
    async fn queue(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        cancel: &mut Cancel,
    ) -> Result<(), Error> {
        let client = session.client.clone();
        let name = request.name.as_str();
        let other = other_limit_sql(&self.prefix, name, request.limit);
        let turnstile = turnstile_key(&self.prefix, name);
        let listen = format!("LISTEN {}", channel(&self.prefix, name));
        within(&request.budget, client.batch_execute(&listen))
            .await
            .map_err(|()| self.no_answer(&request.budget, "LISTEN"))?
            .map_err(|e| classify(&e, &self.display))?;
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&turnstile, Type::INT8)];
        let lock_sql = format!(
            "{} SELECT o.other, {}, CASE WHEN o.other IS NULL THEN pg_advisory_lock($1)::text END \
             FROM (SELECT {other} AS other, {} OFFSET 0) o",
            metadata_comment(&request.holder),
            lock_timeout_sql(&request.budget),
            self.mark_sql(request),
        );
        // The lock call goes out at the first poll below: in the turnstile's queue from then on.
        crate::lock::queued(request);
        let lock = client.query_typed(&lock_sql, &params);
        tokio::pin!(lock);
        let backstop = backstop(&request.budget);
        tokio::pin!(backstop);
        let mut ended = session.ended.clone();
        tokio::select! {
            biased;
            done = &mut lock => {
                match done {
                    Err(e) => Err(self.busy_or(&e, request, session).await),
                    Ok(rows) => match other_limit(rows.first(), 0) {
                        Some(theirs) => Err(limit_mismatch(&request.name, theirs)),
                        None => Ok(()),
                    },
                }
            }
            () = cancel.cancelled() => {
                Err(self.abandon(session, lock.as_mut(), (turnstile, Mode::Exclusive), Error::Cancelled).await)
            }
            () = &mut backstop => {
                let busy = not_acquired(&request.name, "is held", request.budget.wait());
                Err(self.abandon(session, lock.as_mut(), (turnstile, Mode::Exclusive), busy).await)
            }
            _ = ended.wait_for(Option::is_some) => Err(self.lost_while_waiting(session)),
        }
    }

    /// Run the slot statement: the key of the slot we took, if one was free.
    async fn try_slots(
        &self,
        session: &Session,
        request: &AcquireRequest,
        try_sql: &str,
        slots: &[i64],
    ) -> Result<Option<i64>, Error> {
        let client = &session.client;
        let rows = within(
            &request.budget,
            client.query_typed(try_sql, &[(&session.marker, Type::TEXT)]),
        )
        .await
        .map_err(|()| self.no_answer(&request.budget, "taking a slot"))?
        .map_err(|e| classify(&e, &self.display))?;
        let row = rows.first();
        let theirs = other_limit(row, 2);
        let slot = row
            .and_then(|r| r.try_get::<_, Option<i32>>(3).ok())
            .flatten()
            .and_then(|s| usize::try_from(s).ok());
        let won = slot.and_then(|s| slots.get(s).copied());
        let taken = won.map(|key| (key, Mode::Exclusive));
        self.check_claim(&rows, client, taken, &session.marker)
            .await?;
        if let Some(theirs) = theirs {
            return Err(limit_mismatch(&request.name, theirs));
        }
        Ok(won)
    }

    /// With slot `key` taken: leave the queue and read the token.
    async fn take_slot(
        &self,
        session: &Session,
        request: &AcquireRequest,
        key: i64,
    ) -> Result<u64, Error> {
        let client = &session.client;
        let other = other_limit_sql(&self.prefix, request.name.as_str(), request.limit);
        let (label, host) = holder_label(&request.holder);
        let token_sql = token_sql(&request.holder, &other);
        let token_params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&label, Type::TEXT),
            (&host, Type::TEXT),
            (&session.marker, Type::TEXT),
        ];
        // Leave the queue and read the token in one round trip; the token statement
        // goes last so its metadata comment is what pg_stat_activity shows.
        let leave = async {
            if request.budget.is_no_wait() {
                return Ok(());
            }
            let turnstile = turnstile_key(&self.prefix, request.name.as_str());
            client
                .batch_execute(&format!(
                    "SELECT pg_advisory_unlock({turnstile}); UNLISTEN *"
                ))
                .await
        };
        let both = async { tokio::join!(leave, client.query_typed(&token_sql, &token_params)) };
        let (left, token) = within(&request.budget, both)
            .await
            .map_err(|()| self.no_answer(&request.budget, "reading the token"))?;
        left.map_err(|e| classify(&e, &self.display))?;
        self.check_token(
            token,
            client,
            (key, Mode::Exclusive),
            &session.marker,
            &request.name,
        )
        .await
    }

    /// No slot was free: wait for a NOTIFY or the next look, until the deadline, a cancel or
    /// the end of the connection (giving up leaves the queue).
    async fn wait_for_slot(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        recheck: Duration,
        cancel: &mut Cancel,
    ) -> Result<(), Error> {
        let mut ended = session.ended.clone();
        let next_check = BootInstant::now() + recheck;
        let wake = match request.budget.deadline() {
            Some(at) if at < next_check => at,
            _ => next_check,
        };
        tokio::select! {
            _ = session.notes.recv() => Ok(()),
            () = sleep_until(wake) => {
                if request.budget.is_over() {
                    self.leave_queue(session, request).await;
                    let state = self.describe_holders(session, &request.name).await;
                    return Err(not_acquired(&request.name, &state, request.budget.wait()));
                }
                Ok(())
            }
            () = cancel.cancelled() => {
                self.leave_queue(session, request).await;
                Err(Error::Cancelled)
            }
            _ = ended.wait_for(Option::is_some) => Err(self.lost_while_waiting(session)),
        }
    }

    /// Give up our place at the head of the queue (best effort: the session ends anyway).
    async fn leave_queue(&self, session: &Session, request: &AcquireRequest) {
        let turnstile = turnstile_key(&self.prefix, request.name.as_str());
        let _ = tokio::time::timeout(
            CANCEL_TIMEOUT,
            session
                .client
                .query_typed("SELECT pg_advisory_unlock($1)", &[(&turnstile, Type::INT8)]),
        )
        .await;
    }
}

/// An expression that takes the first free slot, in slot order (`CASE` evaluates its
/// conditions in order and stops at the first true one), and returns its index or NULL.
fn try_slots_sql(slots: &[i64]) -> String {
    let mut sql = String::from("CASE");
    for (i, slot) in slots.iter().enumerate() {
        sql.push_str(&format!(" WHEN pg_try_advisory_lock({slot}) THEN {i}"));
    }
    sql.push_str(" END::int4");
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_statement_tries_in_order() {
        assert_eq!(
            try_slots_sql(&[5, -7]),
            "CASE WHEN pg_try_advisory_lock(5) THEN 0 WHEN pg_try_advisory_lock(-7) THEN 1 END::int4"
        );
    }
}
