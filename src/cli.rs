//! The command line, as clap types only. Nothing outside this module and `settings` imports
//! clap; `settings` turns these raw values into validated settings.
//!
//! One rule clap cannot express by itself: in `dlock run`, option parsing stops at the first
//! word after NAME (like `env`, `timeout` and `flock`), so in `dlock run x ./job.sh --ttl 5`
//! the `--ttl 5` belongs to the job. [`normalize_run_args`] (`argv.rs`) rewrites the arguments into a form
//! clap parses that way; `-c` right after NAME is the one exception.
//!
//! The help texts beyond each option's own line, and where `-h` says less than `--help`, are
//! `help.rs`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand, ValueEnum};

mod argv;
mod fast;
mod help;
mod parse;

pub use argv::normalize_run_args;
use help::{
    long_help_of_hidden, short_url_help, ABOUT, HOLD_AFTER_HELP, HOLD_AFTER_SHORT_HELP, LONG_ABOUT,
    RELEASE_AFTER_HELP, RUN_AFTER_HELP, RUN_AFTER_SHORT_HELP, STATUS_AFTER_HELP,
    TOP_AFTER_LONG_HELP, TOP_EXAMPLES, URL_HELP,
};
pub use parse::parse;
use parse::parse_with_clap;

/// Run a command while holding a named lock.
#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    version,
    long_version = crate::version::LONG_VERSION,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = TOP_EXAMPLES,
    after_long_help = TOP_AFTER_LONG_HELP,
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// More messages on stderr (repeat for more).
    ///
    /// DLOCK_LOG takes a tracing filter instead (dlock=debug).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Fewer messages on stderr (repeat for none).
    ///
    /// `run -q` does not report a lock that was not acquired; `status -q` prints nothing on
    /// stdout. The one `dlock: …` line that explains a failure is always printed.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub quiet: u8,

    /// Config file (TOML; see man dlock.toml).
    ///
    /// Default: $XDG_CONFIG_HOME/dlock/config.toml, then /etc/dlock/config.toml.
    #[arg(
        long,
        value_name = "PATH",
        env = "DLOCK_CONFIG",
        hide_env_values = true,
        global = true
    )]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire NAME, run COMMAND with the lock held, release, exit with its status.
    #[command(
        override_usage = "dlock run [OPTIONS] <NAME> [--] <COMMAND> [ARGS]...\n       \
                          dlock run [OPTIONS] <NAME> -c <SHELL-COMMAND>",
        after_help = RUN_AFTER_SHORT_HELP,
        after_long_help = RUN_AFTER_HELP
    )]
    Run(Box<RunArgs>),
    /// Take NAME for the calling shell: print variables for `eval`, keep the lock in the
    /// background until that shell ends or `dlock release NAME`.
    #[command(after_help = HOLD_AFTER_SHORT_HELP, after_long_help = HOLD_AFTER_HELP)]
    Hold(Box<HoldArgs>),
    /// Show who holds NAME and who waits for it (exit 0 when held, 1 when free).
    #[command(after_long_help = STATUS_AFTER_HELP)]
    Status(StatusArgs),
    /// List held locks under the namespace.
    List(ListArgs),
    /// End your hold of NAME (`dlock hold`); with --force, break anyone's (admin).
    #[command(after_long_help = RELEASE_AFTER_HELP)]
    Release(ReleaseArgs),
    /// Check that the backend can be reached and used: latency, version, permissions.
    Check(CheckArgs),
    /// Generate the man pages or shell completions (for packagers).
    #[command(hide = true)]
    Generate(GenerateArgs),
}

/// Where the locks live.
#[derive(Clone, Debug, Args)]
pub struct BackendArgs {
    // The help text is an attribute, not a doc comment: its URL syntax would read as links.
    #[arg(
        help = URL_HELP,
        short,
        long,
        value_name = "URL",
        env = "DLOCK_URL",
        hide_env_values = true
    )]
    pub url: Vec<String>,

    /// Namespace for keys and paths [default: dlock].
    #[arg(
        long,
        value_name = "P",
        env = "DLOCK_PREFIX",
        hide_env_values = true,
        hide_short_help = true
    )]
    pub prefix: Option<String>,

    /// The ids of this subcommand's options whose value clap took from the environment
    /// (`wait` for DLOCK_WAIT), filled in by [`parse`], so that messages name the variable.
    #[arg(skip)]
    pub from_env: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLost {
    /// SIGTERM the command's process group, SIGKILL after --kill-after.
    Term,
    /// SIGKILL the command's process group at once.
    Kill,
    /// Let the command run on without the lock (a warning is printed).
    Ignore,
}

#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Give up after waiting this long (500ms, 30s, 5m; a bare number is seconds).
    ///
    /// Connecting to the backend counts against it; 0 is the same as --no-wait [default: wait
    /// forever]. As with flock -w, a number without a unit is seconds (-w 0.5), here and in
    /// every other duration.
    #[arg(
        short,
        long,
        value_name = "DUR",
        env = "DLOCK_WAIT",
        hide_env_values = true
    )]
    pub wait: Option<String>,

    /// Give up at once if the lock is held.
    ///
    /// The same as --wait 0.
    #[arg(
        short,
        long,
        env = "DLOCK_NO_WAIT",
        hide_env_values = true,
        action = ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_wait: bool,

    /// Hold the lock shared: any number of shared holders at once, or one exclusive holder
    /// (a run without --shared).
    ///
    /// The command sees DLOCK_MODE=shared (exclusive when it holds the lock exclusively). A
    /// reader that arrives while an exclusive run waits queues behind it. Not with --limit;
    /// backends without shared locks refuse it.
    #[arg(
        short,
        long,
        env = "DLOCK_SHARED",
        hide_env_values = true,
        action = ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub shared: bool,

    /// Hold the lock exclusively (the default), whatever DLOCK_SHARED or the config file say.
    #[arg(short = 'x', long)]
    pub exclusive: bool,

    /// Exit status when the lock was not acquired [default: 75].
    #[arg(
        short = 'E',
        long,
        value_name = "N",
        env = "DLOCK_CONFLICT_EXIT_CODE",
        hide_env_values = true
    )]
    pub conflict_exit_code: Option<String>,

    /// Lease length [default: 15s].
    #[arg(
        short,
        long,
        value_name = "DUR",
        env = "DLOCK_TTL",
        hide_env_values = true,
        long_help = crate::backend::TTL_HELP
    )]
    pub ttl: Option<String>,

    /// Semaphore: up to N holders at once [default: 1].
    ///
    /// All holders of a name must use the same N.
    #[arg(
        short,
        long,
        value_name = "N",
        env = "DLOCK_LIMIT",
        hide_env_values = true
    )]
    pub limit: Option<String>,

    /// What to do when the lock is lost while the command runs [default: term].
    #[arg(
        long,
        value_name = "ACTION",
        env = "DLOCK_ON_LOST",
        hide_env_values = true,
        hide_short_help = true
    )]
    pub on_lost: Option<OnLost>,

    /// Grace between SIGTERM and SIGKILL, on lock loss and after a forwarded signal
    /// [default: 10s].
    #[arg(
        long,
        value_name = "DUR",
        env = "DLOCK_KILL_AFTER",
        hide_env_values = true,
        hide_short_help = true
    )]
    pub kill_after: Option<String>,

    /// Wait in a queue on this host first, so that only the head of the queue holds a server
    /// connection (remote backends, when waiting) [default: on].
    #[arg(long, value_name = "on|off", env = "DLOCK_LOCAL_QUEUE", hide_env_values = true,
          hide_short_help = true, ignore_case = true, value_parser = on_off())]
    pub local_queue: Option<bool>,
    /// Record the command line in the lock's metadata, where `status` and `list` show it
    /// (secret-looking values masked); off records none [default: on].
    #[arg(long, value_name = "on|off", env = "DLOCK_RECORD_COMMAND", hide_env_values = true,
          hide_short_help = true, ignore_case = true, value_parser = on_off())]
    pub record_command: Option<bool>,
    /// Keep the lock at least this long.
    ///
    /// Counted from the acquisition, also when the command ends sooner [default: none]. For
    /// the same cron job on several hosts: the first host keeps the lock past the others'
    /// start times, so the job runs once. The command's status is passed on when the time is
    /// up.
    #[arg(
        long,
        value_name = "DUR",
        env = "DLOCK_MIN_HOLD",
        hide_env_values = true
    )]
    pub min_hold: Option<String>,

    /// Append one JSON line per run to PATH.
    ///
    /// The line says how the run ended: ran, busy, lost, error or signalled. PATH is created
    /// 0600 and checked before acquiring: it must lead only through your or root's directories
    /// and links, and if another user created it first (they can where others may write, as in
    /// /tmp), the run exits 78 without running the command. `-` is stderr [default: none].
    #[arg(
        long,
        value_name = "PATH",
        env = "DLOCK_REPORT",
        hide_env_values = true
    )]
    pub report: Option<PathBuf>,

    /// Hold NAME as well (repeatable): all the names or none.
    ///
    /// Every name is taken in one order (whatever order they are given in, so two runs of the
    /// same names cannot deadlock), each within what is left of --wait; the names taken are
    /// given back when the rest cannot be had. The command sees a token per name in
    /// DLOCK_FENCING_TOKENS, and the lock is lost when any one of them is lost.
    #[arg(long, value_name = "NAME", hide_short_help = true)]
    pub also: Vec<OsString>,

    /// Run SHELL-COMMAND with "$SHELL -c" (or /bin/sh -c) instead of COMMAND.
    #[arg(short = 'c', long = "command", value_name = "SHELL-COMMAND")]
    pub shell_command: Option<OsString>,

    /// The lock name: 1-255 bytes of UTF-8, no control characters.
    #[arg(value_name = "NAME")]
    pub name: OsString,

    /// The command and its arguments, passed verbatim (no shell).
    #[arg(
        value_name = "COMMAND",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// `on` or `off` for a switch that takes a value (`--local-queue off`); the spellings of a
/// boolean (`true`, `no`, `1`, …) are accepted too but not offered, so that help and
/// completions show the two words the option is documented with.
fn on_off() -> impl clap::builder::TypedValueParser<Value = bool> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let hidden = |word: &'static str| PossibleValue::new(word).hide(true);
    PossibleValuesParser::new([
        PossibleValue::new("on"),
        PossibleValue::new("off"),
        hidden("true"),
        hidden("false"),
        hidden("yes"),
        hidden("no"),
        hidden("y"),
        hidden("n"),
        hidden("t"),
        hidden("f"),
        hidden("1"),
        hidden("0"),
    ])
    .map(|word| {
        matches!(
            word.to_ascii_lowercase().as_str(),
            "on" | "true" | "yes" | "y" | "t" | "1"
        )
    })
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// The lock name.
    #[arg(value_name = "NAME")]
    pub name: OsString,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `dlock hold`: the options of `run` (no command), and how long the hold may last without
/// the shell that took it.
#[derive(Clone, Debug, Args)]
pub struct HoldArgs {
    #[command(flatten)]
    pub run: RunArgs,

    /// Keep the lock after the calling shell ends, until `dlock release` or --max-hold (CI
    /// steps in separate shells, systemd's ExecStartPre/ExecStopPost).
    ///
    /// Needs --max-hold, so that a forgotten hold ends by itself.
    #[arg(long, requires = "max_hold")]
    pub until_released: bool,

    /// Give the lock back this long after taking it, whatever else happens [default: none;
    /// required with --until-released].
    #[arg(
        long,
        value_name = "DUR",
        env = "DLOCK_MAX_HOLD",
        hide_env_values = true
    )]
    pub max_hold: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Break the lock whoever holds it (admin): the holder then detects the loss and stops its
    /// command. The file backend refuses and names the holder's pid. Without it, release
    /// ends only your own hold (dlock hold).
    #[arg(long)]
    pub force: bool,

    /// The hold to end: the value of DLOCK_HOLD that `dlock hold` printed [default: the hold
    /// of NAME named in DLOCK_HELD].
    #[arg(long, value_name = "HANDLE", conflicts_with = "force")]
    pub handle: Option<String>,

    /// The lock name.
    #[arg(value_name = "NAME")]
    pub name: OsString,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Lease length to check against the backend's bounds [default: 15s].
    #[arg(
        short,
        long,
        value_name = "DUR",
        env = "DLOCK_TTL",
        hide_env_values = true
    )]
    pub ttl: Option<String>,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(subcommand)]
    pub what: Generate,
}

#[derive(Debug, Subcommand)]
pub enum Generate {
    /// Write man pages (dlock.1 and one per subcommand) into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Write completion scripts for bash, zsh and fish into DIR.
    Completions {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// The command tree: [`Cli`]'s, with the short help that `-h` shows where it differs from the
/// full text of `--help`. Everything that parses or documents the command line starts here.
pub fn command() -> clap::Command {
    Cli::command()
        .mut_subcommands(|sub| {
            sub.mut_args(|arg| {
                values_may_start_with_a_hyphen(long_help_of_hidden(short_url_help(arg)))
            })
        })
        .mut_subcommand("hold", without_a_command)
}

/// `hold` shares `run`'s options but runs nothing: its command and `-c` are neither shown nor
/// accepted (a word after NAME is an error, `settings::hold` says which), and options may
/// follow NAME as in `status`.
fn without_a_command(hold: clap::Command) -> clap::Command {
    hold.mut_arg("command", |arg| {
        arg.hide(true)
            .trailing_var_arg(false)
            .allow_hyphen_values(false)
    })
    .mut_arg("shell_command", |arg| arg.hide(true))
}

/// `--wait -1s` and `-E -1` are a bad value of that option (which its parser says), not an
/// option `-1` that does not exist.
fn values_may_start_with_a_hyphen(arg: clap::Arg) -> clap::Arg {
    if arg.is_positional() || !arg.get_action().takes_values() {
        return arg;
    }
    arg.allow_hyphen_values(true)
}

#[cfg(test)]
mod tests;
