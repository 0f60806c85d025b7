//! Every list of backends a user reads names every backend of the registry
//! (`dlock::backend::KINDS`), and a flag a backend cannot honour is refused by its capability.

use std::path::Path;
use std::process::Command;

use dlock::backend::KINDS;

use crate::support::{
    assert_fails, output_within, stderr_of, FileServer, TestEnv, DLOCK, PATIENCE,
};

fn stdout_of(args: &[&str]) -> String {
    let out = Command::new(DLOCK)
        .args(args)
        .env_remove("DLOCK_URL")
        .output()
        .expect("run dlock");
    assert!(out.status.success(), "dlock {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A man page's text with roff's escaped hyphens and line breaks undone, so that
/// `rediss\-sentinel://` and a URL wrapped over two lines read as written.
fn man_text(page: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("man").join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fR", "")
}

/// Each scheme of each kind, with `://`, is in `text` (`where` names the list for the message).
fn names_every_scheme(text: &str, what: &str) {
    for kind in KINDS {
        for scheme in kind.schemes {
            assert!(
                text.contains(&format!("{scheme}://")),
                "{what} does not name {scheme}:// (the {} backend)",
                kind.name
            );
        }
    }
}

#[test]
fn every_list_of_backends_names_every_registered_backend() {
    names_every_scheme(&stdout_of(&["--help"]), "dlock --help");
    for sub in ["run", "status", "list", "release", "check"] {
        let help = stdout_of(&[sub, "--help"]);
        names_every_scheme(&help, &format!("dlock {sub} --help (--url)"));
        names_every_scheme(
            &man_text(&format!("dlock-{sub}.1")),
            &format!("man/dlock-{sub}.1"),
        );
    }
    names_every_scheme(&man_text("dlock.1"), "man/dlock.1");

    let version = stdout_of(&["--version"]);
    let backends = version
        .lines()
        .find_map(|line| line.strip_prefix("backends: "))
        .expect("a backends line in --version");
    for kind in KINDS {
        for scheme in kind.schemes {
            assert!(
                backends.split([',', ' ', '(', ')']).any(|w| w == *scheme),
                "--version does not list {scheme}: {backends}"
            );
        }
    }

    // What DLOCK_BACKEND may say, in `run --help` and its man page.
    let run_help = stdout_of(&["run", "--help"]);
    let run_man = man_text("dlock-run.1");
    for kind in KINDS {
        for shown in kind.shown_as {
            for (text, what) in [(&run_help, "dlock run --help"), (&run_man, "dlock-run.1")] {
                let listed = text
                    .split("DLOCK_BACKEND (")
                    .nth(1)
                    .and_then(|rest| rest.split(')').next())
                    .unwrap_or_else(|| panic!("{what} has no DLOCK_BACKEND list"));
                let listed = listed.replace('\n', " ");
                assert!(
                    listed.split([',', ' ']).any(|w| w == *shown),
                    "{what}'s DLOCK_BACKEND list lacks {shown}: {listed}"
                );
            }
        }
    }

    // The README's backend table is prose that its authors rewrite; each scheme must be there.
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    names_every_scheme(&readme, "README.md");
}

/// The Redis Cluster URL form is one of the ways `--url` reaches Redis.
#[test]
fn the_url_help_shows_the_redis_cluster_form() {
    let help = stdout_of(&["run", "--help"]).replace('\n', " ");
    assert!(help.contains("Redis Cluster"), "{help}");
}

/// ARCHITECTURE.md's table of kinds says what each kind's `kind.rs` declares: a row per
/// kind, and its lease, FIFO, `finished`, `--limit` and shared columns start with the
/// capability's yes or no.
#[test]
fn the_architecture_table_agrees_with_every_kind() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let table = text
        .split("| kind (schemes) | lease | FIFO | records `finished` | `--limit` | shared |")
        .nth(1)
        .unwrap_or_else(|| panic!("no table of kinds in {path:?}"));
    for kind in KINDS {
        let row = table
            .lines()
            .skip(1)
            .take_while(|line| line.starts_with('|'))
            .find(|line| line.starts_with(&format!("| {} (", kind.name)))
            .unwrap_or_else(|| panic!("ARCHITECTURE.md's table has no row for {}", kind.name));
        let cells: Vec<&str> = row.split(" | ").skip(1).take(5).collect();
        let caps = kind.capabilities;
        let declared = [
            caps.lease,
            caps.fifo,
            caps.records_finished,
            caps.limit,
            caps.shared,
        ];
        let columns = ["lease", "FIFO", "records finished", "--limit", "shared"];
        for ((cell, declared), column) in cells.iter().zip(declared).zip(columns) {
            let says = if declared { "yes" } else { "no" };
            assert!(
                cell.starts_with(says),
                "ARCHITECTURE.md says {cell:?} for {}'s {column}; kind.rs says {says}",
                kind.name
            );
        }
    }
}

/// Several URLs are refused before anything is contacted (64 from flags, 78 from the config
/// file), naming in its own words every kind whose one URL reaches several servers.
#[test]
fn several_urls_are_refused_naming_every_kind_whose_one_url_reaches_several_servers() {
    let file = FileServer::start();
    let env = TestEnv::new(&file);
    let config = env.path("several.toml");
    std::fs::write(
        &config,
        "url = ['redis://127.0.0.1:1', 'redis://127.0.0.1:2']\n",
    )
    .expect("write config");
    let config = config.display().to_string();
    let flags = [
        "run",
        "--url",
        "redis://127.0.0.1:1",
        "--url",
        "redis://127.0.0.1:2",
        "several",
        "touch",
        "ran",
    ];
    let in_file = ["--config", &config, "run", "several", "touch", "ran"];
    for (args, code) in [(&flags[..], 64), (&in_file[..], 78)] {
        let mut dlock = env.dlock(args);
        dlock.env_remove("DLOCK_URL");
        let out = output_within(dlock, PATIENCE);
        assert_fails(
            &out,
            code,
            "several URLs would mean a lock across independent servers",
        );
        let said = stderr_of(&out);
        let ways: Vec<&str> = KINDS
            .iter()
            .map(|kind| kind.words.one_url)
            .filter(|way| !way.is_empty())
            .collect();
        assert!(!ways.is_empty(), "no kind reaches several servers");
        for way in ways {
            assert!(said.contains(way), "{way}: {said}");
        }
        assert!(!env.path("ran").exists(), "the command ran");
    }
}
