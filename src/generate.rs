//! `dlock generate man|completions DIR`: the man pages and completion scripts, generated from
//! the clap definition so they cannot drift from `--help`. The committed copies in `man/` and
//! `completions/` are checked against fresh output by a test.
//!
//! clap_mangen renders each section; the synopsis is dlock's own (clap_mangen's leaves out
//! the options' value placeholders, `--wait DUR`), and EXAMPLES and SEE ALSO are added from
//! [`examples`]. The completion scripts leave out the hidden `generate`, and for `dlock run`
//! stop offering dlock's options after NAME: what follows is a command and its arguments
//! (`completions.rs` edits clap_complete's output for that).

mod completions;

use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, Generate};

pub fn run(what: Generate) -> anyhow::Result<()> {
    match what {
        Generate::Man { dir } => man_pages(&dir),
        Generate::Completions { dir } => completions::write(&dir),
    }
}

/// `dlock.1` plus `dlock-<subcommand>.1` for every visible subcommand.
pub fn man_pages(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The plain version: the long one names the commit, and the pages would go stale with it.
    let command = Cli::command().long_version(None);
    let pages: Vec<String> = std::iter::once("dlock".to_owned())
        .chain(
            command
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| format!("dlock-{}", s.get_name())),
        )
        .collect();
    write_man(dir, "dlock", command.clone(), &pages)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("dlock-{}", sub.get_name());
        let sub = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("dlock {}", sub.get_name()));
        write_man(dir, &name, sub, &pages)?;
    }
    Ok(())
}

fn write_man(
    dir: &Path,
    name: &str,
    command: clap::Command,
    pages: &[String],
) -> anyhow::Result<()> {
    let man = clap_mangen::Man::new(command.clone()).date("");
    let mut page = Vec::new();
    let rendered = (|| -> std::io::Result<()> {
        man.render_title(&mut page)?;
        man.render_name_section(&mut page)?;
        page.extend_from_slice(synopsis(&command).as_bytes());
        man.render_description_section(&mut page)?;
        if command.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(&mut page)?;
        }
        if command.get_subcommands().any(|s| !s.is_hide_set()) {
            man.render_subcommands_section(&mut page)?;
        }
        if command.get_after_long_help().is_some() || command.get_after_help().is_some() {
            man.render_extra_section(&mut page)?;
        }
        page.extend_from_slice(examples(name).as_bytes());
        page.extend_from_slice(see_also(name, pages).as_bytes());
        if command.get_version().is_some() {
            man.render_version_section(&mut page)?;
        }
        Ok(())
    })();
    rendered.with_context(|| format!("cannot render the man page {name}"))?;
    let page = once_preamble(&String::from_utf8_lossy(&page));
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))
}

/// Each section rendered on its own starts with clap_mangen's two-line preamble (the `Aq`
/// string); keep the first.
fn once_preamble(page: &str) -> String {
    const PREAMBLE: &str = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";
    match page.find(PREAMBLE) {
        Some(at) => {
            let rest = &page[at + PREAMBLE.len()..];
            format!("{}{PREAMBLE}{}", &page[..at], rest.replace(PREAMBLE, ""))
        }
        None => page.to_owned(),
    }
}

/// Text for roff: backslashes and hyphens escaped.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// `.SH SYNOPSIS` with each option's value placeholder: `[-w|--wait DUR]`.
fn synopsis(command: &clap::Command) -> String {
    let name = command.get_bin_name().unwrap_or(command.get_name());
    let mut line = format!("\\fB{}\\fR", roff(name));
    for arg in command
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
    {
        let mut names = Vec::new();
        if let Some(short) = arg.get_short() {
            names.push(format!("\\fB\\-{}\\fR", roff(&short.to_string())));
        }
        if let Some(long) = arg.get_long() {
            names.push(format!("\\fB\\-\\-{}\\fR", roff(long)));
        }
        let value = match arg.get_value_names() {
            Some(values) if arg.get_action().takes_values() => {
                format!(" \\fI{}\\fR", roff(&values.join(" ")))
            }
            _ => String::new(),
        };
        line.push_str(&format!(" [{}{value}]", names.join("|")));
    }
    for arg in command.get_positionals().filter(|a| !a.is_hide_set()) {
        let value = arg
            .get_value_names()
            .map_or_else(|| arg.get_id().to_string(), |v| v.join(" "));
        let many = if arg.get_num_args().is_some_and(|n| n.max_values() > 1) {
            "..."
        } else {
            ""
        };
        if arg.is_required_set() {
            line.push_str(&format!(" \\fI{}\\fR{many}", roff(&value)));
        } else {
            line.push_str(&format!(" [\\fI{}\\fR]{many}", roff(&value)));
        }
    }
    if command.get_subcommands().any(|s| !s.is_hide_set()) {
        line.push_str(" \\fICOMMAND\\fR");
    }
    format!(".SH SYNOPSIS\n{line}\n")
}

/// `.SH EXAMPLES` for a page: (command line, what it does) pairs.
fn examples(page: &str) -> String {
    let run: &[(&str, &str)] = &[
        (
            "dlock run deploy-prod -- ./deploy.sh --env prod",
            "Run the deploy while holding the lock deploy-prod (a file lock in the default directory); a second deploy waits.",
        ),
        (
            "dlock run -n -q --min-hold 60s -E 0 nightly -- ./nightly.sh",
            "The same crontab line on several hosts (with one --url): the first host runs the job, the others find the lock held and exit 0 quietly. --min-hold keeps the lock for 60 s even when the job ends sooner, so a host whose clock is behind does not run it again.",
        ),
        (
            "dlock run --url redis://locks.internal --wait 5m report -c 'make report'",
            "Take the lock on a Redis server, wait at most five minutes for it, run a shell command.",
        ),
    ];
    let status: &[(&str, &str)] = &[
        (
            "dlock status deploy-prod",
            "Who holds deploy-prod, since when, its fencing token and waiters.",
        ),
        (
            "dlock status -q deploy-prod && echo held",
            "Exit 0 when held, 1 when free: for scripts.",
        ),
    ];
    let list: &[(&str, &str)] = &[
        (
            "dlock list",
            "Every held lock under the namespace, one line each.",
        ),
        ("dlock list --json", "The same as JSON."),
    ];
    let release: &[(&str, &str)] = &[(
        "dlock release --force --url etcd://10.0.0.5:2379 deploy-prod",
        "Break a lock whose holder is stuck; the holder notices the loss and stops its command.",
    )];
    let check: &[(&str, &str)] = &[(
        "dlock check --url postgres://dlock@db/locks",
        "Connect, measure the round trip, create and delete a test entry, print the server version.",
    )];
    let chosen: Vec<(&str, &str)> = match page {
        "dlock" => run.iter().chain(status).chain(list).copied().collect(),
        "dlock-run" => run.to_vec(),
        "dlock-status" => status.to_vec(),
        "dlock-list" => list.to_vec(),
        "dlock-release" => release.to_vec(),
        "dlock-check" => check.to_vec(),
        _ => Vec::new(),
    };
    if chosen.is_empty() {
        return String::new();
    }
    let mut out = String::from(".SH EXAMPLES\n");
    for (line, what) in chosen {
        out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(line), roff(what)));
    }
    out
}

/// `.SH SEE ALSO`: the other dlock pages, then the tools dlock is modelled on.
fn see_also(page: &str, pages: &[String]) -> String {
    let mut refs: Vec<String> = pages
        .iter()
        .filter(|p| p.as_str() != page)
        .map(|p| format!("\\fB{}\\fR(1)", roff(p)))
        .collect();
    refs.extend(["flock", "timeout", "etcdctl"].map(|p| format!("\\fB{p}\\fR(1)")));
    format!(".SH \"SEE ALSO\"\n{}\n", refs.join(", "))
}
