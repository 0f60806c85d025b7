//! The `--wait` deadline: when it ends, what is left of it as the server's `lock_timeout`,
//! and the client's own backstop a second later for what the server does not end.

use std::future::Future;
use std::time::Duration;

use crate::clock::{sleep_until, BootInstant};
use crate::lock::Wait;

/// When a `--wait` ends, and how long it was (for messages).
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    pub(super) at: BootInstant,
    pub(super) wait: Duration,
}

impl Deadline {
    /// The deadline of a wait that starts now (`None`: `--no-wait`, or no limit).
    pub(super) fn of(wait: Wait) -> Option<Deadline> {
        let Wait::For(length) = wait else {
            return None;
        };
        Some(Deadline {
            at: wait.deadline()?,
            wait: length,
        })
    }

    /// `set_config` of `lock_timeout` to what is left (at least 1 ms: 0 would mean none).
    pub(super) fn lock_timeout_sql(deadline: Option<Deadline>) -> String {
        match deadline {
            Some(d) => format!(
                "set_config('lock_timeout', '{}', false)",
                d.at.remaining().as_millis().clamp(1, i32::MAX as u128)
            ),
            None => "NULL::text".into(),
        }
    }
}

/// Ends a second after the `--wait` deadline (never without one): the client's own limit on
/// a lock call, should the server's `lock_timeout` not end it.
pub(super) async fn backstop(deadline: Option<Deadline>) {
    match deadline {
        Some(d) => sleep_until(d.at + Duration::from_secs(1)).await,
        None => std::future::pending().await,
    }
}

/// `work`, ended a second after the `--wait` deadline if it has not answered by then.
pub(super) async fn within<F: Future>(
    deadline: Option<Deadline>,
    work: F,
) -> Result<F::Output, ()> {
    match deadline {
        Some(d) => {
            let limit = (d.at + Duration::from_secs(1)).remaining();
            tokio::time::timeout(limit, work).await.map_err(|_| ())
        }
        None => Ok(work.await),
    }
}
