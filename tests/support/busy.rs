//! A machine kept busy: one spinning thread per core, for a bounded time.
//!
//! What it reproduces is dlock's own CPU starvation: a `dlock run` that waits on an answer
//! (a grant's confirmation, a renewal) gets the CPU late to read it, so a deadline inside
//! dlock that is not derived from the lease fires although the lease still has seconds to
//! run. The spinners are niced a little ([`NICE`]), so that the rest of a parallel suite is
//! slowed less than by full-weight hogs, yet they still reproduce that starvation: they
//! never sleep, and a nice 2 thread still weighs two thirds of a nice 0 one, so a woken dlock
//! waits for a core behind them as on a loaded CI runner. (On two cores, a grant check
//! bounded by a fixed 500 ms fails the PostgreSQL case with 69 in each of two runs at nice 2
//! and at nice 0, and in none of one at nice 5, where the scheduler hands dlock a core at
//! once.) The threads live in the test process (nothing outlives a killed test) and stop
//! when the [`Busy`] is dropped or after its bound, whichever comes first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The spinners' niceness (see the module docs).
pub const NICE: i32 = 2;

/// Spinning threads, one per core; they stop when this is dropped.
pub struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
    started: Instant,
}

impl Busy {
    /// Keep every core busy for at most `bound`.
    pub fn every_core(bound: Duration) -> Busy {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || spin(&stop, started + bound))
            })
            .collect();
        Busy {
            stop,
            threads,
            started,
        }
    }

    /// How long the spinners have been at it.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Spin at [`NICE`] until told to stop or `until`; returns the rounds spun.
fn spin(stop: &AtomicBool, until: Instant) -> u64 {
    // Only this thread's niceness changes (a Linux thread is a task of its own). Should it
    // fail, the thread spins at the test's own priority: busier, not less so.
    // SAFETY: plain system calls on this thread's own id.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE);
    }
    let mut rounds = 0u64;
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        for _ in 0..100_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        rounds += 1;
    }
    rounds
}
