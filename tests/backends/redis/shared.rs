//! Shared locks on Redis beyond the contract (`tests/contract/shared.rs`): the wake-ups the
//! scripts send (`src/backend/redis/scripts/modes.lua`): the last reader's release wakes the
//! writer behind it, a writer's release wakes every reader waiting behind it at once, a writer
//! that gives up lets the readers behind it in at once, and a dead writer's place in line
//! lapses within its heartbeat's bound.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

use super::sigkill;

/// `dlock ARGS` in the background, with its hand-off events on stderr.
fn spawn_logged(env: &TestEnv, args: &[&str]) -> Child {
    env.dlock(args)
        .env("DLOCK_LOG", "dlock::handoff=debug")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock")
}

/// Whether a hand-off log line ends with ` event`.
fn logged(said: &str, event: &str) -> bool {
    said.lines().any(|l| l.ends_with(&format!(" {event}")))
}

/// A command that records `$DLOCK_FENCING_TOKEN` in `label`, then `touch`es `label.in` and
/// waits (bounded: a minute) for `stop`.
fn recording(dir: &Path, label: &str, stop: &str) -> String {
    format!(
        "echo $DLOCK_FENCING_TOKEN > '{d}/{label}.tmp' && mv '{d}/{label}.tmp' '{d}/{label}'; \
         touch '{d}/{label}.in'; i=0; while [ ! -e '{d}/{stop}' ] && [ $i -lt 1200 ]; do \
         sleep 0.05; i=$((i+1)); done",
        d = dir.display()
    )
}

/// The last reader's release wakes the writer waiting behind the readers (`wake-sent`), so
/// that it does not wait for a poll.
#[test]
fn the_last_readers_release_wakes_the_writer() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let dir = env.scratch.path().to_owned();
    let mut readers: Vec<Child> = ["r0", "r1"]
        .iter()
        .map(|label| {
            let script = recording(&dir, label, &format!("stop-{label}"));
            let reader = spawn_logged(&env, &["run", "--shared", &lock, "sh", "-c", &script]);
            wait_until("reader holds", PATIENCE, || {
                env.path(&format!("{label}.in")).exists()
            });
            reader
        })
        .collect();
    let mut writer = env.spawn(&["run", &lock, "touch", "writer-ran"]);
    wait_until("writer queued", PATIENCE, || env.waiters(&lock) == 1);
    let mut said = String::new();
    for (reader, label) in readers.iter_mut().zip(["r0", "r1"]) {
        std::fs::write(env.path(&format!("stop-{label}")), b"").expect("stop");
        assert!(wait_within(reader, PATIENCE).success());
        said = stderr_left(reader);
    }
    assert!(wait_within(&mut writer, PATIENCE).success());
    assert!(
        logged(&said, "wake-sent"),
        "the last reader's release should wake the writer:\n{said}"
    );
}

#[test]
fn a_writers_release_wakes_every_reader_waiting_behind_it_at_once() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    // The writer is granted after the readers queued, so its grant names the first of them
    // as next in line: its release wakes that one in the script and the others with one call.
    let mut first = env.hold(&lock, &[]);
    let mut writer = spawn_logged(
        &env,
        &[
            "run",
            &lock,
            "sh",
            "-c",
            "touch writer-in; i=0; while [ ! -e stop ] && [ $i -lt 1200 ]; do sleep 0.05; \
             i=$((i+1)); done",
        ],
    );
    wait_until("writer queued", PATIENCE, || env.waiters(&lock) == 1);
    // Each reader holds until all three hold at once.
    let barrier = "touch in-$$; i=0; while [ \"$(ls in-* | wc -l)\" -lt 3 ] && [ $i -lt 1200 ]; \
                   do sleep 0.05; i=$((i+1)); done; [ \"$(ls in-* | wc -l)\" -ge 3 ]";
    let mut readers: Vec<Child> = Vec::new();
    for n in 2..=4u64 {
        readers.push(spawn_logged(
            &env,
            &["run", "--shared", &lock, "sh", "-c", barrier],
        ));
        wait_until("reader queued", PATIENCE, || env.waiters(&lock) == n);
    }
    first.signal(Signal::SIGTERM);
    first.wait();
    wait_until("writer holds", PATIENCE, || env.path("writer-in").exists());
    let readers_in = std::fs::read_dir(env.scratch.path())
        .expect("scratch")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("in-"))
        })
        .count();
    assert_eq!(readers_in, 0, "a reader ran beside the writer");
    std::fs::write(env.path("stop"), b"").expect("stop");
    assert!(wait_within(&mut writer, PATIENCE).success());
    for reader in &mut readers {
        assert!(
            wait_within(reader, PATIENCE).success(),
            "a reader did not hold beside the others: {}",
            stderr_left(reader)
        );
    }
    let said = stderr_left(&mut writer);
    assert!(
        logged(&said, "woke-next") && logged(&said, "wake-sent"),
        "the writer's release should wake the first reader in its script and the others \
         with one more call:\n{said}"
    );
}

#[test]
fn a_writer_that_gives_up_lets_the_readers_behind_it_in_at_once() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let _reader = env.hold(&lock, &["--shared"]);
    let mut writer = spawn_logged(&env, &["run", &lock, "touch", "writer-ran"]);
    wait_until("writer queued", PATIENCE, || env.waiters(&lock) == 1);
    let mut late = env
        .dlock(["run", "--shared", &lock, "touch", "late-ran"])
        .spawn()
        .expect("spawn late reader");
    wait_until("late reader queued", PATIENCE, || env.waiters(&lock) == 2);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(writer.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal the writer");
    assert_eq!(wait_within(&mut writer, PATIENCE).code(), Some(128 + 15));
    assert!(wait_within(&mut late, PATIENCE).success());
    assert!(env.path("late-ran").exists());
    assert!(!env.path("writer-ran").exists());
    let said = stderr_left(&mut writer);
    assert!(
        logged(&said, "wake-sent"),
        "the writer's leaving should wake the reader behind it:\n{said}"
    );
}

#[test]
fn a_killed_writer_in_line_holds_up_the_readers_behind_it_only_briefly() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let _reader = env.hold(&lock, &["--shared"]);
    let mut writer = env
        .dlock(["run", "--ttl", "7days", &lock, "touch", "writer-ran"])
        .spawn()
        .expect("spawn writer");
    wait_until("writer queued", PATIENCE, || env.waiters(&lock) == 1);
    let mut late = env
        .dlock(["run", "--shared", &lock, "touch", "late-ran"])
        .spawn()
        .expect("spawn late reader");
    wait_until("late reader queued", PATIENCE, || env.waiters(&lock) == 2);
    sigkill(&mut writer);
    let killed = Instant::now();
    wait_until("late reader ran", PATIENCE, || {
        env.path("late-ran").exists()
    });
    // A place in line lasts 2 s after the last heartbeat (every 0.5 s).
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(2 + 2),
        "a dead writer in line held up a reader for {took:?}"
    );
    assert!(wait_within(&mut late, PATIENCE).success());
    assert!(!env.path("writer-ran").exists());
}
