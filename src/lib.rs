//! dlock: run a command while holding a named lock.
//!
//! [`main_entry`] parses the command line, builds a current-thread tokio runtime and
//! dispatches to one subcommand. `dlock run` is the heart (`run.rs`): validate everything,
//! install signal listeners, acquire (cancellable, bounded by `--wait`), start the command
//! under [`supervise`], release, and exit with the command's status.

#[macro_use]
mod logging;

#[macro_use]
pub mod backend;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod exit;
pub mod files;
pub mod keeper;
pub mod lock;
mod process;
mod reentry;
mod run;
pub mod secrets;
pub mod settings;
pub mod signals;
mod spawn;
pub mod supervise;
pub mod version;
pub mod wording;

mod generate;
mod report;

use std::ffi::OsString;

use anyhow::Context;

use crate::cli::{Cli, Command};
use crate::error::Error;
use crate::exit::Code;
use crate::lock::Backend;

/// Run dlock with these arguments (including argv\[0\]) and return its exit status.
pub fn main_entry(args: Vec<OsString>) -> u8 {
    std::panic::set_hook(Box::new(|info| {
        say!("internal error (this is a bug in dlock): {info}");
    }));
    match std::panic::catch_unwind(|| main_inner(args)) {
        Ok(code) => code,
        Err(_) => Code::Internal.value(),
    }
}

fn main_inner(args: Vec<OsString>) -> u8 {
    // Before anything reads the environment (clap reads DLOCK_URL): a nested dlock gets back
    // the credentials its ancestor hid from the command.
    let ignored = secrets::restore_inherited();
    let cli = match cli::parse(args) {
        Ok(cli) => cli,
        Err(err) => return report::clap_error(err),
    };
    logging::init(cli.global.verbose, cli.global.quiet);
    if let Some(why) = ignored {
        tracing::info!("{why}");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            say!("cannot start: {err}");
            return Code::Internal.value();
        }
    };
    // Boxed: the future holds every subcommand's state for every backend, and moving it by
    // value into the runtime costs a large memcpy on every run.
    match runtime.block_on(Box::pin(run(cli))) {
        Ok(code) => code,
        Err(err) => {
            say!("{err:#}");
            error::code_of(&err).value()
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    let quiet = cli.global.quiet > 0;
    if let Command::Generate(args) = cli.command {
        generate::run(args.what)?;
        return Ok(0);
    }
    let config = match config::load(cli.global.config.as_deref(), backend::CONFIG_TABLES) {
        Ok(config) => config,
        Err(err) => {
            let err = anyhow::Error::new(err);
            if let Command::Run(args) = &cli.command {
                run::refused(args, &config::FileConfig::default(), &err);
            }
            return Err(err);
        }
    };
    match cli.command {
        Command::Run(args) => {
            let settings = match settings::run((*args).clone(), &config) {
                Ok(settings) => settings,
                Err(err) => {
                    let err = anyhow::Error::new(err);
                    run::refused(&args, &config, &err);
                    return Err(err);
                }
            };
            let held = std::env::var("DLOCK_HELD").unwrap_or_default();
            with_backend!(settings.common, backend => Box::pin(run::run(backend, settings, &held)).await)
        }
        Command::Status(args) => {
            let name = settings::lock_name(&args.name)?;
            let common = settings::common(&args.backend, None, &config)?;
            let status = with_backend!(common, backend => Box::pin(backend.status(&name)).await)
                .with_context(|| format!("cannot read the status of '{name}'"))?;
            if !quiet {
                report::unless_closed(report::print_status(&status, args.json))?;
            }
            Ok(if status.held { 0 } else { 1 })
        }
        Command::List(args) => {
            let common = settings::common(&args.backend, None, &config)?;
            let locks = with_backend!(common, backend => Box::pin(backend.list()).await)
                .context("cannot list locks")?;
            if !quiet {
                report::unless_closed(report::print_list(&locks, args.json))?;
            }
            Ok(0)
        }
        Command::Release(args) => {
            let name = settings::lock_name(&args.name)?;
            if !args.force {
                return Err(Error::Usage(format!(
                    "'dlock release' breaks a lock someone else holds; add --force to confirm (dlock release --force {name})"
                ))
                .into());
            }
            let common = settings::common(&args.backend, None, &config)?;
            let released =
                with_backend!(common, backend => Box::pin(backend.force_release(&name)).await)?;
            if released.is_empty() {
                say!("'{name}' is not held");
                return Ok(1);
            }
            for holder in &released {
                say!(
                    "released '{name}' (was held by {}, token {})",
                    crate::wording::holder(holder),
                    holder.token
                );
            }
            Ok(0)
        }
        Command::Check(args) => {
            let common = settings::common(&args.backend, args.ttl, &config)?;
            let check = with_backend!(common, backend => Box::pin(backend.check()).await)
                .context("check failed")?;
            report::unless_closed(report::print_check(&check, &common, args.json))?;
            Ok(0)
        }
        Command::Generate(_) => Ok(0),
    }
}
