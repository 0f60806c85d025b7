//! A cluster that speaks TLS only (to clients, on its bus, for replication), with client
//! certificates required: `rediss://` with the CA and client certificate of the `[redis]`
//! configuration reaches every master, as against a single server; a wrong CA is a
//! configuration error (78), and plain text never gets through.

use super::one_name_per_master;
use crate::support::*;

#[test]
fn rediss_reaches_every_master_of_a_tls_cluster_with_the_configured_certificates() {
    let cluster = RedisCluster::start_tls();
    let env = TestEnv::new(&cluster);
    let certs = cluster.certs();
    let good = env.config_file("redis", &certs.client_config("ca.crt"));
    let names = one_name_per_master(&cluster);
    assert!(env.url.starts_with("rediss://"), "{}", env.url);
    for (name, _) in &names {
        let out = env.run([
            "--config",
            &good,
            "run",
            name,
            "sh",
            "-c",
            "echo $DLOCK_BACKEND $DLOCK_FENCING_TOKEN",
        ]);
        assert!(out.status.success(), "{}", describe(&out));
        assert!(stdout_of(&out).starts_with("rediss "), "{}", describe(&out));
    }
    let out = env.run(["--config", &good, "check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["--config", &good, "list"]);
    assert!(out.status.success(), "{}", describe(&out));

    // Another CA: refused as a configuration error, and the command never runs.
    let wrong_ca = env.config_file("redis", &certs.client_config("other.crt"));
    let out = env.run(["--config", &wrong_ca, "run", &names[0].0, "touch", "ran"]);
    assert_fails(&out, 78, "TLS");
    // Plain text to the TLS ports: never a fallback.
    let plain = env.url.replacen("rediss://", "redis://", 1);
    let out = env.run(["run", "--url", &plain, &names[1].0, "touch", "ran"]);
    assert!(
        matches!(out.status.code(), Some(69 | 78)),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists(), "the command ran");
}
