//! `dlock.toml(5)`: the config file's page, with every top-level key, every backend table's
//! keys and an example that the tests parse.

use super::CONFIG_FILES;
use crate::generate::{definitions, prose_to_roff, roff};

/// `dlock.toml(5)`, after its title: every key of the config file and every backend table.
pub fn config_file() -> String {
    let tables = crate::backend::config_tables()
        .map(|t| format!("[{t}]"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut page = String::from(".SH NAME\ndlock.toml \\- configuration file of dlock\n");
    page.push_str(
        ".SH SYNOPSIS\n\\fI$XDG_CONFIG_HOME/dlock/config.toml\\fR\n.br\n\\fI/etc/dlock/config.toml\\fR\n",
    );
    page.push_str(".SH DESCRIPTION\n");
    page.push_str(&prose_to_roff(CONFIG_DESCRIPTION));
    page.push_str(".SH KEYS\n");
    page.push_str(&prose_to_roff(
        "Every key is optional and sets the default of the `dlock run` option of the same \
         name. `url`, `prefix`, `ttl` and the secrets apply to the other commands too.",
    ));
    page.push_str(&definitions(CONFIG_KEYS));
    page.push_str(".SH \"BACKEND TABLES\"\n");
    page.push_str(&prose_to_roff(&format!(
        "Secrets and TLS material of one backend go in its table: {tables}. A table may hold \
         these keys; a backend uses the table's `password_file` before the top-level one."
    )));
    page.push_str(&definitions(TABLE_KEYS));
    page.push_str(&prose_to_roff(&crate::backend::config_notes()));
    page.push_str(".SH EXAMPLES\n.EX\n");
    page.push_str(&roff(CONFIG_EXAMPLE));
    page.push_str("\n.EE\n");
    page.push_str(".SH FILES\n");
    page.push_str(&definitions(&[CONFIG_FILES]));
    page
}

const CONFIG_DESCRIPTION: &str = "\
dlock reads one config file, in TOML: the file that `--config` or `DLOCK_CONFIG` names (it must
exist), else the first of `$XDG_CONFIG_HOME/dlock/config.toml` (`~/.config/dlock/config.toml`
when XDG_CONFIG_HOME is unset) and `/etc/dlock/config.toml` that exists. Files are not merged.

Options beat the `DLOCK_*` environment, which beats the config file, which beats the defaults.

An unknown key, a value of the wrong type and an unreadable file are configuration errors (exit
78), and so is a bad value, which the message names as `config file: KEY`. The config file,
password files and TLS files must be regular files of at most 1 MiB (64 KiB for a password
file); a password file must not be readable by group or others.";

/// Every top-level key: name, then what it sets.
pub const CONFIG_KEYS: &[(&str, &str)] = &[
    (
        "url = \"URL\"",
        "The backend (--url); one URL. Default: the file backend in the default lock directory.",
    ),
    (
        "wait = \"DUR\"",
        "Give up after waiting this long (--wait), e.g. \"30s\", \"5m\"; \"0\" is no_wait. \
         Every duration may also be a number of seconds, quoted or not: wait = 30, ttl = 2.5.",
    ),
    (
        "no_wait = true",
        "Give up at once when the lock is held (--no-wait). Not with wait: a file with both \
         is refused.",
    ),
    (
        "conflict_exit_code = N",
        "Exit status when the lock was not acquired (-E), 0 to 255. Default 75.",
    ),
    ("ttl = \"DUR\"", "Lease length (--ttl). Default \"15s\"."),
    (
        "limit = N",
        "Holders at once (--limit), 1 to 1024. Default 1.",
    ),
    (
        "shared = true",
        "Hold locks shared (--shared): many shared holders at once, or one exclusive holder. \
         Default false; refused by backends without shared locks and with a limit above 1.",
    ),
    (
        "on_lost = \"term\"",
        "What to do when the lock is lost (--on-lost): \"term\", \"kill\" or \"ignore\".",
    ),
    (
        "kill_after = \"DUR\"",
        "Grace between SIGTERM and SIGKILL (--kill-after). Default \"10s\".",
    ),
    (
        "min_hold = \"DUR\"",
        "Keep the lock at least this long after acquiring it (--min-hold).",
    ),
    (
        "prefix = \"P\"",
        "Namespace for keys and paths (--prefix). Default \"dlock\".",
    ),
    (
        "local_queue = true",
        "Wait in a queue on this host first (--local-queue); false sends every waiter to the \
         server itself.",
    ),
    (
        "record_command = true",
        "Record the command line in the lock's metadata (--record-command).",
    ),
    (
        "report = \"PATH\"",
        "Append one JSON line per run to PATH (--report).",
    ),
    (
        "password_file = \"PATH\"",
        "The servers' password, when neither the URL nor DLOCK_PASSWORD gives one.",
    ),
];

/// The keys of a backend's table.
pub const TABLE_KEYS: &[(&str, &str)] = &[
    (
        "password_file = \"PATH\"",
        "The password for this backend's servers.",
    ),
    (
        "ca_file = \"PATH\"",
        "The CA certificates (PEM) that the servers' certificates must chain to.",
    ),
    (
        "cert_file = \"PATH\"",
        "A client certificate (PEM), for servers that ask for one.",
    ),
    ("key_file = \"PATH\"", "The client certificate's key (PEM)."),
];

pub const CONFIG_EXAMPLE: &str = "\
# /etc/dlock/config.toml: every host's jobs lock on one Redis
url = \"rediss://dlock@locks.internal:6380\"
wait = \"10m\"
ttl = \"30s\"
report = \"/var/log/dlock/runs.jsonl\"

[redis]
password_file = \"/etc/dlock/redis-password\"
ca_file = \"/etc/dlock/ca.pem\"";
