//! The run path against a fake backend (no server): release on exit, the conflict status, a
//! signal while waiting, the `--wait` backstop, and reentrancy.

use std::cell::RefCell;
use std::ffi::OsString;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Mutex;

use super::*;
use crate::backend::file::FileTarget;
use crate::backend::Target;
use crate::cli::OnLost;
use crate::exit::{Code, Outcome};
use crate::lock::{Cancel, CheckReport, HolderStatus, LockStatus, Lost};
use crate::settings::{CommandSpec, Common};

/// Signals go to the whole test process: runs that listen for them take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[derive(Clone, Copy, Debug)]
enum Acquire {
    /// Grant at once with this token.
    Grant(u64),
    /// Report the lock held.
    Busy,
    /// Wait until cancelled, then report the cancel.
    UntilCancelled,
    /// Never answer, not even to a cancel (a server that went silent).
    Hang,
    /// Grant with token 1 this long after the call (a slow server within its time to answer).
    GrantAfter(Duration),
}

#[derive(Default)]
struct Record {
    acquired: u32,
    released: u32,
    cancelled: bool,
    /// What `status` shows.
    holders: Vec<HolderStatus>,
}

struct Fake {
    acquire: Acquire,
    record: Rc<RefCell<Record>>,
}

struct FakeLease {
    token: u64,
    record: Rc<RefCell<Record>>,
}

impl Lease for FakeLease {
    fn token(&self) -> u64 {
        self.token
    }

    async fn lost(&mut self) -> Lost {
        std::future::pending().await
    }

    async fn release(self) -> Result<(), Error> {
        self.record.borrow_mut().released += 1;
        Ok(())
    }
}

impl Backend for Fake {
    type Lease = FakeLease;

    async fn acquire(&self, _: &AcquireRequest, mut cancel: Cancel) -> Result<FakeLease, Error> {
        match self.acquire {
            Acquire::Grant(token) => {
                self.record.borrow_mut().acquired += 1;
                Ok(FakeLease {
                    token,
                    record: self.record.clone(),
                })
            }
            Acquire::Busy => Err(Error::Busy("lock 'job' is held".into())),
            Acquire::UntilCancelled => {
                cancel.cancelled().await;
                self.record.borrow_mut().cancelled = true;
                Err(Error::Cancelled)
            }
            Acquire::Hang => std::future::pending().await,
            Acquire::GrantAfter(delay) => {
                tokio::time::sleep(delay).await;
                self.record.borrow_mut().acquired += 1;
                Ok(FakeLease {
                    token: 1,
                    record: self.record.clone(),
                })
            }
        }
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let holders: Vec<HolderStatus> = (self.record.borrow().holders.iter())
            .filter(|h| h.holder.name == name.as_str())
            .cloned()
            .collect();
        Ok(LockStatus {
            name: name.to_string(),
            held: !holders.is_empty(),
            holders,
            waiters: None,
            queue: Vec::new(),
            last_token: None,
            waiting_here: Vec::new(),
            location: None,
        })
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        Ok(Vec::new())
    }

    async fn force_release(&self, _: &LockName) -> Result<Vec<Holder>, Error> {
        Ok(Vec::new())
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        Err(Error::Internal("not a real backend".into()))
    }
}

fn fake(acquire: Acquire) -> (Fake, Rc<RefCell<Record>>) {
    let record = Rc::new(RefCell::new(Record::default()));
    (
        Fake {
            acquire,
            record: record.clone(),
        },
        record,
    )
}

/// Settings for `dlock run job sh -c SCRIPT` on a file backend in `dir`.
fn settings(dir: &std::path::Path, script: &str, wait: Wait) -> RunSettings {
    let words = ["sh", "-c", script];
    RunSettings {
        common: Common {
            target: Target::new(FileTarget {
                dir: dir.to_owned(),
                default: false,
            }),
            prefix: "dlock".into(),
            ttl: Duration::from_secs(15),
            display_url: format!("file://{}", dir.display()),
            local_queue: true,
        },
        name: LockName::new("job").expect("a valid name"),
        also: Vec::new(),
        command: CommandSpec {
            program: PathBuf::from("/bin/sh"),
            arg0: "sh".into(),
            args: words[1..].iter().map(OsString::from).collect(),
            display: words.iter().map(|w| w.to_string()).collect(),
        },
        wait,
        conflict_exit_code: 3,
        limit: 1,
        mode: crate::lock::Mode::Exclusive,
        on_lost: OnLost::Term,
        kill_after: Duration::from_secs(10),
        min_hold: None,
        record_command: true,
        report: None,
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

#[test]
fn the_command_runs_with_the_token_and_the_lock_is_released_when_it_exits() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let (backend, record) = fake(Acquire::Grant(7));
    let script = r#"test "$DLOCK_FENCING_TOKEN" = 7 && test "$DLOCK_NAME" = job && exit 5"#;
    let status = block_on(run(
        backend,
        settings(dir.path(), script, Wait::Forever),
        "",
    ));
    assert_eq!(status.ok().map(Outcome::status), Some(5));
    let record = record.borrow();
    assert_eq!((record.acquired, record.released), (1, 1));
}

/// With `--also`, the command sees NAME's token, a line `TOKEN NAME` per name (NAME first,
/// then the `--also` names as given) and a `DLOCK_HELD` entry per name; every name is
/// released when it exits.
#[test]
fn the_command_sees_a_token_and_a_held_entry_for_every_name() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let (backend, record) = fake(Acquire::Grant(7));
    let script = r#"test "$DLOCK_FENCING_TOKEN" = 7 &&
        test "$DLOCK_FENCING_TOKENS" = "7 job
7 zzz
7 aaa" &&
        test "$(printf %s "$DLOCK_HELD" | wc -w)" = 3 && exit 5"#;
    let settings = RunSettings {
        also: vec![
            LockName::new("zzz").expect("a valid name"),
            LockName::new("aaa").expect("a valid name"),
        ],
        ..settings(dir.path(), script, Wait::Forever)
    };
    let backend = lock::Several::new(backend, settings.also.clone());
    let status = block_on(run(backend, settings, ""));
    assert_eq!(status.ok().map(Outcome::status), Some(5));
    let record = record.borrow();
    assert_eq!((record.acquired, record.released), (3, 3));
}

#[test]
fn a_held_lock_exits_with_the_conflict_status_without_running() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran");
    let (backend, record) = fake(Acquire::Busy);
    let script = format!("touch {}", ran.display());
    let status = block_on(run(backend, settings(dir.path(), &script, Wait::No), ""));
    assert_eq!(status.ok().map(Outcome::status), Some(3));
    assert!(!ran.exists());
    assert_eq!(record.borrow().released, 0);
}

#[test]
fn a_signal_while_waiting_cancels_the_wait_and_exits_128_plus_n() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran");
    let (backend, record) = fake(Acquire::UntilCancelled);
    let script = format!("touch {}", ran.display());
    let status = block_on(async {
        // Polled after the run has installed its listeners and started waiting (`biased`).
        let signal = async {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGUSR2).expect("raise");
            std::future::pending::<()>().await;
        };
        tokio::select! {
            biased;
            status = run(backend, settings(dir.path(), &script, Wait::Forever), "") => status,
            () = signal => unreachable!(),
        }
    });
    assert_eq!(
        status.ok().map(Outcome::status),
        Some(128 + libc::SIGUSR2 as u8)
    );
    assert!(record.borrow().cancelled, "the wait was not cancelled");
    assert!(!ran.exists());
}

#[test]
fn a_backend_that_never_answers_is_given_up_after_the_wait() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let (backend, _) = fake(Acquire::Hang);
    let settings = settings(dir.path(), "true", Wait::For(Duration::from_millis(100)));
    let started = std::time::Instant::now();
    let error = block_on(run(backend, settings, "")).expect_err("must give up");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        crate::error::code_of(&error),
        Code::Unavailable,
        "{error:#}"
    );
    assert!(format!("{error:#}").contains("no answer"), "{error:#}");
}

/// A `--wait` shorter than the server's time to answer does not cut that time short: a
/// grant that comes after `--wait` but within what the backend allows (the time to answer,
/// the round trip in flight) starts the command.
#[test]
fn the_backstop_waits_for_a_grant_within_the_backends_time_to_answer() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran");
    let script = format!("touch {}", ran.display());
    let late = crate::budget::MIN_ANSWER + Duration::from_millis(300);
    let (backend, record) = fake(Acquire::GrantAfter(late));
    let settings = settings(dir.path(), &script, Wait::For(Duration::from_millis(1)));
    let status = block_on(run(backend, settings, ""));
    assert_eq!(status.ok().map(Outcome::status), Some(0));
    assert!(ran.exists(), "the command did not run");
    let record = record.borrow();
    assert_eq!((record.acquired, record.released), (1, 1));
}

/// An entry naming our parent (a live ancestor) as the holder of `job`.
fn parent_entry(dir: &std::path::Path, token: u64) -> reentry::Entry {
    let parent = nix::unistd::getppid().as_raw() as u32;
    let common = settings(dir, "true", Wait::Forever).common;
    let ours = reentry::Entry::for_this_process(
        &common.identity(),
        &LockName::new("job").expect("name"),
        token,
    )
    .expect("own /proc entry");
    let start = std::fs::read_to_string(format!("/proc/{parent}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, after) = stat.rsplit_once(')')?;
            after.split_whitespace().nth(19)?.parse().ok()
        })
        .expect("the parent's start time");
    reentry::Entry {
        pid: parent,
        start,
        ..ours
    }
}

fn holder_status(pid: u32, token: u64) -> HolderStatus {
    let name = LockName::new("job").expect("name");
    let mut holder = Holder::for_this_process(&name, &[], Duration::from_secs(15));
    holder.pid = pid;
    holder.token = token;
    HolderStatus {
        holder,
        ttl_left_ms: None,
        session: None,
    }
}

#[test]
fn an_ancestor_the_backend_shows_holding_makes_the_run_reentrant() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let entry = parent_entry(dir.path(), 9);
    let (backend, record) = fake(Acquire::Grant(10));
    record.borrow_mut().holders = vec![holder_status(entry.pid, 9)];
    let held = entry.to_string();
    let status = block_on(run(backend, settings(dir.path(), "true", Wait::No), &held));
    assert_eq!(status.ok().map(Outcome::status), Some(0));
    assert_eq!(
        record.borrow().acquired,
        0,
        "a reentrant run acquired again"
    );
}

/// A nested run of several names re-enters when ancestors provably hold all of them, with
/// their tokens; when they hold some but not all, it is refused (64) without acquiring.
#[test]
fn a_nested_run_of_several_names_reenters_all_or_is_refused() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let entry = parent_entry(dir.path(), 9);
    let other = LockName::new("other").expect("a valid name");
    let identity = settings(dir.path(), "true", Wait::No).common.identity();
    let other_entry = reentry::Entry {
        lock: reentry::lock_key(&identity, &other),
        ..entry.clone()
    };
    let script = r#"test "$DLOCK_FENCING_TOKENS" = "9 job
9 other""#;
    for (held, expected) in [
        (format!("{entry} {other_entry}"), Ok(0)),
        (entry.to_string(), Err(Code::Usage)),
    ] {
        let (backend, record) = fake(Acquire::Grant(10));
        let mut other_holder = holder_status(entry.pid, 9);
        other_holder.holder.name = other.to_string();
        record.borrow_mut().holders = vec![holder_status(entry.pid, 9), other_holder];
        let settings = RunSettings {
            also: vec![other.clone()],
            ..settings(dir.path(), script, Wait::No)
        };
        let status = block_on(run(backend, settings, &held));
        let status = status
            .map(Outcome::status)
            .map_err(|e| crate::error::code_of(&e));
        assert_eq!(status, expected, "{held}");
        assert_eq!(record.borrow().acquired, 0, "{held}: acquired");
    }
}

#[test]
fn an_entry_the_backend_does_not_confirm_acquires_normally() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let entry = parent_entry(dir.path(), 9);
    // The backend shows our parent holding with another token: a hold that ended and a new
    // one, or a forged entry.
    for holders in [vec![], vec![holder_status(entry.pid, 8)]] {
        let (backend, record) = fake(Acquire::Busy);
        record.borrow_mut().holders = holders;
        let held = entry.to_string();
        let status = block_on(run(backend, settings(dir.path(), "true", Wait::No), &held));
        assert_eq!(
            status.ok().map(Outcome::status),
            Some(3),
            "the run did not try to acquire"
        );
    }
}

/// The variables dlock sets to describe the hold to its command (docs/guide.md: "What the
/// command sees").
const DESCRIPTIONS: [&str; 7] = [
    "DLOCK_NAME",
    "DLOCK_BACKEND",
    "DLOCK_MODE",
    "DLOCK_FENCING_TOKEN",
    "DLOCK_FENCING_TOKENS",
    "DLOCK_HELD",
    crate::secrets::CREDENTIALS_FD,
];

/// What dlock sets to describe a hold is never read back as a setting of another run: no
/// variable the command gets from dlock is the variable of an option or one dlock reads for
/// its configuration, and every variable dlock sets is one of [`DESCRIPTIONS`] (or the
/// user's own `DLOCK_URL`, passed on with its password masked).
#[test]
fn no_variable_that_describes_a_hold_is_a_setting() {
    use clap::CommandFactory;
    fn option_variables(command: &clap::Command, into: &mut Vec<String>) {
        for arg in command.get_arguments() {
            if let Some(var) = arg.get_env() {
                into.push(var.to_string_lossy().into_owned());
            }
        }
        for sub in command.get_subcommands() {
            option_variables(sub, into);
        }
    }
    let mut read = vec![
        "DLOCK_CONFIG".to_owned(),
        "DLOCK_DIR".to_owned(),
        "DLOCK_LOG".to_owned(),
        "DLOCK_PASSWORD".to_owned(),
    ];
    read.extend(crate::backend::environment().map(|(var, _)| var.to_owned()));
    option_variables(&crate::cli::Cli::command(), &mut read);
    assert!(read.iter().any(|s| s == "DLOCK_SHARED"), "{read:?}");
    for described in DESCRIPTIONS {
        assert!(
            !read.iter().any(|s| s == described),
            "{described} describes a hold and is also a setting"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for shared in [false, true] {
        let mut run = settings(dir.path(), "true", Wait::Forever);
        run.mode = if shared {
            crate::lock::Mode::Shared
        } else {
            crate::lock::Mode::Exclusive
        };
        let set = child_environment(&run).vars;
        for (key, value) in &set {
            let key = key.to_string_lossy();
            assert!(
                value.is_none() || key == "DLOCK_URL" || DESCRIPTIONS.contains(&&*key),
                "dlock sets {key}, which is not listed as a description"
            );
        }
        let tokens = [(run.name.clone(), 1)];
        for (key, _) in hold_variables(&tokens, "", &run.common.identity()) {
            let key = key.to_string_lossy();
            assert!(
                DESCRIPTIONS.contains(&&*key),
                "dlock sets {key} for a hold, which is not listed as a description"
            );
        }
        let mode = set
            .iter()
            .find(|(k, _)| k == "DLOCK_MODE")
            .and_then(|(_, v)| v.clone());
        let expected = if shared { "shared" } else { "exclusive" };
        assert_eq!(mode, Some(expected.into()));
    }
}

mod outcome;
