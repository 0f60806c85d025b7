//! What the steps of one run tell of what happened to it ([`Event`]), and who listens
//! ([`Observer`]). The steps report facts as they happen and know nothing of who listens;
//! the outcome record (`record.rs`) is one listener, built from what they report.

use crate::lock::Holder;

/// One thing that happened to a run, told when it happened.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Event {
    /// The lock is held: granted with this fencing token, or (`None`) held by an ancestor
    /// whose hold this run re-entered.
    Acquired(Option<u64>),
    /// Acquiring ended without the lock: an error, or a re-entry that would upgrade a
    /// shared hold.
    GaveUp,
    /// The lock is held elsewhere: the run ends with the conflict status.
    Busy,
    /// Who holds the lock this run did not get (told after [`Event::Busy`], when known).
    HeldBy(Holder),
    /// This signal ended the wait, or came while the lock was being granted: the command did
    /// not run.
    SignalledWhileWaiting(i32),
    /// The lock was lost while the command ran (why).
    Lost(String),
    /// dlock was asked to stop by this terminating signal and forwarded it to the command.
    StoppedBy(i32),
    /// The command ended with this status (as dlock maps it: 128+N for a signal).
    CommandEnded(u8),
    /// This signal ended `--min-hold`'s keeping of the lock after the command finished.
    SignalledWhileKept(i32),
    /// A hold (`dlock hold`) ended this way: `release`, `owner` (the process it belonged to
    /// ended), `max-hold`, `signal`.
    HoldEnded(&'static str),
}

/// Whoever wants to know what happens to a run.
pub(super) trait Observer {
    fn saw(&mut self, event: Event);
}
