//! Reading the command line: the everyday `dlock run` line by the fast reader, every other
//! line by clap, whose tree is built once and left to the process's exit.

use std::ffi::OsString;

use super::argv::{bad_value, no_such_command, no_such_option, version_of_dlock};
use super::{command, fast, normalize_run_args, Cli, Command};

/// Parse the process arguments: the everyday `dlock run` line by [`fast::parse_run`], every
/// other line (and help, errors) by clap.
pub fn parse(args: Vec<OsString>) -> Result<Cli, clap::Error> {
    if let Some(cli) = fast::parse_run(&args, |var| std::env::var_os(var)) {
        #[cfg(all(debug_assertions, not(test)))]
        fast::agrees_with_clap(&cli, args);
        return Ok(cli);
    }
    parse_with_clap(args)
}

/// Parse the process arguments with clap.
pub(super) fn parse_with_clap(args: Vec<OsString>) -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    // Building the command tree is the costliest part of start-up: do it once.
    let mut command = command();
    let given = args.clone();
    let args = normalize_run_args(args, &command);
    let matches = command
        .try_get_matches_from_mut(args.iter().cloned())
        .map_err(|e| no_such_option(e, &given, &command))
        .map_err(|e| no_such_command(e, &command))
        .map_err(|e| bad_value(e, &args, &command))
        .map_err(|e| version_of_dlock(e, &args, &mut command))?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    if let Some((name, sub)) = matches.subcommand() {
        let from_env = command
            .find_subcommand(name)
            .map(|c| from_environment(sub, c))
            .unwrap_or_default();
        match &mut cli.command {
            Command::Run(a) => a.backend.from_env = from_env,
            Command::Hold(a) => a.run.backend.from_env = from_env,
            Command::Status(a) => a.backend.from_env = from_env,
            Command::List(a) => a.backend.from_env = from_env,
            Command::Release(a) => a.backend.from_env = from_env,
            Command::Check(a) => a.backend.from_env = from_env,
            Command::Generate(_) => {}
        }
    }
    // The tree and the matches are freed with the process: dropping them walks every
    // subcommand, option and value again (70,000 instructions, 5% of a `dlock run`).
    std::mem::forget(matches);
    std::mem::forget(command);
    Ok(cli)
}

/// The ids of the options of `command` in `matches` whose value came from their `DLOCK_*`
/// variable (not the groups clap makes of flattened structs, which have no variable).
fn from_environment(matches: &clap::ArgMatches, command: &clap::Command) -> Vec<String> {
    matches
        .ids()
        .filter(|id| command.get_arguments().any(|a| a.get_id() == *id))
        .filter(|id| {
            matches.value_source(id.as_str()) == Some(clap::parser::ValueSource::EnvVariable)
        })
        .map(|id| id.as_str().to_owned())
        .collect()
}
