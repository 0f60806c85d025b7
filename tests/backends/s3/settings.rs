//! Settings the way the AWS tools read them, and the refusals before any request: no
//! credentials (78, naming the variables), a bad bucket name or URL option, a TTL below
//! S3's least (64).

use crate::support::*;

/// `dlock ARGS` without the AWS variables the test process sets, with `vars` instead.
fn without_credentials(env: &TestEnv, args: &[&str], vars: &[(&str, &str)]) -> std::process::Output {
    let mut command = env.dlock(args);
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"] {
        command.env_remove(name);
    }
    command.env("HOME", env.path("home"));
    for (name, value) in vars {
        command.env(name, value);
    }
    output_within(command, PATIENCE)
}

#[test]
fn no_credentials_is_78_naming_the_variables() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let out = without_credentials(&env, &["run", &lock_name("c"), "touch", "ran"], &[]);
    assert_fails(&out, 78, "no AWS credentials for s3://: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
    assert!(!env.path("ran").exists());
}

/// A profile in the shared credentials file, and the endpoint from AWS_ENDPOINT_URL_S3.
#[test]
fn a_profile_and_the_endpoint_variable_are_used() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let credentials = env.path("credentials");
    std::fs::write(
        &credentials,
        "[default]\naws_access_key_id = nope\naws_secret_access_key = nope\n\
         [ci]\naws_access_key_id = AKIDCI\naws_secret_access_key = ci-secret\n",
    )
    .expect("write the credentials file");
    let url = format!("s3://{BUCKET}");
    let out = without_credentials(
        &env,
        &["-vv", "run", "--url", &url, &lock_name("p"), "true"],
        &[
            ("AWS_PROFILE", "ci"),
            ("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().expect("utf-8")),
            ("AWS_ENDPOINT_URL_S3", &server.endpoint()),
            ("AWS_REGION", "eu-west-1"),
        ],
    );
    assert!(out.status.success(), "{}", describe(&out));
    let out = without_credentials(
        &env,
        &["check", "--url", &url],
        &[
            ("AWS_PROFILE", "ci"),
            ("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().expect("utf-8")),
            ("AWS_ENDPOINT_URL_S3", &server.endpoint()),
        ],
    );
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains("profile ci"), "{text}");
    assert!(!text.contains("ci-secret"), "{text}");
}

#[test]
fn a_bad_bucket_or_option_is_64() {
    let env = TestEnv::new(&S3Server::shared());
    for (url, said) in [
        ("s3://Bad_Bucket", "bucket name is not valid"),
        ("s3://ab", "is not a valid bucket name"),
        ("s3://bucket?region=", "region takes a region name"),
        ("s3://bucket?endpoint=ftp://x", "endpoint"),
        ("s3://key:secret@bucket", "credentials come from"),
        ("s3://bucket?bogus=1", "unknown URL parameter 'bogus'"),
    ] {
        let out = env.run(["run", "--url", url, &lock_name("b"), "touch", "ran"]);
        assert_fails(&out, 64, said);
        assert!(!stderr_of(&out).contains("secret"), "{}", describe(&out));
    }
    assert!(!env.path("ran").exists());
}

#[test]
fn a_ttl_below_five_seconds_is_64() {
    let env = TestEnv::new(&S3Server::shared());
    let out = env.run(["run", "--ttl", "3s", &lock_name("t"), "touch", "ran"]);
    assert_fails(&out, 64, "5s");
    assert!(!env.path("ran").exists());
}

/// dlock never creates a bucket: one that does not exist is 78, with the server's code.
#[test]
fn a_bucket_that_does_not_exist_is_78_and_not_created() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let url = format!(
        "s3://no-such-bucket-dlock?endpoint={}&region=us-east-1",
        server.endpoint()
    );
    let out = env.run(["run", "--url", &url, &lock_name("n"), "touch", "ran"]);
    assert_fails(&out, 78, "the bucket does not exist (NoSuchBucket (HTTP 404)); dlock never creates one");
    assert!(!env.path("ran").exists());
    let out = env.run(["check", "--url", &url]);
    assert_fails(&out, 78, "NoSuchBucket");
}
