//! `dlock generate man|completions DIR`: the man pages and completion scripts, generated from
//! the clap definition so they cannot drift from `--help`. The committed copies in `man/` and
//! `completions/` are checked against fresh output by a test.

use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::{Cli, Generate};

pub fn run(what: Generate) -> anyhow::Result<()> {
    match what {
        Generate::Man { dir } => man_pages(&dir),
        Generate::Completions { dir } => completions(&dir),
    }
}

/// `dlock.1` plus `dlock-<subcommand>.1` for every visible subcommand.
pub fn man_pages(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The plain version: the long one names the commit, and the pages would go stale with it.
    let command = Cli::command().long_version(None);
    write_man(dir, "dlock", command.clone())?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("dlock-{}", sub.get_name());
        let sub = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("dlock {}", sub.get_name()));
        write_man(dir, &name, sub)?;
    }
    Ok(())
}

fn write_man(dir: &Path, name: &str, command: clap::Command) -> anyhow::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .date("")
        .render(&mut page)
        .with_context(|| format!("cannot render the man page {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))
}

/// `dlock.bash`, `_dlock` (zsh) and `dlock.fish`.
pub fn completions(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (shell, file) in [
        (Shell::Bash, "dlock.bash"),
        (Shell::Zsh, "_dlock"),
        (Shell::Fish, "dlock.fish"),
    ] {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "dlock", &mut script);
        let path = dir.join(file);
        std::fs::write(&path, script)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
