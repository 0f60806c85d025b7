//! Certificates for the TLS tests, made fresh for each test with the `openssl` command.

use std::process::{Command, Stdio};

use super::*;

/// A throw-away CA with a server certificate (localhost, 127.0.0.1), a client certificate,
/// and a second, unrelated CA; made with the `openssl` command.
pub struct TestCerts {
    pub dir: tempfile::TempDir,
}

impl TestCerts {
    pub fn make() -> TestCerts {
        let dir = tempfile::tempdir().expect("temp dir");
        for ca in ["ca", "other"] {
            openssl(
                dir.path(),
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.crt"),
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN=dlock test {ca}"),
                ],
            );
        }
        let certs = TestCerts { dir };
        certs.sign(
            "server",
            "localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        );
        certs.sign(
            "client",
            "localhost",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        );
        certs
    }

    /// One more certificate signed by the CA, `NAME.crt` and `NAME.key`, for the names in
    /// `san` (e.g. `DNS:db.example`): a server certificate that does not name this machine.
    pub fn leaf(&self, name: &str, san: &str) {
        self.sign(name, name, &format!("subjectAltName={san}\n"));
    }

    /// `NAME.key` and `NAME.crt`, common name `cn`, signed by the CA with the extensions `ext`.
    fn sign(&self, name: &str, cn: &str, ext: &str) {
        let dir = self.dir.path();
        std::fs::write(dir.join(format!("{name}.ext")), ext).expect("write");
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }

    /// A backend table's TLS lines: trust the CA in `ca` (a file of this set, e.g. `ca.crt`, or
    /// `other.crt` for a CA the servers do not use), with the client certificate and key.
    pub fn client_config(&self, ca: &str) -> String {
        format!(
            "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            self.path(ca),
            self.path("client.crt"),
            self.path("client.key")
        )
    }
}

/// `openssl ARGS` in `dir`; a failure fails the test with openssl's own message.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new(server_binary("openssl", "openssl"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
