//! What only Azure's blob leases can get wrong: the service's 15–60 s bounds, the token
//! counter in the blob's metadata across every way a hold ends, a break by
//! `release --force`, a host whose wall clock is wrong, and the requests a run costs.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// The blob of `lock` under the test's prefix, as the service names it.
fn blob_of(env: &TestEnv, lock: &str) -> String {
    let prefix = env.prefix.clone().unwrap_or_else(|| "dlock".to_owned());
    format!("{prefix}/{lock}")
}

/// `--ttl` outside the 15 to 60 s a blob lease lasts is a usage error saying so, before
/// anything runs; the default TTL (15 s) is taken.
#[test]
fn a_ttl_outside_what_a_blob_lease_lasts_is_refused_and_the_default_is_taken() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("ttl");
    for ttl in ["14s", "61s", "2m"] {
        let out = env.run(["run", "--ttl", ttl, &lock, "touch", "ran"]);
        assert_fails(
            &out,
            64,
            &format!("'{ttl}' is not a lease Azure Blob can keep: its leases last 15s to 1m"),
        );
        assert!(!env.path("ran").exists(), "the command ran with --ttl {ttl}");
    }
    let out = env.run(["run", "--ttl", "60s", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let mut default = TestEnv::new(&server);
    default.ttl = None;
    let out = default.run(["run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// The token counter is kept in the lock's blob and only ever written under the lease: it
/// goes up by one per grant across a release, a `release --force` and a lease that ran out.
#[test]
fn tokens_increase_across_release_force_and_expiry() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("tokens");
    let first = env.token(&lock);
    let released = env.token(&lock);
    assert_eq!(released, first + 1, "after a release");

    let mut holder = env.hold(&lock, &[]);
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    let forced = env.token(&lock);
    assert_eq!(forced, released + 2, "after a break");
    assert_eq!(holder.wait().code(), Some(124), "the broken holder stops");

    let mut holder = env.hold(&lock, &[]);
    holder.signal(Signal::SIGKILL);
    holder.wait();
    // The killed holder's lease runs out on the service's clock within its 15 s.
    let out = env.run(["run", "--wait", "30s", &lock, "sh", "-c", "echo $DLOCK_FENCING_TOKEN"]);
    assert!(out.status.success(), "{}", describe(&out));
    let expired: u64 = stdout_of(&out).trim().parse().expect("a token");
    assert_eq!(expired, forced + 2, "after an expiry");
}

/// `release --force` breaks the lease at once: the blob's lease is broken, `status` shows
/// the lock free, and the holder notices at its next renewal and stops (124).
#[test]
fn release_force_breaks_the_lease_and_the_holder_stops() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("break");
    let mut holder = env.hold(&lock, &[]);
    let blob = blob_of(&env, &lock);
    assert_eq!(server.blobs(&blob), vec![(blob.clone(), "leased".to_owned())]);
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(server.blobs(&blob), vec![(blob.clone(), "broken".to_owned())]);
    assert_eq!(env.run(["status", &lock]).status.code(), Some(1), "free");
    let started = Instant::now();
    assert_eq!(holder.wait().code(), Some(124));
    // Renewed every TTL/3: the break is seen within 5 s and a renewal's time.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(holder.stderr().contains("broken"), "the loss names the break");
}

/// The service keeps the lease on its own clock: a holder whose wall clock is ten minutes
/// ahead keeps the lock past several TTLs, a waiter whose clock is ten minutes behind does not
/// take it from them, and gets it once the holder is gone.
#[test]
fn a_host_whose_wall_clock_is_ten_minutes_off_holds_and_loses_as_usual() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("skew");
    let ready = env.path("ready");
    let mut holder = env
        .skewed(
            &[
                "run",
                &lock,
                "sh",
                "-c",
                &format!("touch '{}'; exec sleep 1000", ready.display()),
            ],
            600,
        )
    .spawn()
    .expect("spawn the holder");
    wait_until("the skewed holder holds", PATIENCE, || ready.exists());
    // Longer than the lease: the holder renews on the service's clock, whatever its own says.
    let out = output_within(env.skewed(&["run", "--wait", "18s", &lock, "true"], -600), PATIENCE);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert_eq!(holder.try_wait().expect("try_wait"), None, "the holder is still running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        Signal::SIGKILL,
    )
    .expect("kill the holder");
    wait_within(&mut holder, PATIENCE);
    let out = output_within(env.skewed(&["run", "--wait", "30s", &lock, "true"], -600), PATIENCE * 2);
    assert!(out.status.success(), "{}", describe(&out));
}

/// The requests of one run, from its `-vv` log (`azure: OPERATION -> STATUS`).
fn requests(out: &std::process::Output) -> Vec<String> {
    stderr_of(out)
        .lines()
        .filter_map(|l| l.strip_prefix("dlock: debug: azure: "))
        .map(str::to_owned)
        .collect()
}

/// An uncontended run of an existing lock is four requests: the lease, the token's read, the
/// record's write, the release; the first run of a name two more (the blob's creation).
#[test]
fn an_uncontended_run_costs_four_requests() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("cost");
    let first = env.run(["run", "-vv", &lock, "true"]);
    assert!(first.status.success(), "{}", describe(&first));
    assert_eq!(
        requests(&first),
        [
            "lease acquire -> 404",
            "put blob -> 201",
            "lease acquire -> 201",
            "get blob properties -> 200",
            "put blob -> 201",
            "lease release -> 200"
        ]
    );
    let next = env.run(["run", "-vv", &lock, "true"]);
    assert_eq!(
        requests(&next),
        [
            "lease acquire -> 201",
            "get blob properties -> 200",
            "put blob -> 201",
            "lease release -> 200"
        ]
    );
}

/// The service's error code reaches the message: a lease taken by another program (not
/// dlock) keeps dlock waiting, and a blob that is not dlock's is named.
#[test]
fn a_lease_another_program_holds_is_waited_for() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("foreign");
    assert!(env.run(["run", &lock, "true"]).status.success());
    let path = format!("/{CONTAINER}/{}", blob_of(&env, &lock));
    let leased = server.request(
        "PUT",
        &path,
        &[("comp", "lease")],
        &[("x-ms-lease-action", "acquire"), ("x-ms-lease-duration", "-1")],
    );
    assert_eq!(leased.status, 201, "{}", leased.body);
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let out = env.run(["status", "--json", &lock]);
    assert_eq!(out.status.code(), Some(0), "held: {}", describe(&out));
    let id = leased.header("x-ms-lease-id").expect("a lease id").to_owned();
    let released = server.request(
        "PUT",
        &path,
        &[("comp", "lease")],
        &[("x-ms-lease-action", "release"), ("x-ms-lease-id", &id)],
    );
    assert_eq!(released.status, 200, "{}", released.body);
    assert!(env.run(["run", "--no-wait", &lock, "true"]).status.success());
}
