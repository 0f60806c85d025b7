//! Capacity refusals: a server that turns a connection away because it already serves as many
//! clients as it allows (PostgreSQL `max_connections`, ZooKeeper `maxClientCnxns`, Redis
//! `maxclients`) is neither down nor saying that the lock is held. The refusal passes as soon
//! as one of the other clients leaves, so it is waited out like a held lock: within `--wait`,
//! with a jittered exponential backoff so that a crowd of refused clients does not come back
//! in step (docs/guide.md: "The host queue").
//!
//! Each backend's error classification recognises its server's refusal and returns
//! [`refused`] (an [`Error::Capacity`], exit status 69 when it is final); [`wait_out`] is the
//! retry loop, run around the remote `acquire` by [`super::local_queue::LocalQueued`], so every
//! remote backend gets it by being wrapped there.
//!
//! With `--no-wait` a capacity refusal is not retried: it is 69 (unavailable), not 75, because
//! the lock may well be free; the server could not be asked. When `--wait` runs out, the
//! message names the limit that refused.

use std::time::Duration;

use super::backoff::Backoff;
use crate::budget::{Wait, WaitBudget};
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::lock::Cancel;

/// The first pause after a refusal (see [`Backoff`]: pauses are not deadlines).
const FIRST_DELAY: Duration = Duration::from_millis(20);
/// The longest pause between two attempts: a slot freed meanwhile is noticed within it.
const MAX_DELAY: Duration = Duration::from_secs(1);

/// The error for a connection refused because the server is full: `limit` names the setting
/// that refused (e.g. "PostgreSQL max_connections"), `detail` what the server said.
pub fn refused(display: &str, limit: &str, detail: &str) -> Error {
    Error::Capacity(format!(
        "{display} refused the connection: it serves as many clients as its {limit} allows ({detail})"
    ))
}

/// Run `attempt` (given the `--wait` still left) until it does not fail with a capacity
/// refusal; pause with a doubling [`Backoff`] (`FIRST_DELAY` to `MAX_DELAY`) between
/// attempts. One deadline for all attempts: `budget`'s. `cancel` ends the pauses (a signal).
pub async fn wait_out<T>(
    budget: &WaitBudget,
    cancel: &mut Cancel,
    mut attempt: impl AsyncFnMut(Wait) -> Result<T, Error>,
) -> Result<T, Error> {
    let (wait, deadline) = (budget.wait(), budget.deadline());
    let mut backoff = Backoff::new(FIRST_DELAY, MAX_DELAY);
    let mut refusals = 0u32;
    let mut last: Option<String> = None;
    loop {
        let message = match attempt(budget.rest()).await {
            Err(Error::Capacity(message)) => message,
            // An attempt made in the last moments of --wait after refusals may fail only
            // because its time ran out (a connect given a millisecond): the refusal is
            // still the reason the run did not get the lock.
            Err(e)
                if !matches!(e, Error::Cancelled)
                    && deadline.is_some_and(|at| at.remaining().is_zero()) =>
            {
                return Err(match (last, wait) {
                    (Some(message), Wait::For(asked)) => Error::Capacity(format!(
                        "{message}; still refused when --wait ({}) ran out ({refusals} attempts)",
                        humantime::format_duration(asked)
                    )),
                    _ => e,
                });
            }
            other => return other,
        };
        refusals += 1;
        last = Some(message.clone());
        if refusals == 1 {
            tracing::info!("{message}; waiting for a free connection");
        }
        let pause = backoff.next_delay();
        let resume = BootInstant::now() + pause;
        match (wait, deadline) {
            (Wait::No, _) => {
                return Err(Error::Capacity(format!(
                    "{message}; not retried (--no-wait)"
                )))
            }
            (Wait::For(asked), Some(at)) if resume >= at => {
                return Err(Error::Capacity(format!(
                    "{message}; still refused after waiting {} (--wait, {refusals} attempts)",
                    humantime::format_duration(asked)
                )))
            }
            _ => {}
        }
        tokio::select! {
            () = sleep_until(resume) => {}
            () = cancel.cancelled() => return Err(Error::Cancelled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(future)
    }

    #[test]
    fn a_refusal_is_retried_until_it_passes() {
        let mut tries = 0;
        let result = block_on(wait_out(
            &WaitBudget::start(Wait::Forever),
            &mut Cancel::never(),
            async |_| {
                tries += 1;
                if tries < 3 {
                    Err(Error::Capacity("full".into()))
                } else {
                    Ok(tries)
                }
            },
        ));
        assert_eq!(result.ok(), Some(3));
    }

    #[test]
    fn a_connect_timed_out_by_the_end_of_the_wait_still_names_the_limit() {
        let budget = WaitBudget::start(Wait::For(Duration::from_millis(100)));
        let mut tries = 0;
        let result: Result<(), Error> =
            block_on(wait_out(&budget, &mut Cancel::never(), async |left| {
                tries += 1;
                if tries == 1 {
                    return Err(refused("my", "MySQL max_connections", "1040"));
                }
                // The next attempt outlives the deadline and times out.
                if let Wait::For(left) = left {
                    tokio::time::sleep(left + Duration::from_millis(5)).await;
                }
                Err(Error::Unavailable("no answer within 1ms".into()))
            }));
        assert_eq!(tries, 2);
        match result {
            Err(Error::Capacity(m)) => assert!(m.contains("MySQL max_connections"), "{m}"),
            other => panic!("expected a capacity refusal, got {:?}", other.err()),
        }
        // A failure before the deadline is reported as it is.
        let result: Result<(), Error> = block_on(wait_out(
            &WaitBudget::start(Wait::For(Duration::from_secs(30))),
            &mut Cancel::never(),
            async |_| Err(Error::Unavailable("down".into())),
        ));
        assert!(matches!(result, Err(Error::Unavailable(_))));
    }

    #[test]
    fn no_wait_does_not_retry_and_the_wait_names_the_limit_when_it_runs_out() {
        let mut tries = 0;
        let result: Result<(), Error> = block_on(wait_out(
            &WaitBudget::start(Wait::No),
            &mut Cancel::never(),
            async |_| {
                tries += 1;
                Err(refused("pg", "PostgreSQL max_connections", "53300"))
            },
        ));
        assert_eq!(tries, 1);
        assert!(matches!(result, Err(Error::Capacity(m)) if m.contains("--no-wait")));

        let started = BootInstant::now();
        let result: Result<(), Error> = block_on(wait_out(
            &WaitBudget::start(Wait::For(Duration::from_millis(200))),
            &mut Cancel::never(),
            async |_| Err(refused("pg", "PostgreSQL max_connections", "53300")),
        ));
        let waited = BootInstant::now().saturating_since(started);
        assert!(waited < Duration::from_secs(1), "waited {waited:?}");
        match result {
            Err(Error::Capacity(m)) => {
                assert!(m.contains("PostgreSQL max_connections"), "{m}");
                assert!(m.contains("--wait"), "{m}");
            }
            other => panic!("expected a capacity refusal, got {:?}", other.err()),
        }
    }
}
