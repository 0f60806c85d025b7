//! The documentation stays true to the binary.
//!
//! - Every ```` ```sh ```` block of README.md, docs/*.md and docs/backends/*.md runs
//!   successfully against the built `dlock`, in a scratch directory, with no lock, config file
//!   or `DLOCK_*` variable of the machine it runs on. (Blocks tagged `text` or `bash` are not
//!   run: set-up commands, crontab lines, output.)
//! - The README is short, recipes before reference, and every relative link of the README and
//!   docs/ leads to a file and heading that exist; every backend has its page.
//! - The README's exit-status table lists exactly the statuses `dlock run --help` lists; the
//!   help renders them from `exit::TABLE`.
//! - The committed `man/` and `completions/` are what `dlock generate` writes today; the pages
//!   have the sections of a man page and refer only to pages that exist.
//! - `dlock run --help` documents the exit statuses and the signal policy; `dlock run -h` is a
//!   summary with examples.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A README block that runs longer than this has hung (a lock that is never released, a
/// command that waits for input); it is killed and the test fails.
const BLOCK_TIME_LIMIT: Duration = Duration::from_secs(30);

const REGENERATE: &str =
    "cargo run -- generate man man && cargo run -- generate completions completions";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn dlock_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_dlock"))
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn readme() -> String {
    read("README.md")
}

/// The backends, each with its page `docs/backends/<name>.md`.
const BACKEND_PAGES: [&str; 12] = [
    "file",
    "redis",
    "redis-sentinel",
    "redis-cluster",
    "etcd",
    "zookeeper",
    "postgres",
    "mysql",
    "memcached",
    "azure",
    "s3",
    "nats",
];

/// The Markdown files of docs/ and docs/backends/, relative to the repository, sorted.
fn doc_pages() -> Vec<String> {
    let mut pages = Vec::new();
    for dir in ["docs", "docs/backends"] {
        let entries =
            fs::read_dir(repo().join(dir)).unwrap_or_else(|e| panic!("cannot read {dir}: {e}"));
        for entry in entries {
            let name = entry.expect("directory entry").file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".md") {
                pages.push(format!("{dir}/{name}"));
            }
        }
    }
    pages.sort();
    pages
}

/// `cmd` without any `DLOCK_*` variable of the environment the tests run in (a `DLOCK_URL`,
/// `DLOCK_CONFIG` or `DLOCK_HELD` there would change what dlock does).
fn without_dlock_env(mut cmd: Command) -> Command {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DLOCK_") {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// Run the built dlock with `args` and return its output; it must succeed.
fn dlock(args: &[&str]) -> Output {
    let mut cmd = without_dlock_env(Command::new(dlock_binary()));
    let output = cmd
        .args(args)
        // A fixed width, so the help text wraps the same way everywhere.
        .env("COLUMNS", "100")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run dlock {}: {e}", args.join(" ")));
    assert!(
        output.status.success(),
        "dlock {} failed ({}):\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn run_help() -> String {
    String::from_utf8(dlock(&["run", "--help"]).stdout).expect("help is UTF-8")
}

// ---------------------------------------------------------------------------------------------
// README examples

/// A fenced code block of a Markdown file.
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    /// The first word of the info string (`sh`, `text`, …).
    lang: String,
    code: String,
}

/// The fenced (```` ``` ````) code blocks of `markdown`, including those indented inside list
/// items; the fence's indentation is removed from the block's lines.
fn fenced_blocks(file: &str, markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, usize, String, String)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let lang = info.split_whitespace().next().unwrap_or("").to_owned();
                    open = Some((index + 1, indent, lang, String::new()));
                }
            }
            Some((start, fence_indent, lang, code)) => {
                if trimmed.starts_with("```") && trimmed.trim_end().chars().all(|c| c == '`') {
                    blocks.push(Block {
                        line: *start,
                        lang: std::mem::take(lang),
                        code: std::mem::take(code),
                    });
                    open = None;
                } else {
                    let strip = indent.min(*fence_indent);
                    code.push_str(&line[strip..]);
                    code.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "{file}: a code fence is never closed");
    blocks
}

/// How a README block ended.
struct BlockRun {
    /// `None` when it was killed for running too long.
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

/// Run one block with `sh -e -c` in a fresh scratch directory, with the built dlock first on
/// PATH, its own runtime and config directories, and no `DLOCK_*` variables.
fn run_block(code: &str) -> BlockRun {
    let scratch = tempfile::tempdir().expect("temp dir");
    let runtime = tempfile::tempdir().expect("temp dir");
    let config_home = tempfile::tempdir().expect("temp dir");
    // Output goes to files, not pipes: a process the block leaves behind cannot hold them open.
    let logs = tempfile::tempdir().expect("temp dir");
    let stdout_path = logs.path().join("stdout");
    let stderr_path = logs.path().join("stderr");

    let bin_dir = dlock_binary().parent().expect("binary has a directory");
    let mut path = vec![bin_dir.to_owned()];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(path).expect("PATH can be joined");

    let mut cmd = without_dlock_env(Command::new("sh"));
    cmd.arg("-e")
        .arg("-c")
        .arg(code)
        .current_dir(scratch.path())
        .env("PATH", path)
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env("DLOCK_DIR", runtime.path().join("dlock"))
        .env("XDG_CONFIG_HOME", config_home.path())
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(fs::File::create(&stderr_path).expect("stderr file"));
    // Its own process group, so that a block that hangs can be killed with all it started.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("cannot start sh");
    let group = Pid::from_raw(i32::try_from(child.id()).expect("pid fits in i32"));

    let (done, finished) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = done.send(child.wait());
    });
    let status = match finished.recv_timeout(BLOCK_TIME_LIMIT) {
        Ok(status) => Some(status.expect("cannot wait for sh")),
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            None
        }
    };
    waiter.join().expect("waiter thread");

    let read =
        |path: &PathBuf| String::from_utf8_lossy(&fs::read(path).unwrap_or_default()).into_owned();
    BlockRun {
        status,
        stdout: read(&stdout_path),
        stderr: read(&stderr_path),
    }
}

/// Run every ```` ```sh ```` block of `files`; the failures, one message each, and how many ran.
fn run_examples(files: &[String]) -> (Vec<String>, usize) {
    let mut failures = Vec::new();
    let mut count = 0;
    for file in files {
        let blocks: Vec<Block> = fenced_blocks(file, &read(file))
            .into_iter()
            .filter(|b| b.lang == "sh")
            .collect();
        for block in &blocks {
            count += 1;
            let run = run_block(&block.code);
            let outcome = match run.status {
                Some(status) if status.success() => continue,
                Some(status) => format!("failed ({status})"),
                None => format!(
                    "did not finish within {}s and was killed",
                    BLOCK_TIME_LIMIT.as_secs()
                ),
            };
            failures.push(format!(
                "{file} line {}: the ```sh block {outcome}\n--- block ---\n{}--- stdout ---\n{}--- stderr ---\n{}",
                block.line, block.code, run.stdout, run.stderr
            ));
        }
    }
    (failures, count)
}

#[test]
fn readme_examples_run() {
    let (failures, count) = run_examples(&["README.md".to_owned()]);
    assert!(
        count > 0,
        "README.md has no ```sh examples; is the parser broken?"
    );
    assert!(
        failures.is_empty(),
        "{} of {count} README examples failed:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn docs_examples_run() {
    let pages = doc_pages();
    let (failures, count) = run_examples(&pages);
    assert!(
        count >= 10,
        "only {count} ```sh examples in {pages:?}; is the parser broken?"
    );
    assert!(
        failures.is_empty(),
        "{} of {count} examples in docs/ failed:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The shape of the docs

/// The README's `## ` headings, in order.
fn h2_headings(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut headings = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code {
            if let Some(heading) = line.strip_prefix("## ") {
                headings.push(heading.trim().to_owned());
            }
        }
    }
    headings
}

#[test]
fn readme_is_short_with_recipes_before_reference() {
    let text = readme();
    let lines = text.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; keep it to 300 and move the rest to docs/"
    );
    let headings = h2_headings(&text);
    let order = [
        "Install",
        "Set up",
        "Recipes",
        "Backends",
        "Options",
        "Exit status",
    ];
    let positions: Vec<Option<usize>> = order
        .iter()
        .map(|h| headings.iter().position(|x| x == h))
        .collect();
    assert!(
        positions.iter().all(Option::is_some) && positions.windows(2).all(|w| w[0] < w[1]),
        "README.md's sections must be {order:?} in that order; they are {headings:?}"
    );
    let recipes = text
        .split("\n## Recipes\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or_default();
    for needle in [
        "cron",
        "--min-hold",
        "--wait 10m",
        "CI",
        "DLOCK_NAME",
        "exec dlock run",
        "--report",
        "jq",
    ] {
        assert!(
            recipes.contains(needle),
            "README.md's recipes do not mention {needle:?}"
        );
    }
}

#[test]
fn every_backend_has_a_page_linked_from_the_readme() {
    let text = readme();
    for name in BACKEND_PAGES {
        let file = format!("docs/backends/{name}.md");
        let page = read(&file);
        for section in [
            "## URL",
            "## What it promises",
            "## Server settings",
            "## `dlock check`",
            "## Caveats",
        ] {
            assert!(
                page.lines().any(|l| l == section),
                "{file} has no \"{section}\" section"
            );
        }
        assert!(
            text.contains(&format!("]({file})")),
            "README.md's backends table does not link {file}"
        );
    }
    let pages = doc_pages();
    for page in pages.iter().filter(|p| p.starts_with("docs/backends/")) {
        let name = page
            .trim_start_matches("docs/backends/")
            .trim_end_matches(".md");
        assert!(
            BACKEND_PAGES.contains(&name),
            "{page} is not the page of a backend dlock has"
        );
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of the inline links `[text](target)` of a Markdown file, outside code.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        for piece in line.split("](").skip(1) {
            if let Some(end) = piece.find(')') {
                out.push(piece[..end].to_owned());
            }
        }
    }
    out
}

#[test]
fn links_between_the_docs_lead_somewhere() {
    let mut files = vec!["README.md".to_owned()];
    files.extend(doc_pages());
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let here = repo().join(file);
        let dir = here.parent().expect("a file has a directory").to_owned();
        for target in link_targets(&read(file)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                here.clone()
            } else {
                dir.join(path)
            };
            if !resolved.exists() {
                broken.push(format!(
                    "{file}: ({target}): {} does not exist",
                    resolved.display()
                ));
                continue;
            }
            if let Some(fragment) = fragment {
                let text = fs::read_to_string(&resolved).unwrap_or_default();
                if !anchors(&text).contains(fragment) {
                    broken.push(format!("{file}: ({target}): no heading #{fragment} there"));
                }
            }
        }
    }
    assert!(
        checked >= 50,
        "only {checked} links found; is the parser broken?"
    );
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------------
// Exit statuses

/// The statuses listed under "Exit status:" in `help`: the first word of each indented line
/// of that section (`75`, `128+S`, …).
fn help_exit_statuses(help: &str) -> BTreeSet<String> {
    let mut lines = help.lines().skip_while(|l| l.trim() != "Exit status:");
    assert!(
        lines.next().is_some(),
        "`dlock run --help` has no \"Exit status:\" section:\n{help}"
    );
    let mut codes = BTreeSet::new();
    for line in lines {
        if !line.starts_with(' ') {
            break;
        }
        // A wrapped description continues on a line that is indented further.
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 4 {
            continue;
        }
        if let Some(code) = trimmed.split_whitespace().next() {
            codes.insert(code.to_owned());
        }
    }
    codes
}

/// The statuses in the first column of the table under the README's "## Exit status".
fn readme_exit_statuses(readme: &str) -> BTreeSet<String> {
    let mut lines = readme.lines().skip_while(|l| l.trim() != "## Exit status");
    assert!(
        lines.next().is_some(),
        "README.md has no \"## Exit status\" section"
    );
    lines
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.trim().strip_prefix('|'))
        .filter_map(|row| row.split('|').next())
        .map(|cell| cell.trim().trim_matches('`').trim().to_owned())
        .filter(|cell| !cell.is_empty() && cell != "status" && !cell.starts_with('-'))
        .collect()
}

#[test]
fn readme_exit_status_table_matches_code() {
    let from_code = help_exit_statuses(&run_help());
    assert!(
        from_code.len() >= 10,
        "found only {from_code:?} in `dlock run --help`; is the parser broken?"
    );
    let in_readme = readme_exit_statuses(&readme());
    let missing: Vec<_> = from_code.difference(&in_readme).collect();
    let extra: Vec<_> = in_readme.difference(&from_code).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README.md's exit-status table is out of step with src/exit.rs (TABLE, as shown by \
         `dlock run --help`):\n  missing from the README: {missing:?}\n  \
         in the README but not in the code: {extra:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Generated files

/// File name → contents of every file in `dir`.
fn files_in(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    entries
        .map(|entry| {
            let entry = entry.expect("directory entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let contents = fs::read(entry.path())
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", entry.path().display()));
            (name, contents)
        })
        .collect()
}

/// Differences between the committed `dir` and a fresh copy, one line each.
fn stale_files(dir: &str, fresh: &Path) -> Vec<String> {
    let committed = files_in(&repo().join(dir));
    let fresh = files_in(fresh);
    let mut problems = Vec::new();
    for (name, contents) in &fresh {
        match committed.get(name) {
            None => problems.push(format!("{dir}/{name} is missing")),
            Some(old) if old != contents => problems.push(format!("{dir}/{name} is out of date")),
            Some(_) => {}
        }
    }
    for name in committed.keys().filter(|n| !fresh.contains_key(*n)) {
        problems.push(format!("{dir}/{name} is no longer generated"));
    }
    problems
}

#[test]
fn man_pages_and_completions_are_fresh() {
    let fresh = tempfile::tempdir().expect("temp dir");
    let man = fresh.path().join("man");
    let completions = fresh.path().join("completions");
    dlock(&["generate", "man", man.to_str().expect("UTF-8 temp path")]);
    dlock(&[
        "generate",
        "completions",
        completions.to_str().expect("UTF-8 temp path"),
    ]);
    let mut problems = stale_files("man", &man);
    problems.extend(stale_files("completions", &completions));
    assert!(
        problems.is_empty(),
        "the committed man pages or completions are stale:\n  {}\nregenerate them with:\n  {REGENERATE}",
        problems.join("\n  ")
    );
}

/// The sections of a command's man page, in the order man pages have them.
const MAN_SECTIONS: [&str; 9] = [
    ".SH NAME",
    ".SH SYNOPSIS",
    ".SH DESCRIPTION",
    ".SH OPTIONS",
    ".SH \"EXIT STATUS\"",
    ".SH ENVIRONMENT",
    ".SH FILES",
    ".SH EXAMPLES",
    ".SH \"SEE ALSO\"",
];

#[test]
fn man_pages_have_the_sections_of_a_man_page() {
    let pages = files_in(&repo().join("man"));
    assert!(
        pages.contains_key("dlock.1") && pages.contains_key("dlock-run.1"),
        "{:?}",
        pages.keys()
    );
    assert!(
        pages.contains_key("dlock.toml.5"),
        "no man page for the config file (dlock.toml.5)"
    );
    for (name, contents) in &pages {
        let text = String::from_utf8_lossy(contents);
        let sections: Vec<&str> = if name.ends_with(".5") {
            vec![
                ".SH NAME",
                ".SH SYNOPSIS",
                ".SH DESCRIPTION",
                ".SH EXAMPLES",
                ".SH \"SEE ALSO\"",
            ]
        } else {
            MAN_SECTIONS.to_vec()
        };
        let mut from = 0;
        for section in sections {
            let at = text[from..]
                .find(&format!("{section}\n"))
                .unwrap_or_else(|| panic!("man/{name}: no {section} (after the previous section)"));
            from += at + section.len();
        }
        assert!(
            !text.contains(".SH EXTRA"),
            "man/{name}: a section named EXTRA is clap's leftover"
        );
        // Every page says what its command is: a summary after the name, a description.
        let named = text.split(".SH NAME\n").nth(1).unwrap_or_default();
        let summary = named.lines().next().unwrap_or_default();
        assert!(
            summary
                .split_once("\\- ")
                .is_some_and(|(_, what)| !what.trim().is_empty()),
            "man/{name}: no summary in its NAME line {summary:?}"
        );
        let described = text.split(".SH DESCRIPTION\n").nth(1).unwrap_or_default();
        assert!(
            described
                .split("\n.SH ")
                .next()
                .is_some_and(|d| d.chars().any(char::is_alphanumeric)),
            "man/{name}: an empty DESCRIPTION"
        );
        if name.ends_with(".1") {
            // The exit statuses are a table (tbl), and man is told to run tbl.
            assert!(
                text.starts_with("'\\\" t\n"),
                "man/{name} does not ask for tbl"
            );
            let exit = text.split(".SH \"EXIT STATUS\"").nth(1).unwrap_or_default();
            let exit = exit.split("\n.SH ").next().unwrap_or_default();
            assert!(
                exit.contains(".TS\n") && exit.contains(".TE"),
                "man/{name}: EXIT STATUS is not a table:\n{exit}"
            );
        }
    }
    // dlock run's page lists the statuses of `dlock run --help`.
    let run = String::from_utf8_lossy(&pages["dlock-run.1"]).into_owned();
    for code in help_exit_statuses(&run_help()) {
        assert!(
            run.contains(&format!("\n{}@T{{", code.replace('-', "\\-"))),
            "man/dlock-run.1 has no row for exit status {code}"
        );
    }
}

#[test]
fn man_pages_refer_only_to_pages_that_exist() {
    let pages = files_in(&repo().join("man"));
    for (name, contents) in &pages {
        let text = String::from_utf8_lossy(contents);
        let see_also = text
            .split(".SH \"SEE ALSO\"\n")
            .nth(1)
            .unwrap_or_else(|| panic!("man/{name} has no SEE ALSO"));
        let see_also = see_also.split("\n.SH").next().unwrap_or_default();
        let mut refs = 0;
        for reference in see_also.split(", ") {
            // `\fBdlock\-run\fR(1)` → dlock-run, 1
            let page = reference
                .trim()
                .trim_start_matches("\\fB")
                .replace("\\-", "-");
            let (page, section) = page
                .split_once("\\fR(")
                .unwrap_or_else(|| panic!("man/{name}: cannot read {reference:?} in SEE ALSO"));
            let section = section.trim_end_matches(')');
            refs += 1;
            let exists = pages.contains_key(&format!("{page}.{section}"))
                || (page == "flock" && section == "1");
            assert!(
                exists,
                "man/{name}: SEE ALSO names {page}({section}), which is not installed"
            );
        }
        assert!(refs >= 2, "man/{name}: SEE ALSO names {refs} pages");
        assert!(
            !text.contains("dlock\\-help"),
            "man/{name} names dlock-help"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Help text

/// `dlock args` with COLUMNS=100, its stdout (it must succeed).
fn help_of(args: &[&str]) -> String {
    String::from_utf8(dlock(args).stdout).expect("help is UTF-8")
}

#[test]
fn run_short_help_is_a_summary_with_examples() {
    let short = help_of(&["run", "-h"]);
    let lines = short.lines().count();
    assert!(lines <= 40, "`dlock run -h` has {lines} lines:\n{short}");
    assert!(
        short.contains("Examples:\n"),
        "`dlock run -h` has no examples:\n{short}"
    );
    for needle in [
        "--url",
        "--wait",
        "--no-wait",
        "--ttl",
        "-c, --command",
        "--help",
    ] {
        assert!(
            short.contains(needle),
            "`dlock run -h` does not mention {needle}"
        );
    }
    let long = help_of(&["run", "--help"]);
    for needle in [
        "--prefix",
        "--on-lost",
        "--kill-after",
        "--local-queue",
        "--record-command",
        "--also",
        "Examples:",
        "Exit status:",
        "Signals:",
        "redis-sentinel://",
    ] {
        assert!(
            long.contains(needle),
            "`dlock run --help` does not mention {needle}"
        );
    }
}

/// `--local-queue` and `--record-command` take on|off: help and completion offer those two
/// words, and the other spellings of a boolean still work.
#[test]
fn on_off_switches_offer_on_and_off() {
    let long = help_of(&["run", "--help"]);
    let flat = long.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        !flat.contains("[possible values: true, false]"),
        "`dlock run --help` offers true/false for an on|off switch:\n{long}"
    );
    assert!(
        flat.matches("[possible values: on, off]").count() >= 2,
        "`dlock run --help` does not offer on|off:\n{long}"
    );
    let script = repo().join("completions/dlock.bash");
    let program = format!(
        "source '{}'; COMP_WORDS=(dlock run --local-queue ''); COMP_CWORD=3; \
         _dlock dlock '' --local-queue; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .expect("run bash");
    let offered = String::from_utf8_lossy(&out.stdout);
    let offered: Vec<&str> = offered.lines().collect();
    assert_eq!(
        offered,
        ["on", "off"],
        "bash completes --local-queue with {offered:?}"
    );

    let scratch = tempfile::tempdir().expect("temp dir");
    for (args, env) in [
        (vec!["--local-queue", "off", "--record-command", "on"], None),
        (
            vec!["--local-queue", "0", "--record-command", "FALSE"],
            None,
        ),
        (vec![], Some(("DLOCK_LOCAL_QUEUE", "yes"))),
        (vec![], Some(("DLOCK_RECORD_COMMAND", "off"))),
    ] {
        let mut cmd = without_dlock_env(Command::new(dlock_binary()));
        cmd.arg("run")
            .args(&args)
            .args(["switch-demo", "true"])
            .env("DLOCK_DIR", scratch.path().join("dlock"))
            .stdin(Stdio::null());
        if let Some((key, value)) = env {
            cmd.env(key, value);
        }
        let out = cmd.output().expect("run dlock");
        assert!(
            out.status.success(),
            "dlock run {args:?} {env:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `release --force` of a free lock exits 1, and `release --help` says so.
#[test]
fn release_documents_the_status_of_a_free_lock() {
    let help = help_of(&["release", "--help"]);
    let row = help
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("1 "))
        .unwrap_or_else(|| panic!("`dlock release --help` has no exit status 1:\n{help}"));
    assert!(row.contains("not held"), "{row}");

    let scratch = tempfile::tempdir().expect("temp dir");
    let out = without_dlock_env(Command::new(dlock_binary()))
        .args(["release", "--force", "never-held"])
        .env("DLOCK_DIR", scratch.path().join("dlock"))
        .stdin(Stdio::null())
        .output()
        .expect("run dlock");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not held"),
        "{out:?}"
    );
}

#[test]
fn help_mentions_exit_statuses_and_signals() {
    let help = run_help();
    // Wrapping depends on the terminal width; compare with all whitespace runs as one space.
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");

    // README "Exit status", as rendered from exit::TABLE.
    let statuses = help_exit_statuses(&help);
    for code in [
        "N", "128+S", "75", "124", "64", "69", "70", "73", "77", "78", "126", "127", "128+N",
    ] {
        assert!(
            statuses.contains(code),
            "`dlock run --help` does not list exit status {code} (found {statuses:?})"
        );
    }

    // README "Signals": which signals are forwarded, escalation, waiting, lock loss.
    for needle in [
        "Signals:",
        "SIGTERM",
        "SIGINT",
        "SIGHUP",
        "SIGQUIT",
        "SIGUSR1",
        "SIGUSR2",
        "forwarded once",
        "process group",
        "SIGKILL",
        "--kill-after",
        "a second such signal sends SIGKILL",
        "while waiting for the lock cancels the wait",
        "128+N",
        "--on-lost",
        "exit 124",
    ] {
        assert!(
            flat.contains(needle),
            "`dlock run --help` does not mention {needle:?}:\n{help}"
        );
    }
}

/// The completion scripts, loaded into the shell: `dlock <TAB>` offers no `generate`; in
/// `dlock run`, dlock's options before NAME, then a command, then files, never dlock's options.
#[test]
fn completions_hide_generate_and_stop_options_at_the_command() {
    let complete = bash_completions;
    let has = |words: &[String], w: &str| words.iter().any(|x| x == w);
    let top = complete(&["dlock", ""]);
    assert!(has(&top, "run") && !has(&top, "generate"), "{top:?}");
    let options = complete(&["dlock", "run", "-n", "--wait", "5s", "--"]);
    assert!(
        has(&options, "--ttl") && has(&options, "--min-hold"),
        "{options:?}"
    );
    let after_name = complete(&["dlock", "run", "--wait", "5s", "job", "--"]);
    assert!(!has(&after_name, "--ttl"), "{after_name:?}");
    let command = complete(&["dlock", "-v", "run", "job", "ech"]);
    assert!(has(&command, "echo"), "{command:?}");
    let args = complete(&["dlock", "run", "job", "--", "echo", "--"]);
    assert!(!has(&args, "--ttl") && !has(&args, "--wait"), "{args:?}");
}

/// The man pages' first line of a script that locks itself works in a script that runs
/// under `set -u`, where `$DLOCK_NAME` is unset on the first run (as the README's does).
#[test]
fn the_man_pages_self_locking_line_runs_under_set_u() {
    for page in ["man/dlock.1", "man/dlock-run.1"] {
        let text = read(page);
        let line = text
            .lines()
            .find(|l| l.contains("exec dlock run job"))
            .unwrap_or_else(|| panic!("{page} has no self-locking example"));
        let line = line
            .trim_start_matches("\\fB")
            .trim_end_matches("\\fR")
            .replace("\\-", "-");
        let code = format!(
            "cat > job.sh <<'EOF'\n#!/bin/sh\nset -u\n{line}\necho \"held $DLOCK_NAME\"\nEOF\n\
             chmod +x job.sh\n./job.sh"
        );
        let run = run_block(&code);
        assert!(
            run.status.is_some_and(|s| s.success()) && run.stdout == "held job\n",
            "{page}: {line}\nstdout: {}\nstderr: {}",
            run.stdout,
            run.stderr
        );
    }
}

/// What bash offers for the last of `words`, with completions/dlock.bash loaded (COMP_WORDS,
/// COMP_CWORD, `_dlock cmd cur prev`).
fn bash_completions(words: &[&str]) -> Vec<String> {
    let script = repo().join("completions/dlock.bash");
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let n = words.len();
    let program = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; _dlock dlock '{}' '{}'; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        n - 1,
        words[n - 1],
        words[n - 2]
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .current_dir(repo())
        .output()
        .expect("run bash (Debian package bash)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `--url <TAB>` offers the backends' schemes, not file names, in every shell.
#[test]
fn url_completes_the_backends_schemes_in_every_shell() {
    let has = |words: &[String], w: &str| words.iter().any(|x| x == w);
    for sub in ["run", "status", "check"] {
        let offered = bash_completions(&["dlock", sub, "--url", "re"]);
        assert!(
            has(&offered, "redis://") && has(&offered, "redis-sentinel://"),
            "bash {sub}: {offered:?}"
        );
        let offered = bash_completions(&["dlock", sub, "-u", ""]);
        assert!(
            has(&offered, "etcd://") && !has(&offered, "Cargo.toml"),
            "bash {sub}: {offered:?}"
        );
    }
    for shell in ["zsh", "fish"] {
        let offered = shell_completions(shell, "dlock run --url ");
        assert!(
            has(&offered, "etcd://")
                && has(&offered, "postgres://")
                && !has(&offered, "Cargo.toml"),
            "{shell}: {offered:?}"
        );
    }
}

/// What `shell` (zsh or fish, run for real) offers for the command line `line`, with dlock's
/// completion script loaded from completions/.
fn shell_completions(shell: &str, line: &str) -> Vec<String> {
    let dir = repo().join("completions");
    let mut command = Command::new("timeout");
    command.arg("30");
    match shell {
        "zsh" => command
            .args(["zsh", "-f"])
            .arg(repo().join("tests/zsh_complete.zsh"))
            .arg(&dir)
            .arg(line),
        _ => command.args(["fish", "--no-config", "-c"]).arg(format!(
            "source '{}'; complete -C '{line}'",
            dir.join("dlock.fish").display()
        )),
    };
    let out = command
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("run {shell}: {e} (Debian package {shell})"));
    assert!(
        out.status.success(),
        "{shell} failed ({:?}): {} (is the Debian package {shell} installed?)",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // fish prints "candidate<TAB>description".
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect()
}

/// The same promises as for bash, in zsh and fish themselves: `dlock <TAB>` offers `run` and
/// no `generate`; `dlock run` offers dlock's options before NAME and none after it.
#[test]
fn zsh_and_fish_completions_hide_generate_and_stop_options_at_the_command() {
    for shell in ["zsh", "fish"] {
        let has = |words: &[String], w: &str| words.iter().any(|x| x == w);
        let top = shell_completions(shell, "dlock ");
        assert!(
            has(&top, "run") && has(&top, "status") && !has(&top, "generate"),
            "{shell}: {top:?}"
        );
        let options = shell_completions(shell, "dlock run --");
        assert!(
            has(&options, "--ttl") && has(&options, "--min-hold"),
            "{shell}: {options:?}"
        );
        let after_name = shell_completions(shell, "dlock run --wait 5s job --");
        assert!(!has(&after_name, "--ttl"), "{shell}: {after_name:?}");
        let args = shell_completions(shell, "dlock run job echo --");
        assert!(
            !has(&args, "--ttl") && !has(&args, "--wait"),
            "{shell}: {args:?}"
        );
    }
}

/// The guide's `status` sample is what `status` prints: the same fields, in the same order.
#[test]
fn guide_status_sample_is_real_output() {
    let text = read("docs/guide.md");
    let marker = "`dlock status busy-demo` prints:";
    let at = text
        .find(marker)
        .expect("the status sample in docs/guide.md")
        + marker.len();
    let sample: Vec<String> = text[at..]
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a text block after the marker")
        .lines()
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_owned()))
        .collect();
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut cmd = without_dlock_env(Command::new(dlock_binary()));
    let out = cmd
        .args([
            "run",
            "busy-demo",
            "--",
            dlock_binary().to_str().expect("utf-8"),
        ])
        .args(["status", "busy-demo"])
        .env("XDG_RUNTIME_DIR", scratch.path())
        .env("DLOCK_DIR", scratch.path().join("dlock"))
        .stdin(Stdio::null())
        .output()
        .expect("run dlock");
    let real: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_owned()))
        .collect();
    assert_eq!(
        sample, real,
        "docs/guide.md's status sample differs from the real output"
    );
}
