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
        let openssl = server_binary("openssl", "openssl");
        let dir = tempfile::tempdir().expect("temp dir");
        let run = |args: &[&str]| {
            let out = Command::new(&openssl)
                .args(args)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        std::fs::write(
            dir.path().join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("client.ext"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .expect("write");
        for ca in ["ca", "other"] {
            run(&[
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
            ]);
        }
        for leaf in ["server", "client"] {
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{leaf}.key"),
                "-out",
                &format!("{leaf}.csr"),
                "-subj",
                "/CN=localhost",
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{leaf}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{leaf}.crt"),
                "-days",
                "2",
                "-extfile",
                &format!("{leaf}.ext"),
            ]);
        }
        TestCerts { dir }
    }

    /// One more certificate signed by the CA, `NAME.crt` and `NAME.key`, for the names in
    /// `san` (e.g. `DNS:db.example`): a server certificate that does not name this machine.
    pub fn leaf(&self, name: &str, san: &str) {
        let openssl = server_binary("openssl", "openssl");
        std::fs::write(
            self.dir.path().join(format!("{name}.ext")),
            format!("subjectAltName={san}\n"),
        )
        .expect("write");
        for args in [
            vec![
                "req".to_owned(),
                "-newkey".into(),
                "rsa:2048".into(),
                "-nodes".into(),
                "-keyout".into(),
                format!("{name}.key"),
                "-out".into(),
                format!("{name}.csr"),
                "-subj".into(),
                format!("/CN={name}"),
            ],
            vec![
                "x509".to_owned(),
                "-req".into(),
                "-in".into(),
                format!("{name}.csr"),
                "-CA".into(),
                "ca.crt".into(),
                "-CAkey".into(),
                "ca.key".into(),
                "-CAcreateserial".into(),
                "-out".into(),
                format!("{name}.crt"),
                "-days".into(),
                "2".into(),
                "-extfile".into(),
                format!("{name}.ext"),
            ],
        ] {
            let out = Command::new(&openssl)
                .args(&args)
                .current_dir(self.dir.path())
                .stdin(Stdio::null())
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }
}
