//! `dlock hold` and `dlock release`: a lock held for a shell rather than for one command
//! (docs/guide.md: "Holding a lock across commands"). The hold belongs to the shell that
//! evals dlock hold's output and ends with it, however it ends; a keeper renews it meanwhile.

use std::time::{Duration, Instant};

use crate::support::*;

/// A lease long enough that a lock freed within [`FREED_AT_ONCE`] was released, not left to
/// expire (within what every backend's leases allow).
fn long_ttl(server: &dyn LockServer) -> String {
    let kind = dlock::backend::kind_of_scheme(server.scheme()).expect("a registered scheme");
    let ttl = Duration::from_secs(20).max(kind.minimum_ttl);
    let ttl = kind.maximum_ttl.map_or(ttl, |max| ttl.min(max));
    format!("{}s", ttl.as_secs())
}

/// How soon a hold's lock is free after its shell ended: the keeper sees the end at once
/// (a pidfd) and releases; the rest is a busy machine's and the server's round trips.
const FREED_AT_ONCE: Duration = Duration::from_secs(5);

fn read_trimmed(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The shell that evals `dlock hold` owns the hold: the backend shows the keeper holding it
/// with the shell's token and "hold for pid SHELL"; a nested run re-enters it, a process outside
/// the shell with a copy of its DLOCK_HELD does not; the shell killed
/// with SIGKILL frees the lock at once, long before its lease could run out.
pub fn a_hold_belongs_to_its_shell_and_ends_when_the_shell_is_killed(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("hold");
    let ttl = long_ttl(server);
    let script = format!(
        "eval \"$(\"$DLOCK\" hold --ttl {ttl} {lock})\" || exit 9; \
         \"$DLOCK\" run -n {lock} true; echo $? > nested; \
         echo \"$DLOCK_FENCING_TOKEN\" > token; printf '%s' \"$DLOCK_HELD\" > held; \
         echo $$ > ready; exec sleep 1000"
    );
    let mut shell = env.shell(&script);
    let ready = env.path("ready");
    wait_until("the shell holds the lock", PATIENCE, || ready.exists());
    let status = env.status_json(&lock);
    let holder = &status["holders"][0];
    assert_eq!(
        holder["token_str"].as_str(),
        Some(read_trimmed(&env.path("token")).as_str()),
        "{status}"
    );
    assert_eq!(
        holder["command"].as_str(),
        Some(format!("hold for pid {}", shell.pid()).as_str()),
        "{status}"
    );
    assert_eq!(
        read_trimmed(&env.path("nested")),
        "0",
        "the nested run did not re-enter"
    );
    // The shell's DLOCK_HELD copied into a process outside it proves nothing: no re-entry.
    let held = read_trimmed(&env.path("held"));
    assert!(
        held.contains(&lock),
        "DLOCK_HELD {held:?} names no hold of {lock}"
    );
    let mut copied = env.dlock(["run", "-n", &lock, "true"]);
    copied.env("DLOCK_HELD", held);
    let out = output_within(copied, PATIENCE);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shell.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the shell");
    shell.wait();
    wait_until("the lock is free", PATIENCE, || env.is_free(&lock));
    assert!(
        killed.elapsed() <= FREED_AT_ONCE,
        "freed {:?} after its shell was killed (its lease is {ttl})",
        killed.elapsed()
    );
}

/// The keeper killed with SIGKILL leaves the lock to its lease (the file backend's kernel lock
/// and a session lock of PostgreSQL or MySQL end with the keeper's connection), and `dlock release` then says the hold had already ended (1).
pub fn a_killed_keeper_leaves_the_lock_to_its_lease(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("keeper");
    let script = format!(
        "eval \"$(\"$DLOCK\" hold {lock})\" || exit 9; echo \"$DLOCK_HOLD\" > handle; \
         while [ ! -e go ]; do sleep 0.05; done; \
         \"$DLOCK\" release {lock}; echo $? > released"
    );
    let mut shell = env.shell(&script);
    let handle = env.path("handle");
    wait_until("the shell holds the lock", PATIENCE, || {
        !read_trimmed(&handle).is_empty()
    });
    let keeper: i32 = read_trimmed(&handle)
        .split('.')
        .next()
        .and_then(|pid| pid.parse().ok())
        .expect("DLOCK_HOLD starts with the keeper's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(keeper),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the keeper");
    wait_until("the keeper is gone", PATIENCE, || !is_alive(keeper));
    let killed = Instant::now();
    if server.killed_holder_outlives_it() {
        assert!(!env.is_free(&lock), "the lease did not outlive its keeper");
    }
    wait_until("the lock is free", PATIENCE, || env.is_free(&lock));
    if let Some(ttl) = server.ttl().and_then(|t| humantime::parse_duration(t).ok()) {
        assert!(
            killed.elapsed() <= ttl + Duration::from_secs(2),
            "the lease of {ttl:?} ran {:?}",
            killed.elapsed()
        );
    }
    std::fs::write(env.path("go"), "").expect("go");
    shell.wait();
    assert_eq!(read_trimmed(&env.path("released")), "1");
}

/// A lost hold tells its shell: one `dlock:` line on its stderr, SIGTERM (`--on-lost term`),
/// and the outcome record says `lost`.
pub fn a_lost_hold_signals_its_shell_and_is_recorded(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("broken");
    let report = env.path("report.jsonl");
    let script = format!(
        "trap 'echo term > got; exit 7' TERM; \
         eval \"$(\"$DLOCK\" hold --report {report} {lock})\" || exit 9; touch ready; \
         i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
        report = report.display()
    );
    let mut shell = env.shell(&script);
    let ready = env.path("ready");
    wait_until("the shell holds the lock", PATIENCE, || ready.exists());
    server.break_hold(&env, &lock);
    let status = shell.wait();
    assert_eq!(status.code(), Some(7), "the shell was not sent SIGTERM");
    assert_eq!(read_trimmed(&env.path("got")), "term");
    let stderr = shell.stderr();
    assert_eq!(
        stderr.lines().filter(|l| l.contains("was lost")).count(),
        1,
        "not one line about the loss: {stderr}"
    );
    wait_until("the keeper's record", PATIENCE, || {
        read_trimmed(&report).contains("\"outcome\"")
    });
    let record: serde_json::Value =
        serde_json::from_str(&read_trimmed(&report)).expect("one JSON line");
    assert_eq!(record["outcome"], "lost", "{record}");
}

/// `dlock release NAME` ends your own hold (0, the lock free at once) and refuses one that is
/// not yours (77, the lock still held); a second release finds nothing (1). A hold nested in a
/// subshell re-enters the enclosing one, and its release leaves that one held. A hold of
/// several names (`--also`) exports each one's token, and the release of any ends them all.
pub fn release_ends_your_own_hold_and_refuses_anothers(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("rel");
    let also = format!("{lock}-also");
    let script = format!(
        "eval \"$(\"$DLOCK\" hold --also {also} {lock})\" || exit 9; \
         printf '%s\\n' \"$DLOCK_FENCING_TOKENS\" > tokens; \
         ( eval \"$(\"$DLOCK\" hold -n {lock})\" || exit 9; \"$DLOCK\" release {lock}; \
           echo $? > inner ); \"$DLOCK\" status {lock} > /dev/null; echo $? > kept; \
         touch ready; while [ ! -e go ]; do sleep 0.05; done; \
         \"$DLOCK\" release {also}; echo $? > released; \
         \"$DLOCK\" status {lock} > /dev/null; echo $? > free; \
         \"$DLOCK\" status {also} > /dev/null; echo $? > also-free; \
         \"$DLOCK\" release {lock}; echo $? > again"
    );
    let mut shell = env.shell(&script);
    let ready = env.path("ready");
    wait_until("the shell holds the lock", PATIENCE, || ready.exists());
    // Both names held by the keeper, each with the token the shell got for it.
    let tokens = read_trimmed(&env.path("tokens"));
    for name in [&lock, &also] {
        let status = env.status_json(name);
        let token = status["holders"][0]["token_str"].as_str().unwrap_or("none");
        assert!(
            tokens.lines().any(|line| line == format!("{token} {name}")),
            "DLOCK_FENCING_TOKENS {tokens:?} has no {token} {name}: {status}"
        );
    }
    assert_eq!(
        read_trimmed(&env.path("inner")),
        "0",
        "a nested hold's release"
    );
    assert_eq!(
        read_trimmed(&env.path("kept")),
        "0",
        "a nested hold's release ended the enclosing hold"
    );
    let out = env.run(["release", &lock]);
    assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--force"),
        "{}",
        describe(&out)
    );
    assert!(!env.is_free(&lock), "another's release ended the hold");
    std::fs::write(env.path("go"), "").expect("go");
    assert!(shell.wait().success());
    assert_eq!(read_trimmed(&env.path("released")), "0");
    assert_eq!(
        (
            read_trimmed(&env.path("free")),
            read_trimmed(&env.path("also-free"))
        ),
        ("1".into(), "1".into()),
        "not every name is free after the release"
    );
    assert_eq!(read_trimmed(&env.path("again")), "1");
}

/// A hold that belongs to no process (`--until-released`) ends at `--max-hold`, not before,
/// and a later release says it had ended (1). Meanwhile `eval "$(dlock hold -n NAME)"` fails
/// with 75.
pub fn max_hold_ends_a_forgotten_hold(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("forgot");
    let max_hold = Duration::from_secs(3);
    let started = Instant::now();
    let report = env.path("report.jsonl");
    let out = env.run([
        "hold",
        "--until-released",
        "--max-hold",
        "3s",
        "--report",
        report.to_str().expect("utf-8"),
        &lock,
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let assignments = stdout_of(&out);
    assert!(
        assignments.contains("DLOCK_HELD="),
        "no DLOCK_HELD: {assignments}"
    );
    // A busy hold fails `eval` with its status, for `|| exit` and `set -e`.
    let mut busy = env.shell(&format!(
        "eval \"$(\"$DLOCK\" hold -n {lock})\" || echo $? > busy"
    ));
    assert!(busy.wait().success());
    assert_eq!(read_trimmed(&env.path("busy")), "75");
    wait_until("the lock is free", PATIENCE, || env.is_free(&lock));
    assert!(
        started.elapsed() >= max_hold,
        "freed after {:?}, before --max-hold",
        started.elapsed()
    );
    wait_until("the keeper's record", PATIENCE, || {
        read_trimmed(&report).contains("\"outcome\"")
    });
    let record: serde_json::Value =
        serde_json::from_str(&read_trimmed(&report)).expect("one JSON line");
    assert_eq!(
        (&record["outcome"], &record["ended_by"]),
        (&"held".into(), &"max-hold".into()),
        "{record}"
    );
    let held = assignments
        .lines()
        .find_map(|line| line.strip_prefix("DLOCK_HELD='"))
        .and_then(|rest| rest.split_once('\'').map(|(value, _)| value.to_owned()))
        .expect("DLOCK_HELD's value");
    let release = output_within(
        {
            let mut command = env.dlock(["release", &lock]);
            command.env("DLOCK_HELD", held);
            command
        },
        PATIENCE,
    );
    assert_eq!(release.status.code(), Some(1), "{}", describe(&release));
}
