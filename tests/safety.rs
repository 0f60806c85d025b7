//! What a careless or hostile local user can do with the command line, the configuration and
//! the output streams, whatever the backend: closed pipes, devices and FIFOs for files, silent
//! servers, durations no backend can keep, passwords in the wrong place.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

/// `--wait` bounds everything before the command starts, connecting included: a server that
/// accepts the connection and never answers is 69 shortly after the wait. etcd and ZooKeeper
/// end at the deadline itself (before: 4 s and 5 s for `--wait 2s`); Redis and PostgreSQL may
/// take a little longer to leave (before: 20 s and 5 s, more with a longer connect_timeout).
#[test]
fn wait_bounds_connecting_to_a_server_that_never_answers() {
    let (_server, env) = file_env();
    let silent = SilentServer::start();
    let port = silent.port;
    for (url, within) in [
        (
            format!("etcd://127.0.0.1:{port}"),
            Duration::from_millis(3500),
        ),
        (
            format!("zk://127.0.0.1:{port}"),
            Duration::from_millis(3500),
        ),
        (format!("redis://127.0.0.1:{port}"), Duration::from_secs(8)),
        (
            format!("postgres://127.0.0.1:{port}/x?sslmode=disable&connect_timeout=60"),
            Duration::from_secs(8),
        ),
    ] {
        let started = Instant::now();
        let out = env.run(["run", "--wait", "2s", "--url", &url, "job", "touch", "ran"]);
        let took = started.elapsed();
        assert_fails(&out, 69, "within --wait 2s");
        assert!(
            took >= Duration::from_millis(1500) && took < within,
            "{url}: --wait 2s took {took:?}: {}",
            describe(&out)
        );
        assert!(!env.path("ran").exists(), "{url}: the command ran");
    }
}

#[test]
fn config_and_secrets_are_read_only_from_regular_files() {
    let (_server, env) = file_env();
    let fifo = env.path("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let fifo = fifo.display().to_string();
    let password_config = env.path("password.toml");
    std::fs::write(&password_config, format!("password_file = \"{fifo}\"\n")).expect("write");
    std::fs::set_permissions(&password_config, std::fs::Permissions::from_mode(0o600))
        .expect("chmod");
    let password_config = password_config.display().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--config", "/dev/zero", "list"], "a device"),
        (vec!["--config", &fifo, "list"], "a FIFO"),
        (
            vec![
                "--config",
                &password_config,
                "run",
                "--url",
                "redis://user@127.0.0.1:1",
                "x",
                "true",
            ],
            "a FIFO",
        ),
    ];
    for (args, needle) in cases {
        let started = Instant::now();
        let out = env.run(&args);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            started.elapsed()
        );
        assert_fails(&out, 78, needle);
    }
}

#[test]
fn a_postgres_passfile_that_is_not_a_regular_file_is_78_at_once() {
    let (_server, env) = file_env();
    let fifo = env.path("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    for (passfile, needle) in [
        ("/dev/zero", "a device"),
        (fifo.to_str().expect("UTF-8"), "a FIFO"),
    ] {
        let url = format!("postgres://127.0.0.1:1/x?passfile={passfile}");
        let started = Instant::now();
        let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{passfile}: took {:?}",
            started.elapsed()
        );
        assert_fails(&out, 78, needle);
    }
    assert!(!env.path("ran").exists());
}

#[test]
fn a_large_config_file_is_refused_with_78() {
    let (_server, env) = file_env();
    let big = env.path("big.toml");
    let mut text = String::from("# padding\n");
    while text.len() <= 1024 * 1024 {
        text.push_str("# ..............................................................\n");
    }
    std::fs::write(&big, text).expect("write");
    let out = env.run(["--config", &big.display().to_string(), "list"]);
    assert_fails(&out, 78, "larger than");
}

#[test]
fn a_ttl_below_what_a_lease_can_keep_is_a_usage_error() {
    let (_server, env) = file_env();
    for url in [
        "redis://127.0.0.1:1",
        "etcd://127.0.0.1:1",
        "zk://127.0.0.1:1",
        "postgres://127.0.0.1:1/x",
    ] {
        for ttl in ["1ms", "1s", "1999ms"] {
            let out = env.run(["run", "--ttl", ttl, "--url", url, "x", "touch", "ran"]);
            assert_fails(&out, 64, "the minimum is 2s");
        }
    }
    assert!(!env.path("ran").exists());
    // The file backend has no lease: any TTL is kept.
    let out = env.run(["run", "--ttl", "1ms", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn an_out_of_range_ttl_in_the_config_file_is_78() {
    let (_server, env) = file_env();
    for ttl in ["99999999999d", "8days", "1ms"] {
        let config = env.path("config.toml");
        std::fs::write(&config, format!("ttl = \"{ttl}\"\n")).expect("write");
        let out = env.run([
            "--config",
            &config.display().to_string(),
            "run",
            "--url",
            "redis://127.0.0.1:1",
            "x",
            "true",
        ]);
        assert_fails(&out, 78, "ttl");
    }
}

/// `dlock` with stdout (and maybe stderr) connected to a pipe whose reader is gone.
fn run_with_closed_output(env: &TestEnv, args: &[&str], close_stderr: bool) -> Option<i32> {
    let (reader, writer) = nix::unistd::pipe().expect("pipe");
    drop(reader);
    let writer = std::fs::File::from(writer);
    let mut command = env.dlock(args);
    command.stdout(writer.try_clone().expect("dup"));
    if close_stderr {
        command.stderr(writer);
    } else {
        command.stderr(Stdio::null());
    }
    let mut child = command.spawn().expect("spawn");
    let status = wait_within(&mut child, PATIENCE);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), None, "{args:?} died of a signal: {status}");
    status.code()
}

#[test]
fn closed_output_ends_quietly_with_the_status_it_would_have_had() {
    let (_server, env) = file_env();
    let _holder = env.hold("busy", &[]);
    for close_stderr in [false, true] {
        assert_eq!(
            run_with_closed_output(&env, &["status", "busy"], close_stderr),
            Some(0)
        );
        assert_eq!(
            run_with_closed_output(&env, &["status", "--json", "busy"], close_stderr),
            Some(0)
        );
        assert_eq!(
            run_with_closed_output(&env, &["status", "free"], close_stderr),
            Some(1)
        );
        assert_eq!(
            run_with_closed_output(&env, &["list"], close_stderr),
            Some(0)
        );
        assert_eq!(
            run_with_closed_output(&env, &["list", "--json"], close_stderr),
            Some(0)
        );
        assert_eq!(
            run_with_closed_output(&env, &["--bogus"], close_stderr),
            Some(64)
        );
        assert_eq!(
            run_with_closed_output(&env, &["run", "--no-wait", "busy", "true"], close_stderr),
            Some(75)
        );
    }
}

#[test]
fn url_errors_never_show_what_may_be_a_password() {
    let (_server, env) = file_env();
    for url in [
        "etcd://user:S3c/retPW@127.0.0.1:2379",
        "redis://user:S3c/retPW@127.0.0.1",
        "zk://user:S3c/./retPW@127.0.0.1",
        "S3cretPW",
        "S3cretPW@host:1",
        "redis+unix:///tmp/sock?password=S3cretPW",
        "postgres://127.0.0.1/db?S3cretPW",
        "host=127.0.0.1 S3cretPW",
    ] {
        let out = env.run(["run", "--url", url, "x", "true"]);
        assert_ne!(out.status.code(), Some(0), "{url}: {}", describe(&out));
        for secret in ["S3c", "retPW"] {
            assert!(
                !stderr_of(&out).contains(secret),
                "{url}: {}",
                describe(&out)
            );
        }
    }
}

#[test]
fn the_commands_dlock_url_has_a_percent_encoded_password_key_redacted() {
    let (_server, env) = file_env();
    // The password reaches the command's DLOCK_URL only redacted, whichever way the key is
    // spelled (the connection itself fails: nothing listens on port 1).
    let url = "postgres://127.0.0.1:1/x?pass%77ord=S3cretPW&connect_timeout=1";
    let out = output_within(
        {
            let mut c = env.dlock(["check"]);
            c.env("DLOCK_URL", url);
            c
        },
        PATIENCE,
    );
    assert!(!stderr_of(&out).contains("S3cretPW"), "{}", describe(&out));
    assert!(!stdout_of(&out).contains("S3cretPW"), "{}", describe(&out));
}

/// The host-local queue leaves no directory behind: runs against servers that are not there
/// (a typo in a URL) and a run that waited and got the lock remove their queue's directory
/// when the last of them leaves.
#[test]
fn the_host_queue_leaves_no_directory_behind() {
    let (_server, env) = file_env();
    let queues = || -> Vec<String> {
        std::fs::read_dir(env.path("runtime").join("dlock"))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.starts_with("queue-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let closed = free_port();
    for url in [
        format!("redis://127.0.0.1:{closed}"),
        format!("memcached://127.0.0.1:{closed}"),
        format!("redis://127.0.0.1:{closed}/1"),
    ] {
        let out = env.run(["run", "--url", &url, "--wait", "5s", "x", "true"]);
        assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
        assert_eq!(queues(), Vec::<String>::new(), "{url}: a queue is left");
    }
    // Several waiters at once: the directory stays while one of them is in it, and goes with
    // the last.
    let redis = RedisServer::start();
    let url = redis.url();
    let holder = {
        let ready = env.path("ready");
        let script = format!(
            "echo $$ > '{}'; i=0; while [ ! -e '{}' ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
            ready.display(),
            env.path("go").display()
        );
        let child = env
            .dlock(["run", "--url", &url, "q", "sh", "-c", &script])
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn holder");
        let holding = Holding { child, ready };
        wait_until("holder ready", PATIENCE, || {
            std::fs::read_to_string(&holding.ready).is_ok_and(|s| s.ends_with('\n'))
        });
        holding
    };
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            env.dlock(["run", "--url", &url, "--wait", "60s", "q", "true"])
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn waiter")
        })
        .collect();
    wait_until("the waiters queued", PATIENCE, || queues().len() == 1);
    std::fs::write(env.path("go"), "").expect("go file");
    let mut holder = holder;
    assert!(holder.wait().success());
    for mut waiter in waiters {
        assert!(wait_within(&mut waiter, PATIENCE).success());
    }
    assert_eq!(queues(), Vec::<String>::new(), "a queue is left");
}
