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
    let mut lease =
        block_on(backend.acquire(&request("a", Wait::Forever), Cancel::never())).expect("taken");
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
