//! etcd's waiting protocol: each waiter watches its predecessor and the holder, re-reads only
//! when it must, leaves nothing behind when it gives up, and tells a free lock with waiters
//! ahead from a held one.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

use super::{keys, leases, queue_toucher};

#[test]
fn a_signal_while_waiting_leaves_no_key_and_no_lease() {
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
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

/// How many `method` requests (`Txn`, `Range`, ...) the server has handled (from its
/// `/metrics`).
fn requests(server: &EtcdServer, method: &str) -> u64 {
    use std::io::{Read, Write};
    let endpoint = server.endpoints();
    let first = endpoint.split(',').next().expect("an endpoint");
    let mut stream = std::net::TcpStream::connect(first).expect("connect to etcd");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {first}\r\n\r\n").expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("metrics");
    let label = format!("grpc_method=\"{method}\"");
    body.lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn txn_requests(server: &EtcdServer) -> u64 {
    requests(server, "Txn")
}

#[test]
fn a_waiter_behind_a_run_of_this_host_queues_at_once() {
    // The holder came through this host's queue and keeps its ticket: a run behind it knows
    // the lock is taken and queues with one Txn, without first trying to take it free. With
    // the host's queue off it cannot know, and tries (two). The store is idle meanwhile, so
    // no re-check adds to either count.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let _holder = env.hold(&lock, &[]);
    let mut counts = Vec::new();
    for queue in ["on", "off"] {
        let before = txn_requests(&server);
        let out = env.run([
            "run",
            "--local-queue",
            queue,
            "--wait",
            "300ms",
            &lock,
            "touch",
            "ran",
        ]);
        assert_fails(&out, 75, "gave up after waiting");
        counts.push(txn_requests(&server) - before);
    }
    assert!(!env.path("ran").exists());
    assert_eq!(
        counts,
        [1, 2],
        "Txn requests of a waiter behind a run of this host (local queue on, off)"
    );
}

#[test]
fn a_waiter_on_a_busy_cluster_keeps_its_watch() {
    // Revisions are cluster-wide: on a busy cluster the store has always moved on by the
    // time a waiter's watch exists. The waiter re-checks once and keeps that watch; it must
    // not go round re-reading and re-watching for as long as other clients write. A slow
    // link (5 ms each way) makes sure many writes fall between its read and its watch.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
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
    // with no deletion of its own before it, is proof enough. So after queueing (one Txn:
    // the holder is a run of this host, so it does not try for a free lock) the hand-off
    // costs it no read, only the write that moves its key to its --ttl lease, which runs
    // while the command starts. The command here waits for that write to be seen; a command
    // that ends first has its release overtake the move, which is then never sent.
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let mut holder = env.hold(&lock, &[]);
    let before = txn_requests(&server);
    let mut waiter = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            "touch ran; for i in $(seq 1 600); do [ -e go ] && exit 0; sleep 0.05; done; exit 1",
        ])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let queueing = txn_requests(&server) - before;
    // Queueing on the waiter lease.
    assert_eq!(
        queueing, 1,
        "the waiter made {queueing} Txn requests to queue"
    );
    let queued = txn_requests(&server);
    let reads = requests(&server, "Range");
    holder.signal(Signal::SIGTERM);
    holder.wait();
    wait_until("the command started", PATIENCE, || env.path("ran").exists());
    wait_until("the move of the key", PATIENCE, || {
        txn_requests(&server) > queued
    });
    std::fs::write(env.path("go"), "").expect("let the command end");
    assert!(wait_within(&mut waiter, PATIENCE).success());
    let txns = txn_requests(&server) - queued;
    assert_eq!(
        txns, 1,
        "the waiter made {txns} Txn requests at the hand-off; 1 (the move, a write) expected"
    );
    let read = requests(&server, "Range") - reads;
    assert_eq!(read, 0, "the waiter read {read} times at the hand-off");
}

#[test]
fn a_waiter_whose_predecessor_leaves_the_queue_waits_for_the_holder() {
    // The third in line watches the second and the holder. The second leaving (a signal
    // while waiting) is not the holder's release: the third must read again and go on
    // waiting.
    let server = EtcdServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
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
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
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
fn busy_messages_tell_a_free_lock_with_waiters_ahead_from_a_held_one() {
    // A waiter's key at the head of the queue (here a stand-in on a long lease, as a killed
    // waiter's key is for up to 2 s) is not a holder: the lock is free, with one waiting.
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
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
