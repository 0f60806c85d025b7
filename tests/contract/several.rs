//! The contract: several names in one run (`--also NAME`). Every name is an ordinary hold
//! with its own token; they are taken all or none, in one order whatever order they are given
//! in, and the run loses the lock when it loses any one of them.

use std::process::Stdio;
use std::sync::Arc;

use crate::support::*;

/// How long a case waits for its holder's command to show that it runs (bounded like every
/// wait here).
fn wait_for_file(path: &std::path::Path) {
    wait_until(&format!("{}", path.display()), PATIENCE, || {
        std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n'))
    });
}

/// The command sees `DLOCK_FENCING_TOKENS`, a line `TOKEN NAME` per name (NAME first, then
/// the `--also` names as given, not in the order they were taken), and each token is the one
/// `status` shows for that name while the command runs.
pub fn several_names_each_have_their_token_in_dlock_fencing_tokens(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    // Given as m, z, a: taken as a, m, z.
    let (first, second, third) = (lock_name("m"), lock_name("z"), lock_name("a"));
    let seen = env.path("tokens");
    let script = format!(
        "{{ printf '%s\\n' \"$DLOCK_FENCING_TOKENS\"; echo \"$DLOCK_FENCING_TOKEN main\"; }} \
         > {seen}.tmp && mv {seen}.tmp {seen}; exec sleep 1000",
        seen = seen.display()
    );
    let mut holder = env.spawn(&[
        "run", "--also", &second, "--also", &third, &first, "sh", "-c", &script,
    ]);
    wait_for_file(&seen);
    let text = std::fs::read_to_string(&seen).expect("the tokens");
    let lines: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .collect();
    let names: Vec<&str> = lines.iter().map(|(_, name)| *name).collect();
    assert_eq!(
        names,
        [first.as_str(), second.as_str(), third.as_str(), "main"],
        "{text}"
    );
    for (token, name) in &lines[..3] {
        assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "{text}");
        let status = env.status_json(name);
        assert_eq!(
            status["holders"][0]["token_str"].as_str(),
            Some(*token),
            "{name}: {status}"
        );
    }
    assert_eq!(lines[3].1, "main");
    assert_eq!(
        lines[3].0, lines[0].0,
        "DLOCK_FENCING_TOKEN is NAME's: {text}"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

/// All or none: with one of the names held elsewhere and a short `--wait`, the run is not
/// acquired (75), the command does not run, and the name it had taken is given back.
pub fn several_names_are_taken_all_or_none_within_the_wait(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    // `a…` sorts first, so it is taken before `b…` is found held.
    let (free, held) = (lock_name("a"), lock_name("b"));
    let _holder = env.hold(&held, &[]);
    let out = env.run([
        "run", "--wait", "300ms", "--also", &held, &free, "touch", "ran",
    ]);
    assert_fails(&out, 75, &held);
    assert!(!env.path("ran").exists(), "the command ran");
    let status = env.run(["status", &free]);
    assert_eq!(
        status.status.code(),
        Some(1),
        "'{free}' was left held: {}",
        describe(&status)
    );
    assert_eq!(
        env.waiters(&free),
        0,
        "a waiter for '{free}' was left behind"
    );
}

/// Losing any one name (here an `--also` one, broken behind dlock's back) stops the command
/// and the run exits 124, naming the name that was lost; every name is free afterwards.
pub fn several_names_are_lost_when_any_one_is_lost(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let (name, also) = (lock_name("a"), lock_name("b"));
    let ready = env.path("ready");
    let script = format!("echo ok > {}; exec sleep 1000", ready.display());
    let mut dlock = env
        .dlock([
            "run",
            "--kill-after",
            "2s",
            "--also",
            &also,
            &name,
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for_file(&ready);
    server.break_hold(&env, &also);
    let status = wait_within(&mut dlock, PATIENCE);
    let stderr = stderr_left(&mut dlock);
    assert_eq!(status.code(), Some(124), "{stderr}");
    assert!(
        stderr.contains("lost") && stderr.contains(&also),
        "the loss of '{also}' is not told: {stderr}"
    );
    wait_until("both names free", PATIENCE, || {
        [&name, &also]
            .iter()
            .all(|n| env.run(["status", n]).status.code() == Some(1))
    });
}

/// Two clients take the same two names again and again, each naming them in the opposite
/// order: every run gets both (nobody waits for ever on a name the other holds while it
/// waits for the other), and no two commands overlap.
pub fn several_names_in_opposite_orders_never_deadlock(server: &dyn LockServer) {
    const RUNS: usize = 8;
    let env = Arc::new(TestEnv::new(server));
    let (a, b) = (lock_name("a"), lock_name("b"));
    let sentinel = env.path("inside");
    let log = env.path("log");
    let script = format!(
        "mkdir {s} || echo OVERLAP >> {l}; echo in >> {l}; rmdir {s}",
        s = sentinel.display(),
        l = log.display()
    );
    let clients: Vec<_> = [(a.clone(), b.clone()), (b, a)]
        .into_iter()
        .map(|(name, also)| {
            let env = env.clone();
            let script = script.clone();
            std::thread::spawn(move || {
                for _ in 0..RUNS {
                    // A deadlock would end in 75 after the wait, not hang the test.
                    let out = env.run([
                        "run", "--wait", "10s", "--also", &also, &name, "sh", "-c", &script,
                    ]);
                    assert!(out.status.success(), "{}", describe(&out));
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("client thread");
    }
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains("OVERLAP"), "two holders were inside at once");
    assert_eq!(text.lines().count(), 2 * RUNS);
}

/// A nested `dlock run` of an `--also` name inside the command re-enters the outer run's
/// hold (it runs at once, with that name's token), as a nested run of NAME does.
pub fn several_names_let_a_nested_run_of_any_of_them_reenter(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let (name, also) = (lock_name("db"), lock_name("cache"));
    let dlock = DLOCK;
    let script = format!(
        "{dlock} run --no-wait {also} sh -c 'echo inner:$DLOCK_FENCING_TOKEN' && \
         printf '%s\\n' \"$DLOCK_FENCING_TOKENS\""
    );
    let out = env.run(["run", "--also", &also, &name, "sh", "-c", &script]);
    assert!(
        out.status.success(),
        "the nested run did not re-enter: {}",
        describe(&out)
    );
    let text = stdout_of(&out);
    let inner = text.lines().find_map(|l| l.strip_prefix("inner:"));
    let outer = text
        .lines()
        .find_map(|l| l.strip_suffix(&format!(" {also}")));
    assert!(inner.is_some_and(|t| !t.is_empty()), "{text}");
    assert_eq!(
        inner, outer,
        "the nested run's token is not '{also}''s: {text}"
    );
}

/// While a run waits for a later name, its waiting line (here in a CI log) names that name
/// and its holder, not one the run has taken already.
pub fn several_names_say_which_one_they_wait_for(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    // `a…` sorts first: taken at once; `b…` is held.
    let (free, held) = (lock_name("a"), lock_name("b"));
    let mut holder = env.hold(&held, &[]);
    let log = env.path("stderr");
    let stderr = std::fs::File::create(&log).expect("stderr file");
    let mut waiter = env
        .dlock(["run", "--also", &held, &free, "true"])
        .env("CI", "true")
        .stderr(stderr)
        .spawn()
        .expect("spawn");
    let line = format!("waiting for '{held}': held by pid {}", holder.pid());
    wait_until("the waiting line", PATIENCE, || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains(&line))
    });
    holder.signal(nix::sys::signal::Signal::SIGTERM);
    holder.wait();
    let status = wait_within(&mut waiter, PATIENCE);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}: {text}");
    assert!(!text.contains(&format!("waiting for '{free}'")), "{text}");
}
