//! The completion scripts: clap_complete's, for the visible subcommands only (`generate` is
//! for packagers), edited so that in `dlock run` dlock's options stop at NAME, as dlock's
//! parser does: after NAME the shell completes a command, then its arguments (files).

use std::path::Path;

use anyhow::Context;
use clap_complete::Shell;

/// `dlock.bash`, `_dlock` (zsh) and `dlock.fish`.
pub fn write(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let value_options = run_value_options();
    for (shell, file) in [
        (Shell::Bash, "dlock.bash"),
        (Shell::Zsh, "_dlock"),
        (Shell::Fish, "dlock.fish"),
    ] {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut visible_command(), "dlock", &mut script);
        let script = String::from_utf8_lossy(&script);
        let script = match shell {
            Shell::Bash => bash(&script, &value_options),
            Shell::Zsh => zsh(&script),
            Shell::Fish => fish(&script, &value_options),
            _ => script.into_owned(),
        };
        let path = dir.join(file);
        std::fs::write(&path, script)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// dlock's command tree without its hidden subcommands (clap_complete lists those too).
fn visible_command() -> clap::Command {
    let full = crate::cli::command();
    let mut command = clap::Command::new("dlock")
        .version(full.get_version().unwrap_or_default().to_owned())
        .propagate_version(true)
        .disable_help_subcommand(true);
    if let Some(about) = full.get_about() {
        command = command.about(about.clone());
    }
    for arg in full.get_arguments() {
        command = command.arg(arg.clone());
    }
    for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
        command = command.subcommand(sub.clone().mut_args(url_completes_schemes));
    }
    command
}

/// `--url <TAB>` offers the schemes of every backend (`redis://`, `etcd://`, …), not file
/// names. Only the completions' copy of the option lists them: dlock's parser takes any URL.
fn url_completes_schemes(arg: clap::Arg) -> clap::Arg {
    if arg.get_id() != "url" {
        return arg;
    }
    let schemes: Vec<String> = crate::backend::schemes()
        .map(|scheme| format!("{scheme}://"))
        .collect();
    arg.value_parser(clap::builder::PossibleValuesParser::new(schemes))
}

/// The spellings of `dlock run`'s options (global ones included) that take a value from the
/// next word: `-u --url -w --wait …`.
fn run_value_options() -> Vec<String> {
    let full = crate::cli::command();
    let Some(run) = full.find_subcommand("run") else {
        return Vec::new();
    };
    let mut spellings = Vec::new();
    for arg in run.get_arguments().chain(full.get_arguments()) {
        if arg.is_positional() || !arg.get_action().takes_values() {
            continue;
        }
        if let Some(short) = arg.get_short() {
            spellings.push(format!("-{short}"));
        }
        if let Some(long) = arg.get_long() {
            spellings.push(format!("--{long}"));
        }
    }
    spellings
}

const BASH_RUN: &str = r#"
# dlock run: dlock's options stop at NAME; then a command, then its arguments.
__dlock_run_after_name() {
    local i=1 first
    while [[ $i -lt $COMP_CWORD && "${COMP_WORDS[i]}" != run ]]; do
        i=$((i + 1))
    done
    i=$((i + 1))
    while [[ $i -lt $COMP_CWORD ]]; do
        case "${COMP_WORDS[i]}" in
            --) i=$((i + 1)); break ;;
            @VALUE_OPTIONS@) i=$((i + 2)) ;;
            -*) i=$((i + 1)) ;;
            *) break ;;
        esac
    done
    [[ $i -lt $COMP_CWORD ]] || return 1
    first=$((i + 1))
    case "${COMP_WORDS[first]}" in
        --) [[ $first -lt $COMP_CWORD ]] && first=$((first + 1)) ;;
        -c|--command|-c*|--command=*) COMPREPLY=(); return 0 ;;
    esac
    if [[ $COMP_CWORD -eq $first ]]; then
        COMPREPLY=( $(compgen -c -- "${COMP_WORDS[COMP_CWORD]}") )
    else
        COMPREPLY=( $(compgen -f -- "${COMP_WORDS[COMP_CWORD]}") )
    fi
    return 0
}
"#;

fn bash(script: &str, value_options: &[String]) -> String {
    let helper = BASH_RUN.replace("@VALUE_OPTIONS@", &value_options.join("|"));
    let script = script.replacen(
        "        dlock__subcmd__run)\n",
        "        dlock__subcmd__run)\n            __dlock_run_after_name && return 0\n",
        1,
    );
    match script.find("\nif [[ \"${BASH_VERSINFO[0]}\" -eq 4") {
        Some(at) => format!("{}{helper}{}", &script[..at], &script[at..]),
        None => format!("{script}{helper}"),
    }
}

fn zsh(script: &str) -> String {
    // Inside `(run)`: -A "-*" ends option completion at the first argument (NAME), and the
    // command after it is completed as a command line of its own (`_normal`, as for sudo).
    let Some(start) = script.find("(run)\n") else {
        return script.to_owned();
    };
    let (head, tail) = script.split_at(start);
    let tail = tail.replacen(
        "_arguments \"${_arguments_options[@]}\" : \\",
        "_arguments \"${_arguments_options[@]}\" -A \"-*\" : \\",
        1,
    );
    let tail = tail.replacen("(no shell):_default'", "(no shell):_normal'", 1);
    format!("{head}{tail}")
}

const FISH_RUN: &str = r#"
# dlock run: dlock's options stop at NAME (the first word that is not an option).
function __fish_dlock_run_options
    set -l seen_run 0
    set -l skip 0
    for word in (commandline -opc)[2..-1]
        if test $seen_run = 0
            test "$word" = run; and set seen_run 1
            continue
        end
        if test $skip = 1
            set skip 0
            continue
        end
        switch $word
            case --
                return 1
            case @VALUE_OPTIONS@
                set skip 1
            case '-*'
            case '*'
                return 1
        end
    end
    return 0
end
"#;

fn fish(script: &str, value_options: &[String]) -> String {
    let helper = FISH_RUN.replace("@VALUE_OPTIONS@", &value_options.join(" "));
    let script = script.replace(
        "-n \"__fish_dlock_using_subcommand run\" ",
        "-n \"__fish_dlock_using_subcommand run; and __fish_dlock_run_options\" ",
    );
    format!("{script}{helper}")
}
