//! The `dlock` binary: its C `main`, which hands the arguments to the library
//! ([`dlock::start`]). Everything else lives in the library.
//!
//! `#![no_main]`: Rust's runtime set-up before `fn main` costs every run a read of
//! `/proc/self/maps` that dlock does not need; `dlock::start` does the part it does need
//! (src/start.rs says which).

#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
use std::ffi::{c_char, c_int, CStr, OsStr};
#[cfg(not(test))]
use std::os::unix::ffi::OsStrExt;

#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(argc: c_int, argv: *const *const c_char) -> c_int {
    let count = usize::try_from(argc).unwrap_or(0);
    let args = (0..count)
        .map_while(|i| {
            // SAFETY: the C runtime passes `argc` pointers to NUL-terminated strings in
            // `argv`, alive for the whole process; a null one ends the list early.
            let word = unsafe { *argv.add(i) };
            // SAFETY: as above, `word` is a NUL-terminated string when it is not null.
            (!word.is_null()).then(|| unsafe { CStr::from_ptr(word) })
        })
        .map(|word| OsStr::from_bytes(word.to_bytes()).to_owned())
        .collect();
    c_int::from(dlock::start(args))
}
