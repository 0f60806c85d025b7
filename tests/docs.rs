//! The documentation stays true to the binary.
//!
//! - Every ```` ```sh ```` block of README.md runs successfully against the built `dlock`, in a
//!   scratch directory, with no lock, config file or `DLOCK_*` variable of the machine it runs
//!   on. (Blocks tagged `text` or `bash` are not run: set-up commands, crontab lines, output.)
//! - The README's exit-status table lists exactly the statuses `dlock run --help` lists; the
//!   help renders them from `exit::TABLE`.
//! - The committed `man/` and `completions/` are what `dlock generate` writes today.
//! - `dlock run --help` documents the exit statuses and the signal policy.

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

fn readme() -> String {
    let path = repo().join("README.md");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
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
fn fenced_blocks(markdown: &str) -> Vec<Block> {
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
    assert!(open.is_none(), "README.md: a code fence is never closed");
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

#[test]
fn readme_examples_run() {
    let blocks: Vec<Block> = fenced_blocks(&readme())
        .into_iter()
        .filter(|b| b.lang == "sh")
        .collect();
    assert!(
        !blocks.is_empty(),
        "README.md has no ```sh examples; is the parser broken?"
    );
    let mut failures = Vec::new();
    for block in &blocks {
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
            "README.md line {}: the ```sh block {outcome}\n--- block ---\n{}--- stdout ---\n{}--- stderr ---\n{}",
            block.line, block.code, run.stdout, run.stderr
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} README examples failed:\n\n{}",
        failures.len(),
        blocks.len(),
        failures.join("\n")
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

// ---------------------------------------------------------------------------------------------
// Help text

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
    let script = repo().join("completions/dlock.bash");
    // Complete the last of `words` as bash would (COMP_WORDS, COMP_CWORD, `_dlock cmd cur prev`).
    let complete = |words: &[&str]| -> Vec<String> {
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
    };
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

/// The README's `status` sample is what `status` prints: the same fields, in the same order.
#[test]
fn readme_status_sample_is_real_output() {
    let text = readme();
    let marker = "`dlock status busy-demo` prints:";
    let at = text.find(marker).expect("the status sample in README.md") + marker.len();
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
        "README's status sample differs from the real output"
    );
}
