//! `dlock generate man|completions DIR`: the man pages and completion scripts, generated from
//! the clap definition so they cannot drift from `--help`. The committed copies in `man/` and
//! `completions/` are checked against fresh output by a test.
//!
//! A page has the sections a reader of man pages looks for, in the usual order: NAME,
//! SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS, ENVIRONMENT, FILES, EXAMPLES, SEE ALSO.
//! clap_mangen renders the options (each option's full `--help` text); the synopsis is dlock's
//! own (clap_mangen's leaves out the options' value placeholders, `--wait DUR`); the prose of
//! the other sections is in [`pages`], and the exit statuses of `dlock run` come from
//! [`crate::exit::TABLE`], the table `--help` shows. `dlock.toml(5)` describes the config file.
//! The completion scripts leave out the hidden `generate`, and for `dlock run` stop offering
//! dlock's options after NAME: what follows is a command and its arguments (`completions.rs`
//! edits clap_complete's output for that).

mod completions;
mod pages;

use std::path::Path;

use anyhow::Context;

use crate::cli::Generate;

pub fn run(what: Generate) -> anyhow::Result<()> {
    match what {
        Generate::Man { dir } => man_pages(&dir),
        Generate::Completions { dir } => completions::write(&dir),
    }
}

/// `dlock.1`, `dlock-<subcommand>.1` for every visible subcommand, and `dlock.toml.5`.
pub fn man_pages(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The plain version: the long one names the commit, and the pages would go stale with it.
    let command = crate::cli::command().long_version(None);
    let version = command.get_version().unwrap_or_default().to_owned();
    let mut pages: Vec<(String, u8)> = vec![("dlock".to_owned(), 1)];
    pages.extend(visible_subcommands(&command).map(|s| (format!("dlock-{}", s.get_name()), 1)));
    pages.push(("dlock.toml".to_owned(), 5));

    write_page(
        dir,
        "dlock",
        1,
        &command_page("dlock", &command, &version, &pages)?,
    )?;
    for sub in visible_subcommands(&command) {
        let name = format!("dlock-{}", sub.get_name());
        let sub = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("dlock {}", sub.get_name()));
        write_page(dir, &name, 1, &command_page(&name, &sub, &version, &pages)?)?;
    }
    let config = format!(
        "{}{}{}",
        title("dlock.toml", 5, &version, "File Formats"),
        pages::config_file(),
        see_also("dlock.toml", &pages)
    );
    write_page(dir, "dlock.toml", 5, &config)
}

fn visible_subcommands(command: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

fn write_page(dir: &Path, name: &str, section: u8, page: &str) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.{section}"));
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))
}

/// The page of `dlock` or one of its subcommands (`name` is `dlock-run`, …).
fn command_page(
    name: &str,
    command: &clap::Command,
    version: &str,
    pages: &[(String, u8)],
) -> anyhow::Result<String> {
    let prose = pages::command(name);
    let mut page = title(name, 1, version, "User Commands");
    page.push_str(&format!(
        ".SH NAME\n{} \\- {}\n",
        roff(name),
        roff(prose.summary)
    ));
    page.push_str(&synopsis(command));
    page.push_str(".SH DESCRIPTION\n");
    page.push_str(&prose_to_roff(prose.description));
    if name == "dlock" {
        // The backends of this build, as `dlock --help` lists them.
        if let Some(about) = command.get_long_about() {
            if let Some(backends) = about.to_string().split("\n\n").nth(2) {
                page.push_str(&prose_to_roff(backends));
            }
        }
    }
    if name == "dlock-run" {
        if let Some(details) = command.get_after_long_help() {
            let details = details.to_string();
            // The details of `--help` up to its examples, which have their own section.
            let details = details.split("\n\nExamples:").next().unwrap_or_default();
            page.push_str(&prose_to_roff(details));
        }
    }
    page.push_str(&options(command)?);
    if name == "dlock" {
        page.push_str(".SH COMMANDS\n");
        for sub in visible_subcommands(command) {
            page.push_str(&format!(
                ".TP\n\\fBdlock\\-{}\\fR(1)\n{}\n",
                roff(sub.get_name()),
                roff(&sub.get_about().map(|a| a.to_string()).unwrap_or_default())
            ));
        }
    }
    page.push_str(".SH \"EXIT STATUS\"\n");
    let run_statuses = exit_statuses(crate::exit::TABLE);
    let rows: Vec<(&str, &str)> = if prose.exit.is_empty() {
        run_statuses
            .iter()
            .map(|(s, m)| (s.as_str(), m.as_str()))
            .collect()
    } else {
        prose.exit.to_vec()
    };
    page.push_str(&prose_to_roff(prose.exit_intro));
    page.push_str(&table(("STATUS", "MEANING"), &rows));
    page.push_str(".SH ENVIRONMENT\n");
    page.push_str(&definitions(&environment(command, &prose)));
    page.push_str(".SH FILES\n");
    page.push_str(&definitions(&prose.files));
    page.push_str(".SH EXAMPLES\n");
    for (line, what) in &prose.examples {
        page.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(line), roff(what)));
    }
    page.push_str(&see_also(name, pages));
    Ok(page)
}

/// `.TH` with nothing that changes between builds of one version (no date), and the marker
/// that makes `man` run the page through tbl(1) for its tables.
fn title(name: &str, section: u8, version: &str, manual: &str) -> String {
    format!(
        "'\\\" t\n.ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n.TH {} {section} \"\" \"dlock {}\" \"{manual}\"\n",
        roff(&name.to_uppercase()),
        roff(version)
    )
}

/// The options, as clap_mangen renders them.
fn options(command: &clap::Command) -> anyhow::Result<String> {
    let mut out = Vec::new();
    clap_mangen::Man::new(command.clone())
        .render_options_section(&mut out)
        .context("cannot render the options")?;
    let out = String::from_utf8_lossy(&out).into_owned();
    // clap_mangen starts each section with the two lines that define `\*(Aq`; the title has them.
    Ok(out.replace(".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n", ""))
}

/// The rows of an exit-status table such as [`crate::exit::TABLE`]: its indented lines,
/// status and meaning, with wrapped meanings joined.
fn exit_statuses(text: &str) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(' ')) {
        let trimmed = line.trim_start();
        let continued = line.len() - trimmed.len() > 4;
        match (continued, rows.last_mut()) {
            (true, Some((_, meaning))) => {
                meaning.push(' ');
                meaning.push_str(trimmed);
            }
            _ => {
                let (status, meaning) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
                rows.push((status.to_owned(), meaning.trim().to_owned()));
            }
        }
    }
    rows
}

/// A two-column table for tbl(1), the second column wrapped.
fn table(head: (&str, &str), rows: &[(&str, &str)]) -> String {
    let mut out = format!(
        ".TS\ntab(@);\nlB lB\nl lx.\n{}@{}\n",
        roff(head.0),
        roff(head.1)
    );
    for (key, value) in rows {
        out.push_str(&format!("{}@T{{\n{}\nT}}\n", roff(key), roff(value)));
    }
    out.push_str(".TE\n");
    out
}

/// `.TP` items: a name in bold, then its text.
fn definitions<N: AsRef<str>, T: AsRef<str>>(items: &[(N, T)]) -> String {
    items
        .iter()
        .map(|(name, text)| {
            format!(
                ".TP\n\\fB{}\\fR\n{}\n",
                roff(name.as_ref()),
                roff(text.as_ref())
            )
        })
        .collect()
}

/// The variables a page's command reads: its options' (`DLOCK_WAIT`: `--wait`), then the
/// others the page names.
fn environment(command: &clap::Command, prose: &pages::Command) -> Vec<(String, String)> {
    let mut items = Vec::new();
    for arg in command.get_arguments() {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        items.push((
            var.to_string_lossy().into_owned(),
            format!("The same as --{long}."),
        ));
    }
    items.extend(
        prose
            .environment
            .iter()
            .map(|(var, text)| ((*var).to_owned(), (*text).to_owned())),
    );
    items
}

/// `.SH SEE ALSO`: the other pages of dlock, then flock(1).
fn see_also(page: &str, pages: &[(String, u8)]) -> String {
    let mut refs: Vec<String> = pages
        .iter()
        .filter(|(p, _)| p.as_str() != page)
        .map(|(p, section)| format!("\\fB{}\\fR({section})", roff(p)))
        .collect();
    refs.push("\\fBflock\\fR(1)".to_owned());
    format!(".SH \"SEE ALSO\"\n{}\n", refs.join(", "))
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
    if visible_subcommands(command).next().is_some() {
        line.push_str(" \\fICOMMAND\\fR");
    }
    format!(".SH SYNOPSIS\n{line}\n")
}

/// Text for roff: backslashes and hyphens escaped, and a line that would start with a control
/// character (`.` or `'`) protected.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|line| {
            if line.starts_with('.') || line.starts_with('\'') {
                format!("\\&{line}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Plain text as roff: paragraphs (blank lines between them) become `.PP`; a paragraph whose
/// first line ends in `:` and is one short line (`Signals:`) is a subsection title; `code`
/// in backquotes is bold.
fn prose_to_roff(text: &str) -> String {
    let mut out = String::new();
    for paragraph in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        let joined = paragraph
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        let (heading, body) = match joined.split_once(": ") {
            Some((head, body)) if is_heading(head) => (Some(head), body.to_owned()),
            _ => (None, joined.clone()),
        };
        if let Some(head) = heading {
            out.push_str(&format!(".SS {}\n", roff(head)));
        } else {
            out.push_str(".PP\n");
        }
        out.push_str(&bold_code(&roff(&body)));
        out.push('\n');
    }
    out
}

/// `Signals`, `Waiting`: one or two capitalised words before a colon open a subsection.
fn is_heading(head: &str) -> bool {
    let words: Vec<&str> = head.split(' ').collect();
    words.len() <= 2
        && head.chars().next().is_some_and(char::is_uppercase)
        && head.chars().all(|c| c.is_alphabetic() || c == ' ')
}

/// `code` → bold.
fn bold_code(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str(&format!("\\fB{part}\\fR"));
        } else {
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests;
