//! The fault harness's smoke (`scripts/faults --smoke`, docs/faults.md): a three-member etcd
//! cluster in network namespaces, clients on two client hosts, the holder's host cut off from
//! the servers, and the checker on the history. It keeps the harness from rotting; the full
//! matrix of backends and nemeses is the script, not CI.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::*;

/// The smoke's own budget is 60 s on a 2-core machine; twice that before it counts as hung.
const SMOKE_LIMIT: Duration = Duration::from_secs(120);
/// After SIGTERM, how long the harness gets to stop its servers and remove its namespaces.
const CLEANUP_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn the_fault_harness_finds_no_overlap_on_etcd_when_the_holders_host_is_cut_off() {
    // Missing tools fail with how to install them (tests never skip).
    server_binary("ip", "iproute2");
    server_binary("nft", "nftables");
    server_binary("etcd", "etcd-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let log = dir.path().join("faults.log");
    let log_file = std::fs::File::create(&log).expect("log file");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/faults");
    let mut child = Command::new("python3")
        .arg(&script)
        .arg("--smoke")
        .arg("--out")
        .arg(&out)
        .arg("--dlock")
        .arg(DLOCK)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("log file"))
        .stderr(log_file)
        .spawn()
        .expect("python3 runs scripts/faults (python3 must be on PATH)");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > SMOKE_LIMIT {
            // SIGTERM first: the harness removes its namespaces and servers on it.
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let cleanup = Instant::now();
            while child.try_wait().expect("try_wait").is_none() && cleanup.elapsed() < CLEANUP_LIMIT
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "scripts/faults --smoke did not end within {SMOKE_LIMIT:?}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "scripts/faults --smoke: {status}\n{output}"
    );
    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json written"),
    )
    .expect("results.json is JSON");
    let cells = results["cells"].as_array().expect("cells");
    let cell = cells
        .iter()
        .find(|c| c["backend"] == "etcd")
        .unwrap_or_else(|| panic!("no etcd cell in results.json:\n{output}"));
    assert!(
        cell["cs"].as_u64().unwrap_or(0) > 0,
        "no critical section ran: {cell}\n{output}"
    );
    assert_eq!(
        cell["promise_broken"],
        serde_json::Value::Bool(false),
        "a promise broke: {cell}\n{output}"
    );
    assert_eq!(cell["hung"], 0, "{cell}");
    assert_eq!(cell["stale_accepted"], 0, "{cell}");
}
