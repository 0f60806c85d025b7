//! The `--limit` agreement: every holder of a lock uses the same `--limit`, and a run that
//! asks for another is refused (64) with the same words on every backend.

use crate::error::Error;
use crate::lock::{limit_mismatch, LockName};

/// Whether a run asking `--limit asked` may join holders whose record says `recorded`: the
/// same limit, or a record that names none (0). Otherwise the refusal naming the holders'.
pub fn agrees(name: &LockName, asked: u32, recorded: u32) -> Result<(), Error> {
    if recorded != 0 && recorded != asked {
        return Err(limit_mismatch(name, recorded));
    }
    Ok(())
}
