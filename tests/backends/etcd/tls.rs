//! etcd over TLS with the configured CA and client certificate, and no fallback to plain
//! text.

use crate::support::*;

#[test]
fn tls_with_the_configured_ca_and_client_certificate() {
    let certs = TestCerts::make();
    let server = EtcdServer::start_tls(&certs);
    let env = TestEnv::new(&server);
    let config = |body: String| env.config_file("etcd", &body);
    let good = config(certs.client_config("ca.crt"));
    let out = env.run([
        "--config",
        &good,
        "run",
        "tls",
        "sh",
        "-c",
        "echo $DLOCK_BACKEND",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out), "etcds\n");
    let wrong_ca = config(certs.client_config("other.crt"));
    let out = env.run(["--config", &wrong_ca, "run", "tls", "touch", "ran"]);
    assert_fails(&out, 78, "TLS");
    let no_client_cert = config(format!("ca_file = \"{}\"\n", certs.path("ca.crt")));
    let out = env.run(["--config", &no_client_cert, "run", "tls", "touch", "ran"]);
    assert_fails(&out, 78, "client certificate");
    // Plain text to the TLS port fails; nothing falls back.
    let plain = format!("etcd://{}", server.endpoints());
    let out = env.run(["run", "--url", &plain, "tls", "touch", "ran"]);
    assert!(
        matches!(out.status.code(), Some(69 | 78)),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
}
