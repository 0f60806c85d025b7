//! The signals dlock catches, and what they mean to it.
//!
//! Listeners are installed before the lock is requested, so a signal while waiting cancels the
//! wait instead of killing dlock with a waiter left behind. tokio never restores the default
//! action once a listener exists, so every state of dlock must select on [`Signals::recv`].

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::signal::unix::{Signal, SignalKind};

/// The signals dlock has installed a handler for, one bit each (`1 << (n - 1)`): what the
/// command's process must set back to the default before it unblocks signals
/// (`spawn::child_main`). Every handler dlock installs goes through [`listen`] or is
/// recorded with [`catching`]; debug builds check the kernel's list against this one at
/// every spawn.
static CAUGHT: AtomicU64 = AtomicU64::new(0);

/// Record that a handler for `signal` is (about to be) installed.
pub fn catching(signal: i32) {
    if let Some(bit) = signal_bit(signal) {
        CAUGHT.fetch_or(bit, Ordering::SeqCst);
    }
}

/// The signals recorded by [`catching`], one bit each.
pub fn caught() -> u64 {
    CAUGHT.load(Ordering::SeqCst)
}

/// The bit of `signal` in a set of signals 1 to 64 (as /proc's `SigCgt:` shows them).
pub fn signal_bit(signal: i32) -> Option<u64> {
    let shift = u32::try_from(signal).ok()?.checked_sub(1)?;
    1u64.checked_shl(shift)
}

/// A tokio listener for `signal`, recorded in [`caught`].
pub fn listen(signal: i32) -> std::io::Result<Signal> {
    catching(signal);
    tokio::signal::unix::signal(SignalKind::from_raw(signal))
}

/// Signals forwarded to the command (docs/guide.md: "Signals").
pub const FORWARDED: [i32; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Signals that ask the command to stop: after forwarding one, the command gets
/// `--kill-after` to exit, and a second one sends SIGKILL.
pub fn is_terminating(signal: i32) -> bool {
    matches!(
        signal,
        libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT
    )
}

/// The name of a signal, for messages.
pub fn name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_owned())
}

pub struct Signals {
    streams: Vec<(i32, Signal)>,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        let streams = FORWARDED
            .iter()
            .map(|&n| listen(n).map(|s| (n, s)))
            .collect::<std::io::Result<_>>()?;
        Ok(Signals { streams })
    }

    /// The next signal received. Cancel-safe.
    pub async fn recv(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (number, stream) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*number);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// A signal that has already arrived, without waiting.
    pub fn try_recv(&mut self) -> Option<i32> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        for (number, stream) in &mut self.streams {
            if stream.poll_recv(&mut cx).is_ready() {
                return Some(*number);
            }
        }
        None
    }
}
