//! `--wait` as a bound on every request of an acquisition, connecting included: a server that
//! accepts connections and never answers must not keep dlock longer than asked. A cluster that
//! does not answer in time is unavailable (69); a lock that stays busy is 75.

use std::future::Future;

use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::lock::{Cancel, Wait, MIN_ANSWER};

/// `--wait` over every request of an acquisition.
pub(super) struct Before<'a> {
    /// The end of `--wait`.
    pub(super) deadline: Option<BootInstant>,
    /// The end of `--wait`, but at least [`MIN_ANSWER`] from the start: a healthy server gets
    /// the time to answer, so that a short `--wait` still takes a free lock.
    answer_by: Option<BootInstant>,
    pub(super) wait: Wait,
    display: &'a str,
}

impl<'a> Before<'a> {
    pub(super) fn new(wait: Wait, display: &'a str) -> Before<'a> {
        let deadline = wait.deadline();
        Before {
            deadline,
            answer_by: deadline.map(|d| d.max(BootInstant::now() + MIN_ANSWER)),
            wait,
            display,
        }
    }

    pub(super) fn is_over(&self) -> bool {
        self.deadline.is_some_and(|d| BootInstant::now() >= d)
    }

    /// `step`, unless a cancel comes first (an error) or `--wait` runs out (`None`).
    pub(super) async fn bounded<T>(
        &self,
        cancel: &mut Cancel,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<Option<T>, Error> {
        self.bounded_by(self.deadline, cancel, step).await
    }

    async fn bounded_by<T>(
        &self,
        deadline: Option<BootInstant>,
        cancel: &mut Cancel,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<Option<T>, Error> {
        let over = async {
            match deadline {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::Cancelled),
            result = step => result.map(Some),
            _ = over => Ok(None),
        }
    }

    /// A request whose answer dlock needs before it can wait at all: no answer by the end
    /// of `--wait` means the cluster is unavailable.
    pub(super) async fn answer<T>(
        &self,
        cancel: &mut Cancel,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        // (Only a `--wait` of some length has an `answer_by`, so `describe` says how long.)
        self.bounded_by(self.answer_by, cancel, step)
            .await?
            .ok_or_else(|| match self.wait {
                Wait::For(d) if d < MIN_ANSWER => Error::Unavailable(format!(
                    "no answer from {} within {} (--wait {})",
                    self.display,
                    humantime::format_duration(MIN_ANSWER),
                    self.wait.describe()
                )),
                _ => Error::Unavailable(format!(
                    "no answer from {} within --wait {}",
                    self.display,
                    self.wait.describe()
                )),
            })
    }
}
