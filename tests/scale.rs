//! Many clients on one name, at scale: N `dlock run`s started together on one name, each
//! doing a racy read-increment-write of a counter file under the lock, with a `mkdir` sentinel
//! that detects two commands inside at once and the fencing token appended in grant order.
//! Servers at their shipped connection limits: PostgreSQL `max_connections=100`, MariaDB
//! `max_connections=151`, ZooKeeper without `maxClientCnxns` (60 per client address).
//!
//! N is `DLOCK_SCALE_CLIENTS`. The test suite runs a smoke of 20 clients per backend, which
//! checks correctness only (every run succeeds, no two inside at once, no lost increment,
//! tokens increasing in grant order); the measurement is `scripts/scale`, which runs 1000 and
//! compares the wall times, which it reads from `DLOCK_SCALE_REPORT` (one line per backend).
//! Each backend's folder expands [`scale_test!`] with its server: `backends::NAME::scale`.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The command each client runs under the lock. `$D` is the test's directory.
const CRITICAL_SECTION: &str = r#"mkdir "$D/inside" 2>/dev/null || echo overlap >> "$D/overlaps"
n=$(cat "$D/counter"); echo $((n + 1)) > "$D/counter"
echo "$DLOCK_FENCING_TOKEN" >> "$D/tokens"
rmdir "$D/inside""#;

/// Bound for one whole run (all clients), generous for 1000 clients on a loaded machine.
const RUN_BOUND: Duration = Duration::from_secs(600);

fn clients() -> usize {
    env_count("DLOCK_SCALE_CLIENTS", 20)
}

/// Start the clients together, wait for all of them, check what the contention case checks, and
/// report the wall time.
pub fn seed_test(server: &dyn LockServer, label: &str) {
    let env = TestEnv::new(server);
    let n = clients();
    let dir = env.path("scale");
    std::fs::create_dir(&dir).expect("scale dir");
    std::fs::write(dir.join("counter"), "0\n").expect("counter");
    let lock = lock_name("seed");
    let started = Instant::now();
    let mut children: Vec<Child> = (0..n)
        .map(|_| {
            // The default TTL, as a user would run it (the harness's short test TTLs are for
            // tests of expiry; a thousand processes on two cores delay renewals).
            env.dlock([
                "run",
                "--ttl",
                "15s",
                "--wait",
                "10m",
                &lock,
                "sh",
                "-c",
                CRITICAL_SECTION,
            ])
            .env("D", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dlock")
        })
        .collect();
    let deadline = started + RUN_BOUND;
    let mut failures = Vec::new();
    for child in &mut children {
        let status = wait_within(child, deadline.saturating_duration_since(Instant::now()));
        if !status.success() {
            failures.push(format!("{status}: {}", stderr_left(child).trim()));
        }
    }
    let wall = started.elapsed();
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let tokens: Vec<u64> = read("tokens")
        .lines()
        .map(|t| t.trim().parse().expect("a numeric token"))
        .collect();
    let report = format!(
        "{label} clients={n} wall_ms={} count={} overlaps={} failed={} tokens={}",
        wall.as_millis(),
        read("counter").trim(),
        read("overlaps").lines().count(),
        failures.len(),
        tokens.len()
    );
    eprintln!("scale: {report}");
    append_report("DLOCK_SCALE_REPORT", "", &format!("{report}\n"));
    assert!(
        failures.is_empty(),
        "{} of {n} runs failed; first: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(read("overlaps"), "", "two commands were inside at once");
    assert_eq!(read("counter").trim(), n.to_string(), "lost increments");
    assert_eq!(tokens.len(), n, "every command saw a token");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens do not strictly increase in grant order"
    );
}

/// The scale test of one backend, `backends::NAME::scale`, expanded in its folder
/// (`tests/backends/NAME/mod.rs`) with its server at the shipped connection limits:
/// `crate::scale_test!("redis", RedisServer::start());`. `$label` names it in the report.
#[macro_export]
macro_rules! scale_test {
    ($label:expr, $start:expr) => {
        #[test]
        fn scale() {
            $crate::scale::seed_test(&$start, $label);
        }
    };
}
