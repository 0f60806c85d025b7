//! Flags > `DLOCK_*` environment > config file > defaults, merged once into validated settings.
//!
//! clap already folds the environment into the flag values, so this module only has to fill
//! what is still missing from the config file (docs/guide.md: "Configuration") and the defaults, and to validate
//! everything before any backend is contacted. Config file problems are 78,
//! bad flag or environment values 64. It knows no backend: a URL becomes a
//! [`crate::backend::Target`] in the backend registry.
//!
//! The config file itself is [`crate::config`], credentials and redaction
//! [`crate::secrets`], and the command to run and its lookup on `PATH` `command`. Reading a
//! duration text is `duration`, and the backend `--url` names (one URL, completed from the
//! config file) `target`.

pub(crate) mod command;
mod duration;
mod hold;
mod names;
mod target;

use std::time::Duration;

use command::command_spec;
pub use command::{resolve_program, CommandSpec};
pub use duration::parse_duration;
pub use hold::{hold, HoldSettings};
use names::also_setting;
pub use names::lock_name;
use target::target_setting;

use crate::config::FileConfig;

use crate::budget::Wait;
use crate::cli::{self, OnLost};
use crate::error::Error;
pub use crate::kind::Common;
use crate::lock::{LockName, Mode};

pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);
pub const DEFAULT_CONFLICT_EXIT_CODE: u8 = 75;
use crate::lock::{DEFAULT_PREFIX, MAX_LIMIT};
/// A crashed holder blocks everyone for up to one TTL; beyond a week is surely a mistake.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest duration any option takes (100 years, humantime's `100y`): longer is surely a
/// typo, and a deadline this far ahead still fits every clock dlock adds it to (the boot
/// clock, the wall clock for `status`, tokio's timers), so no arithmetic on it can overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

#[derive(Clone, Debug)]
pub struct RunSettings {
    pub common: Common,
    pub name: LockName,
    /// `--also`: the names held with `name`, in the order given; none repeated, none `name`.
    pub also: Vec<LockName>,
    pub command: CommandSpec,
    pub wait: Wait,
    pub conflict_exit_code: u8,
    pub limit: u32,
    /// `--shared`: hold the lock shared.
    pub mode: Mode,
    pub on_lost: OnLost,
    pub kill_after: Duration,
    /// `--min-hold`: keep the lock at least this long after acquiring it.
    pub min_hold: Option<Duration>,
    /// `--record-command`: store the command line in the lock's metadata.
    pub record_command: bool,
    /// `--report`: where to append the run's outcome record.
    pub report: Option<ReportTo>,
}

impl RunSettings {
    /// Every name this run holds: NAME, then the `--also` names in the order given.
    pub fn names(&self) -> impl Iterator<Item = &LockName> + Clone {
        std::iter::once(&self.name).chain(&self.also)
    }
}

/// Where `--report` appends the outcome record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReportTo {
    /// `-`
    Stderr,
    File {
        path: std::path::PathBuf,
        /// The setting as the user wrote it, for messages: `--report PATH`,
        /// `DLOCK_REPORT=PATH (environment)` or `config file: report = 'PATH'`.
        given_as: String,
    },
}

/// A value with the place it came from, so errors can say which setting was wrong.
struct Sourced<T> {
    value: T,
    from_file: bool,
}

fn pick<T>(flag: Option<T>, file: Option<T>) -> Option<Sourced<T>> {
    match (flag, file) {
        (Some(value), _) => Some(Sourced {
            value,
            from_file: false,
        }),
        (None, Some(value)) => Some(Sourced {
            value,
            from_file: true,
        }),
        (None, None) => None,
    }
}

/// A bad value: 64 when it came from a flag or the environment, 78 from the config file.
/// `what` is the flag (`--wait`) or, for a value from the environment, the variable
/// ([`origin`]); the config file's key is the flag's name (`kill_after`).
fn bad(from_file: bool, what: &str, message: String) -> Error {
    if from_file {
        let key = what.trim_start_matches('-').replace('-', "_");
        let at = crate::config::whereabouts(&key);
        Error::Config(format!("config file: {key}: {message}{at}"))
    } else {
        Error::Usage(format!("{what}: {message}"))
    }
}

/// How to name the option `flag` (`--kill-after`) in a message: the flag, or the variable
/// `DLOCK_KILL_AFTER` when clap took its value from the environment (`from_env` holds the
/// ids of such options, see [`cli::BackendArgs::from_env`]).
fn origin(flag: &str, from_env: &[String]) -> String {
    let id = flag.trim_start_matches('-').replace('-', "_");
    if from_env.contains(&id) {
        format!("DLOCK_{} (environment)", id.to_ascii_uppercase())
    } else {
        flag.to_owned()
    }
}

fn duration_setting(
    flag: Option<String>,
    file: Option<String>,
    what: &str,
    zero_allowed: bool,
) -> Result<Option<Duration>, Error> {
    match pick(flag, file) {
        None => Ok(None),
        Some(s) => parse_duration(&s.value, zero_allowed)
            .map(Some)
            .map_err(|m| bad(s.from_file, what, m)),
    }
}

fn integer_setting(
    flag: Option<String>,
    file: Option<i64>,
    what: &str,
    range: (i64, i64),
) -> Result<Option<i64>, Error> {
    let check = |n: i64, from_file: bool| {
        if n < range.0 || n > range.1 {
            Err(bad(
                from_file,
                what,
                format!("{n} is not between {} and {}", range.0, range.1),
            ))
        } else {
            Ok(Some(n))
        }
    };
    match (flag, file) {
        (Some(text), _) => match text.trim().parse::<i64>() {
            Ok(n) => check(n, false),
            Err(_) => Err(bad(false, what, format!("'{text}' is not a whole number"))),
        },
        (None, Some(n)) => check(n, true),
        (None, None) => Ok(None),
    }
}

/// Resolve the backend options shared by every subcommand.
pub fn common(
    backend: &cli::BackendArgs,
    ttl: Option<String>,
    file: &FileConfig,
) -> Result<Common, Error> {
    let env = &backend.from_env;
    dlock_dir_setting()?;
    let (prefix, prefix_from_file) = prefix_setting(backend, file)?;
    let ttl_from_file = ttl.is_none() && file.values.ttl.is_some();
    let ttl_text = ttl.clone().or_else(|| file.values.ttl.clone());
    let ttl = duration_setting(ttl, file.values.ttl.clone(), &origin("--ttl", env), false)?
        .unwrap_or(DEFAULT_TTL);
    if ttl > MAX_TTL {
        return Err(bad(
            ttl_from_file,
            &origin("--ttl", env),
            format!(
                "'{}' is longer than the limit of {} days",
                ttl_text.as_deref().unwrap_or_default().trim(),
                MAX_TTL.as_secs() / 86_400
            ),
        ));
    }
    let (target, display_url) = target_setting(backend, file)?;
    let range = target.maximum_ttl().zip(target.minimum_ttl());
    if let Some((maximum, minimum)) = range.filter(|(max, min)| ttl > *max || ttl < *min) {
        return Err(bad(
            ttl_from_file,
            &origin("--ttl", env),
            format!(
                "'{}' is not a lease {} can keep: its leases last {} to {}",
                ttl_text.as_deref().unwrap_or_default().trim(),
                target.kind().title,
                humantime::format_duration(minimum),
                humantime::format_duration(maximum)
            ),
        ));
    }
    if let Some(minimum) = target.minimum_ttl() {
        if ttl < minimum {
            return Err(bad(
                ttl_from_file,
                &origin("--ttl", env),
                format!(
                    "'{}' is shorter than a lease can be kept; the minimum is {}",
                    ttl_text.as_deref().unwrap_or_default().trim(),
                    humantime::format_duration(minimum)
                ),
            ));
        }
    }
    target
        .check_prefix(&prefix)
        .map_err(|m| bad(prefix_from_file, &origin("--prefix", env), m))?;
    Ok(Common {
        target,
        prefix,
        ttl,
        display_url,
        local_queue: true,
    })
}

/// `DLOCK_DIR`, dlock's own directory (`kit::lock_dir::default_dir`), must be absolute: a
/// relative one would name a different directory from every working directory. Empty is
/// unset.
fn dlock_dir_setting() -> Result<(), Error> {
    let Some(dir) = std::env::var_os("DLOCK_DIR").filter(|d| !d.is_empty()) else {
        return Ok(());
    };
    if std::path::Path::new(&dir).is_absolute() {
        return Ok(());
    }
    let shown = dir.to_string_lossy();
    Err(Error::Usage(format!(
        "DLOCK_DIR (environment): '{shown}' is not an absolute path; give the lock directory \
         from / (DLOCK_DIR=$PWD/{shown})"
    )))
}

/// `--prefix` (`DLOCK_PREFIX`, the config file), checked as a lock name is; and whether it
/// came from the config file.
fn prefix_setting(backend: &cli::BackendArgs, file: &FileConfig) -> Result<(String, bool), Error> {
    let env = &backend.from_env;
    let prefix = pick(backend.prefix.clone(), file.values.prefix.clone());
    let prefix_from_file = prefix.as_ref().is_some_and(|p| p.from_file);
    let prefix = match prefix {
        None => DEFAULT_PREFIX.to_owned(),
        Some(p) => {
            LockName::new(&p.value).map_err(|e| {
                bad(
                    p.from_file,
                    &origin("--prefix", env),
                    e.to_string().replace("lock name", "prefix"),
                )
            })?;
            p.value
        }
    };
    Ok((prefix, prefix_from_file))
}

/// Resolve everything `dlock run` needs, validating it all before the backend is contacted.
pub fn run(args: cli::RunArgs, file: &FileConfig) -> Result<RunSettings, Error> {
    lock_settings(args, file, |shell_command, command, name| {
        command_spec(shell_command.clone(), command.to_vec())
            .map_err(|e| command::name_was_a_command(e, name, command))
    })
}

/// The settings of a run or a hold; `command` reads the command from the arguments, after
/// every other setting was checked.
fn lock_settings(
    args: cli::RunArgs,
    file: &FileConfig,
    command: impl FnOnce(
        &Option<std::ffi::OsString>,
        &[std::ffi::OsString],
        &std::ffi::OsStr,
    ) -> Result<CommandSpec, Error>,
) -> Result<RunSettings, Error> {
    let name = lock_name(&args.name)?;
    let also = also_setting(&name, &args.also)?;
    let mut common = common(&args.backend, args.ttl, file)?;
    common.local_queue = args.local_queue.or(file.values.local_queue).unwrap_or(true);
    let env = &args.backend.from_env;
    let wait = wait_setting(args.no_wait, args.wait, &args.backend.from_env, file)?;
    let conflict_exit_code = integer_setting(
        args.conflict_exit_code,
        file.values.conflict_exit_code,
        &origin("--conflict-exit-code", env),
        (0, 255),
    )?
    .map_or(DEFAULT_CONFLICT_EXIT_CODE, |n| n as u8);
    let limit = integer_setting(
        args.limit,
        file.values.limit,
        &origin("--limit", env),
        (1, i64::from(MAX_LIMIT)),
    )?
    .map_or(1, |n| n as u32);
    common
        .target
        .kind()
        .check_limit(limit, &origin("--limit", env))?;
    let mode = mode_setting(
        (args.shared, args.exclusive),
        &args.backend.from_env,
        file,
        &common,
        limit,
    )?;
    let on_lost = on_lost_setting(args.on_lost, file)?;
    let kill_after = duration_setting(
        args.kill_after,
        file.values.kill_after.clone(),
        &origin("--kill-after", env),
        false,
    )?
    .unwrap_or(DEFAULT_KILL_AFTER);
    let min_hold = duration_setting(
        args.min_hold,
        file.values.min_hold.clone(),
        &origin("--min-hold", env),
        false,
    )?;
    let command = command(&args.shell_command, &args.command, &args.name)?;
    let report = report_to(args.report, &args.backend.from_env, file);
    Ok(RunSettings {
        common,
        name,
        also,
        command,
        wait,
        conflict_exit_code,
        limit,
        mode,
        on_lost,
        kill_after,
        min_hold,
        record_command: args
            .record_command
            .or(file.values.record_command)
            .unwrap_or(true),
        report,
    })
}

/// `--wait`/`--no-wait` (flags, `DLOCK_WAIT`/`DLOCK_NO_WAIT`, the config file): a flag beats
/// a variable, and a flag or variable beats the file; two flags, two variables, or the two
/// keys in the file contradict each other.
fn wait_setting(
    no_wait_flag: bool,
    wait_flag: Option<String>,
    env: &[String],
    file: &FileConfig,
) -> Result<Wait, Error> {
    if no_wait_flag && wait_flag.is_some() {
        let no_wait = origin("--no-wait", env);
        let wait = origin("--wait", env);
        // Flags override the environment: only two flags, or two variables, contradict.
        if no_wait.starts_with('-') == wait.starts_with('-') {
            return Err(Error::Usage(format!(
                "{no_wait} and {wait} contradict each other; give one of them"
            )));
        }
    }
    // The file contradicts itself whatever the flags say, as two flags would.
    if file.values.no_wait == Some(true) && file.values.wait.is_some() {
        let at = crate::config::whereabouts("no_wait");
        return Err(Error::Config(format!(
            "config file: wait and no_wait contradict each other; give one of them{at}"
        )));
    }
    // A flag beats a variable: `DLOCK_NO_WAIT=1 dlock run --wait 5s` waits.
    let no_wait_from_env = env.iter().any(|id| id == "no_wait");
    let wait_from_flag = wait_flag.is_some() && !env.iter().any(|id| id == "wait");
    let no_wait = (no_wait_flag && !(no_wait_from_env && wait_from_flag))
        || (wait_flag.is_none() && file.values.wait.is_none() && file.values.no_wait == Some(true));
    Ok(if no_wait {
        Wait::No
    } else {
        match duration_setting(
            wait_flag,
            file.values.wait.clone(),
            &origin("--wait", env),
            true,
        )? {
            None => Wait::Forever,
            Some(d) if d.is_zero() => Wait::No,
            Some(d) => Wait::For(d),
        }
    })
}

/// `--shared` (`DLOCK_SHARED`, `shared` in the config file) or `--exclusive`, checked against
/// the backend's capability and the `--limit`.
fn mode_setting(
    (shared_flag, exclusive_flag): (bool, bool),
    env: &[String],
    file: &FileConfig,
    common: &Common,
    limit: u32,
) -> Result<Mode, Error> {
    if exclusive_flag {
        // Only the two flags contradict each other: --exclusive overrides DLOCK_SHARED.
        if shared_flag && !env.iter().any(|id| id == "shared") {
            return Err(Error::Usage(
                "--shared and --exclusive contradict each other; give one of them".into(),
            ));
        }
        return Ok(Mode::Exclusive);
    }
    // The flag, or DLOCK_SHARED whether 1 or 0, beats `shared` in the config file.
    let shared_given = shared_flag || env.iter().any(|id| id == "shared");
    let shared = if shared_given {
        shared_flag
    } else {
        file.values.shared == Some(true)
    };
    let shared_origin = if shared_given {
        origin("--shared", env)
    } else {
        "shared (config file)".to_owned()
    };
    common
        .target
        .kind()
        .check_shared(shared, limit, &shared_origin, crate::backend::KINDS)?;
    Ok(if shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    })
}

/// `--on-lost` (`DLOCK_ON_LOST`, `on_lost` in the config file).
fn on_lost_setting(flag: Option<OnLost>, file: &FileConfig) -> Result<OnLost, Error> {
    Ok(match (flag, &file.values.on_lost) {
        (Some(v), _) => v,
        (None, Some(text)) => match text.as_str() {
            "term" => OnLost::Term,
            "kill" => OnLost::Kill,
            "ignore" => OnLost::Ignore,
            other => {
                return Err(bad(
                    true,
                    "on_lost",
                    format!("'{other}' is not one of term, kill, ignore"),
                ))
            }
        },
        (None, None) => OnLost::Term,
    })
}

/// Where `--report` (`DLOCK_REPORT`, `report` in the config file) sends the outcome record.
/// `from_env` names the settings that came from the environment.
pub fn report_to(
    flag: Option<std::path::PathBuf>,
    from_env: &[String],
    file: &FileConfig,
) -> Option<ReportTo> {
    // An empty DLOCK_REPORT is no report, as an unset one.
    let (path, given_as): (_, fn(&std::path::Path) -> String) =
        match flag.filter(|p| !p.as_os_str().is_empty()) {
            Some(path) if from_env.iter().any(|id| id == "report") => (path, |p| {
                format!("DLOCK_REPORT={} (environment)", p.display())
            }),
            Some(path) => (path, |p| format!("--report {}", p.display())),
            None => (file.values.report.clone()?, |p| {
                format!("config file: report = '{}'", p.display())
            }),
        };
    Some(if path.as_os_str() == "-" {
        ReportTo::Stderr
    } else {
        ReportTo::File {
            given_as: given_as(&path),
            path,
        }
    })
}
