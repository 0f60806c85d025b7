//! The fast reader against clap: the same answer wherever it gives one, and an answer for the
//! lines people write.

use std::ffi::OsString;

use super::*;

fn words(line: &[&str]) -> Vec<OsString> {
    line.iter().map(OsString::from).collect()
}

/// The fast reader answers `line`, with this process's environment, as clap does.
fn read_as_clap_reads(line: &[&str]) {
    let args = words(line);
    let fast = parse_run(&args, |var| std::env::var_os(var));
    let fast = fast.unwrap_or_else(|| panic!("{line:?} was left to clap"));
    let clap = crate::cli::parse_with_clap(args).map_err(|e| e.to_string());
    assert_eq!(
        Ok(format!("{fast:?}")),
        clap.map(|c| format!("{c:?}")),
        "{line:?}"
    );
}

/// The lines the fast reader must answer (and answer as clap does), read with this process's
/// environment.
const EVERYDAY: &[&[&str]] = &[
    &["dlock", "run", "x", "--", "true"],
    &["dlock", "run", "x", "true"],
    &[
        "dlock",
        "run",
        "-n",
        "nightly",
        "--",
        "./backup.sh",
        "--ttl",
        "5",
    ],
    &[
        "dlock", "run", "-n", "-E", "0", "-q", "nightly", "--", "./job",
    ],
    &["dlock", "run", "-nqE0", "nightly", "./job"],
    &[
        "dlock",
        "run",
        "-w",
        "5m",
        "-u",
        "redis://locks:6379",
        "deploy",
        "--",
        "./d.sh",
    ],
    &[
        "dlock",
        "run",
        "--wait=5m",
        "--url",
        "file:///tmp/l",
        "deploy",
        "./d.sh",
        "-w",
        "1",
    ],
    &["dlock", "run", "-w", "-1s", "x", "true"],
    &["dlock", "run", "-u", "a", "--url=b", "x", "true"],
    &["dlock", "run", "x", "-c", "echo hi"],
    &["dlock", "run", "x", "-cecho", "--", "a"],
    &["dlock", "run", "x", "--command=make", "--", "-x"],
    &["dlock", "run", "-c", "true", "x"],
    &["dlock", "run", "--", "-x", "a", "--", "b"],
    &["dlock", "run", "-", "a"],
    &["dlock", "run", "x"],
    &["dlock", "run", "-vv", "-v", "--quiet", "x", "a"],
    &[
        "dlock", "run", "--shared", "-x", "--limit", "3", "-t", "20s", "x", "a",
    ],
    &[
        "dlock",
        "run",
        "--on-lost",
        "ignore",
        "--kill-after",
        "3s",
        "x",
        "a",
    ],
    &[
        "dlock",
        "run",
        "--local-queue",
        "OFF",
        "--record-command=yes",
        "x",
        "a",
    ],
    &[
        "dlock",
        "run",
        "--min-hold",
        "1m",
        "--report",
        "-",
        "--prefix",
        "p",
        "x",
        "a",
    ],
    &["dlock", "run", "--config", "/etc/d.toml", "x", "a"],
    &[
        "dlock",
        "run",
        "--also",
        "cache",
        "-n",
        "--also=a b",
        "db",
        "--",
        "./migrate.sh",
        "--also",
        "x",
    ],
];

#[test]
fn the_everyday_lines_are_read_as_clap_reads_them() {
    for line in EVERYDAY {
        read_as_clap_reads(line);
    }
}

/// Lines the fast reader leaves to clap, which helps, errs or reads them its own way.
#[test]
fn what_it_is_not_sure_of_is_left_to_clap() {
    let env = |_: &str| None;
    for line in [
        &["dlock", "run", "-h"][..],
        &["dlock", "run", "--help"],
        &["dlock", "run", "-V", "x", "a"],
        &["dlock", "-v", "run", "x", "a"],
        &["dlock", "status", "x"],
        &["dlock", "rn", "x", "a"],
        &["dlock"],
        &["dlock", "run"],
        &["dlock", "run", "--wait", "1s"],
        &["dlock", "run", "--wiat", "1s", "x", "a"],
        &["dlock", "run", "-w", "1s", "-w", "2s", "x", "a"],
        &["dlock", "run", "-n", "-n", "x", "a"],
        &["dlock", "run", "-nn", "x", "a"],
        &["dlock", "run", "--no-wait=1", "x", "a"],
        &["dlock", "run", "--wait", "", "x", "a"],
        &["dlock", "run", "--wait", "--", "x", "a"],
        &["dlock", "run", "-w=1s", "x", "a"],
        &["dlock", "run", "-nw", "x"],
        &["dlock", "run", "--on-lost", "TERM", "x", "a"],
        &["dlock", "run", "--local-queue", "maybe", "x", "a"],
        &["dlock", "run", "-c", "a", "x", "-c", "b"],
        &["dlock", "run", "x", "-c"],
        &["dlock", "run", ""],
        &["dlock", "run", "--", ""],
        &["dlock", "run", "--also", "", "x", "a"],
        &["dlock", "run", "--also", "x"],
    ] {
        assert!(
            parse_run(&words(line), env).is_none(),
            "{line:?} was not left to clap"
        );
    }
}

/// The variables' values and `from_env`, in clap's order of arguments.
#[test]
fn the_variables_fill_what_the_line_leaves_out() {
    let env = |var: &str| {
        let value = match var {
            "DLOCK_URL" => "redis://r",
            "DLOCK_WAIT" => "5s",
            "DLOCK_NO_WAIT" => "Yes",
            "DLOCK_ON_LOST" => "kill",
            "DLOCK_CONFIG" => "/c.toml",
            "DLOCK_TTL" => "9s",
            _ => return None,
        };
        Some(OsString::from(value))
    };
    let args = words(&["dlock", "run", "--ttl", "3s", "x", "a"]);
    let Some(Cli {
        global,
        command: Command::Run(run),
    }) = parse_run(&args, env)
    else {
        panic!("left to clap");
    };
    assert_eq!(run.backend.url, ["redis://r"]);
    assert_eq!(run.wait.as_deref(), Some("5s"));
    assert!(run.no_wait);
    assert_eq!(run.on_lost, Some(OnLost::Kill));
    assert_eq!(run.ttl.as_deref(), Some("3s"), "the line wins");
    assert_eq!(global.config, Some(PathBuf::from("/c.toml")));
    assert_eq!(
        run.backend.from_env,
        ["url", "wait", "no_wait", "on_lost", "config"]
    );
    // A value clap checks its own way is left to it.
    for (var, value) in [
        ("DLOCK_NO_WAIT", "maybe"),
        ("DLOCK_WAIT", ""),
        ("DLOCK_ON_LOST", "Kill"),
    ] {
        let env = |v: &str| (v == var).then(|| OsString::from(value));
        assert!(parse_run(&args, env).is_none(), "{var}={value:?}");
    }
}

/// In a child process of this test binary, with `DLOCK_*` variables set: the fast reader
/// and clap agree on what the environment gives (clap reads the real environment only, and
/// setting it here would reach the tests running beside this one).
#[test]
fn the_variables_are_read_as_clap_reads_them() {
    let Ok(me) = std::env::current_exe() else {
        panic!("no path to this test binary");
    };
    let cases: &[&[(&str, &str)]] = &[
        &[("DLOCK_URL", "redis://r:1"), ("DLOCK_WAIT", "5s")],
        &[
            ("DLOCK_NO_WAIT", "ON"),
            ("DLOCK_SHARED", "0"),
            ("DLOCK_TTL", "4s"),
        ],
        &[
            ("DLOCK_ON_LOST", "ignore"),
            ("DLOCK_KILL_AFTER", "1s"),
            ("DLOCK_LIMIT", "2"),
        ],
        &[
            ("DLOCK_LOCAL_QUEUE", "off"),
            ("DLOCK_RECORD_COMMAND", "No"),
            ("DLOCK_MIN_HOLD", "1s"),
        ],
        &[
            ("DLOCK_REPORT", "/tmp/r.jsonl"),
            ("DLOCK_PREFIX", "p"),
            ("DLOCK_CONFIG", "/c.toml"),
        ],
        &[
            ("DLOCK_CONFLICT_EXIT_CODE", "0"),
            ("DLOCK_URL", "file:///tmp/x"),
        ],
    ];
    for vars in cases {
        let out = std::process::Command::new(&me)
            .args([
                "--exact",
                "cli::fast::tests::agree_in_this_process",
                "--ignored",
            ])
            .envs(vars.iter().copied())
            .output();
        let Ok(out) = out else {
            panic!("cannot run {me:?}");
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{vars:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
#[ignore = "run by the_variables_are_read_as_clap_reads_them, with variables set"]
fn agree_in_this_process() {
    for line in [
        &["dlock", "run", "x", "true"][..],
        &[
            "dlock",
            "run",
            "-n",
            "-u",
            "file:///l",
            "--wait",
            "1s",
            "x",
            "true",
        ],
        &[
            "dlock",
            "run",
            "--shared",
            "-t",
            "1s",
            "--on-lost",
            "term",
            "x",
            "a",
        ],
        &[
            "dlock",
            "run",
            "--config",
            "/d.toml",
            "--report=-",
            "x",
            "a",
        ],
    ] {
        read_as_clap_reads(line);
    }
}
