//! Starting the command: `clone(CLONE_VM | CLONE_VFORK)` and `exec`, the way `posix_spawn`
//! does it, plus the two steps `posix_spawn` cannot do (`PR_SET_PDEATHSIG` and handing over
//! the terminal).
//!
//! A plain `fork` copies dlock's page tables and then both processes fault on every page
//! either of them writes until the child calls `exec`. With `CLONE_VM` the child borrows
//! dlock's memory and dlock is suspended until the child has called `exec` (or exited), so
//! none of that happens. It is the start-up cost of every critical section, on every backend.
//!
//! Borrowing the memory sets the rules for the child (see [`child_main`]): everything it
//! needs is prepared by the parent beforehand, it allocates nothing, takes no lock and only
//! makes system calls; it reports a failure by storing `errno` where the parent reads it.
//! Signals are blocked in dlock around the `clone`, and the child sets every handled signal
//! back to its default before unblocking, so a signal that arrives before `exec` cannot run one
//! of dlock's handlers in the child. Which signals dlock handles is known
//! ([`crate::signals::caught`]): the child changes those alone instead of asking about all 64
//! (64 system calls while dlock waits for the `exec`).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use libc::c_char;

/// What the child needs between `clone` and `exec`, all of it made before the `clone`.
struct Plan {
    program: CString,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    tty: Option<RawFd>,
    /// A close-on-exec descriptor the command inherits all the same.
    inherit: Option<RawFd>,
    /// dlock's pid: the child checks that it is still dlock's child once its death signal is set.
    parent: libc::pid_t,
    /// The signals to set back to their default, one bit each (`1 << (n - 1)`).
    reset: u64,
    /// `errno` of the step that failed in the child; 0 when `exec` succeeded.
    error: AtomicI32,
}

/// The stack the child runs on until `exec`. Its frames are small (a handful of system calls),
/// so this leaves a wide margin. It is not zeroed: only the pages the child touches are ever
/// faulted in.
const CHILD_STACK: usize = 32 * 1024;

/// Start `program` with `argv` (`argv[0]` included) and `env` (the whole environment) in a new
/// process group, with `PR_SET_PDEATHSIG(SIGKILL)`, and give it the terminal `tty` if set.
/// `inherit`, a descriptor dlock keeps close-on-exec, stays open in the command alone.
/// Returns once the child has called `exec`; an `exec` failure is returned as its `errno`.
pub fn spawn(
    program: &Path,
    argv: &[&OsStr],
    changes: &[(OsString, Option<OsString>)],
    tty: Option<RawFd>,
    inherit: Option<RawFd>,
) -> io::Result<libc::pid_t> {
    let program = c_string(program.as_os_str())?;
    let argv_strings = argv
        .iter()
        .map(|arg| c_string(arg))
        .collect::<io::Result<Vec<_>>>()?;
    let set_strings = changes
        .iter()
        .filter_map(|(key, value)| Some((key, value.as_ref()?)))
        .map(|(key, value)| {
            let mut entry = Vec::with_capacity(key.len() + 1 + value.len() + 1);
            entry.extend_from_slice(key.as_bytes());
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            CString::new(entry).map_err(|_| nul_error())
        })
        .collect::<io::Result<Vec<_>>>()?;
    // dlock's own entries as they are (pointers into its environment, nothing copied), but
    // those `changes` names; then the changed values.
    let mut envp = Vec::new();
    for_each_variable(|key, _, entry| {
        if !changes.iter().any(|(changed, _)| changed.as_bytes() == key) {
            envp.push(entry);
        }
    });
    envp.extend(set_strings.iter().map(|s| s.as_ptr()));
    envp.push(std::ptr::null());
    let plan = Plan {
        program,
        argv: null_terminated(&argv_strings),
        envp,
        tty,
        inherit,
        parent: std::process::id() as libc::pid_t,
        reset: signals_to_reset(),
        error: AtomicI32::new(0),
    };
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK);

    // SAFETY: all signals are blocked for the duration of the clone and restored after it.
    // The child runs `child_main` on `stack`, which outlives it: with CLONE_VFORK this thread
    // does not return from `clone` until the child has exec'd or exited, and `plan` and the
    // strings it points into are not touched by this thread meanwhile.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let top = stack.spare_capacity_mut().as_mut_ptr().add(CHILD_STACK);
        let top = top.sub(top as usize % 16);
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of!(plan) as *mut libc::c_void,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
    match plan.error.load(Ordering::Acquire) {
        0 => Ok(pid),
        errno => {
            // The child has exited; reap it so it does not linger as a zombie.
            let mut status = 0;
            // SAFETY: waiting for our own child, which has already exited.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The signals the command's process sets back to their default: those dlock handles, the
/// C library's own (from 32 to below `SIGRTMIN`: glibc handles them once a thread was
/// started), and SIGPIPE, which dlock ignores (src/start.rs).
fn signals_to_reset() -> u64 {
    let libc_own = (32..libc::SIGRTMIN())
        .filter_map(crate::signals::signal_bit)
        .fold(0, |set, bit| set | bit);
    let handled = crate::signals::caught() | libc_own;
    #[cfg(all(debug_assertions, not(test)))]
    handled_signals_are_known(handled);
    handled | crate::signals::signal_bit(libc::SIGPIPE).unwrap_or(0)
}

/// Debug builds: the kernel's list of this process's handled signals (`SigCgt:`) has none
/// that dlock did not record; one missing would run a handler of dlock's in the command's
/// process before its `exec`.
#[cfg(all(debug_assertions, not(test)))]
fn handled_signals_are_known(known: u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(caught) = status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
    else {
        return;
    };
    assert!(
        caught & !known == 0,
        "handled signals {caught:#x}, of which dlock recorded {known:#x}"
    );
}

/// The child, between `clone` and `exec`. Only system calls on what `Plan` holds: no
/// allocation, no locks, nothing that writes memory dlock uses except `plan.error`.
extern "C" fn child_main(plan: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `plan` is the parent's `Plan`, alive and unchanged until this child execs or exits.
    let plan = unsafe { &*(plan as *const Plan) };
    let fail = |plan: &Plan| {
        plan.error.store(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL),
            Ordering::Release,
        );
        127
    };
    // SAFETY: plain system calls on integers and on the NUL-terminated arrays in `plan`.
    unsafe {
        // dlock's handlers must not run here: back to the default for every handled signal,
        // and SIGPIPE (which dlock ignores) too, before anything is unblocked.
        for signal in 1..=64 {
            if plan.reset & (1u64 << (signal - 1)) != 0 {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        // The child has its own descriptor table: this changes nothing in dlock.
        if let Some(fd) = plan.inherit {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return fail(plan);
            }
        }
        if libc::setpgid(0, 0) != 0 {
            return fail(plan);
        }
        if let Some(tty) = plan.tty {
            // SIGTTOU is blocked (everything is), so this works from the background too.
            libc::tcsetpgrp(tty, libc::getpid());
        }
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return fail(plan);
        }
        // dlock died before the death signal was set: do not run the command orphaned.
        if libc::getppid() != plan.parent {
            plan.error.store(libc::ESRCH, Ordering::Release);
            return 127;
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(
            plan.program.as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
        );
    }
    fail(plan)
}

unsafe extern "C" {
    /// The process's environment, as the C library keeps it.
    static environ: *const *const c_char;
}

/// Each entry of this process's environment, to `each` as its key, its value and the whole
/// `KEY=VALUE` C string; an entry without `=` after its first byte is passed over, as
/// `std::env::vars_os` does. Nothing is copied: for the command's environment and the
/// credentials to take out of it, on the way to the command's start.
pub(crate) fn for_each_variable(mut each: impl FnMut(&[u8], &[u8], *const c_char)) {
    // SAFETY: `environ` is a null-terminated array of NUL-terminated strings that the C
    // library keeps for the whole process. dlock changes its environment only as it starts
    // (`secrets::restore_inherited`, before any other thread exists), and no thread of it
    // does afterwards, so neither the array nor its strings change while this reads them.
    unsafe {
        let mut at = environ;
        if at.is_null() {
            return;
        }
        // Bounded: the array ends with a null pointer.
        while !(*at).is_null() {
            let entry = *at;
            let bytes = std::ffi::CStr::from_ptr(entry).to_bytes();
            if let Some(equals) = bytes.iter().skip(1).position(|&b| b == b'=') {
                let (key, value) = bytes.split_at(equals + 1);
                each(key, &value[1..], entry);
            }
            at = at.add(1);
        }
    }
}

fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes()).map_err(|_| nul_error())
}

fn nul_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "an argument or environment variable contains a NUL byte",
    )
}

fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}
