//! Reaching Redis through the sentinels: all of them down (69), a slow link to one with a
//! short `--wait`, a master name they do not monitor (78), sentinels that want a password of
//! their own, and what `check` reports.

use crate::support::*;

#[test]
fn all_sentinels_down_is_69_with_a_clear_message() {
    let mut server = SentinelServer::start();
    let env = TestEnv::new(&server);
    server.stop_sentinels();
    let out = env.run(["run", "x", "touch", "ran"]);
    assert_fails(&out, 69, "no sentinel answered");
    assert!(!env.path("ran").exists());
    // The data nodes still run: status through the sentinels cannot find them either.
    let out = env.run(["status", "x"]);
    assert_fails(&out, 69, "no sentinel answered");
}

#[test]
fn a_short_wait_still_takes_a_free_lock_over_a_slow_link() {
    crate::contract::a_short_wait_still_takes_a_free_lock_over_a_slow_link(
        &SentinelServer::shared(),
    );
}

#[test]
fn a_master_name_the_sentinels_do_not_monitor_is_78() {
    let server = SentinelServer::shared();
    let env = TestEnv::new(&server);
    let url = server.url().replace("#mymaster", "#nosuchmaster");
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(&out, 78, "no master named 'nosuchmaster'");
    assert!(!env.path("ran").exists());
}

#[test]
fn sentinels_with_a_password_want_it_given_and_never_show_it() {
    let server = SentinelServer::start_with(Some("sentinel-secret-17"));
    let env = TestEnv::new(&server);
    // Missing: said so, naming where the password goes.
    let out = env.run(["run", "x", "touch", "ran"]);
    assert_fails(
        &out,
        77,
        "wants a password for user 'default', and none was given: give the sentinels' password \
         in DLOCK_SENTINEL_PASSWORD",
    );
    assert!(!env.path("ran").exists());
    // Wrong: the same, and the wrong password is not shown.
    let mut command = env.dlock(["run", "x", "true"]);
    command.env("DLOCK_SENTINEL_PASSWORD", "wrong-secret-23");
    let out = output_within(command, PATIENCE);
    assert_fails(
        &out,
        77,
        "refused user 'default' with the password given: check the sentinels' password in \
         DLOCK_SENTINEL_PASSWORD",
    );
    assert!(!stderr_of(&out).contains("wrong-secret-23"));
    // Given in the environment: it works, and the command does not see it.
    let mut command = env.dlock(["run", "x", "env"]);
    command.env("DLOCK_SENTINEL_PASSWORD", "sentinel-secret-17");
    let out = output_within(command, PATIENCE);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!stdout_of(&out).contains("sentinel-secret-17"));
    // Given in the config file's [redis-sentinel] table.
    let file = env.path("sentinel-password");
    std::fs::write(&file, "sentinel-secret-17\n").expect("password file");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let config = env.config_file(
        "redis-sentinel",
        &format!("password_file = '{}'\n", file.display()),
    );
    let out = env.run(["run", "--config", &config, "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn check_reports_the_sentinels_the_master_and_its_replicas() {
    let server = SentinelServer::shared();
    let env = TestEnv::new(&server);
    check_names_the_sentinels_the_master_and_its_replica(&server, &env);
    // One sentinel listed and down, two others up: a majority of the three answers, and the
    // silent one is named.
    let down = free_port();
    let url = format!(
        "redis-sentinel://127.0.0.1:{down},127.0.0.1:{},127.0.0.1:{}/0#{MASTER_NAME}",
        server.sentinel_ports[0], server.sentinel_ports[1]
    );
    let out = env.run(["check", "--url", &url]);
    assert!(out.status.success(), "{}", describe(&out));
    let all = format!("{}{}", stdout_of(&out), stderr_of(&out));
    assert!(all.contains("2 of 3 answered"), "{all}");
    assert!(all.contains(&format!("127.0.0.1:{down}")), "{all}");
    // One listed and down, one up: fewer than the quorum (2) answer, and no majority of the
    // three names the master, so runs could not take the lock: check says so and fails.
    let url = format!(
        "redis-sentinel://127.0.0.1:{down},127.0.0.1:{}/0#{MASTER_NAME}",
        server.sentinel_ports[0]
    );
    let out = env.run(["check", "--url", &url]);
    assert_fails(&out, 69, "only 1 of the 3 sentinels");
}

/// `dlock check` succeeds and names all three sentinels answering, the master and the replica
/// online.
pub(super) fn check_names_the_sentinels_the_master_and_its_replica(
    server: &SentinelServer,
    env: &TestEnv,
) {
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains("3 of 3 answered"), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", server.master_port())),
        "{text}"
    );
    assert!(
        text.contains(&format!("127.0.0.1:{} online", server.nodes[1].port)),
        "{text}"
    );
}
