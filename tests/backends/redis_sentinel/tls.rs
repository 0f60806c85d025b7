//! `rediss-sentinel://` against a master, a replica and three sentinels that speak TLS only
//! (to clients, for replication, and between the sentinels) and want a client certificate:
//! with the CA and client certificate of the `[redis]` table a run takes the lock on the
//! master and runs its command, and `status` and `check` work; another CA is a configuration
//! error (78) before the command could run; plain `redis-sentinel://` never gets through; and
//! a failover during a hold behaves as without TLS.

use super::connect::check_names_the_sentinels_the_master_and_its_replica;
use super::failover::failover_never_runs_two_commands;
use crate::support::*;

/// Make every dlock of `env` use the test CA and client certificate: the `[redis]` table of
/// the config file dlock finds by default (`$XDG_CONFIG_HOME/dlock/config.toml`), so that the
/// harness's own runs (`status` for the waiters, `hold`, `token`) use it too.
fn trust_the_test_ca(env: &TestEnv, certs: &TestCerts) {
    let dir = env.path("no-config").join("dlock");
    std::fs::create_dir_all(&dir).expect("config dir");
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "[redis]
{}",
            certs.client_config("ca.crt")
        ),
    )
    .expect("write config");
}

#[test]
fn rediss_sentinel_takes_locks_with_the_configured_certificates_and_refuses_others() {
    let server = SentinelServer::start_tls();
    let env = TestEnv::new(&server);
    let certs = server.certs();
    assert!(env.url.starts_with("rediss-sentinel://"), "{}", env.url);
    trust_the_test_ca(&env, certs);

    let out = env.run([
        "run",
        "tls",
        "sh",
        "-c",
        "echo $DLOCK_BACKEND $DLOCK_FENCING_TOKEN",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.starts_with("rediss-sentinel "), "{text}");
    // The lock was taken on the master the sentinels name (over TLS, as everything here).
    let keys = server.node_text(server.master_port(), &["KEYS", "dlock:*fence"]);
    assert!(keys.contains("dlock:{tls}:fence"), "{keys:?}");

    // `status` through the sentinels while the lock is held, then `check`.
    let mut holder = env.hold("tls", &[]);
    let out = env.run(["status", "--json", "tls"]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        json["holders"][0]["pid"].as_u64(),
        Some(u64::from(holder.pid() as u32)),
        "{json}"
    );
    // The holder follows `+switch-master` on a sentinel, over TLS too.
    wait_until(
        "a +switch-master subscription on a sentinel",
        PATIENCE,
        || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            server
                .sentinel_ports
                .iter()
                .any(|&p| server.ask(p, &["CLIENT", "LIST"]).contains("cmd=subscribe"))
        },
    );
    // SIGTERM: dlock stops its command and gives the lock back.
    holder.signal(nix::sys::signal::Signal::SIGTERM);
    let _ = holder.wait();
    assert!(env.is_free("tls"), "the lock was not given back");
    check_names_the_sentinels_the_master_and_its_replica(&server, &env);

    // Another CA: a configuration error, and the command never runs.
    let wrong_ca = env.config_file("redis", &certs.client_config("other.crt"));
    let out = env.run(["--config", &wrong_ca, "run", "tls", "touch", "ran"]);
    assert_fails(&out, 78, "TLS");
    assert!(!env.path("ran").exists(), "the command ran");
    // The right CA but no client certificate, which the servers want: the same.
    let no_client_cert = env.config_file(
        "redis",
        &format!("ca_file = \"{}\"\n", certs.path("ca.crt")),
    );
    let out = env.run(["--config", &no_client_cert, "run", "tls", "touch", "ran"]);
    assert_fails(&out, 78, "TLS");
    assert!(!env.path("ran").exists(), "the command ran");

    // Plain text to the sentinels' TLS ports: refused, never a fallback.
    let plain = env
        .url
        .replacen("rediss-sentinel://", "redis-sentinel://", 1);
    let out = env.run(["run", "--url", &plain, "tls", "touch", "ran"]);
    // (Each sentinel resets the connection: unavailable, with the way out.)
    assert_fails(&out, 69, "use rediss-sentinel://");
    assert!(!env.path("ran").exists(), "the command ran");
}

#[test]
fn rediss_sentinel_failover_while_held_and_waited_for_never_runs_two_commands() {
    let server = SentinelServer::start_tls();
    let env = TestEnv::new(&server);
    trust_the_test_ca(&env, server.certs());
    failover_never_runs_two_commands(&server, &env);
    let keys = server.node_text(server.master_port(), &["KEYS", "dlock:*fence"]);
    assert!(
        keys.contains("dlock:"),
        "no lock keys on the new master: {keys:?}"
    );
}
