//! A test run that is interrupted (Ctrl-C, a CI timeout's SIGKILL) leaves no server behind:
//! the watchdog of `support::shared` kills every server process group of the run, a test's
//! own servers too, once the test process is gone.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// Where [`a_private_server_that_waits`] writes its server's pid (set by the outer test).
const PID_FILE: &str = "DLOCK_TEST_CLEANUP_PID_FILE";

/// Run only by [`an_interrupted_run_leaves_no_server_behind`], in a test process of its
/// own: start a private Redis, say its pid, and wait to be killed (bounded).
#[test]
#[ignore = "run by an_interrupted_run_leaves_no_server_behind"]
fn a_private_server_that_waits() {
    let Some(path) = std::env::var_os(PID_FILE) else {
        return;
    };
    let server = RedisServer::start();
    let temp = std::path::PathBuf::from(&path).with_extension("tmp");
    std::fs::write(&temp, format!("{}\n", server.pid())).expect("pid file");
    std::fs::rename(&temp, &path).expect("pid file");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn an_interrupted_run_leaves_no_server_behind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_file = dir.path().join("server.pid");
    let mut run = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--ignored",
            "--exact",
            "cleanup::a_private_server_that_waits",
        ])
        .env(PID_FILE, &pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the inner test run");
    wait_until("the inner run's server", PATIENCE, || pid_file.exists());
    let server = read_pid(&pid_file);
    assert!(is_alive(server), "the server {server} is not running");
    // As a CI timeout does: no chance to clean up.
    let _ = run.kill();
    let _ = run.wait();
    wait_until("the server to be killed", PATIENCE, || !is_alive(server));
}
