//! The kernel's file locks, as the file backend's lock files and the host-local queue's
//! tickets use them: `flock(2)` on a whole file, an OFD record lock on a file's first bytes,
//! and waiting for `flock` in the kernel.
//!
//! Waiting: each file gets a helper thread blocked in `flock(LOCK_EX)`, so a release hands
//! over without polling; the first thread to win gives its file to the waiter. The wait is
//! cancelled by interrupting those threads with a private real-time signal.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::error::Error;

/// `flock(2)` on `file`: `libc::LOCK_EX`, `LOCK_EX | LOCK_NB`, …
pub(crate) fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Take (`lock`) or drop a blocking OFD write lock on the first `len` bytes of `file`: the
/// lock of a counter kept at the start of a file, which `flock` holders of the same file do
/// not conflict with.
pub(crate) fn range_lock(file: &File, len: usize, lock: bool) -> io::Result<()> {
    // SAFETY: a zeroed flock struct is a valid starting value; fcntl reads it only.
    let mut range: libc::flock = unsafe { std::mem::zeroed() };
    range.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    range.l_whence = libc::SEEK_SET as libc::c_short;
    range.l_start = 0;
    range.l_len = len as libc::off_t;
    loop {
        // SAFETY: F_OFD_SETLKW with a pointer to a live, initialised flock struct.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &range) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Blocking `flock(LOCK_EX)` on several slot files at once, one helper thread each; the first
/// to succeed wins. [`BlockedWait::stop`] interrupts the rest and releases any slot that was
/// won after the first.
pub(crate) struct BlockedWait {
    stop: Arc<AtomicBool>,
    threads: Vec<(u32, std::thread::JoinHandle<()>)>,
    results: mpsc::UnboundedReceiver<(u32, io::Result<(File, String)>)>,
}

/// The real-time signal used to interrupt blocked `flock` calls in helper threads.
fn interrupt_signal() -> libc::c_int {
    libc::SIGRTMIN() + 5
}

extern "C" fn ignore_interrupt(_: libc::c_int) {}

fn install_interrupt_handler() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: installing a handler that does nothing; SA_RESTART is deliberately not set so
        // that a blocked flock returns EINTR.
        crate::signals::catching(interrupt_signal());
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore_interrupt as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(interrupt_signal(), &action, std::ptr::null_mut());
        }
    });
}

impl BlockedWait {
    /// Start waiting for each of `files`: (slot, open slot file, its file name).
    pub(crate) fn start(files: Vec<(u32, File, String)>) -> BlockedWait {
        BlockedWait::start_with(files, libc::LOCK_EX)
    }

    /// As [`BlockedWait::start`], blocking in `flock(operation)` (`LOCK_SH` for a shared hold).
    pub(crate) fn start_with(
        files: Vec<(u32, File, String)>,
        operation: libc::c_int,
    ) -> BlockedWait {
        install_interrupt_handler();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, results) = mpsc::unbounded_channel();
        let threads = files
            .into_iter()
            .map(|(slot, file, path)| {
                let stop = stop.clone();
                let tx = tx.clone();
                let thread = std::thread::spawn(move || loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match flock(&file, operation) {
                        Ok(()) => {
                            // Won after the wait was stopped: dropping the file releases it.
                            if !stop.load(Ordering::SeqCst) {
                                let _ = tx.send((slot, Ok((file, path))));
                            }
                            return;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            let _ = tx.send((slot, Err(e)));
                            return;
                        }
                    }
                });
                (slot, thread)
            })
            .collect();
        BlockedWait {
            stop,
            threads,
            results,
        }
    }

    /// The first slot won, with its file.
    pub(crate) async fn first(&mut self) -> Result<(u32, File, String), Error> {
        match self.results.recv().await {
            Some((slot, Ok((file, path)))) => Ok((slot, file, path)),
            Some((_, Err(e))) => Err(Error::from_lock_io("cannot lock".into(), &e)),
            None => Err(Error::Internal(
                "lock waiters ended without a result".into(),
            )),
        }
    }

    /// Interrupt and join every helper thread; slots won meanwhile are released. The thread
    /// that won slot `won` has nothing left to do but return, so it is just joined: this is
    /// on the hand-over path.
    pub(crate) fn stop(mut self, won: Option<u32>) {
        use std::os::unix::thread::JoinHandleExt;
        self.stop.store(true, Ordering::SeqCst);
        for (slot, thread) in std::mem::take(&mut self.threads) {
            if Some(slot) != won {
                // A signal can arrive just before the thread enters flock; keep nudging it.
                for _ in 0..5000 {
                    if thread.is_finished() {
                        break;
                    }
                    // std's handle is an integer; musl's pthread_t is a pointer (the cast is
                    // needed for the static musl build, a no-op with glibc).
                    #[allow(clippy::unnecessary_cast)]
                    let pthread = thread.as_pthread_t() as libc::pthread_t;
                    // SAFETY: the thread is not joined yet, so its pthread_t is valid.
                    unsafe { libc::pthread_kill(pthread, interrupt_signal()) };
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            let _ = thread.join();
        }
        self.results.close();
        while let Ok((_, won)) = self.results.try_recv() {
            drop(won);
        }
    }
}
