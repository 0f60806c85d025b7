//! MySQL / MariaDB over TLS, against a MariaDB with a test CA's certificate for 127.0.0.1 and
//! localhost: which `ssl-mode` encrypts the lock's own session (as the server sees that
//! session, in performance_schema), certificate and host-name checks that fail with 78 before
//! the command runs, client certificates, a server that refuses plaintext, and one that offers
//! no TLS.
//!
//! PREFERRED skips TLS on a loopback address. To see what it does towards another host
//! without leaving 127.0.0.1, the tests spell the address as `[::ffff:127.0.0.1]` (IPv4-mapped
//! IPv6), which dlock does not count as loopback.

use crate::support::*;

/// IPv4-mapped 127.0.0.1: reaches the server, but is not a loopback address to dlock.
const REMOTE_LOOKING: &str = "[::ffff:127.0.0.1]";

fn url(server: &MysqlServer, user: &str, host: &str, query: &str) -> String {
    format!("mysql://{user}@{host}:{}/dlock?{query}", server.port)
}

fn start(options: Vec<String>, more: &[&str]) -> MysqlServer {
    let mut all: Vec<&str> = options.iter().map(String::as_str).collect();
    all.extend(more);
    MysqlServer::start_with(&all)
}

/// Hold a lock through `url` and return the `Ssl_cipher` of the holder's session as the
/// server sees it ("" for a session without TLS).
fn cipher_of_holder(server: &MysqlServer, env: &TestEnv, url: &str) -> String {
    let lock = lock_name("t");
    let _holder = env.hold(&lock, &["--url", url]);
    let out = env.run(["status", "--json", "--url", url, &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let session = json["holders"][0]["session"].as_str().unwrap_or_default();
    let id: u64 = session
        .strip_prefix("connection id ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no connection id in {json}"));
    server
        .session_status(id, "Ssl_cipher")
        .unwrap_or_else(|| panic!("the server has no session {id} ({url})"))
}

#[test]
fn the_lock_session_is_encrypted_as_ssl_mode_says() {
    let certs = TestCerts::make();
    let server = start(
        MysqlServer::tls_options(&certs, "server"),
        &["--performance-schema=ON"],
    );
    let env = TestEnv::new(&server);
    let ca = certs.path("ca.crt");
    for (host, query, encrypted) in [
        ("127.0.0.1", "ssl-mode=REQUIRED".to_owned(), true),
        // The certificate names 127.0.0.1: the host name check passes.
        (
            "127.0.0.1",
            format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
            true,
        ),
        // PREFERRED: TLS where the server offers it, but not on a loopback address.
        (REMOTE_LOOKING, "ssl-mode=PREFERRED".to_owned(), true),
        ("127.0.0.1", "ssl-mode=PREFERRED".to_owned(), false),
        ("127.0.0.1", "ssl-mode=DISABLED".to_owned(), false),
    ] {
        let url = url(&server, "dlock", host, &query);
        let cipher = cipher_of_holder(&server, &env, &url);
        assert_eq!(
            !cipher.is_empty(),
            encrypted,
            "{url}: Ssl_cipher '{cipher}'"
        );
        // `check` reports the session's TLS as the server sees it, not the ssl-mode asked for.
        let tls = check_tls_line(&env, &url);
        assert_eq!(tls.starts_with("tls: TLSv"), encrypted, "{url}: {tls}");
    }
}

/// The `tls:` line of `dlock check --url URL`, which must succeed.
fn check_tls_line(env: &TestEnv, url: &str) -> String {
    let out = env.run(["check", "--url", url]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("tls:"))
        .unwrap_or_else(|| panic!("no tls line: {text}"));
    one_space(line)
}

/// `line` with its runs of spaces made one: `check` aligns its values to its longest label.
fn one_space(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn verify_ca_checks_the_chain_before_the_command_runs_and_client_certificates_work() {
    let certs = TestCerts::make();
    let server = start(MysqlServer::tls_options(&certs, "server"), &[]);
    server.sql("CREATE USER 'certified'@'%' REQUIRE X509; GRANT ALL ON dlock.* TO 'certified'@'%'");
    let env = TestEnv::new(&server);
    let lock = lock_name("t");
    let good = url(
        &server,
        "dlock",
        "127.0.0.1",
        &format!("ssl-mode=VERIFY_CA&ssl-ca={}", certs.path("ca.crt")),
    );
    let out = env.run(["run", "--url", &good, &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    // A CA that did not sign the server's certificate.
    let wrong = url(
        &server,
        "dlock",
        "127.0.0.1",
        &format!("ssl-mode=VERIFY_CA&ssl-ca={}", certs.path("other.crt")),
    );
    let out = env.run(["run", "--url", &wrong, &lock, "touch", "wrong"]);
    assert_fails(&out, 78, "TLS");
    assert!(
        stderr_of(&out).contains("ssl-ca must name the CA"),
        "{}",
        describe(&out)
    );
    assert!(!env.path("wrong").exists(), "the command ran");
    // An account that requires a client certificate: given, and not given.
    let client = format!(
        "ssl-mode=VERIFY_CA&ssl-ca={}&ssl-cert={}&ssl-key={}",
        certs.path("ca.crt"),
        certs.path("client.crt"),
        certs.path("client.key")
    );
    let with_cert = url(&server, "certified", "127.0.0.1", &client);
    let out = env.run(["run", "--url", &with_cert, &lock, "touch", "certified"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("certified").exists());
    let without = url(
        &server,
        "certified",
        "127.0.0.1",
        &format!("ssl-mode=VERIFY_CA&ssl-ca={}", certs.path("ca.crt")),
    );
    let out = env.run(["run", "--url", &without, &lock, "touch", "uncertified"]);
    assert_fails(
        &out,
        77,
        "wants a password for user 'certified', and none was given: give it in the URL, \
         DLOCK_PASSWORD or password_file, or the account wants a client certificate",
    );
    assert!(!env.path("uncertified").exists(), "the command ran");
}

#[test]
fn verify_identity_refuses_a_certificate_for_another_host() {
    let certs = TestCerts::make();
    certs.leaf("elsewhere", "DNS:db.example");
    let server = start(MysqlServer::tls_options(&certs, "elsewhere"), &[]);
    let env = TestEnv::new(&server);
    let lock = lock_name("t");
    let ca = certs.path("ca.crt");
    // The chain is good: VERIFY_CA takes it.
    let chain_only = url(
        &server,
        "dlock",
        "127.0.0.1",
        &format!("ssl-mode=VERIFY_CA&ssl-ca={ca}"),
    );
    let out = env.run(["run", "--url", &chain_only, &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    // But it names db.example, not the host dlock was told.
    for host in ["127.0.0.1", "localhost"] {
        let identity = url(
            &server,
            "dlock",
            host,
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
        );
        let out = env.run(["run", "--url", &identity, &lock, "touch", "wrong"]);
        assert_fails(&out, 78, "TLS");
        assert!(
            stderr_of(&out).contains("not valid for name")
                && stderr_of(&out).contains("ssl-mode=VERIFY_CA"),
            "{}",
            describe(&out)
        );
        assert!(!env.path("wrong").exists(), "the command ran");
    }
}

#[test]
fn a_server_that_requires_tls_refuses_disabled_with_78_and_preferred_encrypts() {
    let certs = TestCerts::make();
    let server = start(
        MysqlServer::tls_options(&certs, "server"),
        &["--require-secure-transport=ON"],
    );
    let env = TestEnv::new(&server);
    let lock = lock_name("t");
    // MariaDB answers "Access denied" (1045), as for a wrong password; dlock tells them apart.
    let disabled = url(&server, "dlock", "127.0.0.1", "ssl-mode=DISABLED");
    let out = env.run(["run", "--url", &disabled, &lock, "touch", "ran"]);
    assert_fails(&out, 78, "require_secure_transport");
    assert!(
        stderr_of(&out).contains("ssl-mode=REQUIRED"),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists(), "the command ran");
    // A wrong password stays a wrong password (77), with and without TLS.
    for mode in ["DISABLED", "REQUIRED"] {
        let wrong = format!(
            "mysql://app:not-the-password@127.0.0.1:{}/dlock?ssl-mode={mode}",
            server.port
        );
        let out = env.run(["run", "--url", &wrong, &lock, "touch", "ran"]);
        assert_fails(
            &out,
            77,
            &crate::backends::password_refused(&format!("127.0.0.1:{}", server.port), "app"),
        );
        assert!(!stderr_of(&out).contains("not-the-password"));
    }
    // PREFERRED on loopback starts without TLS, is refused, and goes on with TLS (the server
    // takes no other); REQUIRED uses TLS from the start.
    for mode in ["PREFERRED", "REQUIRED"] {
        let url = url(&server, "dlock", "127.0.0.1", &format!("ssl-mode={mode}"));
        let out = env.run(["run", "--url", &url, &lock, "touch", mode]);
        assert!(out.status.success(), "{mode}: {}", describe(&out));
        assert!(env.path(mode).exists());
    }
    assert!(!env.path("ran").exists(), "a refused command ran");
}

#[test]
fn a_server_without_tls_is_78_for_required_and_plaintext_for_preferred() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("t");
    let required = url(&server, "dlock", "127.0.0.1", "ssl-mode=REQUIRED");
    let out = env.run(["run", "--url", &required, &lock, "touch", "ran"]);
    assert_fails(
        &out,
        78,
        "did not answer the TLS handshake; is it serving plain text? (ssl-mode=REQUIRED requires TLS",
    );
    assert!(!env.path("ran").exists(), "the command ran");
    // PREFERRED towards a remote-looking host asks for TLS, and falls back to plaintext.
    let preferred = url(&server, "dlock", REMOTE_LOOKING, "ssl-mode=PREFERRED");
    let out = env.run(["run", "--url", &preferred, &lock, "touch", "preferred"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("preferred").exists());
    // `check` says so: the session has no TLS, and towards another host that is a warning.
    let out = env.run(["check", "--url", &preferred]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    let lines: Vec<String> = text.lines().map(one_space).collect();
    assert!(
        lines.iter().any(|l| l == "tls: none (ssl-mode=PREFERRED)")
            && lines
                .iter()
                .any(|l| l == "warning: the connection is not encrypted (ssl-mode=PREFERRED)"),
        "{text}"
    );
}
