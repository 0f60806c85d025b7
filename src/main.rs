//! The `dlock` binary: parse, run on a current-thread runtime, map the outcome to an exit
//! status. Everything else lives in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(dlock::main_entry(std::env::args_os().collect()))
}
