//! The prose of the man pages: what clap's definition does not say (descriptions, exit
//! statuses of the other commands, environment, files, examples) and `dlock.toml(5)` (in
//! `config_file`).
//! Plain text: paragraphs separated by blank lines, `code` in backquotes (see
//! `prose_to_roff`). What a page says of each backend comes from the registry
//! (`crate::backend`: the kinds' own words), not from lists here.

use crate::text::put;

mod config_file;
mod hold;

pub use self::config_file::config_file;
#[cfg(test)]
pub use self::config_file::{CONFIG_EXAMPLE, CONFIG_KEYS};

/// The sections of one command's page that are written here.
pub struct Command {
    /// The NAME line's text after the dash.
    pub summary: &'static str,
    pub description: &'static str,
    /// What comes before the exit-status table.
    pub exit_intro: &'static str,
    /// The exit-status table; empty means `dlock run`'s ([`crate::exit::TABLE`]).
    pub exit: Vec<(&'static str, &'static str)>,
    /// Variables besides the options' own (`DLOCK_WAIT` for `--wait` is added from clap).
    pub environment: Vec<(&'static str, &'static str)>,
    pub files: Vec<(&'static str, &'static str)>,
    pub examples: Vec<(&'static str, &'static str)>,
}

const DLOCK_CONFIG: (&str, &str) = (
    "DLOCK_CONFIG",
    "The config file to read instead of the default ones (the same as --config); it must exist.",
);
const DLOCK_DIR: (&str, &str) = (
    "DLOCK_DIR",
    "The file backend's default lock directory (an absolute path). Set it for every run of a \
     job or for none: runs that use different directories do not exclude each other.",
);
const DLOCK_PASSWORD: (&str, &str) = ("DLOCK_PASSWORD", const_text!(render_password));

const fn render_password(out: &mut [u8]) -> usize {
    let at = put(out, 0, "The server's password when the URL has none (");
    let at = put(out, at, crate::backend::PASSWORD_TITLES);
    put(
        out,
        at,
        "). dlock removes it from the command's environment.",
    )
}
const DLOCK_LOG: (&str, &str) = (
    "DLOCK_LOG",
    "A tracing filter for dlock's messages on stderr (dlock=debug); it overrides -v and -q. \
     dlock::handoff=debug prints time-stamped hand-off events.",
);
const XDG_CONFIG_HOME: (&str, &str) = (
    "XDG_CONFIG_HOME",
    "Where the per-user config file is looked for (~/.config when unset).",
);

const CONFIG_FILES: (&str, &str) = (
    "$XDG_CONFIG_HOME/dlock/config.toml, /etc/dlock/config.toml",
    "The config file: the first of these that exists, unless --config or DLOCK_CONFIG names \
     one. See dlock.toml(5).",
);
const LOCK_DIRECTORY: (&str, &str) = (
    "$DLOCK_DIR, /run/dlock, /run/lock/dlock-UID, /tmp/dlock-UID",
    "The file backend's default lock directory: $DLOCK_DIR when set; for root /run/dlock \
     (/var/lib/dlock where /run is not root's alone); for other users /run/lock/dlock-UID \
     where /run/lock is root's with mode 1777, else /tmp/dlock-UID. It is the same from cron \
     and from a login shell, and created with mode 0700. One that another user made first is \
     refused (exit 73, naming them): have root remove it, or set DLOCK_DIR for every run. The \
     host-local queues of the remote backends live there too.",
);
const LOCK_FILES: (&str, &str) = (
    "DIR/NAME.lock",
    "A lock of the file backend. Every byte of the name outside [A-Za-z0-9._-] is written as \
     %XX (a/b is a%2Fb.lock); slot i > 0 of --limit is NAME#i.lock; a --prefix P other than \
     dlock is the sub-directory P.d. The file holds the fencing counter and the last holder's \
     metadata. dlock never deletes a lock file; do not delete one that is in use. A --shared \
     hold keeps its metadata in NAME.PID.reader (removed on release); NAME.turnstile queues \
     shared runs behind a waiting exclusive one.",
);
const PROC_LOCKS: (&str, &str) = (
    "/proc/locks",
    "Where status and list see the file backend's holders and waiters.",
);

const STATUS_EXIT: &[(&str, &str)] = &[
    ("64", "usage error: bad option, name or URL"),
    (
        "69",
        "the backend cannot be reached or does not answer, or speaks another protocol",
    ),
    (
        "73",
        "the lock directory or a lock file is refused (owner, mode, type)",
    ),
    ("77", "the server refused the password or the permission"),
    (
        "78",
        "configuration error: bad config file, TLS set-up, a replica, standby or pooler refused",
    ),
];

/// A command's own statuses, then the errors every command shares (where the command has no
/// meaning of its own for the status), in numeric order.
fn with_errors(own: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut rows: Vec<(&str, &str)> = own.to_vec();
    rows.extend(
        STATUS_EXIT
            .iter()
            .filter(|(code, _)| !own.iter().any(|(c, _)| c == code)),
    );
    rows.sort_by_key(|(code, _)| code.parse::<u16>().unwrap_or(u16::MAX));
    rows
}

/// The written sections of the page `name` (`dlock`, `dlock-run`, …).
pub fn command(name: &str) -> Command {
    match name {
        "dlock" => dlock_page(),
        "dlock-run" => run_page(),
        "dlock-status" => status_page(),
        "dlock-list" => list_page(),
        "dlock-hold" => hold::hold_page(),
        "dlock-release" => hold::release_page(),
        "dlock-check" => check_page(),
        _ => Command {
            summary: "",
            description: "",
            exit_intro: "",
            exit: Vec::new(),
            environment: Vec::new(),
            files: Vec::new(),
            examples: Vec::new(),
        },
    }
}

/// The variables every page lists.
fn common_environment() -> Vec<(&'static str, &'static str)> {
    let mut variables = vec![DLOCK_DIR, DLOCK_PASSWORD];
    variables.extend(crate::backend::environment());
    variables.extend([DLOCK_LOG, XDG_CONFIG_HOME]);
    variables
}

/// The files every page lists.
fn common_files() -> Vec<(&'static str, &'static str)> {
    vec![CONFIG_FILES, LOCK_DIRECTORY, LOCK_FILES, PROC_LOCKS]
}

/// The variables of a subcommand's page: `DLOCK_CONFIG`, then the common ones.
fn subcommand_environment() -> Vec<(&'static str, &'static str)> {
    [vec![DLOCK_CONFIG], common_environment()].concat()
}

/// `dlock(1)`: the overview, with the exit statuses of every subcommand.
fn dlock_page() -> Command {
    Command {
        summary: "run a command while holding a named lock",
        description: DLOCK,
        exit_intro: "`dlock run` exits with the command's status, or with one of these \
                     when it could not run the command or had to stop it. `dlock status` \
                     exits 0 when the lock is held and 1 when it is free; `dlock release` \
                     exits 1 when there was nothing to release. Every status dlock causes \
                     itself comes with one `dlock: …` line on stderr.",
        exit: Vec::new(),
        environment: common_environment(),
        files: common_files(),
        examples: [RUN_EXAMPLES, STATUS_EXAMPLES, LIST_EXAMPLES].concat(),
    }
}

/// `dlock-run(1)`.
fn run_page() -> Command {
    Command {
        summary: "acquire a named lock, run a command while holding it, release it",
        description: RUN,
        exit_intro: "Every status dlock causes itself comes with one `dlock: …` line on \
                     stderr. `-E` changes 75.",
        exit: Vec::new(),
        environment: [subcommand_environment(), run_environment()].concat(),
        files: common_files(),
        examples: RUN_EXAMPLES.to_vec(),
    }
}

/// The variables only `dlock run` reads or sets for its command.
fn run_environment() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "CI",
            "When set (and not false or 0) and stderr is not a terminal, a run \
             that waits prints whole lines: at once, then every 30 seconds.",
        ),
        (
            "SHELL",
            "The shell that runs -c SHELL-COMMAND (else /bin/sh).",
        ),
        (
            "DLOCK_NAME, DLOCK_BACKEND (set for the command)",
            "The lock's name and the backend's URL scheme.",
        ),
        (
            "DLOCK_MODE (set for the command)",
            "shared when the command holds the lock shared, exclusive otherwise. A \
             description, not a setting: a nested dlock run is exclusive unless it \
             says --shared.",
        ),
        (
            "DLOCK_FENCING_TOKEN (set for the command)",
            "A decimal number that strictly increases with every acquisition of \
             the name on the backend: pass it to the resource the lock protects.",
        ),
        (
            "DLOCK_FENCING_TOKENS (set for the command)",
            "A line TOKEN NAME for each name held (NAME, then each --also name), for \
             while read -r token name.",
        ),
        (
            "DLOCK_HELD (set for the command)",
            "The locks the command's dlock ancestors hold; a nested dlock run of \
             one of them runs its command at once. Opaque.",
        ),
        (
            "DLOCK_CREDENTIALS_FD (set for the command)",
            "A descriptor from which a nested dlock reads the credentials that \
             were removed from the environment.",
        ),
    ]
}

/// `dlock-status(1)`.
fn status_page() -> Command {
    Command {
        summary: "show who holds a named lock",
        description: STATUS,
        exit_intro: "",
        exit: with_errors(&[("0", "the lock is held"), ("1", "the lock is free")]),
        environment: subcommand_environment(),
        files: common_files(),
        examples: STATUS_EXAMPLES.to_vec(),
    }
}

/// `dlock-list(1)`.
fn list_page() -> Command {
    Command {
        summary: "list the locks held under a namespace",
        description: LIST,
        exit_intro: "",
        exit: with_errors(&[("0", "the list was read (it may be empty)")]),
        environment: subcommand_environment(),
        files: common_files(),
        examples: LIST_EXAMPLES.to_vec(),
    }
}

/// `dlock-check(1)`.
fn check_page() -> Command {
    Command {
        summary: "check that a lock backend can be reached and used",
        description: CHECK,
        exit_intro: "",
        exit: with_errors(&[(
            "0",
            "dlock can use the backend (warnings, if any, are printed)",
        )]),
        environment: subcommand_environment(),
        files: common_files(),
        examples: vec![
            (
                "dlock check",
                "Check the default lock directory of this host.",
            ),
            (
                "dlock check --url postgres://dlock@db/locks",
                "Connect, measure the round trip, create and delete a test entry, print \
                 the server version and what its settings mean for locks.",
            ),
        ],
    }
}

const DLOCK: &str = "\
dlock runs a command while holding a named lock, so that cron jobs, deploy scripts, CI steps and
shell scripts never run the same critical section twice at once. `dlock run NAME -- COMMAND`
acquires the lock NAME, runs COMMAND as its child with the lock held, keeps the lock's lease
alive while it runs, releases the lock when COMMAND exits and exits with COMMAND's status.
Signals sent to dlock are passed on to the command; if the lock is lost, the command is stopped.
`eval \"$(dlock hold NAME)\"` holds NAME for the calling shell instead, until it ends or runs
`dlock release NAME` (dlock-hold(1)).

Without `--url` the lock is a flock(2) lock on a file of this host, as with flock(1): no server
is needed, and the kernel frees the lock when dlock dies. With `--url` the lock lives on a
server that several hosts share; dlock-run(1) lists the URL forms under `--url`.

Every command takes its settings from its options, then the `DLOCK_*` environment, then the
config file (dlock.toml(5)), then the defaults.";

const RUN: &str = "\
`dlock run` acquires the lock NAME on the backend that `--url` names (a lock file on this host
by default), runs COMMAND with its arguments, or SHELL-COMMAND with `-c`, while holding it, and
releases it when the command exits. It exits with the command's status. A second `dlock run` of
the same NAME waits until the first has released the lock: for ever, or for `--wait`; with
`--no-wait` it gives up at once and exits 75 (or the status `-E` gives).

dlock checks everything (options, name, URL, config file, that the command exists and can be
executed) before it touches a lock.";

const STATUS: &str = "\
`dlock status NAME` prints the lock's state: its holders (pid, host, user, the command line they
recorded), since when they hold it (the grant, not when they started waiting), the fencing
token, the lease (its length, and what is left of it where the server tells) and the number of
waiters; several holders (`--shared`, `--limit N`) read one line each. Then each process of
this host that waits for it, the longest-waiting first: its pid, user and command, since when
it waits, and where (for the lock file, in this host's queue, or at the server). `--json`
prints the same as JSON (the waiters of this host as `waiting_here`). It changes nothing: on
the file backend a lock directory that does not exist is reported, not created.

Without `--url` or `DLOCK_DIR` the file backend's directory is each user's own, and `status`
says whose (`free (locks of uid 1000 in /run/lock/dlock-1000)`; `location` in JSON): another
user's locks are not in it. Users who share a lock use a directory root prepared for them (the
file backend's page: locks shared between users).

With `-q` it prints nothing, and its exit status answers: 0 held, 1 free.";

const LIST: &str = const_text!(render_list);

const fn render_list(out: &mut [u8]) -> usize {
    let at = put(out, 0, LIST_FIRST);
    put(out, at, crate::backend::LIST_NOTES)
}

const LIST_FIRST: &str = "\
`dlock list` prints every lock held under the namespace (`--prefix`), a line for each holder:
the name, pid, host, user, how long it has held the lock, the number of waiters, the mode, the
fencing token and the command; `no locks are held` when there are none. `--json` prints the
same as JSON. It changes nothing.";

const CHECK: &str = const_text!(render_check);

const fn render_check(out: &mut [u8]) -> usize {
    let at = put(
        out,
        0,
        "`dlock check` connects to the backend, measures the round trip, reads the server's \
         version and the settings that matter to a lock (",
    );
    let at = put(out, at, crate::backend::CHECK_WARNS);
    put(out, at, CHECK_REST)
}

const CHECK_REST: &str = "), \
and creates and deletes a test entry under the prefix. On the file backend it checks
the lock directory (owner, mode, a network file system) and says whether the first `dlock run`
can create it. It prints what it found, one value to a line in one column (times as `5.7 ms`),
or JSON with `--json` (`round_trip_ms` a number, `facts` an object of what it found,
`settings` the effective URL, prefix and `ttl_ms`, beside the older `round_trip_us` and
`details` pairs). Warnings do not change the exit status.";

const RUN_EXAMPLES: &[(&str, &str)] = &[
    (
        "dlock run deploy-prod -- ./deploy.sh --env prod",
        "Run the deploy while holding the lock deploy-prod (a file lock in the default \
         directory); a second deploy waits.",
    ),
    (
        "dlock run -n -q -E 0 mirror -- /usr/local/bin/sync-mirror",
        "A crontab line: skip the run, quietly and with status 0, while the previous one still \
         runs.",
    ),
    (
        "dlock run -u redis://locks -n -q --min-hold 60s -E 0 nightly -- ./nightly.sh",
        "The same crontab line on several hosts: the first host runs the job, the others find \
         the lock held and exit 0. --min-hold keeps the lock for 60 s even when the job ends \
         sooner, so a host whose clock is behind does not run it again.",
    ),
    (
        "dlock run --url redis://locks.internal --wait 5m report -c 'make report'",
        "Take the lock on a Redis server, wait at most five minutes for it, run a shell command.",
    ),
    (
        "[ \"${DLOCK_NAME-}\" = job ] || exec dlock run job -- \"$0\" \"$@\"",
        "The first line of a script that locks itself: run again under the lock, unless it \
         already runs under it.",
    ),
];

const STATUS_EXAMPLES: &[(&str, &str)] = &[
    (
        "dlock status deploy-prod",
        "Who holds deploy-prod, since when, its fencing token and waiters.",
    ),
    (
        "dlock status -q deploy-prod && echo held",
        "Exit 0 when held, 1 when free: for scripts.",
    ),
];

const LIST_EXAMPLES: &[(&str, &str)] = &[
    (
        "dlock list",
        "Every held lock under the namespace, one line each.",
    ),
    ("dlock list --json", "The same as JSON."),
];
