//! PostgreSQL over TLS: `sslmode=require` never falls back to plain text, `verify-full` works
//! with the right CA and fails with another.

use crate::support::*;

#[test]
fn tls_require_never_falls_back_to_plaintext() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        server.port
    );
    let out = env.run(["run", "--url", &url, &lock_name("p"), "true"]);
    assert_fails(&out, 78, "TLS");
}

#[test]
fn tls_verify_full_works_and_a_wrong_ca_is_78() {
    let certs = TestCerts::make();
    // The server's key must belong to the server's user and be private.
    let dir = tempfile::tempdir().expect("temp dir");
    for file in ["server.crt", "server.key"] {
        let to = dir.path().join(file);
        std::fs::copy(certs.path(file), &to).expect("copy cert");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        give_away(&to);
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let cert = dir.path().join("server.crt").display().to_string();
    let key = dir.path().join("server.key").display().to_string();
    let server = PgServer::start_with(&[
        "-c",
        "ssl=on",
        "-c",
        &format!("ssl_cert_file={cert}"),
        "-c",
        &format!("ssl_key_file={key}"),
    ]);
    let env = TestEnv::new(&server);
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        certs.path("ca.crt")
    );
    let out = env.run(["run", "--url", &url, &lock_name("p"), "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["check", "--url", &url]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains("TLSv1"), "{}", describe(&out));
    // A CA that did not sign the server's certificate.
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        certs.path("other.crt")
    );
    let out = env.run(["run", "--url", &url, &lock_name("p"), "true"]);
    assert_fails(&out, 78, "TLS");
}
