//! What is particular to each backend, beside the contract every backend passes
//! (`crate::contract`): one module per backend, each invoking `contract_tests!` with its test
//! server from `crate::support`. A URL pointed at a server of another kind is checked here
//! once for every backend ([`assert_names_the_server_there`]).

mod etcd;
mod file;
mod memcached;
mod mysql;
mod postgres;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod zk;

use crate::support::*;

/// dlock pointed (`url`) at a server of another kind: 69 at once, in one line that names what
/// answered there (`ours`: "a Redis server", `theirs`: "a PostgreSQL server"), as it does on
/// every backend, and the command never runs.
pub fn assert_names_the_server_there(url: &str, ours: &str, theirs: &str) {
    let file = FileServer::start();
    let env = TestEnv::new(&file);
    let out = env.run([
        "run",
        "--wait",
        "60s",
        "--url",
        url,
        &lock_name("o"),
        "touch",
        "ran",
    ]);
    assert_fails(
        &out,
        69,
        &format!(
            "does not look like {ours} (it answers like {theirs}); check the URL's host and port"
        ),
    );
    assert_eq!(
        stderr_of(&out).lines().count(),
        1,
        "more than one line: {}",
        describe(&out)
    );
    assert!(!env.path("ran").exists(), "the command ran");
}
