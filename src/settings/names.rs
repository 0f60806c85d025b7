//! Lock names given on the command line: NAME, and each `--also` name.

use crate::error::Error;
use crate::lock::LockName;

/// Validate a lock name given on the command line.
pub fn lock_name(raw: &std::ffi::OsStr) -> Result<LockName, Error> {
    let text = raw
        .to_str()
        .ok_or_else(|| Error::Usage("lock name must be valid UTF-8".into()))?;
    LockName::new(text)
}

/// `--also` (the command line only: a variable or a config key would reach every nested
/// run, which would then wait for the names its ancestor holds), each checked as NAME is;
/// a name given twice, or NAME itself, is a mistake.
pub(super) fn also_setting(
    name: &LockName,
    given: &[std::ffi::OsString],
) -> Result<Vec<LockName>, Error> {
    let mut also: Vec<LockName> = Vec::with_capacity(given.len());
    for raw in given {
        let next = lock_name(raw).map_err(|e| Error::Usage(format!("--also: {e}")))?;
        if next == *name {
            return Err(Error::Usage(format!(
                "--also '{next}' is NAME itself; give each name once"
            )));
        }
        if also.contains(&next) {
            return Err(Error::Usage(format!(
                "--also '{next}' is given twice; give each name once"
            )));
        }
        also.push(next);
    }
    Ok(also)
}
