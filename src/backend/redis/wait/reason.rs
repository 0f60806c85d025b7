//! Why a lock was not ours, for the message that gives up: held (by whom, as `status` would
//! say), or free or not full with waiters ahead of us in line.

use crate::backend::redis::conn::Conn;

use super::{Waiter, WAITER_LEASE};

impl Waiter<'_> {
    /// Why the lock was not ours, from the last acquire reply: held, or free (or not full)
    /// with waiters ahead of us in line.
    pub(in crate::backend::redis) async fn busy_reason(
        &self,
        conn: &mut Conn,
        live: i64,
        ahead: i64,
    ) -> String {
        let holders = if live > 0 {
            self.describe_holders(conn).await
        } else {
            String::new()
        };
        self.reason(live, ahead, &holders)
    }

    /// The reason of [`Waiter::busy_reason`], with `holders` already described.
    pub(super) fn reason(&self, live: i64, ahead: i64, holders: &str) -> String {
        let limit = i64::from(self.request.limit);
        if live >= limit {
            let queue = crate::wording::waiting_ahead_text(ahead.max(0) as usize);
            return format!("is held{holders}{queue}");
        }
        let state = if live == 0 {
            "free".to_owned()
        } else {
            format!("not full ({live} of --limit {limit} held{holders})")
        };
        let ahead = match ahead {
            n if n <= 1 => "1 waiter is".to_owned(),
            n => format!("{n} waiters are"),
        };
        format!(
            "is {state}, but {ahead} ahead in the queue (a waiter that was killed \
             drops out within {})",
            humantime::format_duration(WAITER_LEASE)
        )
    }

    /// " by pid N on host since T" for messages about a held lock (bounded: this only
    /// decorates a message).
    async fn describe_holders(&self, conn: &mut Conn) -> String {
        match self
            .backend
            .status_with(conn, &self.request.name, self.budget())
            .await
        {
            Ok(Ok(status)) => status.held_by(),
            _ => String::new(),
        }
    }
}
