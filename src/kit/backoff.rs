//! Pauses between retries: each drawn from the upper half of a step that grows from a first
//! step up to a cap, so that a crowd of clients started together spreads out instead of
//! coming back in step. The callers pick the first step, the cap and how fast it grows:
//! waiting out a full server ([`super::capacity`]), a memcached waiter's polls and its
//! reconnections.
//!
//! Pauses are periods, not deadlines: `--wait` bounds the whole, and a busy machine only makes
//! a pause longer, never an attempt fail.

use std::time::Duration;

/// Growing, jittered pauses (see the module doc).
#[derive(Debug)]
pub struct Backoff {
    /// The step the next pause is drawn from.
    next: Duration,
    first: Duration,
    cap: Duration,
    /// Each step is the last times `grow.0 / grow.1`.
    grow: (u32, u32),
    rng: u64,
}

impl Backoff {
    /// Pauses from about `first`, the step doubling each time up to `cap`.
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        Backoff {
            next: first,
            first,
            cap,
            grow: (2, 1),
            rng: (a ^ b) | 1,
        }
    }

    /// A waiter's polls where the server notifies nobody (memcached, S3, Azure Blob): from
    /// about `first`, the step growing by half each time up to `cap`, so that a release is
    /// seen soon after a short hold and a long wait costs few requests.
    pub fn polling(first: Duration, cap: Duration) -> Backoff {
        Backoff::new(first, cap).growing_by(3, 2)
    }

    /// The same, the step growing by `numerator / denominator` each time instead of doubling.
    pub fn growing_by(self, numerator: u32, denominator: u32) -> Backoff {
        Backoff {
            grow: (numerator, denominator.max(1)),
            ..self
        }
    }

    /// The next pause: drawn uniformly from the upper half of the current step (to the
    /// microsecond); the step then grows, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (step * self.grow.0 / self.grow.1).min(self.cap);
        let micros = u64::try_from(step.as_micros()).unwrap_or(u64::MAX).max(2);
        Duration::from_micros(micros / 2 + self.random(micros / 2 + 1))
    }

    /// Start again from the first step (what was retried has succeeded).
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// A number in `0..n` from the same generator (xorshift64*, seeded from the kernel's
    /// random source; not for secrets): for other choices that must not fall in step.
    pub fn random(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_pauses_grow_with_jitter_up_to_the_cap() {
        let (first, cap) = (Duration::from_millis(20), Duration::from_secs(1));
        let mut backoff = Backoff::new(first, cap);
        let pauses: Vec<Duration> = (0..12).map(|_| backoff.next_delay()).collect();
        assert!(pauses[0] >= first / 2 && pauses[0] <= first, "{pauses:?}");
        assert!(pauses[1] >= first && pauses[1] <= first * 2, "{pauses:?}");
        assert!(pauses.iter().all(|p| *p <= cap), "{pauses:?}");
        assert!(pauses[11] >= cap / 2, "{pauses:?}");
        // Two crowds of clients do not pause in step.
        let mut other = Backoff::new(first, cap);
        let theirs: Vec<Duration> = (0..12).map(|_| other.next_delay()).collect();
        assert_ne!(pauses, theirs);
    }

    #[test]
    fn slower_growth_reaches_the_cap_later_and_reset_starts_again() {
        let (first, cap) = (Duration::from_millis(2), Duration::from_millis(25));
        let mut backoff = Backoff::polling(first, cap);
        let delays: Vec<Duration> = (0..40).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] >= first / 2 && delays[0] <= first, "{delays:?}");
        // 2 ms, then 3 ms: half again, not double.
        assert!(delays[1] <= first * 3 / 2, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= cap), "{delays:?}");
        assert!(delays[30..].iter().all(|d| *d >= cap / 2), "{delays:?}");
        let distinct: std::collections::HashSet<_> = delays[30..].iter().collect();
        assert!(distinct.len() > 1, "no jitter: {delays:?}");
        backoff.reset();
        assert!(backoff.next_delay() <= first);
    }
}
