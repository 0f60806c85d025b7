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
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use tokio::sync::watch;

    use super::*;
    use crate::budget::{Wait, WaitBudget};

    /// What the fake backend was asked, name by name.
    #[derive(Default)]
    struct Log {
        taken: Vec<String>,
        released: Vec<String>,
        /// Names whose lease's `lost()` was polled (kept alive).
        polled: Vec<String>,
        cancelled: Vec<String>,
    }

    /// Grants every name at once, but those in `busy` (75), those in `hang` (waits until
    /// cancelled); a lease is lost when `lose` names it.
    struct Fake {
        log: Rc<RefCell<Log>>,
        busy: Vec<&'static str>,
        hang: Vec<&'static str>,
        fail_release: Vec<&'static str>,
        lose: watch::Receiver<String>,
    }

    struct FakeLease {
        name: String,
        token: u64,
        log: Rc<RefCell<Log>>,
        fail_release: bool,
        lose: watch::Receiver<String>,
    }

    impl Lease for FakeLease {
        fn token(&self) -> u64 {
            self.token
        }

        async fn lost(&mut self) -> Lost {
            self.log.borrow_mut().polled.push(self.name.clone());
            let name = self.name.clone();
            if self.lose.wait_for(|lost| *lost == name).await.is_err() {
                std::future::pending::<()>().await;
            }
            Lost::gone(format!("{name} is gone"))
        }

        async fn release(self) -> Result<(), Error> {
            self.log.borrow_mut().released.push(self.name.clone());
            if self.fail_release {
                return Err(Error::Unavailable(format!(
                    "{} cannot be released",
                    self.name
                )));
            }
            Ok(())
        }
    }

    impl Backend for Fake {
        type Lease = FakeLease;

        async fn acquire(
            &self,
            request: &AcquireRequest,
            mut cancel: Cancel,
        ) -> Result<FakeLease, Error> {
            let name = request.name.as_str();
            assert_eq!(request.holder.name, name, "the holder records its own name");
            if self.busy.contains(&name) {
                return Err(Error::Busy(format!("lock '{name}' is held")));
            }
            if self.hang.contains(&name) {
                cancel.cancelled().await;
                self.log.borrow_mut().cancelled.push(name.to_owned());
                return Err(Error::Cancelled);
            }
            let mut log = self.log.borrow_mut();
            log.taken.push(name.to_owned());
            Ok(FakeLease {
                name: name.to_owned(),
                token: 10 + log.taken.len() as u64,
                log: self.log.clone(),
                fail_release: self.fail_release.contains(&name),
                lose: self.lose.clone(),
            })
        }

        async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
            Err(Error::Internal(format!("no status of {name} here")))
        }

        async fn list(&self) -> Result<Vec<LockStatus>, Error> {
            Ok(Vec::new())
        }

        async fn force_release(&self, _: &LockName) -> Result<Vec<Holder>, Error> {
            Ok(Vec::new())
        }

        async fn check(&self) -> Result<CheckReport, Error> {
            Err(Error::Internal("not a real backend".into()))
        }
    }

    fn name(text: &str) -> LockName {
        LockName::new(text).expect("a valid name")
    }

    /// A [`Several`] over a fake holding `also` with every request, the fake's log, and the
    /// sender that makes a name's lease lost.
    fn several(
        also: &[&str],
        fake: impl FnOnce(&mut Fake),
    ) -> (Several<Fake>, Rc<RefCell<Log>>, watch::Sender<String>) {
        let log = Rc::new(RefCell::new(Log::default()));
        let (lose_tx, lose) = watch::channel(String::new());
        let mut inner = Fake {
            log: log.clone(),
            busy: Vec::new(),
            hang: Vec::new(),
            fail_release: Vec::new(),
            lose,
        };
        fake(&mut inner);
        let also = also.iter().map(|n| name(n)).collect();
        (Several::new(inner, also), log, lose_tx)
    }

    fn request(text: &str, wait: Wait) -> AcquireRequest {
        let name = name(text);
        AcquireRequest {
            holder: Holder::for_this_process(&name, &[], Duration::from_secs(15)),
            name,
            limit: 1,
            mode: crate::lock::Mode::Exclusive,
            ttl: Duration::from_secs(15),
            budget: WaitBudget::start(wait),
            kill_after: Duration::from_secs(10),
            likely_held: false,
            on_queued: Default::default(),
        }
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), future).await })
            .expect("done within 20 s")
    }

    #[test]
    fn names_are_taken_in_one_order_whatever_order_they_are_given_in() {
        for (main, also) in [("m", ["z", "a"]), ("z", ["a", "m"]), ("a", ["m", "z"])] {
            let (backend, log, _lose) = several(&also, |_| {});
            let lease = block_on(backend.acquire(&request(main, Wait::Forever), Cancel::never()))
                .expect("all three taken");
            assert_eq!(log.borrow().taken, ["a", "m", "z"], "given {main} {also:?}");
            let token_of = |n: &str| {
                10 + log
                    .borrow()
                    .taken
                    .iter()
                    .position(|t| t == n)
                    .map_or(0, |i| i as u64 + 1)
            };
            assert_eq!(lease.token(), token_of(main));
            let also_held: Vec<(String, u64)> = lease
                .also_held()
                .into_iter()
                .map(|(n, t)| (n.to_string(), t))
                .collect();
            assert_eq!(
                also_held,
                also.iter()
                    .map(|n| (n.to_string(), token_of(n)))
                    .collect::<Vec<_>>(),
                "the --also names in the order given"
            );
            block_on(lease.release()).expect("released");
            assert_eq!(log.borrow().released.len(), 3);
        }
    }

    #[test]
    fn what_was_taken_is_given_back_when_a_later_name_is_busy() {
        let (backend, log, _lose) = several(&["b", "c"], |fake| fake.busy = vec!["b"]);
        let result = block_on(backend.acquire(&request("a", Wait::No), Cancel::never()));
        assert!(matches!(result, Err(Error::Busy(ref m)) if m.contains("'b'")));
        let log = log.borrow();
        assert_eq!(log.taken, ["a"], "nothing after the busy name is asked for");
        assert_eq!(log.released, ["a"]);
    }

    #[test]
    fn the_names_taken_are_kept_alive_and_a_loss_while_waiting_gives_everything_back() {
        let (backend, log, lose) = several(&["b"], |fake| fake.hang = vec!["b"]);
        let result = block_on(async {
            let request = request("a", Wait::Forever);
            let acquire = backend.acquire(&request, Cancel::never());
            tokio::pin!(acquire);
            // Waiting for `b`: `a`'s lease is polled meanwhile, then lost.
            let polled = async {
                while !log.borrow().polled.contains(&"a".to_owned()) {
                    tokio::task::yield_now().await;
                }
                lose.send_replace("a".into());
                std::future::pending::<()>().await;
            };
            tokio::select! {
                result = &mut acquire => result,
                () = polled => unreachable!(),
            }
        });
        let Err(Error::Unavailable(message)) = result else {
            panic!("not ended by the loss");
        };
        assert!(
            message.contains("'a' was lost while waiting for 'b'"),
            "{message}"
        );
        let log = log.borrow();
        assert_eq!(log.cancelled, ["b"], "the wait for b was cancelled");
        assert_eq!(log.released, ["a"]);
    }

    #[test]
    fn a_cancel_while_waiting_gives_back_what_was_taken() {
        let (backend, log, _lose) = several(&["b"], |fake| fake.hang = vec!["b"]);
        let (canceller, cancel) = lock::cancellation();
        let result = block_on(async {
            let request = request("a", Wait::Forever);
            let acquire = backend.acquire(&request, cancel);
            tokio::pin!(acquire);
            let cancelling = async {
                while !log.borrow().polled.contains(&"a".to_owned()) {
                    tokio::task::yield_now().await;
                }
                canceller.cancel();
                std::future::pending::<()>().await;
            };
            tokio::select! {
                result = &mut acquire => result,
                () = cancelling => unreachable!(),
            }
        });
        assert!(matches!(result, Err(Error::Cancelled)));
        let log = log.borrow();
        assert_eq!(
            (log.cancelled.as_slice(), log.released.as_slice()),
            (&["b".to_owned()][..], &["a".to_owned()][..])
        );
    }

    #[test]
    fn the_lease_is_lost_with_any_name_and_releases_every_name_even_when_one_fails() {
        let (backend, log, lose) = several(&["b", "c"], |fake| fake.fail_release = vec!["b"]);
        let mut lease = block_on(backend.acquire(&request("a", Wait::Forever), Cancel::never()))
            .expect("taken");
        lose.send_replace("c".into());
        let lost = block_on(lease.lost());
        assert!(
            lost.reason.contains("'c', held with it, was lost"),
            "{}",
            lost.reason
        );
        // The request's own name released; `b`'s failure is told, not returned.
        assert!(block_on(lease.release()).is_ok());
        let mut released = log.borrow().released.clone();
        released.sort();
        assert_eq!(released, ["a", "b", "c"]);
    }
}
