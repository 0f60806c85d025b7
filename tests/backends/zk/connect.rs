//! Reaching ZooKeeper: digest authentication, nothing listening, a slow link. (A server that
//! never answers is `safety::wait_bounds_connecting_to_a_server_that_never_answers`.)

use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn wrong_password_is_77() {
    let server = ZkServer::start();
    // The prefix node belongs to digest user u (password "right").
    server.with_client(Some("u:right"), async |client| {
        let options = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::creator_all());
        client
            .create("/dlock", b"", &options)
            .await
            .expect("create /dlock");
    });
    let port = server.members[0].client_port;
    let mut env = TestEnv::new(&server);
    env.url = format!("zk://u:wrong@127.0.0.1:{port}");
    let out = env.run(["run", &lock_name("z"), "true"]);
    let endpoint = format!("127.0.0.1:{port}");
    assert_fails(&out, 77, &crate::backends::password_refused(&endpoint, "u"));
    assert!(
        !stderr_of(&out).contains("wrong"),
        "password shown: {}",
        describe(&out)
    );
    // No user and password at all: said so, in other words.
    env.url = format!("zk://127.0.0.1:{port}");
    let out = env.run(["run", &lock_name("z"), "true"]);
    assert_fails(
        &out,
        77,
        &format!("{endpoint} wants a user and a password, and none was given"),
    );
    env.url = format!("zk://u:right@127.0.0.1:{port}");
    let out = env.run(["run", &lock_name("z"), "env"]);
    assert!(out.status.success(), "{}", describe(&out));
    // The command sees the URL without its password.
    let seen = stdout_of(&out);
    assert!(
        seen.contains(&format!("DLOCK_URL=zk://u:***@127.0.0.1:{port}\n"))
            && !seen.contains("right"),
        "{seen}"
    );
    // From the environment instead of the URL.
    env.url = format!("zk://u@127.0.0.1:{port}");
    let out = output_within(
        {
            let mut c = env.dlock(["run", &lock_name("z"), "true"]);
            c.env("DLOCK_PASSWORD", "right");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn nothing_listening_is_69() {
    let port = free_port();
    let env = TestEnv {
        scratch: tempfile::tempdir().expect("temp dir"),
        url: format!("zk://127.0.0.1:{port}"),
        ttl: Some("3s"),
        prefix: None,
        env: Vec::new(),
    };
    let started = Instant::now();
    let out = env.run(["run", &lock_name("z"), "touch", "ran"]);
    assert_fails(&out, 69, &format!("127.0.0.1:{port}"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!env.path("ran").exists());
}

#[test]
fn a_short_wait_still_takes_a_free_lock_over_a_slow_link() {
    crate::contract::a_short_wait_still_takes_a_free_lock_over_a_slow_link(&ZkServer::shared());
}
