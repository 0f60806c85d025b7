//! Every key a script touches is one of the keys it was called with (KEYS): Redis Cluster
//! requires it, and only then does a slot migration stop a script whose keys are half moved.
//! `MONITOR` shows each script call and then each command the script ran (`[0 lua]`); a
//! scenario goes through every path that touches other holders' and waiters' data (a second
//! holder, a waiter queued and woken, a killed waiter purged, `status`, `list`, renewals,
//! `--min-hold`, `release --force`, readers and writers of a shared lock), and every key of
//! every command a script ran (as `COMMAND GETKEYS` finds them) must be among that call's
//! KEYS.

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// Collects `MONITOR` lines until `stop` is set (bounded: two minutes).
fn monitor(port: u16, stop: Arc<AtomicBool>, lines: Arc<Mutex<Vec<String>>>) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    stream.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut reader = BufReader::new(stream);
    let started = Instant::now();
    let mut line = Vec::new();
    while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) if line.ends_with(b"\n") => {
                let text = String::from_utf8_lossy(&line).trim_end().to_owned();
                lines.lock().expect("lines").push(text);
                line.clear();
            }
            // A partial line (or none yet): keep what was read and read on.
            _ => {}
        }
    }
}

/// The quoted arguments of a `MONITOR` line (`\"` and `\\` unescaped; the test's keys need
/// nothing else).
fn arguments(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => arg.extend(chars.next()),
                '"' => break,
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    args
}

#[test]
fn every_key_a_script_touches_is_declared_in_its_keys() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let stop = Arc::new(AtomicBool::new(false));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let watcher = {
        let (stop, lines, port) = (stop.clone(), lines.clone(), server.port);
        std::thread::spawn(move || monitor(port, stop, lines))
    };
    wait_until("MONITOR on", PATIENCE, || {
        server.command("PING");
        !lines.lock().expect("lines").is_empty()
    });

    // Two holders (the second sees the first), renewing every few hundred ms.
    let limit = ["--limit", "2", "--ttl", "2s"];
    let mut first = env.hold(&lock, &limit);
    let second = env.hold(&lock, &limit);
    // A waiter, and one killed in line (purged by the other's heartbeat).
    let entered = env.path("entered");
    let mut waiter = env
        .dlock(["run", "--limit", "2", "--ttl", "2s", &lock, "touch"])
        .arg(&entered)
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let mut killed = env
        .dlock(["run", "--limit", "2", &lock, "true"])
        .spawn()
        .expect("spawn waiter");
    wait_until("second waiter queued", PATIENCE, || env.waiters(&lock) == 2);
    killed.kill().expect("SIGKILL");
    let _ = killed.wait();
    wait_until("killed waiter purged", PATIENCE, || env.waiters(&lock) == 1);
    assert!(env.run(["status", &lock]).status.success());
    assert!(env.run(["list"]).status.success());
    // The first holder releases: the waiter is woken and runs.
    first.signal(Signal::SIGTERM);
    first.wait();
    assert!(wait_within(&mut waiter, PATIENCE).success());
    assert!(entered.exists());
    // --min-hold records that the command ended; then the lock is released by force.
    let out = env.run(["run", "--limit", "2", "--min-hold", "1s", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    drop(second);

    // Shared holds: a reader, a writer waiting behind it, a reader behind the writer; the
    // writer gives up (its leaving wakes that reader), the readers leave, a writer holds and
    // its release wakes two readers at once.
    let shared = lock_name("s");
    let reader = env.hold(&shared, &["--shared", "--ttl", "2s"]);
    let mut writer = env
        .dlock(["run", &shared, "true"])
        .spawn()
        .expect("spawn writer");
    wait_until("writer queued", PATIENCE, || env.waiters(&shared) == 1);
    let late = env.path("late");
    let mut reader_behind = env
        .dlock(["run", "--shared", &shared, "touch"])
        .arg(&late)
        .spawn()
        .expect("spawn reader");
    wait_until("reader queued", PATIENCE, || env.waiters(&shared) == 2);
    writer.kill().expect("SIGKILL");
    let _ = writer.wait();
    assert!(wait_within(&mut reader_behind, PATIENCE).success());
    assert!(late.exists());
    drop(reader);
    let mut holder = env.hold(&shared, &[]);
    let readers: Vec<std::process::Child> = (0..2)
        .map(|n| {
            let child = env
                .dlock(["run", "--shared", &shared, "true"])
                .spawn()
                .expect("spawn reader");
            wait_until("reader queued", PATIENCE, || env.waiters(&shared) == n + 1);
            child
        })
        .collect();
    holder.signal(Signal::SIGTERM);
    holder.wait();
    for mut reader in readers {
        assert!(wait_within(&mut reader, PATIENCE).success());
    }

    server.command("PING");
    stop.store(true, Ordering::SeqCst);
    watcher.join().expect("monitor thread");
    let lines = lines.lock().expect("lines").clone();

    // Each script's commands follow its EVAL/EVALSHA line (a script runs alone).
    let mut declared: Option<Vec<String>> = None;
    let mut calls: Vec<(Vec<String>, Vec<String>, String)> = Vec::new();
    let mut scripts = 0;
    for line in &lines {
        let args = arguments(line);
        let Some(verb) = args.first() else { continue };
        if !line.contains(" lua]") {
            declared = None;
            if verb.eq_ignore_ascii_case("EVALSHA") || verb.eq_ignore_ascii_case("EVAL") {
                let count: usize = args.get(2).and_then(|n| n.parse().ok()).expect("numkeys");
                declared = Some(args[3..3 + count].to_vec());
                scripts += 1;
            }
            continue;
        }
        let declared = declared
            .clone()
            .unwrap_or_else(|| panic!("a script command with no script call before it: {line}"));
        calls.push((args, declared, line.clone()));
    }
    let keys = keys_of(server.port, calls.iter().map(|c| &c.0));
    let mut checked = 0;
    for ((_, declared, line), keys) in calls.iter().zip(&keys) {
        for key in keys {
            assert!(
                declared.iter().any(|d| d == key),
                "a script touched '{key}', which is not among its KEYS {declared:?}: {line}"
            );
            checked += 1;
        }
    }
    // The scenario went through the scripts (acquire, renew, release, status, force, wake,
    // finish), touching many keys.
    assert!(scripts >= 20, "only {scripts} script calls seen");
    assert!(checked >= 200, "only {checked} keys checked");
}

/// The keys of each command (`COMMAND GETKEYS`, pipelined on one connection; a command
/// without keys, like TIME, has none).
fn keys_of<'a>(port: u16, commands: impl Iterator<Item = &'a Vec<String>>) -> Vec<Vec<String>> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut request = Vec::new();
    let mut count = 0;
    for args in commands {
        request.extend(format!("*{}\r\n", args.len() + 2).into_bytes());
        for arg in ["COMMAND", "GETKEYS"]
            .into_iter()
            .chain(args.iter().map(String::as_str))
        {
            request.extend(format!("${}\r\n", arg.len()).into_bytes());
            request.extend(arg.as_bytes());
            request.extend(b"\r\n");
        }
        count += 1;
    }
    stream.write_all(&request).expect("send");
    let mut reader = BufReader::new(stream);
    let mut line = || {
        let mut text = String::new();
        reader.read_line(&mut text).expect("reply");
        text.trim_end().to_owned()
    };
    let mut all = Vec::new();
    for _ in 0..count {
        let head = line();
        let mut keys = Vec::new();
        if let Some(n) = head.strip_prefix('*') {
            for _ in 0..n.parse::<usize>().expect("array length") {
                let _length = line();
                keys.push(line());
            }
        }
        all.push(keys);
    }
    all
}
