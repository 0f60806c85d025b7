//! The etcd backend: the whole contract against a real `etcd`, plus FIFO, `etcdctl lock`
//! interop, lease loss, and a three-member cluster (issue: etcd backend).

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::common::*;

crate::contract_tests!(etcd_contract, EtcdServer::start());
crate::lease_contract_tests!(etcd_lease_contract, EtcdServer::start());

#[test]
fn waiters_acquire_in_arrival_order() {
    crate::contract::waiters_acquire_in_arrival_order(&EtcdServer::start());
}

fn name() -> String {
    format!("e-{}", unique())
}

/// Keys under `prefix` (etcdctl, keys only).
fn keys(server: &EtcdServer, prefix: &str) -> Vec<String> {
    let out = server.etcdctl(&["get", "--prefix", "--keys-only", prefix]);
    assert!(out.status.success(), "{}", describe(&out));
    stdout_of(&out)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `dlock run LOCK touch FILE`, returned once it is the `place`-th waiter in the queue.
fn queue_toucher(env: &TestEnv, lock: &str, file: &str, place: u64) -> std::process::Child {
    let waiter = env
        .dlock(["run", lock, "touch", file])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(lock) == place);
    waiter
}

fn leases(server: &EtcdServer) -> Vec<String> {
    let out = server.etcdctl(&["lease", "list"]);
    assert!(out.status.success(), "{}", describe(&out));
    stdout_of(&out).lines().skip(1).map(str::to_owned).collect()
}

#[test]
fn etcdctl_lock_and_dlock_exclude_each_other() {
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let log = env.path("log");
    let ready = env.path("ready");
    let go = env.path("go");
    // etcdctl holds `dlock/<name>`: dlock's lock of the same name is busy.
    let script = format!(
        "echo etcdctl >> {log}; touch {ready}; while [ ! -e {go} ]; do sleep 0.02; done",
        log = log.display(),
        ready = ready.display(),
        go = go.display()
    );
    let etcdctl = server_binary("etcdctl", "etcd-client");
    let mut etcdctl_holder = std::process::Command::new(&etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{}", server.endpoints()))
        .args(["lock", &format!("dlock/{lock}"), "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_until("etcdctl holds", PATIENCE, || ready.exists());
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "dlock got a lock etcdctl holds: {}",
        describe(&out)
    );
    let mut dlock_waiter = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo dlock >> {}", log.display()),
        ])
        .spawn()
        .expect("dlock waiter");
    wait_until("dlock queued", PATIENCE, || {
        keys(&server, &format!("dlock/{lock}/")).len() == 2
    });
    std::fs::write(&go, b"").expect("go");
    assert!(wait_within(&mut etcdctl_holder, PATIENCE).success());
    assert!(wait_within(&mut dlock_waiter, PATIENCE).success());

    // dlock holds: etcdctl waits for it.
    let mut holder = env.hold(&lock, &[]);
    let mut etcdctl_waiter = std::process::Command::new(&etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{}", server.endpoints()))
        .args([
            "lock",
            &format!("dlock/{lock}"),
            "--",
            "sh",
            "-c",
            &format!("echo etcdctl-2 >> {}", log.display()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_until("etcdctl queued", PATIENCE, || {
        keys(&server, &format!("dlock/{lock}/")).len() == 2
    });
    std::fs::write(env.path("marker"), b"").expect("marker");
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "etcdctl\ndlock\n",
        "etcdctl ran while dlock held"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
    assert!(wait_within(&mut etcdctl_waiter, PATIENCE).success());
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "etcdctl\ndlock\netcdctl-2\n"
    );
}

#[test]
fn a_signal_while_waiting_leaves_no_key_and_no_lease() {
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let before = leases(&server);
    let mut waiter = env
        .dlock(["run", &lock, "touch", "ran"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || {
        keys(&server, &format!("dlock/{lock}/")).len() == 2
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        Signal::SIGINT,
    )
    .expect("kill");
    assert_eq!(wait_within(&mut waiter, PATIENCE).code(), Some(130));
    assert_eq!(
        keys(&server, &format!("dlock/{lock}/")).len(),
        1,
        "the waiter's key was left behind"
    );
    assert_eq!(
        leases(&server),
        before,
        "the waiter's lease was left behind"
    );
    // --wait running out cleans up the same way.
    let out = env.run(["run", "--wait", "200ms", &lock, "touch", "ran"]);
    assert_eq!(out.status.code(), Some(75));
    assert_eq!(keys(&server, &format!("dlock/{lock}/")).len(), 1);
    assert_eq!(leases(&server), before);
    assert!(!env.path("ran").exists());
}

/// How many `Txn` requests the server has handled (from its `/metrics`).
fn txn_requests(server: &EtcdServer) -> u64 {
    use std::io::{Read, Write};
    let endpoint = server.endpoints();
    let first = endpoint.split(',').next().expect("an endpoint");
    let mut stream = std::net::TcpStream::connect(first).expect("connect to etcd");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {first}\r\n\r\n").expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("metrics");
    body.lines()
        .filter(|l| {
            l.starts_with("grpc_server_msg_received_total{") && l.contains("grpc_method=\"Txn\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn a_waiter_on_a_busy_cluster_keeps_its_watch() {
    // Revisions are cluster-wide: on a busy cluster the store has always moved on by the
    // time a waiter's watch exists. The waiter re-checks once and keeps that watch; it must
    // not go round re-reading and re-watching for as long as other clients write. A slow
    // link (5 ms each way) makes sure many writes fall between its read and its watch.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let puts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (stop, puts) = (stop.clone(), puts.clone());
        let endpoint = format!("http://{}", server.endpoints());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .expect("connect");
                // Several writers at once, so that hardly a millisecond passes without one.
                let tasks = (0..8).map(|w| {
                    let (mut client, stop, puts) = (client.clone(), stop.clone(), puts.clone());
                    tokio::spawn(async move {
                        let started = Instant::now();
                        while !stop.load(std::sync::atomic::Ordering::Relaxed)
                            && started.elapsed() < PATIENCE
                        {
                            if client.put(format!("busy/{w}"), "x", None).await.is_ok() {
                                puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    })
                });
                for task in tasks.collect::<Vec<_>>() {
                    let _ = task.await;
                }
            });
        })
    };
    wait_until("the writers are busy", PATIENCE, || {
        puts.load(std::sync::atomic::Ordering::Relaxed) >= 200
    });
    let before = txn_requests(&server);
    let proxy = Proxy::with_delay(
        server
            .endpoints()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port"),
        Duration::from_millis(5),
    );
    let url = format!("etcd://127.0.0.1:{}", proxy.port);
    let out = env.run(["run", "--url", &url, "--wait", "2s", &lock, "true"]);
    let txns = txn_requests(&server) - before;
    let written = puts.load(std::sync::atomic::Ordering::Relaxed);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = writer.join();
    assert_fails(&out, 75, "gave up after waiting");
    // Queueing (1), the re-check once the watch exists (1), leaving (0: a lease revoke).
    assert!(
        txns <= 4,
        "the waiter made {txns} Txn requests in 2 s while {written} unrelated writes went on"
    );
}

#[test]
fn the_waiter_next_in_line_starts_on_the_holders_deletion_without_reading_again() {
    // Its own key is in the same watch as the holder's: the deletion of the holder's key,
    // with no deletion of its own before it, is proof enough. So after queueing (two Txns:
    // trying for a free lock, then taking a place) the hand-off costs it no read, only the
    // write that moves its key to its --ttl lease.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    let before = txn_requests(&server);
    let mut waiter = queue_toucher(&env, &lock, "ran", 1);
    let queueing = txn_requests(&server) - before;
    // Trying for a free lock, then queueing on the waiter lease.
    assert_eq!(
        queueing, 2,
        "the waiter made {queueing} Txn requests to queue"
    );
    let queued = txn_requests(&server);
    holder.signal(Signal::SIGTERM);
    holder.wait();
    assert!(wait_within(&mut waiter, PATIENCE).success());
    assert!(env.path("ran").exists());
    let txns = txn_requests(&server) - queued;
    assert_eq!(
        txns, 1,
        "the waiter made {txns} Txn requests at the hand-off; 1 (the re-attach, a write) expected"
    );
}

#[test]
fn a_waiter_whose_predecessor_leaves_the_queue_waits_for_the_holder() {
    // The third in line watches the second and the holder. The second leaving (a signal
    // while waiting) is not the holder's release: the third must read again and go on
    // waiting.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    let mut second = queue_toucher(&env, &lock, "second-ran", 1);
    let mut third = queue_toucher(&env, &lock, "third-ran", 2);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal the second");
    assert_eq!(wait_within(&mut second, PATIENCE).code(), Some(128 + 15));
    wait_until("second gone", PATIENCE, || env.waiters(&lock) == 1);
    assert!(
        !env.path("third-ran").exists(),
        "the third in line started while the holder still held the lock"
    );
    assert!(
        matches!(third.try_wait(), Ok(None)),
        "the third stopped waiting"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
    assert!(wait_within(&mut third, PATIENCE).success());
    assert!(env.path("third-ran").exists());
    assert!(!env.path("second-ran").exists());
}

#[test]
fn a_waiter_whose_key_goes_in_the_same_deletion_as_the_holders_does_not_start() {
    // One DeleteRange over the lock's prefix removes the holder's key and the waiter's in
    // one revision; etcd lists the holder's (older lease id) first. The waiter must not take
    // that as the holder's release.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    let mut waiter = queue_toucher(&env, &lock, "ran", 1);
    let out = server.etcdctl(&["del", "--prefix", &format!("dlock/{lock}/")]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "2", "both keys deleted at once");
    let status = wait_within(&mut waiter, PATIENCE);
    assert!(!status.success(), "the waiter must not report success");
    assert!(
        !env.path("ran").exists(),
        "a waiter whose key was deleted started its command"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
}

#[test]
fn a_holder_whose_key_is_deleted_stops_its_command_at_once() {
    // The lease lives on, so keep-alives succeed: only the holder's watch on its own key can
    // tell. A 60 s TTL keeps renewals out of the test. Checked for a holder that got the
    // lock at once and for one that waited (whose waiting watch carries on).
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let prefix = format!("dlock/{lock}/");
    let ttl = ["--ttl", "60s"];
    let mut first = env.hold(&lock, &ttl);
    let ready = env.path("second-ready");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let mut second = env
        .dlock(["run", "--ttl", "60s", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn second");
    wait_until("second queued", PATIENCE, || env.waiters(&lock) == 1);
    let first_key = keys(&server, &prefix).into_iter().min().expect("two keys");
    let first_command = read_pid(&first.ready);
    let out = server.etcdctl(&["del", &first_key]);
    assert!(out.status.success(), "{}", describe(&out));
    let code = first.wait().code();
    let stderr = first.stderr();
    assert_eq!(code, Some(124), "{stderr}");
    assert!(stderr.contains("was deleted"), "{stderr}");
    assert!(
        !is_alive(first_command),
        "the first holder's command ran on"
    );
    // The deletion freed the lock: the second holds it now.
    wait_until("second holds", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let second_command = read_pid(&ready);
    let second_key = keys(&server, &prefix).pop().expect("the second's key");
    let out = server.etcdctl(&["del", &second_key]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(wait_within(&mut second, PATIENCE).code(), Some(124));
    assert!(
        !is_alive(second_command),
        "the second holder's command ran on"
    );
}

#[test]
fn a_waiter_whose_lease_died_never_starts_its_command() {
    // Either lease: the waiter lease that holds its key (the key goes with it), or the lease
    // it would hold the lock on (named in its key; the re-attach must fail).
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    for revoked in ["waiter", "hold"] {
        let lock = name();
        let mut holder = env.hold(&lock, &[]);
        let holder_keys = keys(&server, &format!("dlock/{lock}/"));
        let mut waiter = env
            .dlock(["run", &lock, "touch", "ran"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn waiter");
        wait_until("waiter queued", PATIENCE, || {
            keys(&server, &format!("dlock/{lock}/")).len() == 2
        });
        let waiter_key = keys(&server, &format!("dlock/{lock}/"))
            .into_iter()
            .find(|k| !holder_keys.contains(k))
            .expect("the waiter's key");
        let lease = if revoked == "waiter" {
            format!("{:x}", key_info(&server, &waiter_key).lease)
        } else {
            waiter_key.rsplit('/').next().expect("lease id").to_owned()
        };
        let out = server.etcdctl(&["lease", "revoke", &lease]);
        assert!(out.status.success(), "{}", describe(&out));
        holder.signal(Signal::SIGTERM);
        holder.wait();
        let status = wait_within(&mut waiter, PATIENCE);
        assert!(
            !status.success(),
            "the waiter must not report success ({revoked} lease revoked)"
        );
        assert!(
            !env.path("ran").exists(),
            "a waiter without its {revoked} lease started its command"
        );
    }
}

/// A key's create revision and lease (`etcdctl get -w json`).
struct KeyInfo {
    create_revision: u64,
    lease: u64,
}

fn key_info(server: &EtcdServer, key: &str) -> KeyInfo {
    let out = server.etcdctl(&["get", key, "-w", "json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl JSON");
    let kv = &json["kvs"][0];
    KeyInfo {
        create_revision: kv["create_revision"].as_u64().expect("a key"),
        lease: kv["lease"].as_u64().expect("a lease"),
    }
}

/// The TTL a lease was granted with, in seconds.
fn granted_ttl(server: &EtcdServer, lease: u64) -> i64 {
    let out = server.etcdctl(&["lease", "timetolive", &format!("{lease:x}"), "-w", "json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl JSON");
    json["granted-ttl"].as_i64().expect("granted-ttl")
}

#[test]
fn a_waiters_key_is_on_a_short_lease_until_the_grant_moves_it_to_the_hold_lease() {
    // While it waits, a waiter's key is on its 2 s waiter lease, not on its --ttl lease; at
    // the grant the same key moves to the --ttl lease. A Put keeps the key's create revision:
    // the fencing token and the place in the queue stay what they were.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let prefix = format!("dlock/{lock}/");
    let mut holder = env.hold(&lock, &[]);
    let holder_key = keys(&server, &prefix).pop().expect("the holder's key");
    let ready = env.path("waiter-ready");
    let script = format!(
        "echo $DLOCK_FENCING_TOKEN > '{}'; exec sleep 1000",
        ready.display()
    );
    let mut waiter = env
        .dlock(["run", "--ttl", "60s", &lock, "sh", "-c", &script])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let waiter_key = keys(&server, &prefix)
        .into_iter()
        .find(|k| *k != holder_key)
        .expect("the waiter's key");
    let waiting = key_info(&server, &waiter_key);
    let waiting_ttl = granted_ttl(&server, waiting.lease);
    assert!(
        waiting_ttl < 10,
        "a waiter's key is on a {waiting_ttl}s lease (--ttl 60s); a killed waiter would block the lock that long"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
    wait_until("waiter holds", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let token: u64 = std::fs::read_to_string(&ready)
        .expect("token")
        .trim()
        .parse()
        .expect("a numeric token");
    let holding = key_info(&server, &waiter_key);
    assert_eq!(
        holding.create_revision, waiting.create_revision,
        "the re-attach changed the key's create revision"
    );
    assert_eq!(token, holding.create_revision, "token != create revision");
    assert_ne!(holding.lease, waiting.lease);
    assert_eq!(granted_ttl(&server, holding.lease), 60);
    // The waiter lease, which holds no key any more, is revoked.
    let waiter_lease = format!("{:x}", waiting.lease);
    wait_until("waiter lease revoked", PATIENCE, || {
        !leases(&server).contains(&waiter_lease)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal the waiter");
    wait_within(&mut waiter, PATIENCE);
}

#[test]
fn a_waiter_killed_while_waiting_does_not_hold_up_the_lock_for_its_ttl() {
    // CI runners cancel jobs with SIGKILL: a killed waiter cannot clean up. Its key is on its
    // short waiter lease, so once the holder is done the lock is free within seconds, not
    // after the killed waiter's --ttl (60 s here).
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    let mut killed = env
        .dlock(["run", "--ttl", "60s", &lock, "touch", "killed-ran"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    killed.kill().expect("SIGKILL the waiter");
    let _ = killed.wait();
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let started = Instant::now();
    let out = env.run(["run", "--wait", "30s", &lock, "touch", "ran"]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    assert!(
        took < Duration::from_secs(15),
        "the lock was free only after {took:?}"
    );
    assert!(!env.path("killed-ran").exists());
}

#[test]
fn busy_messages_tell_a_free_lock_with_waiters_ahead_from_a_held_one() {
    // A waiter's key at the head of the queue (here a stand-in on a long lease, as a killed
    // waiter's key is for up to 2 s) is not a holder: the lock is free, with one waiting.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let out = server.etcdctl(&["lease", "grant", "60"]);
    assert!(out.status.success(), "{}", describe(&out));
    let lease = stdout_of(&out)
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_owned();
    let value = r#"{"name":"x","host":"h","pid":4242,"user":"u","command":"c","since":"2026-01-01T00:00:00Z","ttl_ms":60000,"token":0,"version":"0","limit":1,"waiting":true}"#;
    let key = format!("dlock/{lock}/{lease}");
    let out = server.etcdctl(&["put", "--lease", &lease, &key, value]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is free, 1 waiting ahead");
    let out = env.run(["run", "--wait", "300ms", &lock, "touch", "ran"]);
    assert_fails(
        &out,
        75,
        "is free, 1 waiting ahead; gave up after waiting 300ms",
    );
    let out = env.run(["status", "--json", &lock]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["held"], false, "{}", describe(&out));
    assert_eq!(status["waiters"], 1, "{}", describe(&out));
    let out = env.run(["release", "--force", &lock]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("waiters' keys are left alone"),
        "{}",
        describe(&out)
    );
    let out = server.etcdctl(&["lease", "revoke", &lease]);
    assert!(out.status.success(), "{}", describe(&out));
    // Held: the message names the holder.
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held by pid");
    assert!(!env.path("ran").exists());
}

#[test]
fn an_unanswering_server_ends_at_the_wait_deadline() {
    // It accepts connections and never answers: --wait bounds connecting too.
    let silent = SilentServer::start();
    let env = TestEnv::new(&FileServer::start());
    let url = format!("etcd://127.0.0.1:{}", silent.port);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "2s", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 69, "within --wait 2s");
    assert!(!env.path("ran").exists());
    // Before: 4 s (two 2 s attempts on the one endpoint).
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(3500),
        "gave up after {took:?} with --wait 2s"
    );
}

#[test]
fn wrong_password_is_77() {
    let server = EtcdServer::start();
    for args in [
        vec!["user", "add", "root:rootpw"],
        vec!["user", "grant-role", "root", "root"],
        vec!["auth", "enable"],
    ] {
        let out = server.etcdctl(&args);
        assert!(out.status.success(), "etcdctl {args:?}: {}", describe(&out));
    }
    let env = TestEnv::new(&server);
    let url = format!("etcd://root:hunter-wrong-7@{}", server.endpoints());
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(&out, 77, "authentication");
    assert!(
        !stderr_of(&out).contains("hunter-wrong-7"),
        "password leaked: {}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
    // The right password (from DLOCK_PASSWORD) works.
    let out = output_within(
        {
            let mut c = env.dlock([
                "run",
                "--url",
                &format!("etcd://root@{}", server.endpoints()),
                "x",
                "true",
            ]);
            c.env("DLOCK_PASSWORD", "rootpw");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn nothing_listening_is_69() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let out = env.run([
        "run",
        "--url",
        &format!("etcd://127.0.0.1:{}", free_port()),
        "x",
        "touch",
        "ran",
    ]);
    assert_fails(&out, 69, "etcd");
    assert!(!env.path("ran").exists());
}

#[test]
fn a_three_member_cluster_keeps_the_hold_through_one_failure_and_stops_at_quorum_loss() {
    let mut cluster = EtcdServer::cluster(
        3,
        &["--heartbeat-interval", "50", "--election-timeout", "500"],
    );
    let env = TestEnv::new(&cluster);
    let lock = name();
    let ready = env.path("ready");
    let mut holder = env
        .dlock([
            "run",
            "--ttl",
            "6s",
            "--kill-after",
            "1s",
            &lock,
            "sh",
            "-c",
            &format!("touch {}; while :; do sleep 0.05; done", ready.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || ready.exists());
    // One member down — the leader, the harder case (an election): the hold survives several
    // renewal periods.
    let leader = cluster.leader();
    cluster.members[leader].stop();
    let survived_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < survived_until {
        assert!(
            holder.try_wait().expect("try_wait").is_none(),
            "the hold broke with one member down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A second member down: no quorum, no renewals: the command is stopped (124) before the
    // lease could have expired on the server.
    let stopped = Instant::now();
    let second = (leader + 1) % 3;
    cluster.members[second].stop();
    assert_eq!(wait_within(&mut holder, PATIENCE).code(), Some(124));
    assert!(
        stopped.elapsed() < Duration::from_secs(6),
        "stopped only after {:?} (TTL 6s)",
        stopped.elapsed()
    );
}

#[test]
fn tls_with_the_configured_ca_and_client_certificate() {
    let certs = TestCerts::make();
    let server = EtcdServer::start_tls(&certs);
    let env = TestEnv::new(&server);
    let config = |body: String| {
        let path = env.path(&format!("config-{}.toml", unique()));
        std::fs::write(&path, format!("[etcd]\n{body}")).expect("write config");
        path.display().to_string()
    };
    let good = config(format!(
        "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        certs.path("ca.crt"),
        certs.path("client.crt"),
        certs.path("client.key")
    ));
    let out = env.run([
        "--config",
        &good,
        "run",
        "tls",
        "sh",
        "-c",
        "echo $DLOCK_BACKEND",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out), "etcds\n");
    let wrong_ca = config(format!(
        "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        certs.path("other.crt"),
        certs.path("client.crt"),
        certs.path("client.key")
    ));
    let out = env.run(["--config", &wrong_ca, "run", "tls", "touch", "ran"]);
    assert_fails(&out, 78, "TLS");
    let no_client_cert = config(format!("ca_file = \"{}\"\n", certs.path("ca.crt")));
    let out = env.run(["--config", &no_client_cert, "run", "tls", "touch", "ran"]);
    assert_fails(&out, 78, "client certificate");
    // Plain text to the TLS port fails; nothing falls back.
    let plain = format!("etcd://{}", server.endpoints());
    let out = env.run(["run", "--url", &plain, "tls", "touch", "ran"]);
    assert!(
        matches!(out.status.code(), Some(69 | 78)),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
}

#[test]
fn a_ttl_below_the_minimum_is_a_usage_error() {
    // etcd would raise a 1 s lease to its own minimum; dlock refuses it instead of changing it.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let out = env.run(["run", "--ttl", "1s", "short", "touch", "ran"]);
    assert_fails(&out, 64, "the minimum is 2s");
    assert!(!env.path("ran").exists());
}

#[test]
fn holders_must_agree_on_the_limit() {
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &["--limit", "2"]);
    let out = env.run(["run", "--no-wait", "--limit", "3", &lock, "true"]);
    assert_fails(&out, 64, "--limit 2");
    assert_eq!(
        keys(&server, &format!("dlock/{lock}/")).len(),
        1,
        "the refused waiter left its key"
    );
}

#[test]
fn a_short_wait_still_takes_a_free_lock_over_a_slow_link() {
    // --wait bounds waiting, not a healthy server's answers: each of them takes 100 ms here.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let proxy = Proxy::with_delay(server.port(), Duration::from_millis(50));
    let url = format!("etcd://127.0.0.1:{}", proxy.port);
    let out = env.run([
        "run",
        "--wait",
        "1ms",
        "--url",
        &url,
        &name(),
        "touch",
        "ran",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
}
