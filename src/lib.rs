//! dlock: run a command while holding a named lock.
//!
//! [`main_entry`] parses the command line, builds a current-thread tokio runtime and
//! dispatches to one subcommand. `dlock run` is the heart (`run.rs`): validate everything,
//! install signal listeners, acquire (cancellable, bounded by `--wait`), start the command
//! under [`supervise`], release, and exit with the command's status.

#[macro_use]
mod logging;
#[macro_use]
mod text;

pub mod backend;
pub mod budget;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod exit;
pub mod files;
pub mod keeper;
pub mod kind;
pub mod kit;
pub mod lock;
mod process;
mod run;
pub mod secrets;
pub mod settings;
pub mod signals;
mod sniff;
mod spawn;
mod start;
pub mod supervise;
pub mod version;
pub mod wording;

mod generate;

pub use start::start;
mod report;

use std::ffi::OsString;

use anyhow::Context;

use crate::cli::{Cli, Command};
use crate::error::Error;
use crate::exit::{Code, Outcome};
use crate::lock::Backend;

/// Run dlock with these arguments (including argv\[0\]) and return its exit status.
pub fn main_entry(args: Vec<OsString>) -> u8 {
    std::panic::set_hook(Box::new(|info| {
        say!("internal error (this is a bug in dlock): {info}");
    }));
    match std::panic::catch_unwind(|| main_inner(args)) {
        Ok(status) => status,
        Err(_) => Outcome::Failed(Code::Internal).status(),
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
    let cli = match cli {
        // Before any runtime: the hold's keeper is a fork of this process.
        Cli {
            command: Command::Hold(args),
            global,
        } => {
            let tables: Vec<&str> = backend::config_tables().collect();
            return run::hold::start(*args, config::load(global.config.as_deref(), &tables));
        }
        cli => cli,
    };
    // Boxed: the future holds every subcommand's state for every backend, and moving it by
    // value into the runtime costs a large memcpy on every run.
    block_on(Box::pin(run(cli)))
}

/// Run `future` on a current-thread runtime made for it, to dlock's exit status.
pub(crate) fn block_on(future: impl std::future::Future<Output = anyhow::Result<Outcome>>) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            say!("cannot start: {err}");
            return Outcome::Failed(Code::Internal).status();
        }
    };
    match runtime.block_on(future) {
        Ok(outcome) => outcome.status(),
        Err(err) => {
            say!("{err:#}");
            Outcome::Failed(error::code_of(&err)).status()
        }
    }
}

/// One subcommand, to its outcome.
async fn run(cli: Cli) -> anyhow::Result<Outcome> {
    let quiet = cli.global.quiet > 0;
    // Read first by every subcommand that uses a backend; `generate` does without.
    let config = || {
        let tables: Vec<&str> = backend::config_tables().collect();
        config::load(cli.global.config.as_deref(), &tables)
    };
    match cli.command {
        Command::Generate(args) => {
            generate::run(args.what)?;
            Ok(Outcome::Done)
        }
        Command::Run(args) => Box::pin(run_command(&args, config())).await,
        Command::Hold(_) => {
            Err(Error::Internal("a hold is started before the runtime".into()).into())
        }
        Command::Status(args) => status(&args, &config()?, quiet).await,
        Command::List(args) => list(&args, &config()?, quiet).await,
        Command::Release(args) => release(&args, &config()?).await,
        Command::Check(args) => check(args, &config()?).await,
    }
}

/// `dlock run`: settings refused before anything runs are recorded too (`--report`).
async fn run_command(
    args: &cli::RunArgs,
    config: Result<config::FileConfig, Error>,
) -> anyhow::Result<Outcome> {
    let config = match config {
        Ok(config) => config,
        Err(err) => {
            let err = anyhow::Error::new(err);
            run::refused(args, &config::FileConfig::default(), &err);
            return Err(err);
        }
    };
    let settings = match settings::run(args.clone(), &config) {
        Ok(settings) => settings,
        Err(err) => {
            let err = anyhow::Error::new(err);
            run::refused(args, &config, &err);
            return Err(err);
        }
    };
    let held = std::env::var("DLOCK_HELD").unwrap_or_default();
    let backend = run::open(&settings);
    Box::pin(run::run(backend, settings, &held)).await
}

/// `dlock status NAME`: 0 when held, 1 when free.
async fn status(
    args: &cli::StatusArgs,
    config: &config::FileConfig,
    quiet: bool,
) -> anyhow::Result<Outcome> {
    let name = settings::lock_name(&args.name)?;
    let common = settings::common(&args.backend, None, config)?;
    let status = common
        .target
        .open(&common)
        .status(&name)
        .await
        .with_context(|| format!("cannot read the status of '{name}'"))?;
    if !quiet {
        report::unless_closed(report::print_status(&status, args.json))?;
    }
    Ok(if status.held {
        Outcome::Done
    } else {
        Outcome::Nothing
    })
}

/// `dlock list`: the held locks under the namespace.
async fn list(
    args: &cli::ListArgs,
    config: &config::FileConfig,
    quiet: bool,
) -> anyhow::Result<Outcome> {
    let common = settings::common(&args.backend, None, config)?;
    let locks = common
        .target
        .open(&common)
        .list()
        .await
        .context("cannot list locks")?;
    if !quiet {
        report::unless_closed(report::print_list(&locks, args.json))?;
    }
    Ok(Outcome::Done)
}

/// `dlock release --force NAME`: break the lock, naming every holder it had.
async fn release(args: &cli::ReleaseArgs, config: &config::FileConfig) -> anyhow::Result<Outcome> {
    if !args.force {
        return run::hold::releasing::release(args, config).await;
    }
    let name = settings::lock_name(&args.name)?;
    let common = settings::common(&args.backend, None, config)?;
    let released = common.target.open(&common).force_release(&name).await?;
    if released.is_empty() {
        say!("'{name}' is not held");
        return Ok(Outcome::Nothing);
    }
    for holder in &released {
        say!(
            "released '{name}' (was held by {}, token {})",
            crate::wording::holder(holder),
            holder.token
        );
    }
    Ok(Outcome::Done)
}

/// `dlock check`: can this backend be used, and how well.
async fn check(args: cli::CheckArgs, config: &config::FileConfig) -> anyhow::Result<Outcome> {
    let common = settings::common(&args.backend, args.ttl, config)?;
    let check = common
        .target
        .open(&common)
        .check()
        .await
        .context("check failed")?;
    report::unless_closed(report::print_check(&check, &common, args.json))?;
    Ok(Outcome::Done)
}
