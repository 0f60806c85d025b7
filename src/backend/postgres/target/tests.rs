use super::*;

#[test]
fn url_with_everything() {
    let t = parse_url(
        "postgresql://app:p%40ss@db1:5433,[::1]/my%20db?sslmode=verify-full&sslrootcert=/ca.pem&application_name=cron",
    )
    .unwrap();
    assert_eq!(t.user.as_deref(), Some("app"));
    assert_eq!(t.password.as_ref().map(Secret::expose), Some("p@ss"));
    assert_eq!(
        t.hosts,
        vec![
            PgHost::Tcp {
                host: "db1".into(),
                port: 5433
            },
            PgHost::Tcp {
                host: "::1".into(),
                port: DEFAULT_PORT
            }
        ]
    );
    assert_eq!(t.dbname.as_deref(), Some("my db"));
    assert_eq!(t.sslmode, SslMode::VerifyFull);
    assert_eq!(t.tls_files.ca_file, Some(PathBuf::from("/ca.pem")));
    assert_eq!(t.application_name.as_deref(), Some("cron"));
}

#[test]
fn url_without_host_is_the_default_socket() {
    let t = parse_url("postgres:///app").unwrap();
    assert_eq!(
        t.hosts,
        vec![PgHost::Unix {
            dir: PathBuf::from(DEFAULT_SOCKET_DIR),
            port: DEFAULT_PORT
        }]
    );
    assert_eq!(t.sslmode, SslMode::Prefer);
    let t = parse_url("postgres://%2Ftmp%2Fpg:6000/app").unwrap();
    assert_eq!(
        t.hosts,
        vec![PgHost::Unix {
            dir: PathBuf::from("/tmp/pg"),
            port: 6000
        }]
    );
}

#[test]
fn key_value_form_with_quotes() {
    assert!(is_key_value("host=db dbname=app"));
    assert!(!is_key_value("postgres://u@h/db?sslmode=require"));
    let t = parse_key_value(
        "host=/run/pg port = 6000 dbname='my \\'app\\'' password='a b' sslmode=require",
    )
    .unwrap();
    assert_eq!(
        t.hosts,
        vec![PgHost::Unix {
            dir: PathBuf::from("/run/pg"),
            port: 6000
        }]
    );
    assert_eq!(t.dbname.as_deref(), Some("my 'app'"));
    assert_eq!(t.password.as_ref().map(Secret::expose), Some("a b"));
    assert_eq!(t.sslmode, SslMode::Require);
}

#[test]
fn bad_input_is_named() {
    let err = parse_key_value("host=db frobnicate=1").unwrap_err();
    assert!(err.contains("frobnicate"), "{err}");
    let err = parse_url("postgres://h/db?sslmode=sometimes").unwrap_err();
    assert!(err.contains("sometimes"), "{err}");
    assert!(parse_url("postgres://h:99999/db").is_err());
    assert!(parse_url("postgres://h1,h2/db?port=1,2,3").is_err());
    assert!(parse_key_value("host=db dbname='open").is_err());
    assert!(parse_url("postgres://::1/db").is_err());
    let list = "host, hostaddr, port, user, password, dbname, sslmode, sslrootcert, sslcert, \
                sslkey, passfile, connect_timeout, application_name, fallback_application_name, \
                options; see dlock run --help";
    // The same refusal in both forms; only what the key is differs.
    assert_eq!(
        parse_url("postgres://h/db?ssl_mode=require").unwrap_err(),
        format!(
            "unknown URL parameter 'ssl_mode' (did you mean 'sslmode'?); a PostgreSQL URL \
             takes {list}"
        )
    );
    assert_eq!(
        parse_key_value("host=db ssl_mode=require").unwrap_err(),
        format!(
            "unknown connection parameter 'ssl_mode' (did you mean 'sslmode'?); a PostgreSQL \
             connection string takes {list}"
        )
    );
    // Not a plain word: perhaps part of a password, so not shown.
    let err = parse_key_value("host=db hunter2!=x").unwrap_err();
    assert!(err.starts_with("unknown connection parameter; "), "{err}");
    assert_eq!(
        parse_url("postgres://h/db?sslmode=require&sslmode=disable").unwrap_err(),
        "the URL parameter 'sslmode' is given twice"
    );
}

#[test]
fn postgres_urls_in_both_forms() {
    use crate::kind::Target;
    let Ok(t) = Target::parse_as::<PgTarget>("postgresql://u@db:6432/app?sslmode=disable") else {
        panic!("not a postgres URL");
    };
    assert_eq!(t.dbname.as_deref(), Some("app"));
    assert_eq!(t.sslmode, SslMode::Disable);
    let Ok(t) = Target::parse_as::<PgTarget>("host=/run/pg dbname=app") else {
        panic!("not a key=value string");
    };
    assert_eq!(t.dbname.as_deref(), Some("app"));
    assert!(Target::parse("host=db bogus=1").is_err());
}
