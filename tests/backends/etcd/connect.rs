//! Reaching etcd: a wrong password, nothing listening, a slow link. (A server that never
//! answers is `safety::wait_bounds_connecting_to_a_server_that_never_answers`, for every backend.)

use crate::support::*;

#[test]
fn wrong_password_is_77() {
    let server = EtcdServer::start();
    for args in [
        vec!["user", "add", "root:rootpw"],
        vec!["user", "grant-role", "root", "root"],
        vec!["auth", "enable"],
    ] {
        let out = server.etcdctl(&args);
        assert!(out.status.success(), "etcdctl {args:?}: {}", describe(&out));
    }
    let env = TestEnv::new(&server);
    let url = format!("etcd://root:hunter-wrong-7@{}", server.endpoints());
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(
        &out,
        77,
        &crate::backends::password_refused(&server.endpoints(), "root"),
    );
    assert!(
        !stderr_of(&out).contains("hunter-wrong-7"),
        "password leaked: {}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
    // No user and password at all: said so, in other words.
    let bare = format!("etcd://{}", server.endpoints());
    let out = env.run(["run", "--url", &bare, "x", "touch", "ran"]);
    assert_fails(
        &out,
        77,
        &format!(
            "{} wants a user and a password, and none was given: give the user in the URL",
            server.endpoints()
        ),
    );
    assert!(!env.path("ran").exists());
    // The right password (from DLOCK_PASSWORD) works.
    let out = output_within(
        {
            let mut c = env.dlock([
                "run",
                "--url",
                &format!("etcd://root@{}", server.endpoints()),
                "x",
                "true",
            ]);
            c.env("DLOCK_PASSWORD", "rootpw");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn nothing_listening_is_69() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let out = env.run([
        "run",
        "--url",
        &format!("etcd://127.0.0.1:{}", free_port()),
        "x",
        "touch",
        "ran",
    ]);
    assert_fails(&out, 69, "etcd");
    assert!(!env.path("ran").exists());
}

#[test]
fn a_short_wait_still_takes_a_free_lock_over_a_slow_link() {
    crate::contract::a_short_wait_still_takes_a_free_lock_over_a_slow_link(&EtcdServer::shared());
}
