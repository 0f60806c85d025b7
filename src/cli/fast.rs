//! The everyday line, `dlock run [OPTIONS] NAME [--] COMMAND…`, read without clap.
//!
//! Building clap's command tree is most of a run's parsing: every help text and list of the
//! whole CLI, for a run that prints none. This reader knows `dlock run`'s options and their
//! `DLOCK_*` variables, and gives up — `None`, and clap reads the line as before — at anything
//! it is not sure of: help and version, another subcommand, an unknown or repeated option, a
//! value clap would refuse or read its own way (an empty one, one that is not UTF-8, a word
//! of `--on-lost` or `--local-queue` it does not know), options before `run`. So where it
//! answers, clap would have answered the same; debug builds check that on every run
//! ([`agrees_with_clap`]), and the suite's thousands of runs go through it.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use super::{BackendArgs, Cli, Command, GlobalArgs, OnLost, RunArgs};

/// Where an option's value goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Url,
    Prefix,
    Wait,
    NoWait,
    Shared,
    Exclusive,
    ConflictExitCode,
    Ttl,
    Limit,
    OnLost,
    KillAfter,
    LocalQueue,
    RecordCommand,
    MinHold,
    Report,
    Also,
    ShellCommand,
    Verbose,
    Quiet,
    Config,
}

/// One option of `dlock run` (its own, then the global ones), as clap defines it in
/// [`RunArgs`] and [`GlobalArgs`]; `id` is clap's, as `from_env` names it.
struct Opt {
    long: &'static str,
    short: Option<char>,
    slot: Slot,
    takes_value: bool,
    env: Option<&'static str>,
    id: &'static str,
}

const fn opt(
    long: &'static str,
    short: Option<char>,
    slot: Slot,
    takes_value: bool,
    env: Option<&'static str>,
    id: &'static str,
) -> Opt {
    Opt {
        long,
        short,
        slot,
        takes_value,
        env,
        id,
    }
}

/// In clap's order of arguments (the run's own, then the global ones it inherits), which is
/// the order of `from_env`.
const OPTIONS: [Opt; 20] = [
    opt("url", Some('u'), Slot::Url, true, Some("DLOCK_URL"), "url"),
    opt(
        "prefix",
        None,
        Slot::Prefix,
        true,
        Some("DLOCK_PREFIX"),
        "prefix",
    ),
    opt(
        "wait",
        Some('w'),
        Slot::Wait,
        true,
        Some("DLOCK_WAIT"),
        "wait",
    ),
    opt(
        "no-wait",
        Some('n'),
        Slot::NoWait,
        false,
        Some("DLOCK_NO_WAIT"),
        "no_wait",
    ),
    opt(
        "shared",
        Some('s'),
        Slot::Shared,
        false,
        Some("DLOCK_SHARED"),
        "shared",
    ),
    opt(
        "exclusive",
        Some('x'),
        Slot::Exclusive,
        false,
        None,
        "exclusive",
    ),
    opt(
        "conflict-exit-code",
        Some('E'),
        Slot::ConflictExitCode,
        true,
        Some("DLOCK_CONFLICT_EXIT_CODE"),
        "conflict_exit_code",
    ),
    opt("ttl", Some('t'), Slot::Ttl, true, Some("DLOCK_TTL"), "ttl"),
    opt(
        "limit",
        Some('l'),
        Slot::Limit,
        true,
        Some("DLOCK_LIMIT"),
        "limit",
    ),
    opt(
        "on-lost",
        None,
        Slot::OnLost,
        true,
        Some("DLOCK_ON_LOST"),
        "on_lost",
    ),
    opt(
        "kill-after",
        None,
        Slot::KillAfter,
        true,
        Some("DLOCK_KILL_AFTER"),
        "kill_after",
    ),
    opt(
        "local-queue",
        None,
        Slot::LocalQueue,
        true,
        Some("DLOCK_LOCAL_QUEUE"),
        "local_queue",
    ),
    opt(
        "record-command",
        None,
        Slot::RecordCommand,
        true,
        Some("DLOCK_RECORD_COMMAND"),
        "record_command",
    ),
    opt(
        "min-hold",
        None,
        Slot::MinHold,
        true,
        Some("DLOCK_MIN_HOLD"),
        "min_hold",
    ),
    opt(
        "report",
        None,
        Slot::Report,
        true,
        Some("DLOCK_REPORT"),
        "report",
    ),
    opt("also", None, Slot::Also, true, None, "also"),
    opt(
        "command",
        Some('c'),
        Slot::ShellCommand,
        true,
        None,
        "shell_command",
    ),
    opt("verbose", Some('v'), Slot::Verbose, false, None, "verbose"),
    opt("quiet", Some('q'), Slot::Quiet, false, None, "quiet"),
    opt(
        "config",
        None,
        Slot::Config,
        true,
        Some("DLOCK_CONFIG"),
        "config",
    ),
];

/// What the line and the environment set so far.
struct Given {
    run: RunArgs,
    verbose: u8,
    quiet: u8,
    config: Option<PathBuf>,
    seen: [bool; OPTIONS.len()],
}

/// Where `slot` is in [`OPTIONS`].
fn index_of(slot: Slot) -> usize {
    OPTIONS.iter().position(|o| o.slot == slot).unwrap_or(0)
}

/// The line as clap would read it, or `None` where this reader leaves it to clap. `env` looks
/// up a variable (`std::env::var_os`).
pub(super) fn parse_run(args: &[OsString], env: impl Fn(&str) -> Option<OsString>) -> Option<Cli> {
    if args.get(1).map(OsString::as_os_str) != Some(OsStr::new("run")) {
        return None;
    }
    let mut given = Given {
        run: RunArgs {
            backend: BackendArgs {
                url: Vec::new(),
                prefix: None,
                from_env: Vec::new(),
            },
            wait: None,
            no_wait: false,
            shared: false,
            exclusive: false,
            conflict_exit_code: None,
            ttl: None,
            limit: None,
            on_lost: None,
            kill_after: None,
            local_queue: None,
            record_command: None,
            min_hold: None,
            report: None,
            also: Vec::new(),
            shell_command: None,
            name: OsString::new(),
            command: Vec::new(),
        },
        verbose: 0,
        quiet: 0,
        config: None,
        seen: [false; OPTIONS.len()],
    };
    let mut at = 2;
    // Options up to NAME; bounded: each turn takes at least one word.
    let name = loop {
        let word = args.get(at)?;
        let bytes = word.as_encoded_bytes();
        if bytes == b"--" {
            break nonempty(args.get(at + 1)?)?;
        }
        if bytes == b"-" || !bytes.starts_with(b"-") {
            break nonempty(word)?;
        }
        at = given.option(args, at)?;
    };
    at += if args[at] == "--" { 2 } else { 1 };
    // `-c CMD` may also stand right after NAME; `--` before the command is optional.
    if let Some(word) = args.get(at).and_then(|w| w.to_str()) {
        let short = word.strip_prefix("-c").filter(|v| !v.is_empty());
        if word == "-c" || word == "--command" {
            let value = value_word(args.get(at + 1)?)?;
            given.set(index_of(Slot::ShellCommand), Value::Os(value))?;
            at += 2;
        } else if let Some(value) = word.strip_prefix("--command=").or(short) {
            let value = value_word(OsStr::new(value))?;
            given.set(index_of(Slot::ShellCommand), Value::Os(value))?;
            at += 1;
        }
    }
    if args.get(at).is_some_and(|w| w == "--") {
        at += 1;
    }
    given.fill_from_environment(&env)?;
    given.run.name = name;
    given.run.command = args.get(at..).unwrap_or_default().to_vec();
    Some(Cli {
        global: GlobalArgs {
            verbose: given.verbose,
            quiet: given.quiet,
            config: given.config,
        },
        command: Command::Run(Box::new(given.run)),
    })
}

/// A value as it was given.
enum Value {
    None,
    Os(OsString),
}

impl Given {
    /// Read the option at `args[at]` (with its value), returning where the next word is.
    fn option(&mut self, args: &[OsString], at: usize) -> Option<usize> {
        let word = args[at].to_str()?;
        if let Some(long) = word.strip_prefix("--") {
            let (long, inline) = match long.split_once('=') {
                Some((long, value)) => (long, Some(value)),
                None => (long, None),
            };
            let index = OPTIONS.iter().position(|o| o.long == long)?;
            return match (OPTIONS[index].takes_value, inline) {
                (false, None) => self.set(index, Value::None).map(|()| at + 1),
                (false, Some(_)) => None,
                (true, Some(value)) => self
                    .set(index, Value::Os(value_word(OsStr::new(value))?))
                    .map(|()| at + 1),
                (true, None) => {
                    let value = value_word(args.get(at + 1)?)?;
                    self.set(index, Value::Os(value)).map(|()| at + 2)
                }
            };
        }
        // A cluster of flags (`-nq`), or one option with its value attached or next (`-w5s`,
        // `-w 5s`) after any flags.
        let letters = word.strip_prefix('-')?;
        for (pos, letter) in letters.char_indices() {
            let index = OPTIONS.iter().position(|o| o.short == Some(letter))?;
            if !OPTIONS[index].takes_value {
                self.set(index, Value::None)?;
                continue;
            }
            let attached = &letters[pos + letter.len_utf8()..];
            if !attached.is_empty() {
                // clap reads `-w=5s` as `-w 5s`: left to it.
                if attached.starts_with('=') {
                    return None;
                }
                self.set(index, Value::Os(value_word(OsStr::new(attached))?))?;
                return Some(at + 1);
            }
            let value = value_word(args.get(at + 1)?)?;
            self.set(index, Value::Os(value))?;
            return Some(at + 2);
        }
        Some(at + 1)
    }

    /// Put option `index`'s value given on the line; `None` where clap would refuse it (an
    /// option given twice) or check it in a way of its own.
    fn set(&mut self, index: usize, value: Value) -> Option<()> {
        let option = &OPTIONS[index];
        let again = std::mem::replace(&mut self.seen[index], true);
        let counted = matches!(
            option.slot,
            Slot::Verbose | Slot::Quiet | Slot::Url | Slot::Also
        );
        if again && !counted {
            return None;
        }
        self.put(option.slot, value)
    }

    /// Options the line did not give, from their variables.
    fn fill_from_environment(&mut self, env: &impl Fn(&str) -> Option<OsString>) -> Option<()> {
        for (index, option) in OPTIONS.iter().enumerate() {
            let Some(var) = option.env else { continue };
            if self.seen[index] {
                continue;
            }
            let Some(value) = env(var) else { continue };
            let value = nonempty(&value)?;
            match option.slot {
                Slot::NoWait | Slot::Shared => {
                    let on = boolish(value.to_str()?)?;
                    self.put_bool(option.slot, on);
                }
                _ => self.put(option.slot, Value::Os(value))?,
            }
            self.run.backend.from_env.push(option.id.to_owned());
        }
        Some(())
    }

    fn put_bool(&mut self, slot: Slot, on: bool) {
        match slot {
            Slot::NoWait => self.run.no_wait = on,
            Slot::Shared => self.run.shared = on,
            _ => {}
        }
    }

    fn put(&mut self, slot: Slot, value: Value) -> Option<()> {
        let run = &mut self.run;
        let os = match value {
            Value::None => {
                match slot {
                    Slot::NoWait => run.no_wait = true,
                    Slot::Shared => run.shared = true,
                    Slot::Exclusive => run.exclusive = true,
                    Slot::Verbose => self.verbose = self.verbose.checked_add(1)?,
                    Slot::Quiet => self.quiet = self.quiet.checked_add(1)?,
                    _ => return None,
                }
                return Some(());
            }
            Value::Os(os) => os,
        };
        match slot {
            Slot::Report => run.report = Some(PathBuf::from(os)),
            Slot::Config => self.config = Some(PathBuf::from(os)),
            Slot::ShellCommand => run.shell_command = Some(os),
            Slot::Also => run.also.push(os),
            _ => {
                let text = os.into_string().ok()?;
                match slot {
                    Slot::Url => run.backend.url.push(text),
                    Slot::Prefix => run.backend.prefix = Some(text),
                    Slot::Wait => run.wait = Some(text),
                    Slot::ConflictExitCode => run.conflict_exit_code = Some(text),
                    Slot::Ttl => run.ttl = Some(text),
                    Slot::Limit => run.limit = Some(text),
                    Slot::KillAfter => run.kill_after = Some(text),
                    Slot::MinHold => run.min_hold = Some(text),
                    Slot::OnLost => run.on_lost = Some(on_lost(&text)?),
                    Slot::LocalQueue => run.local_queue = Some(on_off(&text)?),
                    Slot::RecordCommand => run.record_command = Some(on_off(&text)?),
                    _ => return None,
                }
            }
        }
        Some(())
    }
}

/// A word that is not empty (clap checks an empty one its own way).
fn nonempty(word: &OsStr) -> Option<OsString> {
    (!word.is_empty()).then(|| word.to_owned())
}

/// An option's value: not empty, and not `--` (which clap may take for the end of options).
fn value_word(word: &OsStr) -> Option<OsString> {
    (word != "--").then(|| nonempty(word)).flatten()
}

/// `--on-lost`'s words, as clap's `ValueEnum` takes them (exactly).
fn on_lost(word: &str) -> Option<OnLost> {
    match word {
        "term" => Some(OnLost::Term),
        "kill" => Some(OnLost::Kill),
        "ignore" => Some(OnLost::Ignore),
        _ => None,
    }
}

/// The words of `--local-queue` and `--record-command` (`cli::on_off`, any case).
fn on_off(word: &str) -> Option<bool> {
    match word.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "y" | "t" | "1" => Some(true),
        "off" | "false" | "no" | "n" | "f" | "0" => Some(false),
        _ => None,
    }
}

/// clap's `BoolishValueParser` (DLOCK_NO_WAIT, DLOCK_SHARED).
fn boolish(word: &str) -> Option<bool> {
    on_off(word)
}

/// Debug builds: the answer is clap's, to the letter (run by every `dlock run` of the suite).
#[cfg(all(debug_assertions, not(test)))]
pub(super) fn agrees_with_clap(cli: &Cli, args: Vec<OsString>) {
    let by_clap = super::parse_with_clap(args.clone());
    let ours = format!("{cli:?}");
    let theirs = by_clap.map(|c| format!("{c:?}")).map_err(|e| e.to_string());
    assert!(
        theirs.as_deref() == Ok(ours.as_str()),
        "the fast reader of {args:?} says\n{ours}\nclap says\n{theirs:?}"
    );
}

#[cfg(test)]
mod tests;
