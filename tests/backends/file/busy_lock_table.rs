//! `status`, `list` and the `--limit` check see every holder while many unrelated flock(2)
//! locks on the machine are taken and released: the kernel's table of locks is read in
//! pieces, and an entry removed ahead of a holder between two pieces must not hide it.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::support::*;

/// Unrelated locks held for the whole test, so that holders sit several pages deep in
/// `/proc/locks`, and locks taken and released in a loop ahead of them.
struct Churn {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    _held: Vec<std::fs::File>,
    _dir: tempfile::TempDir,
}

const HELD: usize = 300;
const CHURNERS: usize = 3;
const CHURNED_PER_THREAD: usize = 40;
/// Each churning thread stops on its own after this long, whatever the test does.
const CHURN_LIMIT: Duration = Duration::from_secs(120);

fn flock(file: &std::fs::File, op: libc::c_int) {
    // SAFETY: flock on a descriptor this test owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
}

impl Churn {
    /// Start after the locks under test are held: newer locks are listed ahead of older.
    fn start() -> Churn {
        let dir = tempfile::tempdir().expect("temp dir");
        let open = |name: String| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(dir.path().join(name))
                .expect("open churn file")
        };
        let held: Vec<std::fs::File> = (0..HELD)
            .map(|i| {
                let file = open(format!("held-{i}"));
                flock(&file, libc::LOCK_EX | libc::LOCK_NB);
                file
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..CHURNERS)
            .map(|t| {
                let files: Vec<std::fs::File> = (0..CHURNED_PER_THREAD)
                    .map(|i| open(format!("churn-{t}-{i}")))
                    .collect();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let started = Instant::now();
                    while !stop.load(Ordering::Relaxed) && started.elapsed() < CHURN_LIMIT {
                        for file in &files {
                            flock(file, libc::LOCK_EX | libc::LOCK_NB);
                        }
                        for file in &files {
                            flock(file, libc::LOCK_UN);
                        }
                    }
                })
            })
            .collect();
        Churn {
            stop,
            threads,
            _held: held,
            _dir: dir,
        }
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Holders under test: each record sits on a page boundary of the table now and then, so
/// more of them make a skipped record likelier in each answer.
const HOLDERS: usize = 32;
/// How many times each question is asked while the table churns (bounded in time too).
const TRIES: usize = 60;
const TRYING: Duration = Duration::from_secs(90);

#[test]
fn list_and_status_see_every_holder_while_other_locks_churn() {
    let (_server, env) = file_env();
    let locks: Vec<String> = (0..HOLDERS).map(|_| lock_name("lock")).collect();
    let holders: Vec<Holding> = locks.iter().map(|l| env.hold(l, &[])).collect();
    let churn = Churn::start();
    let started = Instant::now();
    let mut missed = Vec::new();
    let mut asked = 0;
    for i in 0..TRIES {
        if started.elapsed() > TRYING {
            break;
        }
        asked += 2;
        let out = env.run(["list"]);
        let text = stdout_of(&out);
        let absent: Vec<&String> = locks.iter().filter(|l| !text.contains(*l)).collect();
        if !out.status.success() || !absent.is_empty() {
            missed.push(format!("list #{i} lacks {absent:?}: {}", describe(&out)));
        }
        let (lock, holder) = (&locks[i % HOLDERS], &holders[i % HOLDERS]);
        let out = env.run(["status", lock]);
        if out.status.code() != Some(0) || !stdout_of(&out).contains(&holder.pid().to_string()) {
            missed.push(format!("status #{i}: {}", describe(&out)));
        }
    }
    drop(churn);
    assert!(
        missed.is_empty(),
        "{} of {asked} answers missed a holder:\n{}",
        missed.len(),
        missed.join("\n")
    );
}

#[test]
fn limit_check_sees_every_holder_while_other_locks_churn() {
    let (_server, env) = file_env();
    let locks: Vec<String> = (0..HOLDERS).map(|_| lock_name("lock")).collect();
    let _holders: Vec<Holding> = locks
        .iter()
        .map(|l| env.hold(l, &["--limit", "2"]))
        .collect();
    let churn = Churn::start();
    let started = Instant::now();
    let mut wrong = Vec::new();
    let mut asked = 0;
    for i in 0..TRIES * 4 {
        if started.elapsed() > TRYING {
            break;
        }
        asked += 1;
        let lock = &locks[i % HOLDERS];
        let out = env.run(["run", "--no-wait", "--limit", "3", lock, "true"]);
        if out.status.code() != Some(64) {
            wrong.push(format!("run #{i}: {}", describe(&out)));
        }
    }
    drop(churn);
    assert!(
        wrong.is_empty(),
        "{} of {asked} runs with another --limit were not refused:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
