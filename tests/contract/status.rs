//! The contract: `status`, `list` and `check`, and the holder metadata they show (escaped
//! for terminals, with passwords masked).

use std::collections::HashSet;
use std::process::Stdio;

use crate::support::*;

pub fn status_reports_holder_and_exits_0_held_1_free(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(1), "free lock: {}", describe(&out));
    let holder = env.hold(&lock, &[]);
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains(&holder.pid().to_string()), "{text}");
    assert!(
        text.contains("sleep 1000") || text.contains("sh -c"),
        "command missing: {text}"
    );
    let quiet = env.run(["status", "-q", &lock]);
    assert_eq!(quiet.status.code(), Some(0));
    assert!(
        quiet.stdout.is_empty(),
        "status -q printed {}",
        describe(&quiet)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["status", "--json", &lock]).stdout).expect("json");
    let h = &json["holders"][0];
    assert_eq!(h["pid"].as_u64(), Some(u64::from(holder.pid() as u32)));
    assert!(h["token"].as_u64().is_some_and(|t| t > 0), "{json}");
    assert!(!h["host"].as_str().unwrap_or("").is_empty(), "{json}");
    assert!(!h["since"].as_str().unwrap_or("").is_empty(), "{json}");
    // The lease reads alike on every backend: one `ttl:` line, whatever the server tells.
    let ttl = text
        .lines()
        .filter(|l| l.starts_with("ttl:        "))
        .count();
    assert_eq!(ttl, 1, "{text}");
}

pub fn list_shows_held_locks(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let (a, b) = (lock_name("lock"), lock_name("lock"));
    let _ha = env.hold(&a, &[]);
    let _hb = env.hold(&b, &[]);
    let (json, names) = listed(&env, "");
    assert!(names.contains(&a) && names.contains(&b), "{json}");
    let text = stdout_of(&env.run(["list"]));
    assert!(text.contains(&a) && text.contains(&b), "{text}");
}

/// `list` is complete every time, or fails: back-to-back lists, each right after the locks
/// were read by `status` (a read that some servers' listings skip), show every held lock.
pub fn every_list_shows_every_held_lock(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let locks: Vec<String> = (0..3).map(|_| lock_name("lock")).collect();
    let _holders: Vec<Holding> = locks.iter().map(|l| env.hold(l, &[])).collect();
    for round in 0..10 {
        for lock in &locks {
            assert_eq!(env.run(["status", "-q", lock]).status.code(), Some(0));
        }
        let (json, names) = listed(&env, &format!("round {round}: "));
        let missing: Vec<&String> = locks.iter().filter(|l| !names.contains(*l)).collect();
        assert!(
            missing.is_empty(),
            "round {round}: {missing:?} missing from {json}"
        );
    }
}

/// `list --json`, which must succeed (`context` starts its failure message), and the names
/// it lists.
fn listed(env: &TestEnv, context: &str) -> (serde_json::Value, HashSet<String>) {
    let out = env.run(["list", "--json"]);
    assert!(out.status.success(), "{context}{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names = json
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|l| l["name"].as_str().map(str::to_owned))
        .collect();
    (json, names)
}

pub fn check_reports_ok(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(
        text.contains("round trip") && text.contains(server.scheme()),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["check", "--json"]).stdout).expect("json");
    assert_eq!(json["backend"], server.scheme());
}

/// `check` reads as one column, with one form for measured times (`5.7 ms`), and its JSON
/// has them typed: `round_trip_ms` a number, `facts` an object, the effective `settings`.
pub fn check_aligns_its_values_and_types_its_json(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    let columns: HashSet<usize> = text
        .lines()
        .filter(|l| *l != "ok")
        .map(|l| {
            l.find(": ").map_or(0, |at| {
                at + 2 + l[at + 2..].len() - l[at + 2..].trim_start().len()
            })
        })
        .collect();
    assert_eq!(columns.len(), 1, "values not in one column:\n{text}");
    let round_trip = text
        .lines()
        .find_map(|l| l.strip_prefix("round trip:"))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no round trip in {text}"));
    let (number, unit) = round_trip.split_once(' ').unwrap_or((round_trip, ""));
    assert!(
        number.parse::<f64>().is_ok() && ["ms", "s"].contains(&unit),
        "round trip as {round_trip:?}: {text}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["check", "--json"]).stdout).expect("json");
    assert!(json["round_trip_ms"].is_f64(), "{json}");
    assert!(json["round_trip_us"].is_u64(), "{json}");
    assert!(json["facts"].is_object(), "{json}");
    assert!(json["settings"]["ttl_ms"].is_u64(), "{json}");
}

/// `list` shows each holder's user, how long it has held and its token, and says so when
/// no lock is held.
pub fn list_shows_age_user_and_token_and_says_when_nothing_is_held(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let out = env.run(["list"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        stdout_of(&out).trim(),
        "no locks are held",
        "{}",
        describe(&out)
    );
    let lock = lock_name("listed");
    let holder = env.hold(&lock, &[]);
    let json = env.status_json(&lock);
    let token = json["holders"][0]["token_str"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let user = json["holders"][0]["user"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let text = stdout_of(&env.run(["list"]));
    let header = text.lines().next().unwrap_or_default();
    for column in ["USER", "HELD", "TOKEN"] {
        assert!(header.contains(column), "no {column} column: {text}");
    }
    let line = text
        .lines()
        .find(|l| l.contains(&format!(" {} ", holder.pid())))
        .unwrap_or_else(|| panic!("pid {} not listed: {text}", holder.pid()));
    assert!(line.contains(&format!(" {user} ")), "{text}");
    assert!(line.contains(&format!(" {token} ")), "{text}");
    let held = line
        .split_whitespace()
        .find_map(|word| humantime::parse_duration(word).ok())
        .unwrap_or_else(|| panic!("no age in {line}"));
    assert!(held < std::time::Duration::from_secs(60), "{line}");
}

/// A user name or command line with terminal escape sequences is shown escaped by `status`,
/// `list` and the conflict message.
pub fn holder_metadata_reaches_terminals_escaped(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let ready = env.path("ready");
    let script = format!(
        ": '\u{1b}[2J'; echo $$ > {}; exec sleep 1000",
        ready.display()
    );
    let mut holder = env
        .dlock(["run", &lock, "sh", "-c", &script])
        .env("USER", "evil\u{1b}]0;pwned\u{7}\u{9b}31m")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let status = env.run(["status", &lock]);
    let list = env.run(["list"]);
    let busy = env.run(["run", "--no-wait", &lock, "true"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(status.status.code(), Some(0), "{}", describe(&status));
    assert!(stdout_of(&status).contains("evil"), "{}", describe(&status));
    assert_eq!(busy.status.code(), Some(75), "{}", describe(&busy));
    for (what, out) in [
        ("status", &status),
        ("list", &list),
        ("run --no-wait", &busy),
    ] {
        for byte in [0x1b_u8, 0x07] {
            assert!(
                !out.stdout.contains(&byte) && !out.stderr.contains(&byte),
                "{what} printed a raw control character {byte:#x}: {}",
                describe(out)
            );
        }
        let text = format!("{}{}", stdout_of(out), stderr_of(out));
        assert!(!text.contains('\u{9b}'), "{what} printed a raw CSI: {text}");
    }
}

/// A nested `dlock run --url …://user:password@…` in a holder's command line is recorded
/// with the password masked: the metadata is stored on the backend and shown by `status`.
pub fn passwords_in_the_holders_command_line_are_not_stored(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let ready = env.path("ready");
    let script = format!(
        ": dlock run --url redis://:Hunter2Secret@h x -- y; echo $$ > {}; exec sleep 1000",
        ready.display()
    );
    let mut holder = env
        .dlock(["run", &lock, "sh", "-c", &script])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let status = env.run(["status", "--json", &lock]);
    let list = env.run(["list", "--json"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(status.status.code(), Some(0), "{}", describe(&status));
    assert!(
        stdout_of(&status).contains("redis://:***@h"),
        "{}",
        describe(&status)
    );
    for out in [&status, &list] {
        assert!(
            !stdout_of(out).contains("Hunter2Secret"),
            "{}",
            describe(out)
        );
    }
    server.assert_nothing_stored_contains("Hunter2Secret");
}

/// Secret-bearing options and variables in the holder's command line (`-pX` to the MySQL
/// client, `--password=X`, `--token X`, `MYSQL_PWD=X`, `PGPASSWORD=X`, `API_SECRET=X`) are
/// masked in what is stored and shown; with `--record-command off` (or
/// `DLOCK_RECORD_COMMAND=0`) no command line is stored at all.
pub fn secrets_in_the_holders_command_line_are_masked_or_not_recorded(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let words = "MYSQL_PWD=Pw1Secret PGPASSWORD=Pw2Secret API_SECRET=Pw3Secret mysql -pPw4Secret \
                 --password=Pw5Secret --token Pw6Secret";
    let hold = |lock: &str, extra: &[&str], variable: Option<&str>| {
        let ready = env.path(&format!("ready-{}", unique()));
        let script = format!(": {words}; echo $$ > {}; exec sleep 1000", ready.display());
        let mut args = vec!["run"];
        args.extend(extra);
        args.extend([lock, "sh", "-c", &script]);
        let mut command = env.dlock(&args);
        if let Some(variable) = variable {
            command.env("DLOCK_RECORD_COMMAND", variable);
        }
        let child = command.stderr(Stdio::null()).spawn().expect("spawn holder");
        let mut holding = Holding { child, ready };
        wait_until("holder ready", PATIENCE, || {
            std::fs::read_to_string(&holding.ready).is_ok_and(|s| s.ends_with('\n'))
        });
        let status = env.run(["status", lock]);
        let list = env.run(["list", "--json"]);
        let _ = holding.child.kill();
        let _ = holding.child.wait();
        // This lock's entry only: an earlier holder's lease may still be listed.
        let json: serde_json::Value = serde_json::from_slice(&list.stdout).expect("list --json");
        let listed = json
            .as_array()
            .and_then(|locks| locks.iter().find(|l| l["name"] == lock))
            .map(ToString::to_string)
            .unwrap_or_default();
        (stdout_of(&status), listed)
    };
    let lock = lock_name("masked");
    let (status, list) = hold(&lock, &[], None);
    assert!(
        status.contains(
            "MYSQL_PWD=*** PGPASSWORD=*** API_SECRET=*** mysql -p*** --password=*** --token ***"
        ),
        "{status}"
    );
    for shown in [&status, &list] {
        assert!(!shown.contains("Secret"), "a secret is shown: {shown}");
    }
    server.assert_nothing_stored_contains("Secret");
    for (extra, variable) in [
        (&["--record-command", "off"][..], None),
        (&[][..], Some("0")),
    ] {
        let lock = lock_name("unrecorded");
        let (status, list) = hold(&lock, extra, variable);
        assert!(status.contains("state:      held"), "{status}");
        assert!(!status.contains("command:"), "a command is shown: {status}");
        for shown in [&status, &list] {
            assert!(
                !shown.contains("MYSQL_PWD"),
                "the command is shown: {shown}"
            );
        }
    }
}

/// `status` names each process of this host that waits, with since when it waits: a waiter
/// that started after `before` shows a start no earlier than that (to the second the record
/// is rounded to), a wait no longer than the test has run, and leaves the list once it has
/// run.
pub fn status_shows_since_when_each_waiter_of_this_host_waits(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("waited");
    let mut holder = env.hold(&lock, &[]);
    let before = std::time::SystemTime::now();
    let started = std::time::Instant::now();
    let mut waiter = env
        .dlock(["run", &lock, "true"])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the waiter");
    let pid = u64::from(waiter.id());
    let mut shown = serde_json::Value::Null;
    wait_until("the waiter in status --json", PATIENCE, || {
        let out = env.run(["status", "--json", &lock]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let found = json["waiting_here"].as_array().and_then(|waiting| {
            waiting
                .iter()
                .find(|w| w["pid"].as_u64() == Some(pid))
                .cloned()
        });
        found.map(|w| shown = w).is_some()
    });
    let since = humantime::parse_rfc3339(shown["since"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("since is not RFC 3339 ({e}): {shown}"));
    let rounded = before - std::time::Duration::from_secs(1);
    assert!(since >= rounded, "waiting since before it started: {shown}");
    assert!(since <= std::time::SystemTime::now(), "{shown}");
    let waited = shown["waited_ms"].as_u64().expect("waited_ms");
    assert!(
        waited <= started.elapsed().as_millis() as u64 + 1000,
        "waited longer than the test ran: {shown}"
    );
    let stage = shown["stage"].as_str().unwrap_or_default();
    let expected = if server.scheme() == "file" {
        "lock file"
    } else {
        "server"
    };
    assert_eq!(stage, expected, "{shown}");
    assert!(
        shown["command"]
            .as_str()
            .unwrap_or_default()
            .contains(&lock),
        "{shown}"
    );
    let text = stdout_of(&env.run(["status", &lock]));
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("pid {pid},")) && l.contains("waiting since")),
        "{text}"
    );
    holder.signal(nix::sys::signal::Signal::SIGTERM);
    holder.wait();
    let status = wait_within(&mut waiter, PATIENCE);
    assert_eq!(status.code(), Some(0), "the waiter did not run");
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(["status", "--json", &lock]).stdout).unwrap_or_default();
    assert!(json["waiting_here"].is_null(), "{json}");
}

/// A waiter of this host that the server also lists in its queue is shown once.
pub fn status_shows_each_waiter_once(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("once");
    let _holder = env.hold(&lock, &[]);
    let waiter = Holding {
        child: env.spawn(&["run", &lock, "true"]),
        ready: env.path("never"),
    };
    let pid = u64::from(waiter.child.id());
    wait_until("the waiter in status", PATIENCE, || {
        let json = env.status_json(&lock);
        let here = json["waiting_here"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["pid"].as_u64() == Some(pid)));
        // Where the server keeps a queue, wait until it lists the waiter too.
        let queued = json["waiters"].as_u64() != Some(0);
        here && queued
    });
    let text = stdout_of(&env.run(["status", &lock]));
    let shown = text
        .lines()
        .filter(|l| l.contains(&format!("pid {pid} ")) || l.contains(&format!("pid {pid},")))
        .count();
    assert_eq!(shown, 1, "{text}");
}

/// A holder whose lock was released by force is stopping its command, not waiting: `status`
/// never lists it among this host's waiters.
pub fn a_holder_released_by_force_is_never_shown_waiting(server: &dyn LockServer) {
    if server.scheme() == "file" {
        // A kernel lock cannot be broken from outside (`release --force` refuses).
        return;
    }
    let env = TestEnv::new(server);
    let lock = lock_name("forced");
    let ready = env.path("forced-ready");
    // A command that takes its time to stop: the ex-holder lives on after the loss.
    let script = format!(
        "trap '' TERM; echo $$ > '{}'; while :; do sleep 0.05; done",
        ready.display()
    );
    let holder = Holding {
        child: env.spawn(&["run", "--kill-after", "3s", &lock, "sh", "-c", &script]),
        ready: ready.clone(),
    };
    wait_until("the holder holds", PATIENCE, || ready.exists());
    let pid = u64::from(holder.child.id());
    let out = env.run(["release", "--force", &lock]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let mut holder = holder;
    let deadline = std::time::Instant::now() + PATIENCE;
    // Until the ex-holder has stopped its command and exited (bounded).
    while holder.child.try_wait().ok().flatten().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the ex-holder never exited"
        );
        let json = env.status_json(&lock);
        let waiting = json["waiting_here"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["pid"].as_u64() == Some(pid)));
        assert!(!waiting, "the ex-holder {pid} shown waiting: {json}");
    }
}

/// How long the second run of [`since_counts_from_the_grant_not_from_the_wait`] waits: long
/// enough that a `since` taken when it started reads seconds older than its grant.
const WAITED: std::time::Duration = std::time::Duration::from_secs(4);

/// A holder's `since`, and the busy line's "held … for", count from its grant: a run that
/// waited W and then held H shows an age near H, not W + H.
pub fn since_counts_from_the_grant_not_from_the_wait(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("since");
    let mut first = env.hold(&lock, &[]);
    let ready = env.path("second-ready");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let second = Holding {
        child: env.spawn(&["run", &lock, "sh", "-c", &script]),
        ready: ready.clone(),
    };
    let pid = u64::from(second.child.id());
    wait_until("the second run waiting", PATIENCE, || {
        env.status_json(&lock)["waiting_here"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["pid"].as_u64() == Some(pid)))
    });
    // The wait under test, not a synchronisation: the second run is queued already.
    std::thread::sleep(WAITED);
    let released = std::time::SystemTime::now();
    first.signal(nix::sys::signal::Signal::SIGTERM);
    first.wait();
    wait_until("the second run holding", PATIENCE, || ready.exists());
    let mut json = serde_json::Value::Null;
    wait_until("status showing the second run holding", PATIENCE, || {
        json = env.status_json(&lock);
        json["holders"][0]["pid"].as_u64() == Some(pid)
    });
    let holder = &json["holders"][0];
    let since = humantime::parse_rfc3339(holder["since"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("since is not RFC 3339 ({e}): {json}"));
    // `since` is in whole seconds.
    let rounded = released - std::time::Duration::from_secs(1);
    assert!(
        since >= rounded,
        "since counts from before the grant ({:?} before the release): {json}",
        released.duration_since(since).unwrap_or_default()
    );
    let busy = env.run(["run", "--no-wait", &lock, "true"]);
    assert_eq!(busy.status.code(), Some(75), "{}", describe(&busy));
    let held_for = released.elapsed().unwrap_or_default() + std::time::Duration::from_secs(1);
    let line = String::from_utf8_lossy(&busy.stderr).into_owned();
    let said = line
        .split(" for ")
        .nth(1)
        .and_then(|rest| rest.split([' ', ',', ';', ')']).next())
        .and_then(|d| humantime::parse_duration(d).ok())
        .unwrap_or_else(|| panic!("no \"for <duration>\" in the busy line: {line}"));
    assert!(
        said <= held_for,
        "the busy line says held for {said:?}, the hold is {held_for:?} old: {line}"
    );
    drop(second);
}

/// Every JSON that shows a fencing token shows it exactly to every JSON tool: `token_str`
/// (status, list) and `last_token_str` hold the digits the command saw in
/// `DLOCK_FENCING_TOKEN`, read with `jq -r` (which reads numbers as doubles: PostgreSQL's
/// tokens are above 2^53), and so does the outcome record's `token_str`.
pub fn json_shows_each_token_exactly_for_every_json_tool(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let seen = env.path("token");
    let release = env.path("release");
    let script = format!(
        "echo $DLOCK_FENCING_TOKEN > {seen}.tmp; mv {seen}.tmp {seen}; \
         n=0; while [ ! -e {release} ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done",
        seen = seen.display(),
        release = release.display(),
    );
    let report = env.path("runs.jsonl");
    let report = report.to_str().expect("utf-8 path");
    let mut holder = env.spawn(&["run", "--report", report, &lock, "sh", "-c", &script]);
    wait_until("the holder runs", PATIENCE, || seen.exists());
    let token = std::fs::read_to_string(&seen)
        .expect("the token")
        .trim()
        .to_owned();
    assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "{token}");
    let jq = |filter: &str, json: &[u8]| {
        let mut child = std::process::Command::new("jq")
            .args(["-r", filter])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("jq is needed (apt-get install jq)");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(json)
            .expect("write to jq");
        let out = child.wait_with_output().expect("jq");
        assert!(out.status.success(), "jq {filter}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let status = env.run(["status", "--json", &lock]);
    assert_eq!(jq(".holders[0].token_str", &status.stdout), token);
    let last = jq(".last_token_str", &status.stdout);
    assert!(
        last == token || last == "null",
        "last_token_str {last}, token {token}"
    );
    let list = env.run(["list", "--json"]);
    let filter = format!(".[] | select(.name == \"{lock}\") | .holders[0].token_str");
    assert_eq!(jq(&filter, &list.stdout), token);
    std::fs::write(&release, "").expect("release the holder");
    let status = wait_within(&mut holder, PATIENCE);
    assert!(status.success(), "{}", stderr_left(&mut holder));
    let record = std::fs::read(report).expect("the outcome record");
    assert_eq!(jq(".token_str", &record), token);
}

/// The processes of this host that wait for a lock are shown as holders are: the secrets in
/// their command lines masked (a password in the waiter's own `--url` included), and a waiter
/// that records no command line (`--record-command off`, `DLOCK_RECORD_COMMAND=0`) shows
/// none, in `status`'s text and JSON alike.
pub fn waiters_command_lines_are_masked_or_not_shown(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("waiters");
    let mut holder = env.hold(&lock, &[]);
    let waiter = |extra: &[&str], variable: Option<&str>, words: &[&str]| {
        // Bounded: a waiter left by a failed test gives up by itself.
        let mut args = vec!["run", "--wait", "60s"];
        args.extend(extra);
        args.push(&lock);
        // `true` ignores its arguments: they are only there to be shown.
        args.push("true");
        args.extend(words);
        let mut command = env.dlock(&args);
        if let Some(variable) = variable {
            command.env("DLOCK_RECORD_COMMAND", variable);
        }
        command
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a waiter")
    };
    let mut masked = waiter(
        &[],
        None,
        &[
            "mysql",
            "-pPw1Secret",
            "--password=Pw2Secret",
            "redis://:Pw3Secret@h",
            "--pass",
            "Pw4Secret",
        ],
    );
    let mut unrecorded = waiter(&["--record-command", "off"], None, &["Unrecorded1"]);
    let mut unrecorded_by_variable = waiter(&[], Some("0"), &["Unrecorded2"]);
    let pids = [&masked, &unrecorded, &unrecorded_by_variable].map(|c| u64::from(c.id()));
    let mut json = serde_json::Value::Null;
    wait_until("every waiter in status --json", PATIENCE, || {
        json = env.status_json(&lock);
        let shown: Vec<u64> = json["waiting_here"]
            .as_array()
            .map(|waiting| waiting.iter().filter_map(|w| w["pid"].as_u64()).collect())
            .unwrap_or_default();
        pids.iter().all(|pid| shown.contains(pid))
    });
    let text = stdout_of(&env.run(["status", &lock]));
    holder.signal(nix::sys::signal::Signal::SIGTERM);
    holder.wait();
    for child in [&mut masked, &mut unrecorded, &mut unrecorded_by_variable] {
        assert_eq!(
            wait_within(child, PATIENCE).code(),
            Some(0),
            "a waiter failed"
        );
    }
    let command_of = |pid: u64| {
        json["waiting_here"]
            .as_array()
            .and_then(|waiting| waiting.iter().find(|w| w["pid"].as_u64() == Some(pid)))
            .map(|w| w["command"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    let shown = command_of(pids[0]);
    for part in [
        "mysql -p***",
        "--password=***",
        "redis://:***@h",
        "--pass ***",
    ] {
        assert!(shown.contains(part), "{part} is not in {shown:?}: {json}");
    }
    assert_eq!(command_of(pids[1]), "", "{json}");
    assert_eq!(command_of(pids[2]), "", "{json}");
    for out in [&json.to_string(), &text] {
        for hidden in ["Secret", "Unrecorded"] {
            assert!(!out.contains(hidden), "{hidden} is shown: {out}");
        }
    }
    assert!(text.contains("mysql -p***"), "{text}");
}

/// Characters that must not reach a terminal as they are: the line and paragraph separators,
/// a zero-width space, the byte-order mark and a right-to-left override.
pub const INVISIBLE: &str = "\u{2028}\u{2029}\u{200b}\u{feff}\u{202e}";

/// How many characters of one field of a holder's metadata dlock shows (docs/guide.md:
/// "Looking at locks"), before the `…` that marks the cut.
pub const MAX_SHOWN: usize = 256;

/// What dlock shows of a holder of `lock` whose metadata was written by hand, each field far
/// longer than dlock writes it and the command starting with [`INVISIBLE`]: `status`, `list`
/// (text and JSON), the conflict line, the outcome record and a CI log's waiting line each
/// show every field cut
/// to [`MAX_SHOWN`] characters and marked `…`, the text escapes the invisible characters, and
/// the JSON is still JSON.
pub fn oversized_holder_metadata_is_cut_and_escaped(env: &TestEnv, lock: &str) {
    let status = env.run(["status", lock]);
    let status_json = env.run(["status", "--json", lock]);
    let list = env.run(["list"]);
    let list_json = env.run(["list", "--json"]);
    let report = env.path("oversized.jsonl");
    let report = report.to_str().expect("utf-8 path");
    let busy = env.run(["run", "--no-wait", "--report", report, lock, "true"]);
    let waited = output_within(
        {
            let mut command = env.dlock(["run", "--wait", "2s", lock, "true"]);
            command.env("CI", "true");
            command
        },
        PATIENCE,
    );
    assert_eq!(status.status.code(), Some(0), "{}", describe(&status));
    assert_eq!(busy.status.code(), Some(75), "{}", describe(&busy));
    assert_eq!(waited.status.code(), Some(75), "{}", describe(&waited));
    assert!(
        stderr_of(&waited).contains("waiting for"),
        "{}",
        describe(&waited)
    );
    // Three fields of a holder on one line, and the words around them.
    let longest_line = 4 * MAX_SHOWN;
    for (what, out) in [
        ("status", &status),
        ("status --json", &status_json),
        ("list", &list),
        ("list --json", &list_json),
        ("run --no-wait", &busy),
        ("a CI log's waiting line", &waited),
    ] {
        let text = format!("{}{}", stdout_of(out), stderr_of(out));
        let longest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(
            longest <= longest_line,
            "{what} printed a line of {longest} characters"
        );
        assert!(text.contains('…'), "{what} does not mark the cut: {text}");
        if !what.ends_with("--json") {
            for c in INVISIBLE.chars() {
                assert!(
                    !text.contains(c),
                    "{what} printed U+{:04X} as it is: {text}",
                    u32::from(c)
                );
            }
            assert!(text.contains("\\u{2028}"), "{what}: {text}");
        }
    }
    let record = std::fs::read_to_string(report).expect("the busy run's outcome record");
    let record: serde_json::Value =
        serde_json::from_str(record.trim_end()).expect("one outcome record");
    for field in ["command", "host", "user"] {
        let value = record["holder"][field].as_str().unwrap_or_default();
        assert!(
            value.ends_with('…') && value.chars().count() == MAX_SHOWN + 1,
            "the outcome record's holder {field} is {} characters",
            value.chars().count()
        );
    }
    let status: serde_json::Value =
        serde_json::from_slice(&status_json.stdout).expect("status --json is JSON");
    let list: serde_json::Value =
        serde_json::from_slice(&list_json.stdout).expect("list --json is JSON");
    let listed = list
        .as_array()
        .and_then(|locks| locks.iter().find(|l| l["name"] == lock))
        .cloned()
        .unwrap_or_default();
    for (what, json) in [("status --json", &status), ("list --json", &listed)] {
        let holder = &json["holders"][0];
        for field in ["command", "host", "user", "version"] {
            let value = holder[field].as_str().unwrap_or_default();
            assert!(
                value.ends_with('…') && value.chars().count() == MAX_SHOWN + 1,
                "{what}: {field} is {} characters: {}",
                value.chars().count(),
                value.chars().take(80).collect::<String>()
            );
        }
        let command = holder["command"].as_str().unwrap_or_default();
        assert!(command.starts_with(INVISIBLE), "{what}: {command}");
    }
}

/// A semaphore (`--limit N`) says how many of its N slots are taken, in `status` and as each
/// holder's `limit` in `--json`; a lock of one slot says nothing of slots.
pub fn a_semaphore_says_how_many_of_its_slots_are_taken(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("slots");
    if !crate::contract::capabilities(server).limit {
        return;
    }
    let _first = env.hold(&lock, &["--limit", "3"]);
    let out = env.run(["status", &lock]);
    assert!(
        stdout_of(&out).contains("(1 of 3 slots, --limit 3)"),
        "{}",
        describe(&out)
    );
    let _second = env.hold(&lock, &["--limit", "3"]);
    let out = env.run(["status", &lock]);
    assert!(
        stdout_of(&out).contains("held by 2 holders (2 of 3 slots, --limit 3)"),
        "{}",
        describe(&out)
    );
    let json = env.status_json(&lock);
    let limits: Vec<u64> = json["holders"]
        .as_array()
        .map(|all| all.iter().filter_map(|h| h["limit"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(limits, [3, 3], "{json}");
    let single = lock_name("single");
    let _alone = env.hold(&single, &[]);
    let out = env.run(["status", &single]);
    assert!(!stdout_of(&out).contains("slots"), "{}", describe(&out));
}
