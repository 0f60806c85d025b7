//! What a process needs before dlock's own code runs, done here instead of by Rust's runtime.
//!
//! The binary has its own C `main` (`src/main.rs`, `#![no_main]`): Rust's runtime set-up
//! before `fn main` reads `/proc/self/maps` through `pthread_getattr_np` to place a guard for
//! the main thread's stack (a tenth of an uncontended run's instructions, and six system
//! calls), which dlock does not need: a stack overflow is then a plain SIGSEGV instead of
//! the runtime's message before its abort — either way a crash, and the kernel's guard gap
//! still stops it. The two things the runtime does that dlock relies on are done here: the
//! standard streams are open (a lock file must never become descriptor 1, where the command
//! would write its output), and SIGPIPE is ignored (a write to a closed pipe is an error
//! dlock reports, not its death). Standard output is flushed at the end, as the runtime does.

use std::ffi::OsString;

/// Run dlock as a process: set up what Rust's runtime would have, run [`crate::main_entry`]
/// with `args` (argv\[0\] first), flush standard output, and return the exit status.
pub fn start(args: Vec<OsString>) -> u8 {
    open_standard_streams();
    // SAFETY: setting a signal's disposition to SIG_IGN runs no code of ours.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let status = crate::main_entry(args);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    status
}

/// Descriptors 0, 1 and 2 that are closed are opened on /dev/null, so that no file dlock
/// opens takes their place.
fn open_standard_streams() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // Bounded: poll with a timeout of 0 is retried only when a signal interrupted it.
    for _ in 0..100 {
        // SAFETY: `fds` is an array of three pollfd that poll may write.
        if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } != -1 {
            for pollfd in fds {
                if pollfd.revents & libc::POLLNVAL != 0 {
                    open_null();
                }
            }
            return;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    // poll refused (a descriptor limit under 3): ask each descriptor.
    for fd in 0..3 {
        // SAFETY: F_GETFD reads a descriptor's flags, on any integer.
        let closed = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
        if closed {
            open_null();
        }
    }
}

/// Open /dev/null, which takes the lowest closed descriptor; abort where even that fails
/// (nothing could be said: the standard streams are closed).
fn open_null() {
    // SAFETY: a NUL-terminated path and plain flags.
    if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } == -1 {
        std::process::abort();
    }
}
