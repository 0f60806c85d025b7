//! The contract: what the command sees (its variables, no credentials, its stdin and
//! stdout untouched) and reentrancy (a nested run of a held lock, and what is not one).

use std::io::Write;
use std::process::Stdio;

use crate::support::*;

pub fn command_sees_lock_variables_and_no_credentials(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let out = output_within(
        {
            let mut c = env.dlock(["run", &lock, "env"]);
            // Credential-looking variables dlock does not consume are scrubbed too.
            c.env("DLOCK_OTHER_PASSWORD", "hunter2")
                .env("DLOCK_REDIS_PASSWORD", "hunter3");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let seen = stdout_of(&out);
    assert!(seen.contains(&format!("DLOCK_NAME={lock}\n")), "{seen}");
    assert!(
        seen.contains(&format!("DLOCK_BACKEND={}\n", server.scheme())),
        "{seen}"
    );
    assert!(seen.contains("DLOCK_HELD="), "{seen}");
    let token = seen
        .lines()
        .find_map(|l| l.strip_prefix("DLOCK_FENCING_TOKEN="))
        .expect("token variable");
    assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "token {token:?}");
    assert!(
        !seen.contains("hunter2") && !seen.contains("hunter3"),
        "a credential reached the command"
    );
}

pub fn stdin_and_stdout_pass_through_untouched(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let mut child = env
        .dlock(["run", &lock_name("lock"), "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let payload: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = {
        let payload = payload.clone();
        std::thread::spawn(move || stdin.write_all(&payload))
    };
    let mut echoed = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().expect("stdout"), &mut echoed)
        .expect("read");
    writer.join().expect("writer").expect("write");
    assert!(wait_within(&mut child, PATIENCE).success());
    assert!(echoed == payload, "stdout differs from stdin");
}

pub fn nested_run_of_a_held_lock_is_reentrant(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let other = lock_name("lock");
    let dlock = DLOCK;
    let script = format!(
        "{dlock} run --no-wait {lock} sh -c 'echo inner:$DLOCK_FENCING_TOKEN' && \
         {dlock} run --no-wait {other} sh -c 'echo other:$DLOCK_NAME'; echo outer:$DLOCK_FENCING_TOKEN"
    );
    let out = env.run(["run", &lock, "sh", "-c", &script]);
    assert!(
        out.status.success(),
        "nested run blocked on its own lock: {}",
        describe(&out)
    );
    let text = stdout_of(&out);
    let token = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_owned)
    };
    assert_eq!(token("inner:"), token("outer:"), "{text}");
    assert_eq!(token("other:").as_deref(), Some(other.as_str()), "{text}");
}

/// Reentrancy needs proof, not an environment: a process that copies a holder's DLOCK_HELD
/// (it is no descendant of the holder) acquires normally, so it finds the lock held.
pub fn a_copied_held_environment_is_not_reentrant(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let copied = env.path("held");
    let ready = env.path("ready");
    let script = format!(
        "printf %s \"$DLOCK_HELD\" > {held}; echo $$ > {ready}; exec sleep 1000",
        held = copied.display(),
        ready = ready.display()
    );
    let mut holder = env
        .dlock(["run", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let held = std::fs::read_to_string(&copied).expect("the holder's DLOCK_HELD");
    assert!(!held.is_empty(), "the holder's command saw no DLOCK_HELD");
    let out = output_within(
        {
            let mut command = env.dlock(["run", "--no-wait", &lock, "touch", "ran"]);
            command.env("DLOCK_HELD", &held);
            command
        },
        PATIENCE,
    );
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        !env.path("ran").exists(),
        "the copied environment ran under the lock"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

/// A background process left behind by a holder's command, run after that holder is gone
/// and someone else holds the lock, acquires normally (and so finds the lock held).
pub fn an_orphan_of_a_past_holder_acquires_normally(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let go = env.path("go");
    let result = env.path("result");
    let dlock = DLOCK;
    // The orphan waits (bounded) for the go file, then tries the lock without waiting.
    let script = format!(
        "( i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; \
           {dlock} run --no-wait {lock} touch {ran}; echo $? > {result}.tmp; mv {result}.tmp {result} ) \
           </dev/null >/dev/null 2>&1 &",
        go = go.display(),
        ran = env.path("ran").display(),
        result = result.display(),
    );
    let out = env.run(["run", &lock, "sh", "-c", &script]);
    assert!(out.status.success(), "{}", describe(&out));
    let _next = env.hold(&lock, &[]);
    std::fs::write(&go, "").expect("go file");
    wait_until("the orphan's attempt", PATIENCE, || result.exists());
    let status = std::fs::read_to_string(&result).expect("result");
    assert_eq!(
        status.trim(),
        "75",
        "the orphan ran under someone else's lock"
    );
    assert!(!env.path("ran").exists());
}

/// A `dlock run` inside the command, of the same lock and of another, reaches the server with
/// the credentials the outer run was given (in `DLOCK_URL` or `DLOCK_PASSWORD`), two levels
/// deep, while no password is in the command's environment.
pub fn nested_runs_reach_the_server_with_the_outer_credentials(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let other = lock_name("other");
    let dlock = DLOCK;
    let script = format!(
        "{dlock} run --no-wait {lock} sh -c 'echo inner:$DLOCK_FENCING_TOKEN' && \
         {dlock} run --no-wait {other} sh -c '{dlock} status {lock} >/dev/null && echo deeper:ok' && \
         echo outer:$DLOCK_FENCING_TOKEN; env"
    );
    let mut cases: Vec<(String, Option<String>)> = vec![(server.url(), None)];
    if let Some(url) = server.password_url() {
        cases.push((url.clone(), None));
        // The same password in DLOCK_PASSWORD, the URL naming only the user.
        let start = url.find("://").expect("a URL") + 3;
        let at = url.rfind('@').expect("user info");
        let colon = start + url[start..at].find(':').expect("a password");
        let without = format!("{}{}", &url[..colon], &url[at..]);
        cases.push((without, Some(url[colon + 1..at].to_owned())));
    }
    for (url, password) in cases {
        let out = output_within(
            {
                let mut c = env.dlock(["run", &lock, "sh", "-c", &script]);
                c.env("DLOCK_URL", &url);
                if let Some(password) = &password {
                    c.env("DLOCK_PASSWORD", password);
                }
                c
            },
            PATIENCE,
        );
        assert!(out.status.success(), "{url}: {}", describe(&out));
        let text = stdout_of(&out);
        let line = |prefix: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .map(str::to_owned)
        };
        assert!(line("inner:").is_some(), "{url}: {text}");
        assert_eq!(line("inner:"), line("outer:"), "{url}: {text}");
        assert_eq!(line("deeper:").as_deref(), Some("ok"), "{url}: {text}");
        let secret = password.clone().or_else(|| {
            let start = url.find("://")? + 3;
            let at = url.rfind('@')?;
            let colon = start + url[start..at].find(':')?;
            Some(url[colon + 1..at].to_owned())
        });
        if let Some(secret) = secret {
            assert!(
                !text.contains(&secret),
                "{url}: the password is in the command's environment: {text}"
            );
        }
    }
}
