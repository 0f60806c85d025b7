//! The pages of a hold and of its release: `dlock-hold(1)` and `dlock-release(1)`.

use super::{common_files, subcommand_environment, with_errors, Command};
use crate::text::put;

/// `dlock-hold(1)`.
pub(super) fn hold_page() -> Command {
    Command {
        summary: "hold a named lock for the calling shell until it ends or releases it",
        description: HOLD,
        exit_intro: "On failure dlock hold also prints (exit N) for eval, so that \
                     eval \"$(dlock hold NAME)\" || exit and set -e stop the script. \
                     -E changes 75.",
        exit: with_errors(&[
            ("0", "the lock is held: the assignments are printed"),
            (
                "75",
                "the lock is held elsewhere (--wait ran out, or --no-wait)",
            ),
            ("128+N", "signal N came while waiting: nothing is held"),
        ]),
        environment: [
            subcommand_environment(),
            vec![
                (
                    "DLOCK_HELD (set by eval)",
                    "An entry for each name held, naming the shell the hold belongs to and \
                     its keeper: nested dlock runs and holds of those names re-enter the \
                     hold, and dlock release finds the keeper. Opaque.",
                ),
                (
                    "DLOCK_HOLD (set by eval)",
                    "The hold's handle, PID.START of its keeper, for dlock release --handle.",
                ),
                (
                    "DLOCK_NAME, DLOCK_BACKEND, DLOCK_MODE, DLOCK_FENCING_TOKEN, \
                     DLOCK_FENCING_TOKENS (set by eval)",
                    "As dlock run sets them for its command (dlock-run(1)).",
                ),
            ],
        ]
        .concat(),
        files: [
            common_files(),
            vec![(
                "DIR/holds/PID.START",
                "The socket where a hold's keeper takes dlock release's request, in the \
                 default lock directory (mode 0700); only its own user and root may ask.",
            )],
        ]
        .concat(),
        examples: vec![
            (
                "eval \"$(dlock hold deploy)\" || exit 1",
                "Hold deploy until this shell ends (however it ends) or runs dlock release \
                 deploy.",
            ),
            (
                "eval \"$(dlock hold --until-released --max-hold 2h -u redis://ci staging)\"",
                "A hold that belongs to no process, for CI steps in separate shells: dlock \
                 release ends it, or --max-hold.",
            ),
        ],
    }
}

/// `dlock-release(1)`.
pub(super) fn release_page() -> Command {
    Command {
        summary: "end your hold of a named lock, or break anyone's with --force",
        description: RELEASE,
        exit_intro: "",
        exit: with_errors(&[
            (
                "0",
                "the lock was released (with --force: its holders are gone, each named on \
                 stderr)",
            ),
            (
                "1",
                "nothing to release: the lock was not held, or your hold of it had ended \
                 already",
            ),
            ("124", "your hold had been lost before this release"),
            (
                "77",
                "the lock is held, but not by a hold of yours (without --force); the file \
                 backend, where a kernel lock cannot be broken (the holder's pid is named); \
                 or the server refused the password or to end another user's session",
            ),
        ]),
        environment: subcommand_environment(),
        files: common_files(),
        examples: vec![
            (
                "dlock release deploy",
                "End the hold of deploy that dlock hold took for this shell.",
            ),
            (
                "dlock release --force --url etcd://10.0.0.5:2379 deploy-prod",
                "Break a lock whose holder is stuck; the holder notices the loss and stops \
                 its command.",
            ),
            (
                "dlock release --force -u redis://locks deploy-prod || [ $? -eq 1 ]",
                "The same in a script that does not mind a lock that was free already.",
            ),
        ],
    }
}

const RELEASE: &str = const_text!(render_release);

const fn render_release(out: &mut [u8]) -> usize {
    let at = put(out, 0, RELEASE_FIRST);
    let at = put(
        out,
        at,
        "`dlock release --force NAME` removes the holders of NAME from the backend: ",
    );
    let at = put(out, at, crate::backend::RELEASE_REMOVES);
    put(out, at, RELEASE_REST)
}

const RELEASE_FIRST: &str = "\
`dlock release NAME` ends a hold of yours (dlock-hold(1)): the one DLOCK_HELD names for NAME,
or the one --handle names. It asks the hold's keeper, which gives the lock back and answers. It
never ends another's hold or run: with no hold of NAME in its environment it refuses (77) and
names the holder.

";

const RELEASE_REST: &str = ". \
A holder that is a dlock notices the loss and stops its command
(exit 124; see `--on-lost` in dlock-run(1)). Waiters keep their places.

A kernel flock(2) lock cannot be broken from outside: on the file backend `release --force`
refuses (77) and names the pid to stop instead.

A lock that is free leaves nothing to release: dlock says so and exits 1, so that a script can
tell a broken lock (0) from a free one (1).";

const HOLD: &str = "\
`dlock hold NAME` acquires NAME as dlock run would (the same options, no command), leaves a
keeper process in the background that keeps the lease alive, and prints shell assignments for
eval: DLOCK_NAME, DLOCK_BACKEND, DLOCK_MODE, DLOCK_FENCING_TOKEN, DLOCK_FENCING_TOKENS,
DLOCK_HELD and DLOCK_HOLD.

The hold belongs to the shell that reads dlock hold's output (in eval \"$(dlock hold NAME)\",
the shell that runs eval), or to dlock hold's parent when its output is not a pipe. When that
process ends, however it ends, the keeper releases the lock at once. Nested dlock runs and holds
of NAME in that shell re-enter the hold. dlock release NAME ends it sooner; --max-hold ends it
after that long. With --until-released the hold belongs to no process and --max-hold is
required. If the keeper is killed, the lock is left to its lease.

When the lease is lost, the keeper writes one line to the shell's stderr and, as --on-lost
says, sends the shell SIGTERM (SIGKILL after --kill-after), SIGKILL, or nothing. Only the shell
is signalled, not the commands it started: use the fencing token, or dlock run for a command
that must be stopped with the lock.";
