//! A wrong wall clock for a dlock under test: the fault harness's shim
//! (`scripts/faultlib/skew.c`, under `LD_PRELOAD`) moves only `CLOCK_REALTIME` and its
//! relatives, never the monotonic or boot clocks and timers a lease is kept on; what a host
//! whose clock is off looks like.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use super::{describe, TestEnv};

/// The shim, built once per test run into cargo's directory for tests' files (under a name of
/// this process's, then renamed: test runs at once never see half a file).
fn skew_library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
            let library = dir.join("skew.so");
            let building = dir.join(format!("skew-{}.so", std::process::id()));
            let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/faultlib/skew.c");
            let out = Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&building)
                .arg(&source)
                .args(["-ldl", "-lpthread"])
                .output()
                .expect("run cc (the C compiler builds the clock-skew shim)");
            assert!(out.status.success(), "{}", describe(&out));
            std::fs::rename(&building, &library).expect("put skew.so in place");
            library
        })
        .clone()
}

impl TestEnv {
    /// `dlock ARGS` whose wall clock reads `seconds` off (ahead when positive).
    pub fn skewed(&self, args: &[&str], seconds: i64) -> Command {
        let mut command = self.dlock(args);
        command
            .env("LD_PRELOAD", skew_library())
            .env("SKEW_SECONDS", seconds.to_string());
        command
    }
}
