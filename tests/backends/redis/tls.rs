//! Redis over TLS: the configured CA and client certificate, bad certificate files, and no
//! fallback to plain text either way.

use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn tls_against_a_plaintext_port_fails_and_never_falls_back() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let url = format!("rediss://127.0.0.1:{}/0", server.port);
    let started = Instant::now();
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert!(
        matches!(out.status.code(), Some(69 | 78)),
        "{}",
        describe(&out)
    );
    // A plaintext server never answers the handshake: one connection's 5 s says so, with a
    // hint, and nothing is tried again or withdrawn (nothing was sent).
    assert!(
        stderr_of(&out).contains("TLS handshake"),
        "{}",
        describe(&out)
    );
    assert!(took < Duration::from_secs(5) + PAST_WAIT, "took {took:?}");
    assert!(
        !env.path("ran").exists(),
        "the command ran over a connection that is not TLS"
    );
}

#[test]
fn tls_with_the_configured_ca_and_client_certificate() {
    let certs = TestCerts::make();
    let port = free_port();
    let server = RedisServer::start_on(
        port,
        &[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &certs.path("server.crt"),
            "--tls-key-file",
            &certs.path("server.key"),
            "--tls-ca-cert-file",
            &certs.path("ca.crt"),
            "--tls-auth-clients",
            "yes",
        ],
    );
    let env = TestEnv::new(&server);
    let url = format!("rediss://127.0.0.1:{port}/0");
    let good = env.config_file("redis", &certs.client_config("ca.crt"));
    let out = env.run([
        "--config",
        &good,
        "run",
        "--url",
        &url,
        "tls",
        "sh",
        "-c",
        "echo $DLOCK_BACKEND",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out), "rediss\n");

    // An unknown CA, and a missing client certificate, are configuration errors.
    let wrong_ca = env.config_file(
        "redis",
        &format!("ca_file = \"{}\"\n", certs.path("other.crt")),
    );
    let out = env.run([
        "--config", &wrong_ca, "run", "--url", &url, "tls", "touch", "ran",
    ]);
    assert_fails(&out, 78, "TLS");
    let no_client = env.config_file(
        "redis",
        &format!("ca_file = \"{}\"\n", certs.path("ca.crt")),
    );
    let out = env.run([
        "--config", &no_client, "run", "--url", &url, "tls", "touch", "ran",
    ]);
    assert_fails(&out, 78, "TLS");
    // Plain text to the TLS port fails; nothing falls back.
    let out = env.run([
        "run",
        "--url",
        &format!("redis://127.0.0.1:{port}/0"),
        "tls",
        "touch",
        "ran",
    ]);
    assert!(
        matches!(out.status.code(), Some(69 | 78)),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
}

#[test]
fn bad_tls_files_are_78_before_connecting() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let not_pem = env.path("not-a-cert.pem");
    std::fs::write(&not_pem, "hello").expect("write");
    let config = env.config_file("redis", &format!("ca_file = \"{}\"\n", not_pem.display()));
    let out = env.run([
        "--config",
        &config,
        "run",
        "--url",
        "rediss://127.0.0.1:1/0",
        "x",
        "true",
    ]);
    assert_fails(&out, 78, "no PEM certificate");
    let config = env.config_file("redis", &format!("cert_file = \"{}\"\n", not_pem.display()));
    let out = env.run([
        "--config",
        &config,
        "run",
        "--url",
        "rediss://127.0.0.1:1/0",
        "x",
        "true",
    ]);
    assert_fails(&out, 78, "both cert_file and key_file");
}
