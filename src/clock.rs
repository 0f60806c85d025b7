//! Time that keeps counting through suspend.
//!
//! Lease deadlines must be measured on `CLOCK_BOOTTIME`: `std::time::Instant` and tokio's
//! timers use `CLOCK_MONOTONIC`, which stops while the machine is suspended, so a deadline
//! computed on it would fire late after a resume, when the server has long expired the lease.
//! [`sleep_until`] arms a `timerfd` on `CLOCK_BOOTTIME` for the same reason.

use std::ops::Add;
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::time::{clock_gettime, ClockId as TimeClockId};
use std::os::fd::{AsFd, AsRawFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A point on `CLOCK_BOOTTIME` (time since boot, suspend included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    pub fn now() -> BootInstant {
        // CLOCK_BOOTTIME exists on every Linux since 2.6.39; the fallback only keeps this total.
        let ts = clock_gettime(TimeClockId::CLOCK_BOOTTIME)
            .or_else(|_| clock_gettime(TimeClockId::CLOCK_MONOTONIC))
            .unwrap_or_else(|_| TimeSpec::new(0, 0));
        BootInstant(Duration::from(ts))
    }

    /// Time since boot, as the kernel counts a process's start (`/proc/PID/stat`).
    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time from now until `self`, zero if it has passed.
    pub fn remaining(self) -> Duration {
        self.saturating_since(BootInstant::now())
    }

    pub fn saturating_sub(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d))
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d))
    }
}

/// Sleep until `deadline` on `CLOCK_BOOTTIME`. Falls back to tokio's timer if a timerfd
/// cannot be created (which only happens when the process is out of file descriptors).
pub async fn sleep_until(deadline: BootInstant) {
    match arm_timerfd(deadline) {
        Ok(fd) => {
            // Readable once the absolute deadline has passed, suspend or not.
            if let Ok(mut guard) = fd.readable().await {
                guard.clear_ready();
            }
        }
        Err(err) => {
            tracing::debug!("timerfd unavailable ({err}); using the monotonic clock");
            tokio::time::sleep(deadline.remaining()).await;
        }
    }
}

fn arm_timerfd(deadline: BootInstant) -> std::io::Result<AsyncFd<Readable<TimerFd>>> {
    let timer = TimerFd::new(
        ClockId::CLOCK_BOOTTIME,
        TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
    )?;
    // A zero it_value disarms a timerfd, so a deadline at "boot + 0" is moved by 1 ns.
    let at = deadline.0.max(Duration::from_nanos(1));
    timer.set(
        Expiration::OneShot(TimeSpec::from_duration(at)),
        TimerSetTimeFlags::TFD_TIMER_ABSTIME,
    )?;
    Readable::register(timer)
}

/// A descriptor-owning nix type, registered with tokio for readability.
pub struct Readable<T: AsFd>(pub T);

impl<T: AsFd> AsRawFd for Readable<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl<T: AsFd> Readable<T> {
    pub fn register(inner: T) -> std::io::Result<AsyncFd<Readable<T>>> {
        // SAFETY: `inner` owns its descriptor and keeps it open, unchanged, until it is dropped
        // together with the AsyncFd.
        unsafe { AsyncFd::register_with_interest(Readable(inner), Interest::READABLE) }
            .map_err(|e| e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_moves_forward() {
        let a = BootInstant::now();
        let b = BootInstant::now();
        assert!(b >= a);
        assert_eq!(
            a.saturating_since(b + Duration::from_secs(1)),
            Duration::ZERO
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sleep_until_waits_for_the_deadline() {
        let start = BootInstant::now();
        sleep_until(start + Duration::from_millis(30)).await;
        assert!(BootInstant::now().saturating_since(start) >= Duration::from_millis(30));
        // A deadline in the past returns at once.
        sleep_until(start).await;
    }
}
