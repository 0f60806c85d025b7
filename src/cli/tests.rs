//! The command-line definition: parsing, normalisation and clap's own consistency checks.

use super::*;

fn norm(words: &[&str]) -> Vec<String> {
    let args = words.iter().map(OsString::from).collect();
    normalize_run_args(args, &Cli::command())
        .into_iter()
        .map(|w| w.into_string().unwrap())
        .collect()
}

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn options_after_name_belong_to_the_command() {
    assert_eq!(
        norm(&["dlock", "run", "--ttl", "5s", "x", "./job.sh", "--ttl", "5"]),
        ["dlock", "run", "--ttl", "5s", "--", "x", "./job.sh", "--ttl", "5"]
    );
    assert_eq!(
        norm(&["dlock", "run", "x", "--wait", "1s"]),
        ["dlock", "run", "--", "x", "--wait", "1s"]
    );
}

#[test]
fn double_dash_is_optional() {
    assert_eq!(
        norm(&["dlock", "run", "x", "--", "a", "--", "b"]),
        ["dlock", "run", "--", "x", "a", "--", "b"]
    );
    assert_eq!(
        norm(&["dlock", "-v", "run", "-nE5", "x", "a"]),
        ["dlock", "-v", "run", "-nE5", "--", "x", "a"]
    );
    assert_eq!(
        norm(&["dlock", "run", "-w", "1s", "--", "-x", "a"]),
        ["dlock", "run", "-w", "1s", "--", "-x", "a"]
    );
}

#[test]
fn shell_command_may_follow_name() {
    assert_eq!(
        norm(&["dlock", "run", "x", "-c", "echo hi"]),
        ["dlock", "run", "--command=echo hi", "--", "x"]
    );
    assert_eq!(
        norm(&["dlock", "run", "-c", "true", "x"]),
        ["dlock", "run", "-c", "true", "--", "x"]
    );
}

#[test]
fn parses_after_normalizing() {
    let cli = parse(
        ["dlock", "run", "-t", "5s", "x", "echo", "-t"]
            .iter()
            .map(OsString::from)
            .collect(),
    )
    .unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run")
    };
    assert_eq!(run.ttl.as_deref(), Some("5s"));
    assert_eq!(run.name, "x");
    assert_eq!(run.command, ["echo", "-t"]);
}
