//! Shared locks on Redis (`--shared`; the mode travels in the owner token, see
//! `src/backend/redis/scripts/modes.lua`): a reader killed with SIGKILL frees its share when
//! its lease ends, a writer behind readers is woken once the last one leaves, a reader behind
//! a waiting writer waits for it (and gets in at once when that writer gives up or dies), a
//! writer's release wakes every reader waiting behind it at once, and `release --force` stops
//! every reader.

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

/// The holders `status --json` shows for `name`: (mode, token) each.
fn holders(env: &TestEnv, name: &str) -> Vec<(String, u64)> {
    let out = env.run(["status", "--json", name]);
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
    json["holders"]
        .as_array()
        .map(|holders| {
            holders
                .iter()
                .map(|h| {
                    (
                        h["mode"].as_str().unwrap_or_default().to_owned(),
                        h["token"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
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

fn token_in(env: &TestEnv, label: &str) -> u64 {
    std::fs::read_to_string(env.path(label))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no token recorded in {label}"))
}

#[test]
fn a_killed_reader_frees_its_share_when_its_lease_ends() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut dead = env.hold(&lock, &["--shared", "--ttl", "5s"]);
    let mut other = env.hold(&lock, &["--shared"]);
    let entered = env.path("entered");
    let mut writer = env
        .dlock(["run", &lock, "touch"])
        .arg(&entered)
        .spawn()
        .expect("spawn writer");
    wait_until("writer queued", PATIENCE, || env.waiters(&lock) == 1);
    // The killed reader never releases; the live one does, and the writer still waits.
    dead.signal(Signal::SIGKILL);
    dead.wait();
    let killed = Instant::now();
    other.signal(Signal::SIGTERM);
    other.wait();
    assert_eq!(holders(&env, &lock).len(), 1, "the killed reader's share");
    assert!(
        !entered.exists(),
        "the writer ran beside a killed reader's live lease"
    );
    wait_until("writer entered", PATIENCE, || entered.exists());
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(5 + 1),
        "the writer got the lock {took:?} after the reader was killed (--ttl 5s)"
    );
    assert!(wait_within(&mut writer, PATIENCE).success());
}

#[test]
fn a_writer_behind_readers_is_woken_once_the_last_one_leaves() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let dir = env.scratch.path().to_owned();
    let mut readers: Vec<(Child, String)> = Vec::new();
    for i in 0..3 {
        let label = format!("r{i}");
        let script = recording(&dir, &label, &format!("stop-{label}"));
        readers.push((
            spawn_logged(&env, &["run", "--shared", &lock, "sh", "-c", &script]),
            label.clone(),
        ));
        wait_until("reader holds", PATIENCE, || {
            env.path(&format!("{label}.in")).exists()
        });
    }
    let shared = holders(&env, &lock);
    assert_eq!(shared.len(), 3, "{shared:?}");
    assert!(
        shared.iter().all(|(mode, _)| mode == "shared"),
        "{shared:?}"
    );
    let mut writer = env
        .dlock(["run", &lock, "touch", "writer-ran"])
        .spawn()
        .expect("spawn writer");
    wait_until("writer queued", PATIENCE, || env.waiters(&lock) == 1);
    let mut said = String::new();
    for left in (0..readers.len()).rev() {
        let (mut reader, label) = readers.remove(0);
        std::fs::write(env.path(&format!("stop-{label}")), b"").expect("stop");
        assert!(wait_within(&mut reader, PATIENCE).success());
        said = stderr_left(&mut reader);
        if left > 0 {
            assert_eq!(holders(&env, &lock).len(), left);
            assert!(
                !env.path("writer-ran").exists(),
                "the writer ran beside {left} reader(s)"
            );
            assert_eq!(env.waiters(&lock), 1);
        }
    }
    assert!(wait_within(&mut writer, PATIENCE).success());
    assert!(env.path("writer-ran").exists());
    assert!(
        logged(&said, "wake-sent"),
        "the last reader's release should wake the writer:\n{said}"
    );
    let tokens: Vec<u64> = shared.iter().map(|(_, token)| *token).collect();
    let after = env.token(&lock);
    assert!(
        tokens.iter().all(|t| *t < after),
        "tokens {tokens:?} then {after}"
    );
}

#[test]
fn a_late_reader_queues_behind_a_waiting_writer_and_runs_after_it() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let dir = env.scratch.path().to_owned();
    let mut first = spawn_logged(
        &env,
        &[
            "run",
            "--shared",
            &lock,
            "sh",
            "-c",
            &recording(&dir, "first", "stop-first"),
        ],
    );
    wait_until("first reader holds", PATIENCE, || {
        env.path("first.in").exists()
    });
    let mut writer = spawn_logged(
        &env,
        &[
            "run",
            &lock,
            "sh",
            "-c",
            &recording(&dir, "writer", "stop-writer"),
        ],
    );
    wait_until("writer queued", PATIENCE, || env.waiters(&lock) == 1);
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    let mut late = spawn_logged(
        &env,
        &[
            "run",
            "--shared",
            &lock,
            "sh",
            "-c",
            &recording(&dir, "late", "stop-late"),
        ],
    );
    wait_until("late reader queued", PATIENCE, || env.waiters(&lock) == 2);
    assert!(
        !env.path("late.in").exists(),
        "the late reader went ahead of the waiting writer"
    );
    std::fs::write(env.path("stop-first"), b"").expect("stop");
    wait_until("writer holds", PATIENCE, || env.path("writer.in").exists());
    assert!(wait_within(&mut first, PATIENCE).success());
    assert!(
        !env.path("late.in").exists(),
        "a reader ran beside the writer"
    );
    std::fs::write(env.path("stop-writer"), b"").expect("stop");
    wait_until("late reader holds", PATIENCE, || {
        env.path("late.in").exists()
    });
    assert!(wait_within(&mut writer, PATIENCE).success());
    std::fs::write(env.path("stop-late"), b"").expect("stop");
    assert!(wait_within(&mut late, PATIENCE).success());
    let (first, writer, late) = (
        token_in(&env, "first"),
        token_in(&env, "writer"),
        token_in(&env, "late"),
    );
    assert!(
        first < writer && writer < late,
        "tokens: first reader {first}, writer {writer}, late reader {late}"
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

#[test]
fn release_force_stops_every_reader() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut readers: Vec<Holding> = (0..2)
        .map(|_| env.hold(&lock, &["--shared", "--kill-after", "2s"]))
        .collect();
    let shown = holders(&env, &lock);
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert_ne!(shown[0].1, shown[1].1, "readers share no token: {shown:?}");
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    for reader in &mut readers {
        assert_eq!(reader.wait().code(), Some(124), "{}", reader.stderr());
    }
    assert!(holders(&env, &lock).is_empty());
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}
