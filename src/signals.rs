//! The signals dlock catches, and what they mean to it.
//!
//! Listeners are installed before the lock is requested, so a signal while waiting cancels the
//! wait instead of killing dlock with a waiter left behind. tokio never restores the default
//! action once a listener exists, so every state of dlock must select on [`Signals::recv`].

use tokio::signal::unix::{signal, Signal, SignalKind};

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
            .map(|&n| signal(SignalKind::from_raw(n)).map(|s| (n, s)))
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
