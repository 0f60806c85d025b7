//! The contract of `--min-hold`'s finish record (docs/guide.md: "Min-hold"): `status` says that the
//! command has ended only for a hold that is still the recorder's. Called per backend (with
//! how it notices a broken hold), not from `contract_tests!`.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

const FINISHED: &str = "finished:   the command has ended";

/// `status` of `lock`: held by `holder` (dlock's pid), with no finish shown.
fn assert_held_by_without_finish(env: &TestEnv, lock: &str, holder: &Holding) {
    let status = stdout_of(&env.run(["status", lock]));
    assert!(
        status.contains(&format!("pid {} on", holder.pid())),
        "not the new holder: {status}"
    );
    assert!(
        !status.contains(FINISHED),
        "the new holder shows a finish it never recorded: {status}"
    );
}

/// A finish recorded, or attempted, after the lock was broken (`release --force`) and taken
/// by another run writes nothing into the new holder's metadata, in both orders:
///
/// 1. the finish is recorded (`status` says so, `list --json` has `kept_until`), then the
///    lock is broken and taken again: the old holder's renewals (which carry the finished
///    metadata now) find the hold gone, write nothing, and it exits with its command's status;
/// 2. the lock is broken and taken while the command still runs, then the command ends.
///    Where a broken hold is noticed only at the next renewal (`noticed_at_once` false:
///    memcached, MySQL) dlock goes on into `--min-hold` and attempts the finish on a hold
///    that is no longer its own; where it is noticed at once (PostgreSQL's session end,
///    ZooKeeper's watch on the node) the command is stopped first (124).
pub fn a_finish_after_the_lock_was_taken_over_writes_nothing(
    server: &dyn LockServer,
    noticed_at_once: bool,
) {
    let env = TestEnv::new(server);

    // 1. Recorded, then taken over.
    let lock = lock_name("recorded");
    let mut first = Holding {
        child: env
            .dlock(["run", "--min-hold", "60s", &lock, "true"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn first run"),
        ready: env.path("unused"),
    };
    wait_until("the finish recorded", PATIENCE, || {
        stdout_of(&env.run(["status", &lock])).contains(FINISHED)
    });
    // `list` reads the same metadata back.
    let list = env.run(["list", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&list.stdout).expect("list --json");
    let listed = json
        .as_array()
        .and_then(|locks| locks.iter().find(|l| l["name"] == lock.as_str()))
        .map(|l| l["holders"][0]["kept_until"].clone());
    assert!(
        listed.as_ref().is_some_and(serde_json::Value::is_string),
        "list shows no kept_until: {json}"
    );
    server.break_hold(&env, &lock);
    let second = env.hold(&lock, &[]);
    assert_held_by_without_finish(&env, &lock, &second);
    let code = first.wait().code();
    assert_eq!(code, Some(0), "the command's status after the loss");
    assert_held_by_without_finish(&env, &lock, &second);
    drop(second);

    // 2. Taken over while the command runs; the finish comes after.
    let lock = lock_name("late");
    let started = env.path("started");
    let go = env.path("go");
    let script = format!(
        "touch '{}'; i=0; while [ ! -e '{}' ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 3",
        started.display(),
        go.display()
    );
    let log_path = env.path("first.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    // A long TTL: the first renewal comes 10 s after the acquisition, long after the finish.
    let mut first = Holding {
        child: env
            .dlock([
                "run",
                "-v",
                "--ttl",
                "30s",
                "--min-hold",
                "60s",
                &lock,
                "sh",
                "-c",
                &script,
            ])
            .stderr(log)
            .spawn()
            .expect("spawn first run"),
        ready: env.path("unused"),
    };
    wait_until("the first command", PATIENCE, || started.exists());
    server.break_hold(&env, &lock);
    let second = env.hold(&lock, &[]);
    std::fs::write(&go, "").expect("touch go");
    let first_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    if noticed_at_once {
        let code = first.wait().code();
        assert_eq!(code, Some(124), "{}", first_log());
    } else {
        wait_until("the first run in its --min-hold", PATIENCE, || {
            first_log().contains("the command has finished (status 3)")
        });
        assert_held_by_without_finish(&env, &lock, &second);
        // Its first renewal, at most 10 s after it acquired, finds the hold gone.
        let code = wait_within(&mut first.child, Duration::from_secs(40)).code();
        assert_eq!(code, Some(3), "{}", first_log());
    }
    assert_held_by_without_finish(&env, &lock, &second);
}
