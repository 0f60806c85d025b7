//! What the builds promise (README "Install"): `dlock --version` names the version, the commit
//! and the backends; the default build is portable (nothing pins a target); the README's
//! install lines name the files `.ci/package` writes. `.ci/package --check`, run by `.ci/run`,
//! builds the static binary and the Debian package and installs, uses and removes the package.

use std::path::Path;
use std::process::Command;

use crate::support::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn dlock_stdout(args: &[&str]) -> String {
    let output = Command::new(DLOCK).args(args).output().expect("dlock runs");
    assert!(output.status.success(), "dlock {args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The commit the test binary's dlock was built from: what `build.rs` reads.
fn expected_commit() -> String {
    if let Some(commit) = std::env::var("DLOCK_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return commit;
    }
    Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

#[test]
fn version_names_the_version_the_commit_and_the_backends() {
    let text = dlock_stdout(&["--version"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], format!("dlock {}", env!("CARGO_PKG_VERSION")));
    assert_eq!(lines[1], format!("commit: {}", expected_commit()));
    let backends = lines[2]
        .strip_prefix("backends: ")
        .expect("a backends line");
    for scheme in [
        "file",
        "redis",
        "rediss",
        "redis+unix",
        "etcd",
        "etcds",
        "zk",
        "postgres",
        "postgresql",
    ] {
        assert!(
            backends
                .split([',', '(', ')', ' '])
                .any(|word| word == scheme),
            "{scheme} is missing from '{backends}'"
        );
    }

    // `-V` stays one line, the version alone (scripts that parse it keep working).
    assert_eq!(
        dlock_stdout(&["-V"]),
        format!("dlock {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// `cargo install --path .` works on any architecture: no config pins the build to a target,
/// and no rustflags for a target apply to a plain build (a static flag there would also reach
/// proc-macros, which cannot be static).
#[test]
fn the_default_build_pins_no_target() {
    let path = repo().join(".cargo/config.toml");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return; // no config at all: nothing pins anything
    };
    let config: toml::Table = toml::from_str(&text).expect(".cargo/config.toml is TOML");
    let build = config.get("build").and_then(|b| b.as_table());
    assert!(
        build.is_none_or(|b| !b.contains_key("target") && !b.contains_key("rustflags")),
        ".cargo/config.toml pins the build: {build:?}"
    );
    let targets = config.get("target").and_then(|t| t.as_table());
    assert!(
        targets.is_none_or(|t| t.values().all(|v| v.get("rustflags").is_none())),
        ".cargo/config.toml sets rustflags for a target: {targets:?}"
    );
}

#[test]
fn the_readme_install_lines_name_what_the_package_script_writes() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let script = std::fs::read_to_string(repo().join(".ci/package")).expect(".ci/package");
    let install = readme
        .split("\n## Install\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README has an Install section");
    for (readme_says, script_writes) in [
        (
            "target/debian/dlock_",
            "target/debian/dlock_VERSION_ARCH.deb",
        ),
        (
            "target/dist/dlock-",
            "target/dist/dlock-VERSION-TRIPLE.sha256",
        ),
        ("bash .ci/package", "bash .ci/package"),
        ("cargo install --locked --path .", ""),
    ] {
        assert!(
            install.contains(readme_says),
            "README Install lacks {readme_says}"
        );
        assert!(
            script.contains(script_writes),
            ".ci/package lacks {script_writes}"
        );
    }
}
