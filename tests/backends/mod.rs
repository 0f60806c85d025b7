//! What is particular to each backend, beside the contract every backend passes
//! (`crate::contract`): one folder per backend, each invoking `contract_tests!` with its test
//! server, which lives in the folder too (`NAME/server.rs`, the file backend's included). The
//! words every backend shares for what goes wrong in reaching a
//! server are here once: a server of another kind at the URL
//! ([`assert_names_the_server_there`]), a password missing or refused, a database the server
//! does not have, a Unix socket that does not exist.

/// Declares each backend's folder (`mod NAME;`) and re-exports its test server
/// (`NAME/server.rs`) in [`servers`], which `crate::support` re-exports to every test: a
/// backend's tests are its folder and its line here, with nothing to add elsewhere.
macro_rules! backends_with_servers {
    ($($name:ident),* $(,)?) => {
        $(mod $name;)*

        /// Every backend's test server, as `crate::support` gives them to the tests.
        pub mod servers {
            $(pub use super::$name::server::*;)*
        }
    };
}

backends_with_servers! {
    azure,
    etcd,
    file,
    memcached,
    mysql,
    nats,
    postgres,
    redis,
    redis_cluster,
    redis_sentinel,
    s3,
    zk,
}

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

/// A shared server answers every question of the contract as the server it wraps: a case
/// that asks a wrapper that does not pass a question on would pass without testing anything.
#[test]
fn a_shared_server_answers_as_the_server_it_wraps() {
    let shared = RedisServer::shared();
    let dir = std::path::Path::new("/nonexistent");
    assert_eq!(
        shared.url_at("127.0.0.1:1"),
        (*shared).url_at("127.0.0.1:1")
    );
    assert!(shared.url_at("127.0.0.1:1").is_some());
    assert_eq!(
        shared.missing_socket_url(dir),
        (*shared).missing_socket_url(dir)
    );
    assert!(shared.missing_socket_url(dir).is_some());
    // PostgreSQL's answer is not the default one.
    let shared = PgServer::shared();
    assert!(!shared.killed_holder_outlives_it());
    assert_eq!(
        shared.killed_holder_outlives_it(),
        (*shared).killed_holder_outlives_it()
    );
}

/// What dlock says when `endpoint` wants a password for `user` and none was given (77).
pub fn password_missing(endpoint: &str, user: &str) -> String {
    format!(
        "{endpoint} wants a password for user '{user}', and none was given: give it in \
         the URL, DLOCK_PASSWORD"
    )
}

/// What dlock says when `endpoint` refused `user` with the password given (77).
pub fn password_refused(endpoint: &str, user: &str) -> String {
    format!(
        "{endpoint} refused user '{user}' with the password given: check the user, and \
         the password in the URL, DLOCK_PASSWORD"
    )
}

/// What dlock says when the URL names a database `endpoint` does not have (78).
pub fn no_database(endpoint: &str, name: &str) -> String {
    format!("{endpoint} has no database '{name}'")
}

/// What dlock says when a Unix socket URL's `path` does not exist (69).
pub fn no_socket(path: &std::path::Path) -> String {
    format!("cannot connect to {}: no such socket", path.display())
}
