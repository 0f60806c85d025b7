//! The contract: one holder at a time (or exactly `--limit` of them), increasing fencing
//! tokens, and names that are opaque and never collide.

use std::sync::Arc;

use crate::support::*;

pub fn mutual_exclusion_under_contention_with_increasing_tokens(server: &dyn LockServer) {
    contention(server, 16, 20);
}

/// `clients` threads each take one lock `runs` times, one after the other: every run
/// succeeds, no two commands are inside at once, and the tokens increase in entry order.
pub fn contention(server: &dyn LockServer, clients: usize, runs: usize) {
    let env = Arc::new(TestEnv::new(server));
    let lock = lock_name("lock");
    let sentinel = env.path("inside");
    let log = env.path("tokens");
    // mkdir fails if someone else is inside; tokens are appended in entry order.
    let script = format!(
        "mkdir {s} || echo OVERLAP >> {l}; echo $DLOCK_FENCING_TOKEN >> {l}; rmdir {s}",
        s = sentinel.display(),
        l = log.display()
    );
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let env = env.clone();
            let lock = lock.clone();
            let script = script.clone();
            std::thread::spawn(move || {
                for _ in 0..runs {
                    let out = env.run(["run", &lock, "sh", "-c", &script]);
                    assert!(out.status.success(), "{}", describe(&out));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("client thread");
    }
    let text = std::fs::read_to_string(&log).expect("token log");
    assert!(!text.contains("OVERLAP"), "two holders were inside at once");
    let tokens: Vec<u64> = text.lines().map(|l| l.parse().expect("token")).collect();
    assert_eq!(tokens.len(), clients * runs);
    for pair in tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "tokens not strictly increasing: {} then {}",
            pair[0],
            pair[1]
        );
    }
}

pub fn limit_allows_exactly_n_holders(server: &dyn LockServer) {
    let env = Arc::new(TestEnv::new(server));
    let lock = lock_name("lock");
    let dir = env.path("inside");
    std::fs::create_dir(&dir).expect("mkdir");
    let log = env.path("counts");
    // Each holder registers itself, records how many are inside, lingers, and leaves.
    let script = format!(
        "touch {d}/$$; ls {d} | wc -l >> {l}; sleep 0.2; rm {d}/$$",
        d = dir.display(),
        l = log.display()
    );
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let env = env.clone();
            let lock = lock.clone();
            let script = script.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let out = env.run(["run", "--limit", "3", &lock, "sh", "-c", &script]);
                    assert!(out.status.success(), "{}", describe(&out));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("client thread");
    }
    let counts: Vec<u32> = std::fs::read_to_string(&log)
        .expect("counts")
        .lines()
        .map(|l| l.trim().parse().expect("count"))
        .collect();
    assert_eq!(counts.len(), 24);
    assert!(
        counts.iter().all(|&c| c <= 3),
        "more than 3 holders at once: {counts:?}"
    );
    assert!(
        counts.contains(&3),
        "3 concurrent holders were never reached: {counts:?}"
    );
}

/// A run whose `--limit` differs from the current holders' is a usage error (64) on every
/// backend, before it waits, and its command does not run.
pub fn all_holders_must_agree_on_the_limit(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let _holder = env.hold(&lock, &["--limit", "2"]);
    for limit in ["3", "1"] {
        let out = env.run(["run", "--no-wait", "--limit", limit, &lock, "touch", "ran"]);
        assert_fails(&out, 64, "--limit 2");
        let out = env.run([
            "run", "--wait", "30s", "--limit", limit, &lock, "touch", "ran",
        ]);
        assert_fails(&out, 64, "--limit 2");
    }
    assert!(
        !env.path("ran").exists(),
        "a run with another --limit ran its command"
    );
    // The same limit is accepted beside the holder.
    let out = env.run(["run", "--no-wait", "--limit", "2", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

pub fn names_are_opaque_and_isolated(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let base = lock_name("lock");
    let names = [
        base.clone(),
        format!("{base}/b"),
        format!("{base}b"),
        format!("{base}:fence"),
        format!("../{base}"),
        ".".to_owned(),
        "..".to_owned(),
        format!("锁-{base}"),
        format!("{base} with spaces"),
        format!("{base}%2Fb"),
    ];
    // Hold every one of them at once: none may block another.
    let holders: Vec<Holding> = names.iter().map(|n| env.hold(n, &["--no-wait"])).collect();
    for n in &names {
        let out = env.run(["status", "--json", n]);
        assert_eq!(out.status.code(), Some(0), "{n}: {}", describe(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(json["name"], n.as_str());
        assert_eq!(
            json["holders"].as_array().map(Vec::len),
            Some(1),
            "{n}: {json}"
        );
    }
    drop(holders);
}
