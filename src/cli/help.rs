//! What `dlock -h` and `dlock --help` say beyond each option's own line: the about texts, the
//! examples and exit statuses after the options, and where `-h` is shorter than `--help`
//! (`--url`'s forms, an option hidden from `-h`). The texts that name the backends are built at
//! compile time, so a backend added to the registry shows up in every help text and man page.

use crate::text::put;
use crate::{backend, exit};

/// The examples of `dlock -h` and `dlock --help`.
pub(super) const TOP_EXAMPLES: &str = "\
Examples:
  dlock run nightly -- ./nightly.sh      run it while holding the lock 'nightly'
  dlock run -n -E 0 nightly -- ./job     skip (exit 0) while someone else holds it
  eval \"$(dlock hold deploy)\"            hold it until this shell ends (dlock release)
  dlock status nightly                   who holds it, since when
  dlock check --url redis://locks:6379   can this backend be used?

More: dlock run -h, man dlock, man dlock-run; the guide is docs/guide.md in the source
(/usr/share/doc/dlock/docs/guide.md where the Debian package is installed).";

/// The examples of `dlock run -h` and `dlock run --help`.
const RUN_EXAMPLES: &str = "\
Examples:
  dlock run nightly -- ./nightly.sh              wait for the lock, run, release
  dlock run -n -E 0 -q nightly -- ./nightly.sh   skip quietly (exit 0) while it is held
  dlock run -w 5m -u redis://locks:6379 deploy -- ./deploy.sh
  dlock run report -c 'make report && ./mail-it'";

/// What `dlock status --help` adds.
pub(super) const STATUS_AFTER_HELP: &str = "\
Shows the holder (pid, host, user, command, since its grant, token, lease), several holders
(shared, or --limit N) one line each, the number of waiters where the backend can tell, and
each process of this host that waits, the longest-waiting first: since when, and where (for
the lock file, in this host's queue, or at the server).

Without --url or DLOCK_DIR the lock directory is each user's own: `free (locks of uid 1000 in
/run/lock/dlock-1000)` says nothing of another user's locks. Users who share a lock use one
directory root prepared for them (--url file:///srv/locks; the file backend's page, \"locks
shared between users\").

Exit status: 0 when NAME is held, 1 when it is free; an error is one `dlock: …` line and the
status `dlock run --help` lists for it (64 usage, 69 unavailable, 73, 77, 78).";

/// What `dlock release --help` adds.
pub(super) const RELEASE_AFTER_HELP: &str = "\
Without --force, release ends a hold of yours (dlock hold): the one DLOCK_HELD names for NAME
in this environment, or --handle's. It never ends another's hold or run: that is --force,
which breaks the lock whoever holds it.

Exit status:
  0    the lock was released (with --force: its holders' entries are gone, each named on
       stderr)
  1    NAME was not held, or your hold of it had ended already (--max-hold, the end of the
       shell it belonged to, its keeper killed): there was nothing to release
  124  your hold had been lost before this release (the reason is on stderr)
  64   a bad name, URL or handle
  69   the backend cannot be reached
  77   refused: NAME is held, but not by a hold of yours (without --force); the server's
       permission (killing another user's session); or the file backend, where a kernel lock
       cannot be broken from outside (the holder's pid is named)";

/// `dlock hold -h`'s text after the options.
pub(super) const HOLD_AFTER_SHORT_HELP: &str = "\
Examples:
  eval \"$(dlock hold deploy)\" || exit     hold 'deploy' until this shell ends
  dlock release deploy                     give it back sooner
  eval \"$(dlock hold --until-released --max-hold 1h deploy)\"   for later CI steps";

/// `dlock hold --help`'s text after the options.
pub(super) const HOLD_AFTER_HELP: &str = "\
dlock hold acquires NAME as dlock run would (waiting, --wait, -E, --ttl, --shared, --limit,
--min-hold, --report), then leaves a keeper process in the background that keeps the lease
alive, and exits 0 printing shell assignments: eval them to set and export DLOCK_NAME,
DLOCK_BACKEND, DLOCK_MODE, DLOCK_FENCING_TOKEN, DLOCK_HELD (nested dlock runs of NAME re-enter
the hold, and dlock release finds it) and DLOCK_HOLD (the hold's handle, for --handle).

How a hold ends:
  - the shell it belongs to ends, however it ends (kill -9 included): the keeper releases at
    once. That shell is the one that reads dlock hold's output (eval \"$(dlock hold x)\"), or
    dlock hold's parent when its output is not a pipe;
  - dlock release NAME, from that shell or a process it started;
  - --max-hold runs out;
  - with --until-released the hold belongs to no process: only dlock release (with DLOCK_HELD
    or --handle) or --max-hold, which it requires, end it;
  - the lease is lost (the keeper could not renew it, or someone ran release --force): the
    keeper writes one line to the shell's stderr and, as --on-lost says, sends the shell
    SIGTERM (SIGKILL after --kill-after) or SIGKILL, or nothing (ignore). Only the shell is
    signalled, not the commands it started: check DLOCK_FENCING_TOKEN where it matters, or use
    dlock run for a command that must be stopped with the lock.
  - If the keeper itself is killed, the lock is left to its lease (the file backend frees it
    at once).

Exit status: 0 with the lock held; otherwise as dlock run's before its command would start
(75 or -E when the lock is held elsewhere, 128+N for a signal while waiting, 64, 69, 77,
78, ...).

Examples:
  eval \"$(dlock hold deploy)\" || exit 1
  dlock hold -w 30s --url redis://locks:6379 deploy > /run/deploy.hold   (. it later)
  eval \"$(dlock hold --until-released --max-hold 1h deploy)\"
  echo \"DLOCK_HELD=$DLOCK_HELD\" >> \"$GITHUB_ENV\"      later steps: dlock release deploy";

/// Where the locks are when no URL is given.
const DEFAULT_FILE: &str = "Default: the file backend in $DLOCK_DIR, else /run/dlock for root, \
    else /run/lock/dlock-<uid> where /run/lock is sticky, else /tmp/dlock-<uid>: the same from \
    cron and a login shell.";

// The texts that name the backends are assembled at compile time from the registry's lists
// (`text.rs`): clap builds every help text on every run.

pub(super) const ABOUT: &str = const_text!(render_about);

const fn render_about(out: &mut [u8]) -> usize {
    let at = put(out, 0, "Run a command while holding a named lock (");
    let at = put(out, at, backend::TITLES);
    put(out, at, ")")
}

pub(super) const LONG_ABOUT: &str = const_text!(render_long_about);

const fn render_long_about(out: &mut [u8]) -> usize {
    let at = put(
        out,
        0,
        "Run a command while holding a named lock.\n\n\
        dlock acquires the lock NAME on a backend chosen by URL (a local file by default), runs \
        the command with the lock held, keeps the lease alive while it runs, releases the lock \
        when the command exits or dlock is signalled, and exits with the command's status.\n\n\
        Backends in this build: ",
    );
    let at = put(out, at, backend::KINDS_WITH_SCHEMES);
    let at = put(out, at, ". ");
    put(out, at, DEFAULT_FILE)
}

pub(super) const URL_HELP: &str = const_text!(render_url_help);

const fn render_url_help(out: &mut [u8]) -> usize {
    let at = put(out, 0, "Backend URL: ");
    let at = put(out, at, backend::URL_FORMS);
    let at = put(out, at, ". ");
    put(out, at, DEFAULT_FILE)
}

/// `dlock run --help`'s text after the options: how the command is run, and the exit statuses.
pub(super) const RUN_AFTER_HELP: &str = const_text!(render_run_after_help);

const fn render_run_after_help(out: &mut [u8]) -> usize {
    let at = put(
        out,
        0,
        "\
Option parsing stops at the first word after NAME: in `dlock run x ./job.sh --ttl 5` the
`--ttl 5` belongs to the job. `--` before the command is accepted and optional. `-c` may
stand before NAME or right after it.

The command sees dlock's stdin, stdout, stderr and environment, plus DLOCK_NAME,
DLOCK_BACKEND (",
    );
    let at = put(out, at, backend::SHOWN_AS);
    let at = put(
        out,
        at,
        "), DLOCK_FENCING_TOKEN (strictly increasing per lock
name) and DLOCK_HELD.
Credentials dlock consumed are removed from its environment. A nested `dlock run` of a lock
its ancestor already holds on the same backend runs its command at once.

Signals: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are forwarded
once to the command's process group. After TERM, INT, HUP or QUIT the command gets
--kill-after to exit before SIGKILL; a second such signal sends SIGKILL at once. At an
interactive terminal the command runs in the foreground, so Ctrl-C and Ctrl-Z reach it
directly; on a lease backend dlock warns when it stops that the lease is not renewed while
stopped. A signal while waiting for the lock cancels the wait and dlock exits 128+N.
At a terminal, a wait says whom it waits for, on one line; in a CI job (CI set) and with
-v also elsewhere, as whole lines (every 30s in CI); otherwise (cron) it is silent.
With --min-hold, a signal after the command has finished releases at once (128+N).
If the lock is lost while the command runs, --on-lost decides (default: SIGTERM to the
command's process group, SIGKILL after --kill-after, exit 124).

Every option can also be set in the environment (DLOCK_URL, DLOCK_WAIT, DLOCK_NO_WAIT,
DLOCK_CONFLICT_EXIT_CODE, DLOCK_TTL, DLOCK_LIMIT, DLOCK_ON_LOST, DLOCK_KILL_AFTER,
DLOCK_MIN_HOLD, DLOCK_PREFIX, DLOCK_LOCAL_QUEUE, DLOCK_RECORD_COMMAND, DLOCK_REPORT) or in
the config file. Precedence: flags > environment > config file >
defaults.\n\n",
    );
    let at = put(out, at, RUN_EXAMPLES);
    let at = put(out, at, "\n\n");
    put(out, at, exit::TABLE)
}

/// `dlock run -h`'s text after the options.
pub(super) const RUN_AFTER_SHORT_HELP: &str = const_text!(render_run_after_short_help);

const fn render_run_after_short_help(out: &mut [u8]) -> usize {
    let at = put(out, 0, RUN_EXAMPLES);
    put(
        out,
        at,
        "\n\nMore: dlock run --help (every option, signals, exit statuses), man dlock-run.",
    )
}

/// `dlock --help`'s text after the commands.
pub(super) const TOP_AFTER_LONG_HELP: &str = const_text!(render_top_after_long_help);

const fn render_top_after_long_help(out: &mut [u8]) -> usize {
    let at = put(out, 0, TOP_EXAMPLES);
    let at = put(out, at, "\n\n");
    put(out, at, exit::TABLE)
}

/// What `-h` says of `--url`; `--help` gives every backend's form.
const URL_SHORT_HELP: &str =
    "Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock \
     file on this host]";

/// An option left out of `-h` keeps its one help text as the full one, which the man page
/// shows (clap_mangen shows no short help of an option hidden from `-h`).
pub(super) fn long_help_of_hidden(arg: clap::Arg) -> clap::Arg {
    if !arg.is_hide_short_help_set() || arg.get_long_help().is_some() {
        return arg;
    }
    match arg.get_help().cloned() {
        Some(help) => arg.long_help(help),
        None => arg,
    }
}

/// `--url`'s list of every backend's URL form is for `--help`; `-h` names two and points there.
pub(super) fn short_url_help(arg: clap::Arg) -> clap::Arg {
    if arg.get_id() != "url" || arg.get_long_help().is_some() {
        return arg;
    }
    match arg.get_help().cloned() {
        Some(full) => arg.help(URL_SHORT_HELP).long_help(full),
        None => arg,
    }
}
