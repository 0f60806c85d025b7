//! TLS (`tls://`): the server's certificate checked against `NATS_CA` (the `nats` CLI's
//! variable), and a server whose certificate another CA signed refused (78) before the
//! command runs.

use crate::support::*;

#[test]
fn a_tls_url_checks_the_server_against_nats_ca() {
    let certs = TestCerts::make();
    let (cert, key) = (certs.path("server.crt"), certs.path("server.key"));
    let server = NatsServer::start_with(&["--tls", "--tlscert", &cert, "--tlskey", &key]);
    let env = TestEnv::new(&server);
    let url = format!("tls://127.0.0.1:{}", server.port);
    let lock = lock_name("tls");
    let run = |ca: &str| {
        let mut command = env.dlock(["run", "--url", &url, &lock, "touch", "ran"]);
        command.env("NATS_CA", certs.path(ca));
        output_within(command, PATIENCE)
    };
    let out = run("other.crt");
    assert_fails(&out, 78, "TLS");
    assert!(!env.path("ran").exists(), "the command ran");
    let out = run("ca.crt");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists(), "the command did not run");
}
