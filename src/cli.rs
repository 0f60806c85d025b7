//! The command line, as clap types only. Nothing outside this module and `settings` imports
//! clap; `settings` turns these raw values into validated settings.
//!
//! One rule clap cannot express by itself: in `dlock run`, option parsing stops at the first
//! word after NAME (like `env`, `timeout` and `flock`), so in `dlock run x ./job.sh --ttl 5`
//! the `--ttl 5` belongs to the job. [`normalize_run_args`] (`argv.rs`) rewrites the arguments into a form
//! clap parses that way; `-c` right after NAME is the one exception.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::text::put;
use crate::{backend, exit};

mod argv;
mod fast;

pub use argv::normalize_run_args;
use argv::{bad_value, no_such_command, no_such_option};

/// The examples of `dlock -h` and `dlock --help`.
const TOP_EXAMPLES: &str = "\
Examples:
  dlock run nightly -- ./nightly.sh      run it while holding the lock 'nightly'
  dlock run -n -E 0 nightly -- ./job     skip (exit 0) while someone else holds it
  dlock status nightly                   who holds it, since when
  dlock check --url redis://locks:6379   can this backend be used?

More: dlock run -h, man dlock, man dlock-run; the guide is docs/guide.md in the source
(/usr/share/doc/dlock/docs/guide.md where the Debian package is installed).";

/// The examples of `dlock run -h` and `dlock run --help`.
const RUN_EXAMPLES: &str = "\
Examples:
  dlock run nightly -- ./nightly.sh              wait for the lock, run, release
  dlock run -n -E 0 -q nightly -- ./nightly.sh   skip quietly (exit 0) while it is held
  dlock run -w 5m -u redis://locks:6379 deploy -- ./deploy.sh
  dlock run report -c 'make report && ./mail-it'";

/// What `dlock status --help` adds.
const STATUS_AFTER_HELP: &str = "\
Shows the holder (pid, host, user, command, since its grant, token, lease), several holders
(shared, or --limit N) one line each, the number of waiters where the backend can tell, and
each process of this host that waits, the longest-waiting first: since when, and where (for
the lock file, in this host's queue, or at the server).

Without --url or DLOCK_DIR the lock directory is each user's own: `free (locks of uid 1000 in
/run/lock/dlock-1000)` says nothing of another user's locks. Users who share a lock use one
directory root prepared for them (--url file:///srv/locks; the file backend's page, \"locks
shared between users\").

Exit status: 0 when NAME is held, 1 when it is free; an error is one `dlock: …` line and the
status `dlock run --help` lists for it (64 usage, 69 unavailable, 73, 77, 78).";

/// What `dlock release --help` adds.
const RELEASE_AFTER_HELP: &str = "\
Exit status:
  0    NAME was held; its holders' entries are gone (each is named on stderr)
  1    NAME was not held: there was nothing to release
  64   --force is missing, or a bad name or URL
  69   the backend cannot be reached
  77   refused: the server's permission (killing another user's session), or the file
       backend, where a kernel lock cannot be broken from outside (the holder's pid is named)";

/// Where the locks are when no URL is given.
const DEFAULT_FILE: &str = "Default: the file backend in $DLOCK_DIR, else /run/dlock for root, \
    else /run/lock/dlock-<uid> where /run/lock is sticky, else /tmp/dlock-<uid>: the same from \
    cron and a login shell.";

// The texts that name the backends are assembled at compile time from the registry's lists
// (`text.rs`): clap builds every help text on every run.

const ABOUT: &str = const_text!(render_about);

const fn render_about(out: &mut [u8]) -> usize {
    let at = put(out, 0, "Run a command while holding a named lock (");
    let at = put(out, at, backend::TITLES);
    put(out, at, ")")
}

const LONG_ABOUT: &str = const_text!(render_long_about);

const fn render_long_about(out: &mut [u8]) -> usize {
    let at = put(
        out,
        0,
        "Run a command while holding a named lock.\n\n\
        dlock acquires the lock NAME on a backend chosen by URL (a local file by default), runs \
        the command with the lock held, keeps the lease alive while it runs, releases the lock \
        when the command exits or dlock is signalled, and exits with the command's status.\n\n\
        Backends in this build: ",
    );
    let at = put(out, at, backend::KINDS_WITH_SCHEMES);
    let at = put(out, at, ". ");
    put(out, at, DEFAULT_FILE)
}

const URL_HELP: &str = const_text!(render_url_help);

const fn render_url_help(out: &mut [u8]) -> usize {
    let at = put(out, 0, "Backend URL: ");
    let at = put(out, at, backend::URL_FORMS);
    let at = put(out, at, ". ");
    put(out, at, DEFAULT_FILE)
}

/// `dlock run --help`'s text after the options: how the command is run, and the exit statuses.
const RUN_AFTER_HELP: &str = const_text!(render_run_after_help);

const fn render_run_after_help(out: &mut [u8]) -> usize {
    let at = put(
        out,
        0,
        "\
Option parsing stops at the first word after NAME: in `dlock run x ./job.sh --ttl 5` the
`--ttl 5` belongs to the job. `--` before the command is accepted and optional. `-c` may
stand before NAME or right after it.

The command sees dlock's stdin, stdout, stderr and environment, plus DLOCK_NAME,
DLOCK_BACKEND (",
    );
    let at = put(out, at, backend::SHOWN_AS);
    let at = put(
        out,
        at,
        "), DLOCK_FENCING_TOKEN (strictly increasing per lock
name) and DLOCK_HELD.
Credentials dlock consumed are removed from its environment. A nested `dlock run` of a lock
its ancestor already holds on the same backend runs its command at once.

Signals: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are forwarded
once to the command's process group. After TERM, INT, HUP or QUIT the command gets
--kill-after to exit before SIGKILL; a second such signal sends SIGKILL at once. At an
interactive terminal the command runs in the foreground, so Ctrl-C and Ctrl-Z reach it
directly; on a lease backend dlock warns when it stops that the lease is not renewed while
stopped. A signal while waiting for the lock cancels the wait and dlock exits 128+N.
At a terminal, a wait says whom it waits for, on one line; in a CI job (CI set) and with
-v also elsewhere, as whole lines (every 30s in CI); otherwise (cron) it is silent.
With --min-hold, a signal after the command has finished releases at once (128+N).
If the lock is lost while the command runs, --on-lost decides (default: SIGTERM to the
command's process group, SIGKILL after --kill-after, exit 124).

Every option can also be set in the environment (DLOCK_URL, DLOCK_WAIT, DLOCK_NO_WAIT,
DLOCK_CONFLICT_EXIT_CODE, DLOCK_TTL, DLOCK_LIMIT, DLOCK_ON_LOST, DLOCK_KILL_AFTER,
DLOCK_MIN_HOLD, DLOCK_PREFIX, DLOCK_LOCAL_QUEUE, DLOCK_RECORD_COMMAND, DLOCK_REPORT) or in
the config file. Precedence: flags > environment > config file >
defaults.\n\n",
    );
    let at = put(out, at, RUN_EXAMPLES);
    let at = put(out, at, "\n\n");
    put(out, at, exit::TABLE)
}

/// `dlock run -h`'s text after the options.
const RUN_AFTER_SHORT_HELP: &str = const_text!(render_run_after_short_help);

const fn render_run_after_short_help(out: &mut [u8]) -> usize {
    let at = put(out, 0, RUN_EXAMPLES);
    put(
        out,
        at,
        "\n\nMore: dlock run --help (every option, signals, exit statuses), man dlock-run.",
    )
}

/// `dlock --help`'s text after the commands.
const TOP_AFTER_LONG_HELP: &str = const_text!(render_top_after_long_help);

const fn render_top_after_long_help(out: &mut [u8]) -> usize {
    let at = put(out, 0, TOP_EXAMPLES);
    let at = put(out, at, "\n\n");
    put(out, at, exit::TABLE)
}

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
    /// Show who holds NAME and who waits for it (exit 0 when held, 1 when free).
    #[command(after_long_help = STATUS_AFTER_HELP)]
    Status(StatusArgs),
    /// List held locks under the namespace.
    List(ListArgs),
    /// Break a lock held by someone else (admin; needs --force).
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

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Required: this breaks a lock that someone else holds; the holder then detects the loss
    /// and stops its command. The file backend refuses and names the holder's pid.
    #[arg(long)]
    pub force: bool,

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

/// What `-h` says of `--url`; `--help` gives every backend's form.
const URL_SHORT_HELP: &str =
    "Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock \
     file on this host]";

/// The command tree: [`Cli`]'s, with the short help that `-h` shows where it differs from the
/// full text of `--help`. Everything that parses or documents the command line starts here.
pub fn command() -> clap::Command {
    Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|arg| values_may_start_with_a_hyphen(long_help_of_hidden(short_url_help(arg))))
    })
}

/// `--wait -1s` and `-E -1` are a bad value of that option (which its parser says), not an
/// option `-1` that does not exist.
fn values_may_start_with_a_hyphen(arg: clap::Arg) -> clap::Arg {
    if arg.is_positional() || !arg.get_action().takes_values() {
        return arg;
    }
    arg.allow_hyphen_values(true)
}

/// An option left out of `-h` keeps its one help text as the full one, which the man page
/// shows (clap_mangen shows no short help of an option hidden from `-h`).
fn long_help_of_hidden(arg: clap::Arg) -> clap::Arg {
    if !arg.is_hide_short_help_set() || arg.get_long_help().is_some() {
        return arg;
    }
    match arg.get_help().cloned() {
        Some(help) => arg.long_help(help),
        None => arg,
    }
}

/// `--url`'s list of every backend's URL form is for `--help`; `-h` names two and points there.
fn short_url_help(arg: clap::Arg) -> clap::Arg {
    if arg.get_id() != "url" || arg.get_long_help().is_some() {
        return arg;
    }
    match arg.get_help().cloned() {
        Some(full) => arg.help(URL_SHORT_HELP).long_help(full),
        None => arg,
    }
}

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
fn parse_with_clap(args: Vec<OsString>) -> Result<Cli, clap::Error> {
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

/// A subcommand's `-V` / `--version` is dlock's (clap would name the subcommand:
/// `dlock-run 0.1.0`).
fn version_of_dlock(
    err: clap::Error,
    args: &[OsString],
    command: &mut clap::Command,
) -> clap::Error {
    if err.kind() != clap::error::ErrorKind::DisplayVersion {
        return err;
    }
    let flag = if args.iter().any(|a| a == "--version") {
        "--version"
    } else {
        "-V"
    };
    match command.try_get_matches_from_mut(["dlock", flag]) {
        Err(top) if top.kind() == clap::error::ErrorKind::DisplayVersion => top,
        _ => err,
    }
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

#[cfg(test)]
mod tests;
