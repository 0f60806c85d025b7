//! What the contract needs from a lock service (`LockServer`, and `LeaseServer` for those
//! that expire a silent holder), and the simplest one: the file backend in a private
//! directory.

use super::*;

/// A lock service the contract tests can run against.
pub trait LockServer: Send + Sync {
    /// The `--url` of this server.
    fn url(&self) -> String;
    /// DLOCK_BACKEND as the command sees it.
    fn scheme(&self) -> &'static str;
    /// Take the lock away from its current holder behind dlock's back (the holder must then
    /// detect the loss). By default `dlock release --force`.
    fn break_hold(&self, env: &TestEnv, name: &str) {
        let out = env.run(["release", "--force", name]);
        assert!(
            out.status.success(),
            "release --force failed: {}",
            describe(&out)
        );
    }
    /// Environment variables dlock needs to reach this server beside its URL (an object
    /// store's account and key), set on every dlock a test runs.
    fn env(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// A URL of this server that carries a password the server checks, where it has one.
    fn password_url(&self) -> Option<String> {
        None
    }

    /// This backend's URL for a server at `addr` (`host:port`), and what dlock calls its
    /// server ("a Redis server"): for a URL pointed at another kind of server. `None` where
    /// the backend's URL names no single server of its own kind (the file backend; Sentinel
    /// and Cluster, whose URLs name a group).
    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        let _ = addr;
        None
    }

    /// This backend's URL for a Unix socket in `dir` that no server listens on, and the
    /// socket's path as dlock names it; `None` where the backend has no Unix sockets.
    fn missing_socket_url(&self, dir: &std::path::Path) -> Option<(String, std::path::PathBuf)> {
        let _ = dir;
        None
    }

    /// Whether a holder killed with SIGKILL keeps its hold until its lease (`--ttl`) runs
    /// out, rather than losing it with its connection: so on a lease backend (a key or a
    /// session that expires), by default; a server whose hold is a session that ends as the
    /// connection closes (PostgreSQL) says no.
    fn killed_holder_outlives_it(&self) -> bool {
        dlock::backend::kind_of_scheme(self.scheme()).is_some_and(|kind| kind.capabilities.lease)
    }

    /// Kill the server as a crash does (SIGKILL: nothing more reaches its disk) and start it
    /// again on the same port and data; `false` where this server cannot (a shared one,
    /// which other tests use meanwhile). The `crash_contract_tests!` cases need it.
    fn crash_and_restart(&mut self) -> bool {
        false
    }

    /// The `--ttl` the tests use (short, so that renewals and loss detection are quick).
    fn ttl(&self) -> Option<&'static str> {
        None
    }

    /// The `--prefix` of the test on this server, where the server is shared by other tests
    /// of the run (see `shared`).
    fn prefix(&self) -> Option<String> {
        None
    }
    /// Everything the backend stores, as text, where a test can read it raw (lock files,
    /// Redis keys); `None` where only dlock's own `status` can show it.
    fn stored_text(&self) -> Option<String> {
        None
    }
    /// Fail if `needle` is stored anywhere [`LockServer::stored_text`] can see.
    fn assert_nothing_stored_contains(&self, needle: &str) {
        if let Some(text) = self.stored_text() {
            assert!(
                !text.contains(needle),
                "'{needle}' is stored on the backend: {text}"
            );
        }
    }
}

/// A server that expires the lease of a holder that goes silent (Redis, etcd).
pub trait LeaseServer: LockServer {
    /// The client port of the (first) server, for a proxy in front of it.
    fn port(&self) -> u16;
    /// The URL of this server reached through `port` instead.
    fn url_via(&self, port: u16) -> String;
    fn as_lock_server(&self) -> &dyn LockServer;
}
