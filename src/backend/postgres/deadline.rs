//! The `--wait` deadline: when it ends, what is left of it as the server's `lock_timeout`,
//! how long the server gets to answer at all (at least [`MIN_ANSWER`]), and the client's own
//! backstop a second after that for what the server does not end.

use std::future::Future;
use std::time::Duration;

use crate::clock::{sleep_until, BootInstant};
use crate::lock::Wait;

/// The least time the server gets to answer (connecting included), however short `--wait`
/// is; the lock's own wait still ends with `--wait` ([`Deadline::lock_timeout_sql`]).
pub(super) use crate::lock::MIN_ANSWER;

/// How long after the server's time to answer the client ends a lock call itself, should
/// the server's `lock_timeout` not end it: a round trip to a server that answers, on a busy
/// machine.
pub(super) const CLIENT_LIMIT: Duration = Duration::from_secs(1);

/// When a `--wait` ends, and how long it was (for messages).
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    pub(super) at: BootInstant,
    /// `at`, but at least [`MIN_ANSWER`] from the start: until then the server may answer.
    pub(super) answer_by: BootInstant,
    pub(super) wait: Duration,
}

impl Deadline {
    /// The deadline of a wait that starts now (`None`: `--no-wait`, or no limit).
    pub(super) fn of(wait: Wait) -> Option<Deadline> {
        let Wait::For(length) = wait else {
            return None;
        };
        let at = wait.deadline()?;
        Some(Deadline {
            at,
            answer_by: at.max(BootInstant::now() + MIN_ANSWER),
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

/// Ends a second after the server's time to answer (never without a `--wait`): the client's
/// own limit on a lock call, should the server's `lock_timeout` not end it.
pub(super) async fn backstop(deadline: Option<Deadline>) {
    match deadline {
        Some(d) => sleep_until(d.answer_by + CLIENT_LIMIT).await,
        None => std::future::pending().await,
    }
}

/// `work`, ended a second after the server's time to answer if it has not answered by then.
pub(super) async fn within<F: Future>(
    deadline: Option<Deadline>,
    work: F,
) -> Result<F::Output, ()> {
    match deadline {
        Some(d) => {
            let limit = (d.answer_by + CLIENT_LIMIT).remaining();
            tokio::time::timeout(limit, work).await.map_err(|_| ())
        }
        None => Ok(work.await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_wait_still_gives_the_server_time_to_answer() {
        let start = BootInstant::now();
        let d = Deadline::of(Wait::For(Duration::from_millis(1))).expect("a deadline");
        assert!(d.at < start + Duration::from_millis(100));
        assert!(d.answer_by >= start + MIN_ANSWER);
        let d = Deadline::of(Wait::For(Duration::from_secs(5))).expect("a deadline");
        assert_eq!(d.answer_by, d.at);
        assert!(Deadline::of(Wait::No).is_none());
    }
}
