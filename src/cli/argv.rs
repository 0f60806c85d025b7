//! How the argument words reach clap: `dlock run`'s rule that option parsing stops at the
//! first word after NAME (the words are rewritten into a form clap parses that way), and
//! clap's errors about unknown options and bad values reworded to name the command, and a
//! subcommand's version made dlock's.

use std::ffi::{OsStr, OsString};

/// clap's word for an unknown option ("to pass '--shared' as a value, use '-- --shared'")
/// would make the option the lock's NAME: say which command has no such option instead, with
/// the one clap thinks was meant.
pub(super) fn no_such_option(
    err: clap::Error,
    args: &[OsString],
    command: &clap::Command,
) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::UnknownArgument {
        return err;
    }
    let Some(ContextValue::String(given)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let option = given.split_once('=').map_or(given.as_str(), |(o, _)| o);
    // The subcommand whose options it stands among (dlock's own before the subcommand).
    let words: Vec<&str> = args.iter().skip(1).filter_map(|a| a.to_str()).collect();
    let sub_at = words
        .iter()
        .position(|a| command.find_subcommand(a).is_some());
    let given_at = words
        .iter()
        .position(|a| a == given || a.strip_prefix(option).is_some_and(|v| v.starts_with('=')));
    let who = match (sub_at, given_at) {
        (Some(s), Some(g)) if g < s => "dlock".to_owned(),
        (Some(s), _) => format!("dlock {}", words[s]),
        (None, _) => "dlock".to_owned(),
    };
    if let (Some(s), Some(g)) = (sub_at, given_at) {
        if g < s {
            if let Some(moved) = moved_to_its_command(&words, g, s, command) {
                return clap::Error::raw(ErrorKind::UnknownArgument, moved);
            }
        }
    }
    let meant = match err.get(ContextKind::SuggestedArg) {
        Some(ContextValue::String(s)) => format!(" (did you mean {s}?)"),
        _ => String::new(),
    };
    clap::Error::raw(
        ErrorKind::UnknownArgument,
        format!("{who} has no option {option}{meant}; see {who} --help"),
    )
}

/// An option of the subcommand `words[sub_at]` given before it, at `words[given_at]`
/// (`dlock -n run x true`): say so, with the command line it belongs in, or `None` when the
/// subcommand has no such option either.
fn moved_to_its_command(
    words: &[&str],
    given_at: usize,
    sub_at: usize,
    command: &clap::Command,
) -> Option<String> {
    let sub = command.find_subcommand(words[sub_at])?;
    let given = words[given_at];
    let takes_value = if let Some(long) = given.strip_prefix("--") {
        // `--wait=5s` carries its value.
        let (long, inline) = long
            .split_once('=')
            .map_or((long, false), |(l, _)| (l, true));
        let arg = sub.get_arguments().find(|a| a.get_long() == Some(long))?;
        arg.get_action().takes_values() && !inline
    } else {
        let mut letters = given.strip_prefix('-')?.chars();
        let (Some(letter), None) = (letters.next(), letters.next()) else {
            return None;
        };
        let arg = sub
            .get_arguments()
            .find(|a| a.get_short() == Some(letter))?;
        arg.get_action().takes_values()
    };
    let moved_end = if takes_value {
        given_at + 2
    } else {
        given_at + 1
    };
    if moved_end > sub_at {
        return None;
    }
    let mut line: Vec<&str> = vec!["dlock"];
    line.extend(&words[..given_at]);
    line.extend(&words[moved_end..=sub_at]);
    line.extend(&words[given_at..moved_end]);
    line.extend(&words[sub_at + 1..]);
    let name = words[sub_at];
    let option = given.split_once('=').map_or(given, |(o, _)| o);
    Some(format!(
        "dlock has no option {option}; it belongs to {name}: {}; see dlock {name} --help",
        line.join(" ")
    ))
}

/// clap's word for an unknown subcommand suggests none where it stopped at a word it could
/// not place (`dlock rn x true`), and leaves a suggestion to a line that the one-line report
/// drops: say the command meant, within two edits, on the line.
pub(super) fn no_such_command(err: clap::Error, command: &clap::Command) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::InvalidSubcommand {
        return err;
    }
    let Some(ContextValue::String(given)) = err.get(ContextKind::InvalidSubcommand) else {
        return err;
    };
    let names: Vec<&str> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(clap::Command::get_name)
        .collect();
    let meant = crate::config::closest(given, &names)
        .map(|name| format!(" (did you mean {name}?)"))
        .unwrap_or_default();
    clap::Error::raw(
        ErrorKind::InvalidSubcommand,
        format!("dlock has no command {given}{meant}; see dlock --help"),
    )
}

/// clap's bad value of an option names the option even when the value came from its
/// `DLOCK_*` variable, and leaves the values it takes to a line that the one-line report
/// drops: name the variable, and the values.
pub(super) fn bad_value(
    err: clap::Error,
    args: &[OsString],
    command: &clap::Command,
) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return err;
    }
    let Some(ContextValue::String(shown)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let flag = shown.split(' ').next().unwrap_or(shown);
    let text = err.to_string();
    let first = text.lines().next().unwrap_or_default();
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    let long = flag.strip_prefix("--").unwrap_or_default();
    let env = command
        .get_subcommands()
        .chain(std::iter::once(command))
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env().map(|v| (v.to_owned(), a.get_short())));
    if let Some((var, short)) = env {
        let on_the_line = args.iter().filter_map(|a| a.to_str()).any(|a| {
            a == flag
                || a.starts_with(&format!("{flag}="))
                || short
                    .is_some_and(|s| a.starts_with('-') && !a.starts_with("--") && a.contains(s))
        });
        if !on_the_line && std::env::var_os(&var).is_some() {
            message = message.replace(
                &format!("for '{shown}'"),
                &format!("for {} (environment)", var.to_string_lossy()),
            );
        }
    }
    // BoolishValueParser's words leave out what it takes.
    message = message.replace(
        "value was not a boolean",
        "not a boolean; expected 1, 0, true, false, yes, no, on, off",
    );
    if let Some(ContextValue::Strings(valid)) = err.get(ContextKind::ValidValue) {
        message.push_str(&format!("; expected {}", valid.join(", ")));
    }
    clap::Error::raw(err.kind(), message)
}

/// A subcommand's `-V` / `--version` is dlock's (clap would name the subcommand:
/// `dlock-run 0.1.0`).
pub(super) fn version_of_dlock(
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

/// Rewrite `dlock … run [OPTS] NAME [-c CMD] [--] COMMAND…` into
/// `dlock … run [OPTS] [--command=CMD] -- NAME COMMAND…`, so clap stops option parsing at the
/// first word after NAME. Anything it does not recognise is left for clap to report.
pub fn normalize_run_args(args: Vec<OsString>, command: &clap::Command) -> Vec<OsString> {
    let Some(run) = command.find_subcommand("run") else {
        return args;
    };
    let top_level = scan_options(&args, 1, command, command, |word| word == "run");
    let Some(run_at) = top_level.filter(|&i| args[i] == "run") else {
        return args;
    };
    let Some(name_at) = scan_options(&args, run_at + 1, run, command, |_| true) else {
        return args;
    };
    let mut out: Vec<OsString> = args[..name_at].to_vec();
    let mut rest = name_at;
    if args[rest] == "--" {
        rest += 1;
    }
    let Some(name) = args.get(rest).cloned() else {
        return args;
    };
    rest += 1;
    // `-c CMD` / `-cCMD` / `--command CMD` / `--command=CMD` right after NAME.
    if let Some(word) = args.get(rest).and_then(|w| w.to_str()) {
        let shell_command = if word == "-c" || word == "--command" {
            args.get(rest + 1).cloned().map(|v| (v, 2))
        } else if let Some(v) = word.strip_prefix("--command=") {
            Some((OsString::from(v), 1))
        } else {
            word.strip_prefix("-c")
                .filter(|v| !v.is_empty())
                .map(|v| (OsString::from(v), 1))
        };
        if let Some((value, consumed)) = shell_command {
            let mut flag = OsString::from("--command=");
            flag.push(&value);
            out.push(flag);
            rest += consumed;
        }
    }
    if args.get(rest).is_some_and(|w| w == "--") {
        rest += 1;
    }
    out.push("--".into());
    out.push(name);
    out.extend(args[rest..].iter().cloned());
    out
}

/// From `start`, skip options (and their values) of `command` and the global ones of `top`;
/// return the index of the first word that is not an option and satisfies `stop`, or of `--`.
fn scan_options(
    args: &[OsString],
    start: usize,
    command: &clap::Command,
    top: &clap::Command,
    stop: impl Fn(&OsStr) -> bool,
) -> Option<usize> {
    let mut i = start;
    while i < args.len() {
        let word = args[i].to_str()?;
        if word == "--" || !word.starts_with('-') || word == "-" {
            return (word == "--" || stop(args[i].as_os_str())).then_some(i);
        }
        let takes_value = if let Some(long) = word.strip_prefix("--") {
            !long.contains('=') && long_takes_value(command, top, long)
        } else {
            short_cluster_wants_next(command, top, &word[1..])
        };
        i += if takes_value { 2 } else { 1 };
    }
    None
}

fn long_takes_value(command: &clap::Command, top: &clap::Command, long: &str) -> bool {
    arguments(command, top).any(|a| {
        (a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|al| al.contains(&long)))
            && a.get_action().takes_values()
    })
}

/// In a cluster like `-nE5` or `-w`, does the last option take its value from the next word?
fn short_cluster_wants_next(command: &clap::Command, top: &clap::Command, cluster: &str) -> bool {
    for (pos, c) in cluster.char_indices() {
        let takes = arguments(command, top)
            .any(|a| a.get_short() == Some(c) && a.get_action().takes_values());
        if takes {
            return pos + c.len_utf8() == cluster.len();
        }
    }
    false
}

/// The options of `command`, plus the global ones of `top` (clap only propagates them to
/// subcommands when it builds the tree, so they are looked up where they are defined; a
/// second tree of them would cost every run its building).
fn arguments<'a>(
    command: &'a clap::Command,
    top: &'a clap::Command,
) -> impl Iterator<Item = &'a clap::Arg> {
    command
        .get_arguments()
        .chain(top.get_arguments().filter(|a| a.is_global_set()))
}
