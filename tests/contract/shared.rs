//! The contract of shared locks (`--shared`, docs/guide.md: "Shared locks"), for every
//! backend with the `shared` capability: many shared holders or one exclusive holder, never
//! both; a reader that arrives while a writer waits queues behind it; every hold takes a
//! larger token; `status`/`list` show the mode and every holder; reentrancy never upgrades;
//! waiting, signals, `--min-hold`, dead readers and `release --force` as for exclusive holds.
//! [`shared_contract_tests!`](crate::shared_contract_tests) expands them for one backend;
//! `offered_or_refused_as_the_registry_says` is in every backend's `contract_tests!`.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

fn finish(child: &mut Child) -> i32 {
    wait_within(child, PATIENCE).code().unwrap_or(-1)
}

/// How many holders `status` shows for `name`.
fn holders(env: &TestEnv, name: &str) -> usize {
    env.status_json(name)["holders"]
        .as_array()
        .map_or(0, Vec::len)
}

/// The token `status` shows for the holder of `name` whose dlock is `pid`.
fn holder_token(env: &TestEnv, name: &str, pid: i32) -> u64 {
    let status = env.status_json(name);
    status["holders"]
        .as_array()
        .and_then(|holders| holders.iter().find(|h| h["pid"] == pid))
        .and_then(|h| h["token"].as_u64())
        .unwrap_or_else(|| panic!("holder {pid} not shown with a token: {status}"))
}

/// A shell loop that waits (bounded) until `count` files match `pattern`, else exits 9.
fn until_files(pattern: &str, count: usize) -> String {
    format!(
        "n=0; while [ \"$(ls {pattern} 2>/dev/null | wc -l)\" -lt {count} ]; do \
         n=$((n+1)); [ $n -gt 2000 ] && exit 9; sleep 0.01; done"
    )
}

/// A backend with the capability takes `--shared` (the command sees DLOCK_MODE=shared); one
/// without refuses it and DLOCK_SHARED=1 with 64, naming itself, before anything runs.
pub fn offered_or_refused_as_the_registry_says(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("shared");
    let kind = dlock::backend::kind_of_scheme(server.scheme()).expect("a registered scheme");
    let show = format!("echo \"$DLOCK_MODE\" > {}", env.path("seen").display());
    let out = env.run(["run", "--shared", &lock, "sh", "-c", &show]);
    if kind.capabilities.shared {
        assert!(out.status.success(), "{}", describe(&out));
        let seen = std::fs::read_to_string(env.path("seen")).expect("the command ran");
        assert_eq!(seen.trim(), "shared");
        return;
    }
    assert_fails(&out, 64, kind.title);
    assert!(
        stderr_of(&out).contains("does not offer shared locks"),
        "{}",
        describe(&out)
    );
    let mut from_env = env.dlock(["run", &lock, "sh", "-c", &show]);
    from_env.env("DLOCK_SHARED", "1");
    let out = output_within(from_env, PATIENCE);
    assert_fails(&out, 64, "DLOCK_SHARED");
    assert!(!env.path("seen").exists(), "a refused run ran its command");
}

/// Four shared runs hold at once: each waits, holding, for a file from every other, which
/// only four simultaneous holders can all reach; each sees DLOCK_MODE=shared, and an exclusive
/// run afterwards sees exclusive.
pub fn many_shared_holders_hold_at_once(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("readers");
    let barrier = until_files("in-*", 4);
    let mut readers: Vec<Child> = (0..4)
        .map(|i| {
            let script = format!("touch in-{i}; {barrier}; echo \"$DLOCK_MODE\" > seen-{i}");
            env.spawn(&["run", "--shared", &lock, "sh", "-c", &script])
        })
        .collect();
    for (i, reader) in readers.iter_mut().enumerate() {
        let code = finish(reader);
        assert_eq!(code, 0, "reader {i}: {}", stderr_left(reader));
        let seen = std::fs::read_to_string(env.path(&format!("seen-{i}"))).expect("seen");
        assert_eq!(seen.trim(), "shared", "reader {i} saw DLOCK_MODE={seen}");
    }
    let out = env.run(["run", &lock, "sh", "-c", "echo \"$DLOCK_MODE\""]);
    assert_eq!(stdout_of(&out).trim(), "exclusive", "{}", describe(&out));
}

/// An exclusive run waits while a reader holds, and no reader gets in while it holds.
pub fn an_exclusive_run_waits_for_readers_and_excludes_them(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let reader = env.hold(&lock, &["--shared"]);
    let mut writer = env.spawn(&["run", &lock, "sh", "-c", "touch writing; exec sleep 1000"]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) >= 1);
    assert!(
        !env.path("writing").exists(),
        "the writer ran beside a reader"
    );
    drop(reader);
    wait_until("the writer holds", PATIENCE, || {
        env.path("writing").exists()
    });
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    let _ = writer.kill();
    let _ = writer.wait();
}

/// A writer waiting behind three readers stays waiting while any of them still holds,
/// whichever leaves first (the middle one, then the newest, then the oldest), and is granted
/// once all have left. Each reader has a token of its own, larger than the one before it, and
/// the writer's is larger than every reader's.
pub fn a_writer_behind_readers_is_granted_once_they_all_leave(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let mut readers: Vec<Holding> = (0..3).map(|_| env.hold(&lock, &["--shared"])).collect();
    let tokens: Vec<u64> = readers
        .iter()
        .map(|reader| holder_token(&env, &lock, reader.pid()))
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "the readers' tokens: {tokens:?}"
    );
    let mut writer = env.spawn(&[
        "run",
        &lock,
        "sh",
        "-c",
        "echo $DLOCK_FENCING_TOKEN > writer.tmp && mv writer.tmp writer",
    ]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) >= 1);
    for (left, i) in [(2, 1), (1, 2)] {
        readers[i].signal(Signal::SIGTERM);
        assert_eq!(readers[i].wait().code(), Some(128 + 15));
        wait_until("the reader is gone", PATIENCE, || {
            holders(&env, &lock) == left
        });
        assert!(
            !env.path("writer").exists(),
            "the writer ran beside {left} reader(s)"
        );
        assert!(env.waiters(&lock) >= 1, "the writer stopped waiting");
    }
    readers[0].signal(Signal::SIGTERM);
    readers[0].wait();
    assert_eq!(finish(&mut writer), 0, "{}", stderr_left(&mut writer));
    let written = env.recorded_token("writer");
    assert!(
        tokens.iter().all(|&t| t < written),
        "the writer's token {written} after the readers' {tokens:?}"
    );
}

/// A reader that arrives while a writer waits queues behind that writer (no writer
/// starvation): `--no-wait` gives up, `status` shows the queue (where the server lists one)
/// in arrival order with its modes, and a waiting reader runs after the writer, with a
/// larger token.
pub fn a_reader_behind_a_waiting_writer_waits_for_it(server: &dyn LockServer) {
    late_reader_waits_for_the_writer(server, &[]);
}

/// The same with the writer and the late reader waiting at the server itself, as runs on
/// other hosts do (`DLOCK_LOCAL_QUEUE=off`), for backends that line up a host's waiters
/// first: the server's own queue keeps the reader behind the writer. Without a host queue
/// the case above is this one.
pub fn a_reader_behind_a_writer_waiting_at_the_server_waits_for_it(server: &dyn LockServer) {
    if super::capabilities(server).host_queue {
        late_reader_waits_for_the_writer(server, &[("DLOCK_LOCAL_QUEUE", "off")]);
    }
}

fn late_reader_waits_for_the_writer(server: &dyn LockServer, vars: &[(&str, &str)]) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let spawn = |args: &[&str]| {
        let mut command = env.dlock(args);
        command.envs(vars.iter().copied()).stderr(Stdio::piped());
        command.spawn().expect("spawn dlock")
    };
    let first = env.hold(&lock, &["--shared"]);
    let first_token = holder_token(&env, &lock, first.pid());
    let mut writer = spawn(&[
        "run",
        &lock,
        "sh",
        "-c",
        "echo $DLOCK_FENCING_TOKEN > writer.tmp && mv writer.tmp writer",
    ]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) >= 1);
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    let mut late = spawn(&[
        "run",
        "--shared",
        &lock,
        "sh",
        "-c",
        "if [ -e writer ]; then echo after > late; else echo before > late; fi; \
         echo $DLOCK_FENCING_TOKEN > late-token.tmp && mv late-token.tmp late-token",
    ]);
    wait_until("the late reader waits", PATIENCE, || {
        env.waiters(&lock) >= 2
    });
    let status = env.status_json(&lock);
    if status.get("queue").is_some() {
        assert_eq!(
            modes_in(&status, "queue"),
            ["exclusive", "shared"],
            "{status}"
        );
    }
    assert!(!env.path("late").exists(), "the late reader went ahead");
    drop(first);
    assert_eq!(finish(&mut writer), 0, "{}", stderr_left(&mut writer));
    assert_eq!(finish(&mut late), 0, "{}", stderr_left(&mut late));
    let late = std::fs::read_to_string(env.path("late")).expect("late ran");
    assert_eq!(
        late.trim(),
        "after",
        "the late reader ran before the writer"
    );
    let (writer, late) = (
        env.recorded_token("writer"),
        env.recorded_token("late-token"),
    );
    assert!(
        first_token < writer && writer < late,
        "tokens: first reader {first_token}, writer {writer}, late reader {late}"
    );
}

/// Every hold takes a larger token than every earlier one of the name, shared or not: a
/// writer's is larger than every reader's before it, a reader's larger than the last
/// writer's, also beside another reader.
pub fn tokens_increase_across_shared_and_exclusive_holds(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let shared_token = || {
        let out = env.run([
            "run",
            "--shared",
            &lock,
            "sh",
            "-c",
            "echo $DLOCK_FENCING_TOKEN",
        ]);
        assert!(out.status.success(), "{}", describe(&out));
        stdout_of(&out).trim().parse::<u64>().expect("a token")
    };
    let w1 = env.token(&lock);
    let r1 = shared_token();
    let holder = env.hold(&lock, &["--shared"]);
    let held = env.status_json(&lock)["holders"][0]["token"]
        .as_u64()
        .expect("holder token");
    let r2 = shared_token();
    drop(holder);
    let w2 = env.token(&lock);
    assert!(
        w1 < r1 && r1 < held && held < r2 && r2 < w2,
        "{w1} {r1} {held} {r2} {w2}"
    );
}

/// The outcome record (`--report`) of a shared run says `"mode": "shared"`.
pub fn report_records_a_shared_run(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let report = env.path("runs.jsonl");
    let report = report.to_str().expect("UTF-8 path");
    let out = env.run(["run", "--shared", "--report", report, &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = std::fs::read_to_string(report).expect("the record");
    let record: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    assert_eq!(record["mode"], "shared", "{record}");
    assert_eq!(record["outcome"], "ran", "{record}");
    assert!(record["token"].as_u64().is_some(), "{record}");
}

/// `--shared --limit 2` is refused before anything runs (64).
pub fn shared_with_a_limit_is_refused(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let out = env.run(["run", "--shared", "--limit", "2", &lock, "touch", "ran"]);
    assert_fails(&out, 64, "--limit 2");
    assert!(!env.path("ran").exists());
}

/// `status` and `list`, in text and JSON, show the mode and every shared holder; an
/// exclusive holder shows as exclusive.
pub fn status_and_list_show_the_mode_and_every_holder(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let a = env.hold(&lock, &["--shared"]);
    let b = env.hold(&lock, &["--shared"]);
    let status = env.status_json(&lock);
    let holders = status["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 2, "{status}");
    for holding in [&a, &b] {
        assert!(
            holders
                .iter()
                .any(|h| h["pid"] == holding.pid() && h["mode"] == "shared"),
            "{status}"
        );
    }
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout_of(&out);
    // Several holders: the mode once, then a line for each holder.
    assert!(
        text.contains("state:      held by 2 holders") && text.contains("mode:       shared"),
        "{text}"
    );
    for holding in [&a, &b] {
        let line = format!("pid {} on ", holding.pid());
        assert_eq!(text.matches(&line).count(), 1, "{text}");
    }
    // Each test lists only its own locks (its own prefix, or its own directory).
    let list = stdout_of(&env.run(["list"]));
    assert_eq!(list.matches(" shared ").count(), 2, "{list}");
    let listed: serde_json::Value =
        serde_json::from_slice(&env.run(["list", "--json"]).stdout).expect("list json");
    let ours = listed
        .as_array()
        .and_then(|locks| locks.iter().find(|l| l["name"] == lock.as_str()))
        .unwrap_or_else(|| panic!("{lock} not listed: {listed}"));
    assert_eq!(ours["holders"].as_array().map(Vec::len), Some(2), "{ours}");
    drop((a, b));
    wait_until("the readers are gone", PATIENCE, || env.is_free(&lock));
    let _w = env.hold(&lock, &[]);
    let status = env.status_json(&lock);
    assert_eq!(status["holders"][0]["mode"], "exclusive", "{status}");
    let text = stdout_of(&env.run(["status", &lock]));
    assert!(text.contains("mode:       exclusive"), "{text}");
}

/// Nested runs of the same name: shared inside shared or exclusive re-enters; exclusive
/// inside shared is refused (64), never a silent upgrade, whether the nested run says nothing,
/// `--exclusive` or `DLOCK_SHARED=0`: the outer hold's mode is no setting of the nested run.
pub fn nested_runs_reenter_but_never_upgrade_a_shared_hold(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let nested = |outer: &[&str], inner: &str| {
        let script = format!("{inner} {DLOCK} run --no-wait {lock} sh -c 'echo \"$DLOCK_MODE\"'");
        let mut args = vec!["run"];
        args.extend(outer);
        args.extend([lock.as_str(), "sh", "-c", &script]);
        env.run(&args)
    };
    let out = nested(&["--shared"], "DLOCK_SHARED=1");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "shared");
    let out = nested(&[], "DLOCK_SHARED=1");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "shared");
    for (inner, flag) in [
        ("", ""),
        ("DLOCK_SHARED=0", ""),
        ("DLOCK_SHARED=1", "--exclusive"),
    ] {
        let script =
            format!("{inner} {DLOCK} run {flag} --no-wait {lock} sh -c 'echo \"$DLOCK_MODE\"'");
        let out = env.run(["run", "--shared", &lock, "sh", "-c", &script]);
        assert_fails(&out, 64, "upgrade");
        assert!(
            stdout_of(&out).is_empty(),
            "{inner} {flag}: {}",
            describe(&out)
        );
    }
}

/// Inside a shared holder, a nested run that does not see the hold (`env -u DLOCK_HELD`, a
/// daemon it starts) is an exclusive run of its own: it finds the lock held shared.
pub fn a_nested_run_that_cannot_see_the_shared_hold_is_exclusive(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let script = format!(
        "env -u DLOCK_HELD {DLOCK} run --no-wait {lock} sh -c 'echo \"$DLOCK_MODE\"'; \
         echo \"nested: $?\""
    );
    let out = env.run(["run", "--shared", &lock, "sh", "-c", &script]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "nested: 75", "{}", describe(&out));
}

/// A shared hold of a file lock around a run of this backend does not make that run shared,
/// whatever the name (design.md §3: what describes a hold is no setting): the nested run is
/// exclusive on every backend (one without shared locks does not refuse it), and two of them
/// under two shared holders of the outer lock never hold at once.
pub fn a_shared_hold_around_it_never_makes_a_nested_run_shared(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let outer_url = format!("file://{}", env.path("outer-locks").display());
    let lock = lock_name("migrate");
    let held = env.path("held");
    let done = env.path("done");
    let first_script = format!(
        "{DLOCK} run --no-wait {lock} sh -c 'echo \"$DLOCK_MODE\" > {held}; \
         n=0; while [ ! -e {done} ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done'",
        held = held.display(),
        done = done.display(),
    );
    let mut first = env.spawn(&[
        "run",
        "--url",
        &outer_url,
        "--shared",
        "dataset",
        "sh",
        "-c",
        &first_script,
    ]);
    wait_until("the first nested run holds", PATIENCE, || {
        std::fs::read_to_string(&held).is_ok_and(|seen| seen.ends_with('\n'))
    });
    let seen = std::fs::read_to_string(&held).unwrap_or_default();
    assert_eq!(seen.trim(), "exclusive", "the nested run's mode");
    let status = env.status_json(&lock);
    assert_eq!(status["holders"][0]["mode"], "exclusive", "{status}");
    let second = env.run([
        "run",
        "--url",
        &outer_url,
        "--shared",
        "dataset",
        DLOCK,
        "run",
        "--no-wait",
        &lock,
        "true",
    ]);
    std::fs::write(&done, "").expect("write the done file");
    assert_eq!(second.status.code(), Some(75), "{}", describe(&second));
    assert_eq!(finish(&mut first), 0, "{}", stderr_left(&mut first));
}

/// Shared holders hold with `--limit 1`: a `--limit 3` run beside them is refused (64), as
/// beside any holder with another limit, waiting or not, although slots 1 and 2 are free; and
/// so is a shared run beside `--limit 3` holders. A refused run leaves no waiter behind.
pub fn shared_holders_and_a_semaphore_refuse_each_other(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let refused = |mode: &[&str], limit: &str| {
        for wait in [&["--no-wait"][..], &[]] {
            let mut args = vec!["run"];
            args.extend(mode);
            args.extend(wait);
            args.extend([lock.as_str(), "touch", "ran"]);
            let out = env.run(&args);
            assert_fails(&out, 64, limit);
            assert_eq!(env.waiters(&lock), 0, "a refused run stayed queued");
        }
    };
    let reader = env.hold(&lock, &["--shared"]);
    refused(&["--limit", "3"], "--limit 1");
    drop(reader);
    wait_until("the reader is gone", PATIENCE, || env.is_free(&lock));
    let _semaphore = env.hold(&lock, &["--limit", "3"]);
    let _other = env.hold(&lock, &["--limit", "3"]);
    refused(&["--shared"], "--limit 3");
    assert!(!env.path("ran").exists(), "a refused run's command ran");
}

/// A shared run keeps to `--wait` behind an exclusive holder (75, in time), and a signal
/// while it waits cancels it (128+N); neither leaves a waiter or a share behind.
pub fn a_waiting_shared_run_keeps_to_wait_and_signals(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let mut writer = env.hold(&lock, &[]);
    let started = Instant::now();
    let out = env.run(["run", "--shared", "--wait", "1s", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held");
    assert!(started.elapsed() < Duration::from_secs(1) + PAST_WAIT);
    assert_eq!(env.waiters(&lock), 0, "--wait's end left a waiter");
    let mut reader = env.spawn(&["run", "--shared", &lock, "touch", "ran"]);
    wait_until("the reader waits", PATIENCE, || env.waiters(&lock) >= 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(reader.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal the reader");
    assert_eq!(
        finish(&mut reader),
        128 + 15,
        "{}",
        stderr_left(&mut reader)
    );
    wait_until("no waiter left", PATIENCE, || env.waiters(&lock) == 0);
    assert!(!env.path("ran").exists());
    // Neither left a share held: the lock is free once the writer leaves.
    writer.signal(Signal::SIGTERM);
    writer.wait();
    assert!(env.is_free(&lock), "a share was left held");
}

/// `--min-hold` keeps a shared hold after its command, and `status` says so from the
/// holder's own record: a writer is kept out, another reader gets in.
pub fn min_hold_keeps_a_shared_hold_and_status_says_so(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let mut reader = env.spawn(&["run", "--shared", "--min-hold", "1h", &lock, "true"]);
    wait_until("the command has finished", PATIENCE, || {
        env.status_json(&lock)["holders"][0]["kept_until"].is_string()
    });
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let _ = reader.kill();
    let _ = reader.wait();
}

/// A writer that gives up (`--wait`) or dies (SIGKILL) while a reader queues behind it does
/// not keep that reader out: it joins the reader that still holds.
pub fn readers_behind_a_writer_that_gives_up_or_dies_get_in(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let _first = env.hold(&lock, &["--shared"]);
    let mut writer = env.spawn(&["run", "--wait", "5s", &lock, "touch", "wrote"]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) >= 1);
    let mut late = env.spawn(&["run", "--shared", &lock, "touch", "late-ran"]);
    wait_until("the late reader waits", PATIENCE, || {
        env.waiters(&lock) >= 2
    });
    assert_eq!(finish(&mut writer), 75, "{}", stderr_left(&mut writer));
    assert_eq!(finish(&mut late), 0, "{}", stderr_left(&mut late));
    assert!(env.path("late-ran").exists() && !env.path("wrote").exists());

    let mut writer = env.spawn(&["run", &lock, "touch", "wrote"]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) >= 1);
    let mut late = env.spawn(&["run", "--shared", &lock, "touch", "late-ran-2"]);
    wait_until("the late reader waits", PATIENCE, || {
        env.waiters(&lock) >= 2
    });
    let _ = writer.kill();
    let _ = writer.wait();
    assert_eq!(finish(&mut late), 0, "{}", stderr_left(&mut late));
    assert!(env.path("late-ran-2").exists() && !env.path("wrote").exists());
}

/// A reader whose dlock is SIGKILLed (its command goes down with it) frees its share, and
/// the other reader's share is untouched until it leaves too: where the server ends the hold
/// with the connection (a kernel lock, a database session) at once, so the writer waiting
/// behind both is granted within moments of the other's leaving; where the hold is a lease
/// (`LockServer::killed_holder_outlives_it`) only when that lease runs out, never before and
/// within a second after it.
pub fn a_killed_reader_frees_its_share(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let outlives = server.killed_holder_outlives_it();
    // The killed reader's lease; the longest a ZooKeeper test server grants a session.
    let lease = Duration::from_secs(4);
    let mut killed = if outlives {
        env.hold(&lock, &["--shared", "--ttl", "4s"])
    } else {
        env.hold(&lock, &["--shared"])
    };
    let mut other = env.hold(&lock, &["--shared"]);
    let mut writer = env.spawn(&["run", &lock, "touch", "written"]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) >= 1);
    killed.signal(Signal::SIGKILL);
    killed.wait();
    let killed_at = Instant::now();
    if outlives {
        other.signal(Signal::SIGTERM);
        other.wait();
        assert_eq!(holders(&env, &lock), 1, "the killed reader's share");
        assert!(
            !env.path("written").exists(),
            "the writer ran beside a killed reader's live lease"
        );
        assert_eq!(finish(&mut writer), 0, "{}", stderr_left(&mut writer));
        let took = killed_at.elapsed();
        assert!(
            took <= lease + Duration::from_secs(1),
            "the writer got the lock {took:?} after the reader was killed (--ttl 4s)"
        );
    } else {
        wait_until("the killed reader's share is gone", PATIENCE, || {
            holders(&env, &lock) == 1
        });
        assert!(
            !env.path("written").exists(),
            "the writer ran beside a reader"
        );
        assert!(env.waiters(&lock) >= 1, "the writer stopped waiting");
        other.signal(Signal::SIGKILL);
        other.wait();
        let killed_at = Instant::now();
        assert_eq!(finish(&mut writer), 0, "{}", stderr_left(&mut writer));
        let took = killed_at.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "the writer got the lock {took:?} after the last reader was killed"
        );
    }
    assert!(env.path("written").exists());
    assert!(env.is_free(&lock), "the killed reader's share outlived it");
}

/// `release --force` on a server frees every holder of a shared lock and names each: each
/// holder's dlock stops its command and exits 124, and the writer waiting behind them gets
/// the lock. Where the hold is a kernel lock (no lease: the file backend) it cannot be
/// broken: `release --force` refuses (77) and names every shared holder to stop.
pub fn release_force_frees_every_shared_holder(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("data");
    let mut readers: Vec<Holding> = (0..3)
        .map(|_| env.hold(&lock, &["--shared", "--kill-after", "5s"]))
        .collect();
    let mut writer = env.spawn(&["run", &lock, "touch", "written"]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) >= 1);
    let out = env.run(["release", "--force", &lock]);
    let said = format!("{}{}", stdout_of(&out), stderr_of(&out));
    for pid in readers.iter().map(Holding::pid) {
        assert!(
            said.contains(&format!("pid {pid}")),
            "release --force does not name holder {pid}: {}",
            describe(&out)
        );
    }
    if !super::capabilities(server).lease {
        assert_fails(&out, 77, "cannot break a kernel lock");
        let _ = writer.kill();
        let _ = writer.wait();
        return;
    }
    assert!(out.status.success(), "{}", describe(&out));
    for reader in &mut readers {
        let code = finish(&mut reader.child);
        assert_eq!(code, 124, "{}", stderr_left(&mut reader.child));
    }
    assert_eq!(finish(&mut writer), 0, "{}", stderr_left(&mut writer));
    assert!(env.path("written").exists());
    assert!(env.is_free(&lock), "a holder is left after release --force");
}

/// A reader behind a black-holed link is stopped (124) before the writer waiting behind it
/// gets the lock, as an exclusive holder is.
pub fn blackholed_reader_is_stopped_before_a_writer_gets_the_lock(server: &dyn LeaseServer) {
    let proxy = Proxy::start(server.port());
    let env = TestEnv::new(server.as_lock_server());
    let lock = lock_name("lock");
    let (mut reader, log) =
        env.stoppable_holder_with(&server.url_via(proxy.port), &lock, &["--shared"]);
    let mut writer = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo writer-started >> {}", log.display()),
        ])
        .spawn()
        .expect("spawn writer");
    wait_until("the writer queued", PATIENCE, || env.waiters(&lock) == 1);
    proxy.blackhole();
    let status = wait_within(&mut reader, PATIENCE);
    assert_eq!(
        status.code(),
        Some(124),
        "the reader must report the lost lock"
    );
    assert!(wait_within(&mut writer, PATIENCE).success());
    let order = std::fs::read_to_string(&log).expect("log");
    assert_eq!(
        order, "holder-stopped\nwriter-started\n",
        "the writer got in before the reader stopped"
    );
}

/// Expand the shared-lock promises into `#[test]`s for one backend with the `shared`
/// capability, in a module `$module`, each starting (or joining) its server with `$start`.
/// The cases that need another capability (`--limit`, `--min-hold`'s record, a server that
/// can free a hold) check it through the registry.
#[macro_export]
macro_rules! shared_contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@tests $start;
                many_shared_holders_hold_at_once,
                an_exclusive_run_waits_for_readers_and_excludes_them,
                a_writer_behind_readers_is_granted_once_they_all_leave,
                a_reader_behind_a_waiting_writer_waits_for_it,
                a_reader_behind_a_writer_waiting_at_the_server_waits_for_it,
                tokens_increase_across_shared_and_exclusive_holds,
                report_records_a_shared_run,
                shared_with_a_limit_is_refused,
                status_and_list_show_the_mode_and_every_holder,
                nested_runs_reenter_but_never_upgrade_a_shared_hold,
                a_nested_run_that_cannot_see_the_shared_hold_is_exclusive,
                shared_holders_and_a_semaphore_refuse_each_other,
                a_waiting_shared_run_keeps_to_wait_and_signals,
                min_hold_keeps_a_shared_hold_and_status_says_so,
                readers_behind_a_writer_that_gives_up_or_dies_get_in,
                a_killed_reader_frees_its_share,
                release_force_frees_every_shared_holder,
            );
        }
    };
}

/// The shared-lock promises of lease backends (a server that expires a silent holder's
/// lease), for those with the `shared` capability.
#[macro_export]
macro_rules! shared_lease_contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@tests $start;
                blackholed_reader_is_stopped_before_a_writer_gets_the_lock,
            );
        }
    };
}
