//! What a waiter may have left on a server, given back on the one way out of its acquisition.
//!
//! A step of an acquisition can leave something on the server for the waiter's token: a
//! place in line, or a grant whose reply was lost. Rather than a give-back beside each
//! `return` (each with its own condition), the steps say after each answer or failure what
//! the server may now hold for us ([`Owed::set`]), and the acquisition ends through
//! [`Owed::settle`], which gives it back when the acquisition ended without the lock.
//!
//! Backends whose queue place is their session (PostgreSQL, MySQL, ZooKeeper's ephemeral
//! node, etcd's waiter lease) or a single registration (memcached) leave at one point
//! already; the Redis waiter, whose place outlives its connection, uses this.

use std::cell::Cell;
use std::future::Future;

/// Whether the server may hold something for this acquisition that it must give back if
/// the lock does not become ours. Starts empty.
#[derive(Debug, Default)]
pub struct Owed(Cell<bool>);

impl Owed {
    pub fn new() -> Owed {
        Owed::default()
    }

    /// After a step: whether the server may now hold something for us.
    pub fn set(&self, held: bool) {
        self.0.set(held);
    }

    /// Whether the server may hold something for us.
    pub fn is_held(&self) -> bool {
        self.0.get()
    }

    /// The acquisition's way out: when `outcome` is not the lock and the server may hold
    /// something for us, `leave` gives it back first.
    pub async fn settle<T, E, L>(
        &self,
        outcome: Result<T, E>,
        leave: impl FnOnce() -> L,
    ) -> Result<T, E>
    where
        L: Future<Output = ()>,
    {
        if outcome.is_err() && self.is_held() {
            leave().await;
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `settle` with `outcome`, counting the calls of `leave`.
    fn leaves(owed: &Owed, outcome: Result<(), ()>) -> usize {
        let calls = Cell::new(0);
        let settled = owed.settle(outcome, || async { calls.set(calls.get() + 1) });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
        let _ = runtime.block_on(settled);
        calls.get()
    }

    #[test]
    fn gives_back_only_what_a_failed_acquisition_may_have_left() {
        let owed = Owed::new();
        assert_eq!(leaves(&owed, Err(())), 0, "nothing was left yet");
        owed.set(true);
        assert_eq!(leaves(&owed, Err(())), 1, "a place in line is given back");
        assert_eq!(leaves(&owed, Ok(())), 0, "a grant is kept");
        owed.set(false);
        assert_eq!(leaves(&owed, Err(())), 0, "a step said nothing is left");
    }
}
