//! The account and the container as dlock reads them: what is missing or wrong is said in
//! one line with the right status, the container is never created, another kind of server
//! at the endpoint is named, and no key or SAS ever reaches a message, a log line, `status`,
//! `check` or the outcome record.

use crate::support::*;

/// Fails unless none of `secrets` is in `out`'s streams.
fn assert_shows_none_of(out: &std::process::Output, secrets: &[&str]) {
    let text = format!("{}{}", stdout_of(out), stderr_of(out));
    for secret in secrets {
        assert!(!text.contains(secret), "'{secret}' shown: {}", describe(out));
    }
}

/// No account in the environment: 78 naming the variables that give one, before any request.
#[test]
fn no_account_is_78_naming_the_variables() {
    let server = AzuriteServer::shared();
    let mut env = TestEnv::new(&server);
    env.env.clear();
    let out = env.run(["run", &lock_name("none"), "touch", "ran"]);
    assert_fails(
        &out,
        78,
        "no Azure Storage account is configured: set AZURE_STORAGE_CONNECTION_STRING, or \
         AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN",
    );
    assert!(!env.path("ran").exists());
    let out = env.run(["status", &lock_name("none")]);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
}

/// A container name Azure would refuse is a usage error (64) at once; a container that does
/// not exist is 78 saying dlock never creates one, and it still does not exist afterwards.
#[test]
fn a_bad_container_is_64_and_a_missing_one_78_never_created() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let out = env.run(["run", "--url", "az://Bad_Name", &lock_name("c"), "touch", "ran"]);
    assert_fails(&out, 64, "'Bad_Name' is not a container name");
    let missing = format!(
        "az://no-such-container?endpoint=http://127.0.0.1:{}/{AZURITE_ACCOUNT}",
        server.port
    );
    for args in [
        vec!["run", "--url", &missing, "x", "touch", "ran"],
        vec!["status", "--url", &missing, "x"],
        vec!["check", "--url", &missing],
    ] {
        let out = env.run(&args);
        assert_fails(
            &out,
            78,
            "the container 'no-such-container' does not exist (ContainerNotFound); dlock never \
             creates one",
        );
    }
    assert!(!env.path("ran").exists());
    let container = server.request("GET", "/no-such-container", &[("restype", "container")], &[]);
    assert_eq!(container.status, 404, "the container was created");
}

/// A wrong key and a SAS the service refuses are 77, and neither the key, nor the SAS, nor
/// the right key appears in any output, log line (`-vv`) or outcome record.
#[test]
fn refused_credentials_are_77_and_no_secret_is_ever_shown() {
    let server = AzuriteServer::shared();
    let mut env = TestEnv::new(&server);
    let endpoint = format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", server.port);
    let wrong_key = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=";
    let sas = "sv=2021-08-06&ss=b&srt=sco&sp=rwdl&se=2099-01-01T00:00:00Z&sig=c2VjcmV0LXNhcw%3D";
    for connection in [
        format!(
            "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={wrong_key};\
             BlobEndpoint={endpoint};"
        ),
        format!("BlobEndpoint={endpoint};SharedAccessSignature={sas}"),
    ] {
        env.env = vec![("AZURE_STORAGE_CONNECTION_STRING", connection)];
        let report = env.path("report");
        let out = env.run([
            "run",
            "-vv",
            "--report",
            report.to_str().expect("utf-8"),
            &lock_name("k"),
            "true",
        ]);
        assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
        assert!(stderr_of(&out).contains("refused the request"), "{}", describe(&out));
        let recorded = std::fs::read_to_string(&report).unwrap_or_default();
        for secret in [wrong_key, "c2VjcmV0LXNhcw", AZURITE_KEY] {
            assert!(!recorded.contains(secret), "'{secret}' recorded: {recorded}");
        }
        assert_shows_none_of(&out, &[wrong_key, "c2VjcmV0LXNhcw", AZURITE_KEY]);
    }
    // With the right key: a run, status, list and check at -vv show no part of it.
    let env = TestEnv::new(&server);
    let lock = lock_name("k");
    let _holder = env.hold(&lock, &[]);
    for args in [
        vec!["run", "-vv", "--no-wait", &lock, "true"],
        vec!["status", "-vv", "--json", &lock],
        vec!["list", "-vv"],
        vec!["check", "-vv", "--json"],
    ] {
        let out = env.run(&args);
        assert_shows_none_of(&out, &[AZURITE_KEY, &AZURITE_KEY[..20]]);
    }
}

/// `check` reads the container, compares the service's clock with this host's, and takes
/// and gives back a lease on a probe blob it leaves nothing of.
#[test]
fn check_takes_a_lease_and_compares_clocks() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let out = env.run(["check", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let text = json.to_string();
    assert!(text.contains("service clock"), "{text}");
    assert!(text.contains("a lease was taken and released"), "{text}");
    let prefix = env.prefix.clone().unwrap_or_default();
    let left: Vec<_> = server
        .blobs(&prefix)
        .into_iter()
        .filter(|(name, _)| name.contains("~check-"))
        .collect();
    assert!(left.is_empty(), "check left {left:?}");
}

/// An endpoint where another kind of server answers is 69 at once, naming what answers.
#[test]
fn an_endpoint_at_another_kind_of_server_names_what_answers() {
    let server = AzuriteServer::shared();
    let env = TestEnv::new(&server);
    let redis = RedisServer::shared();
    let url = format!("az://{CONTAINER}?endpoint=http://127.0.0.1:{}/x", redis.port);
    let out = env.run(["run", "--wait", "60s", "--url", &url, &lock_name("o"), "touch", "ran"]);
    assert_fails(
        &out,
        69,
        "does not look like an Azure Blob server (it answers like a Redis server)",
    );
    assert!(!env.path("ran").exists());
}
