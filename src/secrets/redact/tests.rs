use super::*;

#[test]
fn passwords_are_redacted() {
    assert_eq!(
        redact_url("redis://:s3cret@h:6379/0"),
        "redis://:***@h:6379/0"
    );
    assert_eq!(
        redact_url("postgres://u:p@db/app?x=1"),
        "postgres://u:***@db/app?x=1"
    );
    assert_eq!(redact_url("etcd://u@h:2379"), "etcd://u@h:2379");
    assert_eq!(redact_url("file:///tmp/x"), "file:///tmp/x");
    assert_eq!(
        redact_url("postgres://db/app?sslmode=require&password=s3cret&x=1"),
        "postgres://db/app?sslmode=require&password=***&x=1"
    );
    assert_eq!(
        redact_url("host=db password = 'a \\'b' dbname=app passwordless=1"),
        "host=db password=*** dbname=app passwordless=1"
    );
    assert_eq!(redact_url("host=db password=x"), "host=db password=***");
    assert_eq!(
        redact_url("host=db password=ab&cd#x\\ y dbname=app"),
        "host=db password=*** dbname=app"
    );
    assert_eq!(
        redact_url("postgres://u:p#ss@db/app"),
        "postgres://u:***@db/app"
    );
    assert_eq!(
        redact_url("postgres://u:pa/ss@db/app"),
        "postgres://u:***@db/app"
    );
}

fn shown(words: &[&str]) -> String {
    let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
    redact_command(&words).join(" ")
}

#[test]
fn secrets_in_a_command_line_are_masked() {
    let cases: &[(&[&str], &str)] = &[
        (&["mysql", "-pS3cret", "-u", "app"], "mysql -p*** -u app"),
        (&["/usr/bin/mariadb", "-pS3cret"], "/usr/bin/mariadb -p***"),
        (&["tool", "--password=S3cret", "x"], "tool --password=*** x"),
        (&["tool", "--token", "S3cret", "x"], "tool --token *** x"),
        (&["tool", "--api-key", "S3cret"], "tool --api-key ***"),
        (
            &["tool", "--key-file", "/k/S3cret.pem"],
            "tool --key-file ***",
        ),
        (
            &["tool", "--Client-Secret=S3cret"],
            "tool --Client-Secret=***",
        ),
        (
            &["env", "MYSQL_PWD=S3cret", "mysql"],
            "env MYSQL_PWD=*** mysql",
        ),
        (
            &["env", "PGPASSWORD=S3cret", "psql"],
            "env PGPASSWORD=*** psql",
        ),
        (&["env", "API_SECRET=S3cret", "x"], "env API_SECRET=*** x"),
        (&["env", "github_token=S3cret"], "env github_token=***"),
        (
            &[
                "sh",
                "-c",
                "MYSQL_PWD=S3cret mysql -pS3cret --token S3cret db",
            ],
            "sh -c MYSQL_PWD=*** mysql -p*** --token *** db",
        ),
        (&["tool", "--passwd", "S3cret"], "tool --passwd ***"),
    ];
    for (words, expected) in cases {
        let line = shown(words);
        assert!(!line.contains("S3cret"), "{words:?} -> {line}");
        assert_eq!(&line, expected, "{words:?}");
    }
    // What is no secret stays as it is.
    for words in [
        &["ssh", "-p", "22", "host"][..],
        &["find", ".", "-print"],
        &["tool", "--no-password", "-h", "db"],
        &["make", "CC=gcc", "-j4"],
        &["tool", "--keep", "x"],
    ] {
        assert_eq!(shown(words), words.join(" "));
    }
    // An option without its value at the end of a script does not mask the next word.
    assert_eq!(
        shown(&["sh", "-c", "prompt --password ", "next"]),
        "sh -c prompt --password  next"
    );
}

#[test]
fn common_secret_options_are_masked() {
    let cases: &[(&[&str], &str)] = &[
        (&["tool", "--pass", "S3cret", "x"], "tool --pass *** x"),
        (&["tool", "--passphrase", "S3cret"], "tool --passphrase ***"),
        (&["tool", "--passphrase=S3cret"], "tool --passphrase=***"),
        (&["tool", "--auth", "S3cret", "x"], "tool --auth *** x"),
        (&["tool", "--http-auth=S3cret"], "tool --http-auth=***"),
        (
            &["tool", "--credentials", "S3cret"],
            "tool --credentials ***",
        ),
        (&["tool", "--db-pass", "S3cret"], "tool --db-pass ***"),
        (
            &["env", "REDISCLI_AUTH=S3cret", "x"],
            "env REDISCLI_AUTH=*** x",
        ),
        (&["env", "SSHPASS=S3cret", "x"], "env SSHPASS=*** x"),
        (&["env", "DB_PASS=S3cret", "x"], "env DB_PASS=*** x"),
        (
            &["redis-cli", "-a", "S3cret", "ping"],
            "redis-cli -a *** ping",
        ),
        (
            &["/usr/bin/redis-cli", "-aS3cret"],
            "/usr/bin/redis-cli -a***",
        ),
        (
            &["valkey-cli", "-h", "h", "-a", "S3cret"],
            "valkey-cli -h h -a ***",
        ),
        (
            &["sshpass", "-p", "S3cret", "ssh", "h"],
            "sshpass -p *** ssh h",
        ),
        (&["sshpass", "-pS3cret", "ssh", "h"], "sshpass -p*** ssh h"),
        (
            &["curl", "-u", "bob:S3cret", "https://h/"],
            "curl -u bob:*** https://h/",
        ),
        (
            &["curl", "-ubob:S3cret", "https://h/"],
            "curl -ubob:*** https://h/",
        ),
        (&["curl", "--user", "bob:S3cret"], "curl --user bob:***"),
        (&["curl", "--user=bob:S3cret"], "curl --user=bob:***"),
        (&["curl", "-U", "proxy:S3cret", "x"], "curl -U proxy:*** x"),
        (
            &[
                "sh",
                "-c",
                "redis-cli -a S3cret ping && curl -u bob:S3cret h",
            ],
            "sh -c redis-cli -a *** ping && curl -u bob:*** h",
        ),
    ];
    for (words, expected) in cases {
        let line = shown(words);
        assert!(!line.contains("S3cret"), "{words:?} -> {line}");
        assert_eq!(&line, expected, "{words:?}");
    }
}

#[test]
fn short_options_of_other_programs_stay_as_they_are() {
    for words in [
        &["tar", "-u", "-f", "a.tar", "b"][..],
        &["cp", "-a", "src", "dst"],
        &["ssh", "-p", "22", "host"],
        &["docker", "run", "-u", "1000:1000", "img"],
        &["rsync", "-a", "src", "dst"],
        &["git", "commit", "--author", "A <a@b>"],
        &["tool", "--passthrough", "x"],
        &["curl", "-u", "bob", "https://h/"],
        &["mysql", "-p", "db"],
    ] {
        assert_eq!(shown(words), words.join(" "));
    }
}

#[test]
fn each_url_of_a_line_is_masked_on_its_own() {
    assert_eq!(
        redact_url("https://api@h1.example/p; curl https://web@h2.example/q"),
        "https://api@h1.example/p; curl https://web@h2.example/q"
    );
    assert_eq!(
        redact_url("a https://u:S3cret@h1/p b https://v:S3cret@h2/q c"),
        "a https://u:***@h1/p b https://v:***@h2/q c"
    );
    assert_eq!(
        shown(&[
            "sh",
            "-c",
            "curl https://api@h1.example/p; curl https://web@h2.example/q"
        ]),
        "sh -c curl https://api@h1.example/p; curl https://web@h2.example/q"
    );
    // A `://` in a password starts no URL of its own.
    for url in ["redis://:a://S3cret@h", "redis://u:x;b://S3cret@h"] {
        let shown = redact_url(url);
        assert!(!shown.contains("S3cret"), "{url} -> {shown}");
    }
}

#[test]
fn passwords_the_parsers_would_find_are_redacted() {
    // A percent-encoded key is still `password` to the URL parser.
    assert_eq!(
        redact_url("postgres://db/app?pass%77ord=s3cret&x=1"),
        "postgres://db/app?pass%77ord=***&x=1"
    );
    assert_eq!(
        redact_url("postgres://db/app?options=-c%20a=b&password=s3cret"),
        "postgres://db/app?options=-c%20a=b&password=***"
    );
    // Any white space separates key=value pairs.
    for sep in ["\n", "\u{b}", "\u{3000}", "\r\n", "\u{c}"] {
        let text = format!("host=db{sep}password=s3cret dbname=app");
        let shown = redact_url(&text);
        assert!(!shown.contains("s3cret"), "{text:?} -> {shown:?}");
        let parsed = crate::backend::Target::parse(&text);
        let Some(target) = parsed
            .as_ref()
            .ok()
            .and_then(|t| t.downcast_ref::<crate::backend::postgres::PgTarget>())
        else {
            panic!("{text:?} does not parse as PostgreSQL");
        };
        assert_eq!(
            target
                .password
                .as_ref()
                .map(|p| p.expose().to_owned())
                .as_deref(),
            Some("s3cret")
        );
    }
    // Keys that merely contain the word stay as they are.
    assert_eq!(redact_url("host=db xpassword=1"), "host=db xpassword=1");
}
