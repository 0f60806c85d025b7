//! Records the git commit dlock is built from, for `dlock --version` (`src/version.rs`).
//!
//! A bug report that quotes `dlock --version` then names the exact source. The commit is
//! `git rev-parse --short HEAD` of the checkout; `DLOCK_BUILD_COMMIT` overrides it (a build
//! from a source tarball, which has no git); "unknown" when neither is there. Computed here,
//! at build time, so the version text is a constant and costs nothing at start-up.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DLOCK_BUILD_COMMIT");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let commit = std::env::var("DLOCK_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&dir, &["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DLOCK_BUILD_COMMIT={}", commit.trim());

    // Build again when HEAD moves: HEAD itself (another branch checked out), the branch's ref
    // (a new commit) and packed-refs (`git gc`, `git pack-refs`). Only files that exist are
    // named: cargo treats a missing one as changed and would rebuild dlock every time.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        let args = ["rev-parse", "--path-format=absolute", "--git-path", &name];
        if let Some(path) = git(&dir, &args).filter(|p| Path::new(p).is_file()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// The trimmed output of `git ARGS` in `dir`, or `None` (no git, not a checkout, an error).
fn git(dir: &str, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_owned())
}
