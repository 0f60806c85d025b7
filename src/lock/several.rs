//! Several names held as one lock (`--also NAME`; docs/guide.md: "Several names at once"):
//! [`Several`] wraps any [`Backend`] and takes the request's name and the `--also` names
//! together, as `LocalQueued` wraps a remote backend.
//!
//! - One order: the names are taken one after the other, sorted by their encoded names,
//!   whatever order they were given in. Two runs that share names take the shared ones in the
//!   same order, so neither can hold a name the other waits for while it waits for one the
//!   other holds: no deadlock.
//! - All or none, within one `--wait`: each name is asked for with what is left of the wait;
//!   when one cannot be had (held past the wait, an error, a cancel), the names already taken
//!   are given back before the error is returned.
//! - The names taken are kept while a later one is waited for: a lease renews only while its
//!   `lost()` is polled, so they are polled beside the acquisition, and a loss among them
//!   ends it (the wait is cancelled, everything is given back).
//! - The lease ([`SeveralLease`]): NAME's token, the others' in [`Lease::also_held`]; lost when
//!   any name is lost; proven until the earliest of their proofs; released and marked
//!   finished on every name.
//!
//! A run of one name never meets this wrapper (`run::open`).

use std::time::Duration;

use futures_util::future::{join_all, select_all};
use futures_util::FutureExt;

use crate::budget::MIN_ANSWER;
use crate::error::Error;
use crate::lock::{
    self, AcquireRequest, Backend, Cancel, CheckReport, Holder, Lease, LockName, LockStatus, Lost,
};

/// A backend that holds `also` with the name of every request (see the module doc).
pub struct Several<B> {
    inner: B,
    also: Vec<LockName>,
}

impl<B: Backend> Several<B> {
    /// `inner`, taking the names `also` (none of them the request's, none twice: the
    /// settings checked that) with every request's name.
    pub fn new(inner: B, also: Vec<LockName>) -> Several<B> {
        Several { inner, also }
    }

    /// Every name of `request`, in the one order they are taken in.
    fn in_order<'a>(&'a self, request: &'a AcquireRequest) -> Vec<&'a LockName> {
        let mut names: Vec<&LockName> = std::iter::once(&request.name).chain(&self.also).collect();
        names.sort_by_cached_key(|name| name.encoded());
        names
    }

    /// Take `one`, keeping the leases already `taken` alive meanwhile. A loss among them
    /// cancels the wait and is the error; a lease granted after all is given back then.
    async fn take_keeping(
        &self,
        one: &AcquireRequest,
        taken: &mut [(LockName, B::Lease)],
        mut cancel: Cancel,
    ) -> Result<B::Lease, Error> {
        if taken.is_empty() {
            return self.inner.acquire(one, cancel).await;
        }
        let (canceller, inner_cancel) = lock::cancellation();
        let acquire = self.inner.acquire(one, inner_cancel);
        tokio::pin!(acquire);
        let mut cancelled = false;
        let mut lost = None;
        // Bounded: the two branches besides the acquisition fire once each at most.
        let result = loop {
            tokio::select! {
                result = &mut acquire => break result,
                () = cancel.cancelled(), if !cancelled => {
                    cancelled = true;
                    canceller.cancel();
                }
                gone = first_lost(taken), if lost.is_none() => {
                    lost = Some(gone);
                    canceller.cancel();
                }
            }
        };
        let Some((index, gone)) = lost else {
            return result;
        };
        if let Ok(lease) = result {
            release_all(vec![(one.name.clone(), lease)], one.ttl).await;
        }
        Err(Error::Unavailable(format!(
            "lock '{}' was lost while waiting for '{}' ({}); the command did not run",
            taken[index].0, one.name, gone.reason
        )))
    }
}

/// The request for `name`, one of several: the same in everything but the name (and the
/// name recorded), and, after the first, with what is left of the wait.
fn request_for(request: &AcquireRequest, name: &LockName, first: bool) -> AcquireRequest {
    let mut one = request.clone();
    one.name = name.clone();
    one.holder.name = name.as_str().to_owned();
    if !first {
        one.budget = request.budget.rest_from_now();
    }
    one
}

/// Which of `taken` is lost first (its index), and how. Cancel-safe, as every `lost()` is.
async fn first_lost<L: Lease>(taken: &mut [(LockName, L)]) -> (usize, Lost) {
    if taken.is_empty() {
        return std::future::pending().await;
    }
    let waits = taken
        .iter_mut()
        .enumerate()
        .map(|(index, (_, lease))| async move { (index, lease.lost().await) }.boxed_local());
    let (first, _, _) = select_all(waits).await;
    first
}

/// Release every lease of `taken` at once, each whatever becomes of the others, within the
/// time a run gives its own release (the TTL, at most 10 s); how each went, in `taken`'s
/// order.
async fn release_each<L: Lease>(
    taken: Vec<(LockName, L)>,
    ttl: Duration,
) -> Vec<(LockName, Result<(), Error>)> {
    let budget = ttl.min(Duration::from_secs(10));
    let releases = taken.into_iter().map(|(name, lease)| async move {
        let released = match tokio::time::timeout(budget, lease.release()).await {
            Ok(released) => released,
            Err(_) => Err(Error::Unavailable(format!(
                "releasing it timed out; the lease expires by itself within {}",
                humantime::format_duration(ttl)
            ))),
        };
        (name, released)
    });
    join_all(releases).await
}

/// Give back every lease of `taken` ([`release_each`]), telling each failure by its name.
async fn release_all<L: Lease>(taken: Vec<(LockName, L)>, ttl: Duration) {
    for (name, released) in release_each(taken, ttl).await {
        if let Err(err) = released {
            tracing::warn!("could not release '{name}': {err}");
        }
    }
}

impl<B: Backend> Backend for Several<B> {
    type Lease = SeveralLease<B::Lease>;

    /// Every name after the first may start at the end of the wait, with the server's time
    /// to answer ([`MIN_ANSWER`]) of its own.
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        let more = u32::try_from(self.also.len()).unwrap_or(u32::MAX);
        (self.inner.finish_after_answer(request) + MIN_ANSWER).saturating_mul(more)
            + self.inner.finish_after_answer(request)
    }

    /// Each name in the one order, each with what is left of the wait; all or none.
    async fn acquire(
        &self,
        request: &AcquireRequest,
        cancel: Cancel,
    ) -> Result<SeveralLease<B::Lease>, Error> {
        let mut taken: Vec<(LockName, B::Lease)> = Vec::with_capacity(self.also.len() + 1);
        for (at, name) in self.in_order(request).into_iter().enumerate() {
            // A cancel that came with the last grant: the next name is not asked for.
            let cancelled = cancel.clone().cancelled().now_or_never().is_some();
            let taking = if cancelled {
                Err(Error::Cancelled)
            } else {
                let one = request_for(request, name, at == 0);
                self.take_keeping(&one, &mut taken, cancel.clone()).await
            };
            match taking {
                Ok(lease) => taken.push((name.clone(), lease)),
                Err(err) => {
                    release_all(taken, request.ttl).await;
                    return Err(err);
                }
            }
        }
        Ok(SeveralLease::new(taken, request, &self.also))
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        self.inner.status(name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        self.inner.list().await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        self.inner.force_release(name).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        self.inner.check().await
    }
}

/// The leases of every name of a run, held as one.
pub struct SeveralLease<L> {
    /// Each name's lease, in the order taken.
    held: Vec<(LockName, L)>,
    /// Where the request's own name is in `held`.
    main: usize,
    /// Where each `--also` name is in `held`, in the order given.
    also: Vec<usize>,
    /// The lease length asked for, which bounds the release.
    ttl: Duration,
}

impl<L: Lease> SeveralLease<L> {
    fn new(
        held: Vec<(LockName, L)>,
        request: &AcquireRequest,
        also: &[LockName],
    ) -> SeveralLease<L> {
        let at = |wanted: &LockName| held.iter().position(|(name, _)| name == wanted);
        SeveralLease {
            main: at(&request.name).unwrap_or(0),
            also: also.iter().filter_map(at).collect(),
            ttl: request.ttl,
            held,
        }
    }
}

impl<L: Lease> Lease for SeveralLease<L> {
    fn token(&self) -> u64 {
        self.held
            .get(self.main)
            .map_or(0, |(_, lease)| lease.token())
    }

    fn also_held(&self) -> Vec<(LockName, u64)> {
        self.also
            .iter()
            .filter_map(|&at| self.held.get(at))
            .map(|(name, lease)| (name.clone(), lease.token()))
            .collect()
    }

    /// The first loss of any name; another name's says which.
    async fn lost(&mut self) -> Lost {
        let (index, mut lost) = first_lost(&mut self.held).await;
        if index != self.main {
            if let Some((name, _)) = self.held.get(index) {
                lost.reason = format!("'{name}', held with it, was lost: {}", lost.reason);
            }
        }
        lost
    }

    /// Every name, at once. A failure of an `--also` name is told here by its name; the
    /// request's own name's is returned, for the caller to tell.
    async fn release(self) -> Result<(), Error> {
        let main = self.main;
        let mut own = Ok(());
        for (at, (name, released)) in release_each(self.held, self.ttl)
            .await
            .into_iter()
            .enumerate()
        {
            match released {
                Err(err) if at != main => tracing::warn!("could not release '{name}': {err}"),
                released if at == main => own = released,
                _ => {}
            }
        }
        own
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        self.held
            .iter()
            .filter_map(|(_, lease)| lease.proven_until())
            .min()
    }

    /// On every name; recorded when it was for all of them.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let mut all = true;
        let mut first_error = None;
        for (name, lease) in &mut self.held {
            let holder = Holder {
                name: name.as_str().to_owned(),
                ..holder.clone()
            };
            match lease.finished(&holder).await {
                Ok(recorded) => all &= recorded,
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(all),
        }
    }
}

#[cfg(test)]
mod tests;
