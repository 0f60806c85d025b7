//! Shared locks (`--shared`, docs/guide.md: "Shared locks"): many shared holders or one
//! exclusive holder, a reader queues behind a waiting writer, `flock -s`/`flock -x` interop,
//! tokens, refusals, what the command and `status`/`list` see, and reentrancy. On the file
//! backend, the one with the `shared` capability.

use std::process::{Child, Command, Stdio};

use crate::support::*;

/// `dlock run ARGS` in the background, stderr kept for the failure message.
fn spawn(env: &TestEnv, args: &[&str]) -> Child {
    env.dlock(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock")
}

fn finish(child: &mut Child) -> i32 {
    let status = wait_within(child, PATIENCE);
    status.code().unwrap_or(-1)
}

/// The `--json` status of `name`.
fn status_json(env: &TestEnv, name: &str) -> serde_json::Value {
    let out = env.run(["status", "--json", name]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)))
}

/// A shell loop that waits (bounded) until `count` files match `pattern`, else exits 9.
fn until_files(pattern: &str, count: usize) -> String {
    format!(
        "n=0; while [ \"$(ls {pattern} 2>/dev/null | wc -l)\" -lt {count} ]; do \
         n=$((n+1)); [ $n -gt 2000 ] && exit 9; sleep 0.01; done"
    )
}

/// Four shared runs hold at once: each waits, holding, for a file from every other, which
/// only four simultaneous holders can all reach; each sees DLOCK_SHARED=1.
#[test]
fn many_shared_holders_hold_at_once_and_see_dlock_shared() {
    let (_server, env) = file_env();
    let barrier = until_files("in-*", 4);
    let mut readers: Vec<Child> = (0..4)
        .map(|i| {
            let script = format!("touch in-{i}; {barrier}; echo \"$DLOCK_SHARED\" > seen-{i}");
            spawn(&env, &["run", "--shared", "data", "sh", "-c", &script])
        })
        .collect();
    for (i, reader) in readers.iter_mut().enumerate() {
        let code = finish(reader);
        assert_eq!(code, 0, "reader {i}: {}", stderr_left(reader));
        let seen = std::fs::read_to_string(env.path(&format!("seen-{i}"))).expect("seen");
        assert_eq!(seen.trim(), "1", "reader {i} saw DLOCK_SHARED={seen}");
    }
    let out = env.run(["run", "data", "sh", "-c", "echo \"$DLOCK_SHARED\""]);
    assert_eq!(stdout_of(&out).trim(), "0", "{}", describe(&out));
}

/// The setting comes from DLOCK_SHARED and the config file too; `DLOCK_SHARED=0` beats the
/// config file.
#[test]
fn shared_is_read_from_the_environment_and_the_config_file() {
    let (_server, env) = file_env();
    let config = env.path("config.toml");
    std::fs::write(&config, "shared = true\n").expect("config");
    let config = config.display().to_string();
    let show = ["sh", "-c", "echo \"$DLOCK_SHARED\""];
    let mut from_env = env.dlock(["run", "data"].iter().chain(&show));
    from_env.env("DLOCK_SHARED", "1");
    let out = output_within(from_env, PATIENCE);
    assert_eq!(stdout_of(&out).trim(), "1", "{}", describe(&out));
    let out = env.run(["--config", &config, "run", "data"].iter().chain(&show));
    assert_eq!(stdout_of(&out).trim(), "1", "{}", describe(&out));
    let mut off = env.dlock(["--config", &config, "run", "data"].iter().chain(&show));
    off.env("DLOCK_SHARED", "0");
    let out = output_within(off, PATIENCE);
    assert_eq!(stdout_of(&out).trim(), "0", "{}", describe(&out));
}

/// An exclusive run waits while readers hold, and no reader gets in while it holds.
#[test]
fn an_exclusive_run_waits_for_readers_and_excludes_them() {
    let (_server, env) = file_env();
    let reader = env.hold("data", &["--shared"]);
    let mut writer = spawn(
        &env,
        &["run", "data", "sh", "-c", "touch writing; exec sleep 1000"],
    );
    wait_until("the writer waits", PATIENCE, || env.waiters("data") >= 1);
    assert!(
        !env.path("writing").exists(),
        "the writer ran beside a reader"
    );
    drop(reader);
    wait_until("the writer holds", PATIENCE, || {
        env.path("writing").exists()
    });
    let out = env.run(["run", "--shared", "--no-wait", "data", "true"]);
    assert_fails(&out, 75, "is held");
    let _ = writer.kill();
    let _ = writer.wait();
}

/// A reader that arrives while a writer waits queues behind that writer (no writer
/// starvation): it is counted waiting, `--no-wait` gives up, and it runs after the writer.
#[test]
fn a_reader_behind_a_waiting_writer_waits_for_it() {
    let (_server, env) = file_env();
    let first = env.hold("data", &["--shared"]);
    let mut writer = spawn(&env, &["run", "data", "touch", "writer-done"]);
    wait_until("the writer waits", PATIENCE, || env.waiters("data") >= 1);
    let out = env.run(["run", "--shared", "--no-wait", "data", "true"]);
    assert_fails(&out, 75, "is held");
    let mut late = spawn(
        &env,
        &[
            "run",
            "--shared",
            "data",
            "sh",
            "-c",
            "if [ -e writer-done ]; then echo after > late; else echo before > late; fi",
        ],
    );
    wait_until("the late reader waits", PATIENCE, || {
        env.waiters("data") >= 2
    });
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
}

/// `flock -s` on the lock file shares with `dlock run --shared`; `flock -x` excludes both,
/// and dlock's exclusive run excludes `flock -s`.
#[test]
fn flock_s_shares_and_flock_x_excludes() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    env.token("data");
    let file = server.dir.path().join("data.lock");
    let file = file.to_str().expect("utf-8 path");
    let ready = env.path("flock-ready");
    // One process that holds the lock itself, so that killing it (by pid) frees the lock.
    let mut flock_s = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec 9<>'{file}'; flock -s 9; touch '{}'; exec sleep 1000",
            ready.display()
        ))
        .spawn()
        .expect("flock");
    wait_until("flock -s holds", PATIENCE, || ready.exists());
    let out = env.run(["run", "--shared", "--no-wait", "data", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--no-wait", "data", "true"]);
    assert_fails(&out, 75, "is held");
    // /proc/locks names the flock(1) that took the lock (it has exited; its shell holds it).
    let status = status_json(&env, "data");
    assert_eq!(
        status["holders"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
    assert_eq!(status["holders"][0]["mode"], "shared", "{status}");
    let _ = flock_s.kill();
    let _ = flock_s.wait();

    let reader = env.hold("data", &["--shared"]);
    let probe = |mode: &str| {
        let out = output_within(
            {
                let mut c = Command::new("flock");
                c.args(["-n", mode, file, "true"]);
                c
            },
            PATIENCE,
        );
        out.status.code()
    };
    assert_eq!(probe("-s"), Some(0), "flock -s beside dlock --shared");
    assert_eq!(probe("-x"), Some(1), "flock -x beside dlock --shared");
    drop(reader);
    let writer = env.hold("data", &[]);
    assert_eq!(probe("-s"), Some(1), "flock -s beside an exclusive dlock");
    drop(writer);
}

/// Every hold takes the next token of the name, shared or not: a writer's token is larger
/// than every earlier one, a reader's larger than the last writer's, also beside another
/// reader.
#[test]
fn tokens_increase_across_shared_and_exclusive_holds() {
    let (_server, env) = file_env();
    let shared_token = || {
        let out = env.run([
            "run",
            "--shared",
            "data",
            "sh",
            "-c",
            "echo $DLOCK_FENCING_TOKEN",
        ]);
        assert!(out.status.success(), "{}", describe(&out));
        stdout_of(&out).trim().parse::<u64>().expect("a token")
    };
    let w1 = env.token("data");
    let r1 = shared_token();
    let holder = env.hold("data", &["--shared"]);
    let held = status_json(&env, "data")["holders"][0]["token"]
        .as_u64()
        .expect("holder token");
    let r2 = shared_token();
    drop(holder);
    let w2 = env.token("data");
    assert!(
        w1 < r1 && r1 < held && held < r2 && r2 < w2,
        "{w1} {r1} {held} {r2} {w2}"
    );
}

/// A backend without the capability refuses `--shared` (and DLOCK_SHARED) with 64, naming
/// itself, before it runs anything.
#[test]
fn a_backend_without_shared_locks_refuses_them() {
    let server = MemcachedServer::shared();
    let env = TestEnv::new(&*server);
    let out = env.run(["run", "--shared", "data", "touch", "ran"]);
    assert_fails(&out, 64, "memcached");
    assert!(
        stderr_of(&out).contains("does not offer shared locks"),
        "{}",
        describe(&out)
    );
    let mut from_env = env.dlock(["run", "data", "touch", "ran"]);
    from_env.env("DLOCK_SHARED", "1");
    let out = output_within(from_env, PATIENCE);
    assert_fails(&out, 64, "DLOCK_SHARED");
    assert!(!env.path("ran").exists());
}

#[test]
fn shared_with_a_limit_is_refused() {
    let (_server, env) = file_env();
    let out = env.run(["run", "--shared", "--limit", "2", "data", "touch", "ran"]);
    assert_fails(&out, 64, "--limit 2");
    assert!(!env.path("ran").exists());
}

/// `status` and `list`, in text and JSON, show the mode and every shared holder.
#[test]
fn status_and_list_show_the_mode_and_every_holder() {
    let (_server, env) = file_env();
    let a = env.hold("data", &["--shared"]);
    let b = env.hold("data", &["--shared"]);
    let status = status_json(&env, "data");
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
    let text = stdout_of(&env.run(["status", "data"]));
    assert_eq!(text.matches("mode:       shared").count(), 2, "{text}");
    let list = stdout_of(&env.run(["list"]));
    assert_eq!(list.matches(" shared ").count(), 2, "{list}");
    let listed: serde_json::Value =
        serde_json::from_slice(&env.run(["list", "--json"]).stdout).expect("list json");
    assert_eq!(listed[0]["holders"].as_array().map(Vec::len), Some(2));
    drop((a, b));
    let _w = env.hold("data", &[]);
    let status = status_json(&env, "data");
    assert_eq!(status["holders"][0]["mode"], "exclusive", "{status}");
    let text = stdout_of(&env.run(["status", "data"]));
    assert!(text.contains("mode:       exclusive"), "{text}");
}

/// Nested runs of the same name: shared inside shared or exclusive re-enters; exclusive
/// inside shared is refused (64), never a silent upgrade. A nested dlock takes the outer
/// mode from DLOCK_SHARED unless told otherwise.
#[test]
fn nested_runs_reenter_but_never_upgrade_a_shared_hold() {
    let (_server, env) = file_env();
    let nested = |outer: &[&str], inner: &str| {
        let script = format!("{inner} {DLOCK} run --no-wait data sh -c 'echo \"$DLOCK_SHARED\"'");
        let mut args = vec!["run"];
        args.extend(outer);
        args.extend(["data", "sh", "-c", &script]);
        env.run(&args)
    };
    let out = nested(&["--shared"], "");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "1");
    let out = nested(&[], "DLOCK_SHARED=1");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "1");
    let out = nested(&["--shared"], "DLOCK_SHARED=0");
    assert_fails(&out, 64, "upgrade");
    assert!(stdout_of(&out).is_empty(), "{}", describe(&out));
}

/// Shared holders hold with `--limit 1`: a `--limit 3` run beside them is refused (64), as
/// beside any holder with another limit, and so is a shared run beside a `--limit 3` holder.
#[test]
fn shared_holders_and_a_semaphore_refuse_each_other() {
    let (_server, env) = file_env();
    let reader = env.hold("data", &["--shared"]);
    let out = env.run(["run", "--limit", "3", "--no-wait", "data", "touch", "ran"]);
    assert_fails(&out, 64, "--limit 1");
    drop(reader);
    let _semaphore = env.hold("data", &["--limit", "3"]);
    let _other = env.hold("data", &["--limit", "3"]);
    let out = env.run(["run", "--shared", "--no-wait", "data", "touch", "ran"]);
    assert_fails(&out, 64, "--limit 3");
    assert!(!env.path("ran").exists());
}

/// A shared run keeps to `--wait` behind an exclusive holder (75, in time), and a signal
/// while it waits cancels it (128+N) and leaves no waiter behind.
#[test]
fn a_waiting_shared_run_keeps_to_wait_and_signals() {
    let (_server, env) = file_env();
    let _writer = env.hold("data", &[]);
    let started = std::time::Instant::now();
    let out = env.run(["run", "--shared", "--wait", "1s", "data", "touch", "ran"]);
    assert_fails(&out, 75, "is held");
    assert!(started.elapsed() < std::time::Duration::from_secs(1) + PAST_WAIT);
    let mut reader = spawn(&env, &["run", "--shared", "data", "touch", "ran"]);
    wait_until("the reader waits", PATIENCE, || env.waiters("data") >= 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(reader.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal the reader");
    assert_eq!(
        finish(&mut reader),
        128 + 15,
        "{}",
        stderr_left(&mut reader)
    );
    assert_eq!(env.waiters("data"), 0);
    assert!(!env.path("ran").exists());
}

/// `--min-hold` keeps a shared hold after its command, and `status` says so from the
/// holder's own record.
#[test]
fn min_hold_keeps_a_shared_hold_and_status_says_so() {
    let (_server, env) = file_env();
    let mut reader = spawn(
        &env,
        &["run", "--shared", "--min-hold", "1h", "data", "true"],
    );
    wait_until("the command has finished", PATIENCE, || {
        status_json(&env, "data")["holders"][0]["kept_until"].is_string()
    });
    let out = env.run(["run", "--no-wait", "data", "true"]);
    assert_fails(&out, 75, "is held");
    let out = env.run(["run", "--shared", "--no-wait", "data", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let _ = reader.kill();
    let _ = reader.wait();
}

/// `release --force` cannot break kernel locks, shared ones included: it refuses (77) and
/// names every shared holder to stop.
#[test]
fn release_force_refuses_and_names_every_shared_holder() {
    let (_server, env) = file_env();
    let a = env.hold("data", &["--shared"]);
    let b = env.hold("data", &["--shared"]);
    let out = env.run(["release", "--force", "data"]);
    assert_fails(&out, 77, "cannot break a kernel lock");
    // In the kernel's order, which is not the order of arrival.
    let stderr = stderr_of(&out);
    let named = [a.pid(), b.pid()].map(|pid| stderr.contains(&format!("pid {pid}")));
    assert_eq!(named, [true, true], "{}", describe(&out));
}
