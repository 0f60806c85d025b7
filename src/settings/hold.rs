//! `dlock hold`'s settings: `run`'s, without a command, and how long a hold may last.

use std::time::Duration;

use super::{duration_setting, lock_settings, origin, CommandSpec, RunSettings};
use crate::cli;
use crate::config::FileConfig;
use crate::error::Error;

/// `dlock hold`'s settings: `run`'s, without a command.
#[derive(Clone, Debug)]
pub struct HoldSettings {
    /// As for `run`; the command is the hold's description in the lock's metadata.
    pub run: RunSettings,
    /// `--until-released`: the hold belongs to no process.
    pub until_released: bool,
    /// `--max-hold`: the hold ends this long after the grant.
    pub max_hold: Option<Duration>,
}

pub fn hold(args: cli::HoldArgs, file: &FileConfig) -> Result<HoldSettings, Error> {
    let words = args.run.shell_command.iter().chain(&args.run.command);
    if let Some(word) = words.into_iter().next() {
        return Err(Error::Usage(format!(
            "dlock hold takes no command (got '{}' after the name); to run one while holding \
             the lock: dlock run NAME -- COMMAND",
            crate::logging::printable(&word.to_string_lossy())
        )));
    }
    let env = &args.run.backend.from_env;
    let max_hold = duration_setting(args.max_hold, None, &origin("--max-hold", env), false)?;
    if args.until_released && max_hold.is_none() {
        return Err(Error::Usage(
            "--until-released needs --max-hold DUR, so that a forgotten hold ends by itself".into(),
        ));
    }
    let until_released = args.until_released;
    let mut run = lock_settings(args.run, file, |_, _, _| {
        Ok(CommandSpec::hold(until_released))
    })?;
    // A hold's description is no secret, and `status` shows it in place of a command.
    run.record_command = true;
    Ok(HoldSettings {
        run,
        until_released,
        max_hold,
    })
}
