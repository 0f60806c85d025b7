//! The command line: bad input, option parsing, configuration precedence, command lookup.
//! None of these depend on a backend beyond the default file backend.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

#[test]
fn bad_input_gives_its_status_and_one_clear_line() {
    let (_server, env) = file_env();
    let long = "x".repeat(256);
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["run", "", "true"], 64, "must not be empty"),
        (vec!["run", &long, "true"], 64, "255"),
        (vec!["run", "a\nb", "true"], 64, "control characters"),
        (vec!["run", "a\u{1b}b", "true"], 64, "control characters"),
        (vec!["run", "--ttl", "0", "x", "true"], 64, "--ttl"),
        (vec!["run", "--ttl=-5s", "x", "true"], 64, "--ttl"),
        (vec!["run", "--ttl", "5x", "x", "true"], 64, "--ttl"),
        (
            vec!["run", "--ttl", "5 furlongs", "x", "true"],
            64,
            "unknown unit",
        ),
        (
            vec!["run", "--wait", "soon", "x", "true"],
            64,
            "not a duration",
        ),
        (
            vec!["run", "--kill-after", "0", "x", "true"],
            64,
            "--kill-after",
        ),
        (vec!["run", "--limit", "0", "x", "true"], 64, "--limit"),
        (vec!["run", "--limit", "many", "x", "true"], 64, "--limit"),
        (
            vec!["run", "-E", "256", "x", "true"],
            64,
            "--conflict-exit-code",
        ),
        (
            vec!["run", "--on-lost", "explode", "x", "true"],
            64,
            "explode",
        ),
        (
            vec!["run", "--url", "gopher://h/x", "x", "true"],
            64,
            "unknown URL scheme",
        ),
        (
            vec!["run", "--url", "file://elsewhere/x", "x", "true"],
            64,
            "not this host",
        ),
        (
            vec!["run", "--url", "file:relative", "x", "true"],
            64,
            "absolute",
        ),
        (vec!["run", "--bogus", "x", "true"], 64, "--bogus"),
        (
            vec!["run", "--also", "x", "x", "true"],
            64,
            "is NAME itself",
        ),
        (
            vec!["run", "--also", "y", "--also", "y", "x", "true"],
            64,
            "'y' is given twice",
        ),
        (
            vec!["run", "--also", "a\nb", "x", "true"],
            64,
            "--also: lock name must not contain control characters",
        ),
        (vec!["run", "--also", "", "x", "true"], 64, "--also"),
        (vec!["run", "x"], 64, "no command given"),
        (vec!["run", "x", "--"], 64, "no command given"),
        (
            vec!["run", "x", "-c", "true", "extra"],
            64,
            "-c takes one shell command",
        ),
        (
            vec!["run", "x", "definitely-not-a-command-dlock"],
            127,
            "command not found",
        ),
        (
            vec!["run", "x", "/nonexistent/dir/cmd"],
            127,
            "command not found",
        ),
        (vec!["run", "x", "/"], 126, "is a directory"),
        (vec!["release", "x"], 1, "nothing to release"),
        (
            vec!["release", "--handle", "nonsense", "x"],
            64,
            "not the handle",
        ),
        (vec!["hold", "x", "make"], 64, "takes no command"),
        (vec!["hold", "-c", "make", "x"], 64, "takes no command"),
        (vec!["hold", "--until-released", "x"], 64, "--max-hold"),
        (vec!["nonsense"], 64, "nonsense"),
    ];
    for (args, code, needle) in cases {
        let out = env.run(&args);
        assert_fails(&out, code, needle);
        assert_eq!(
            stderr_of(&out)
                .lines()
                .filter(|l| l.starts_with("dlock:"))
                .count(),
            1,
            "{args:?}: expected one dlock: line: {}",
            describe(&out)
        );
    }
}

#[test]
fn non_executable_command_is_126_before_locking() {
    let (_server, env) = file_env();
    let script = env.path("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write");
    let out = env.run(["run", "x", script.to_str().expect("utf-8")]);
    assert_fails(&out, 126, "cannot execute");
}

#[test]
fn non_utf8_name_is_a_usage_error() {
    use std::os::unix::ffi::OsStrExt;
    let (_server, env) = file_env();
    let name = std::ffi::OsStr::from_bytes(b"\xff\xfe");
    let out = output_within(
        {
            let mut c = env.dlock(["run"]);
            c.arg(name).arg("true");
            c
        },
        PATIENCE,
    );
    assert_fails(&out, 64, "UTF-8");
}

#[test]
fn options_after_name_belong_to_the_command() {
    let (_server, env) = file_env();
    let out = env.run(["run", "x", "echo", "--ttl", "5"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out), "--ttl 5\n");
    // `--` is optional and only the first one is consumed.
    let out = env.run(["run", "x", "--", "echo", "--", "-n"]);
    assert_eq!(stdout_of(&out), "-- -n\n", "{}", describe(&out));
}

#[test]
fn shell_command_runs_with_sh_before_or_after_name() {
    let (_server, env) = file_env();
    for args in [
        ["run", "-c", "echo $((1+2))", "x"],
        ["run", "x", "-c", "echo $((1+2))"],
    ] {
        let out = output_within(
            {
                let mut c = env.dlock(args);
                c.env("SHELL", "/bin/sh");
                c
            },
            PATIENCE,
        );
        assert_eq!(stdout_of(&out), "3\n", "{args:?}: {}", describe(&out));
    }
}

/// One signal set from a `/proc/PID/status` line such as `SigIgn:\t0000000000001000`.
fn signal_set(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    u64::from_str_radix(line.trim(), 16).expect("a hex signal set")
}

/// dlock with `args`, started by `sh -c SCRIPT` (which runs it as `"$0" "$@"`), with the
/// environment `env` gives its runs: for what a shell does to dlock's process before it runs.
fn dlock_from_sh(env: &TestEnv, script: &str, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("sh");
    c.args(["-c", script, DLOCK]).args(args);
    for (key, value) in env.dlock(["x"]).get_envs() {
        match value {
            Some(value) => c.env(key, value),
            None => c.env_remove(key),
        };
    }
    c.current_dir(env.path("")).stdin(Stdio::null());
    c
}

#[test]
fn command_starts_with_no_blocked_signals_and_default_sigpipe() {
    let bit = |signal: i32| 1u64 << (signal - 1);
    let (_server, env) = file_env();
    // dlock blocks every signal around starting the command and Rust ignores SIGPIPE: neither
    // may reach the command. A signal that dlock's own parent ignored, and dlock does not
    // handle, stays ignored.
    let out = output_within(
        dlock_from_sh(
            &env,
            "trap '' ALRM; exec \"$0\" \"$@\"",
            &["run", "x", "cat", "/proc/self/status"],
        ),
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let status = stdout_of(&out);
    assert_eq!(signal_set(&status, "SigBlk:"), 0, "{status}");
    let ignored = signal_set(&status, "SigIgn:");
    assert_eq!(ignored & bit(libc::SIGPIPE), 0, "SIGPIPE ignored: {status}");
    assert_ne!(
        ignored & bit(libc::SIGALRM),
        0,
        "inherited SIGALRM ignore lost: {status}"
    );
}

/// What Rust's runtime does before `main`, dlock's own `main` does (src/start.rs): a closed
/// standard stream is opened on /dev/null, so that no lock file becomes the command's
/// output, and dlock itself ignores SIGPIPE (a closed pipe is an error it reports).
#[test]
fn a_closed_stdout_is_dev_null_and_dlock_ignores_sigpipe() {
    let bit = |signal: i32| 1u64 << (signal - 1);
    let (_server, env) = file_env();
    let out = output_within(
        dlock_from_sh(
            &env,
            "exec \"$0\" \"$@\" >&-",
            &[
                "run",
                "x",
                "sh",
                "-c",
                "echo \"$(readlink /proc/$$/fd/1)\" >&2; cat /proc/$PPID/status >&2",
            ],
        ),
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let said = stderr_of(&out);
    assert_eq!(said.lines().next(), Some("/dev/null"), "{said}");
    let ignored = signal_set(&said, "SigIgn:");
    assert_ne!(
        ignored & bit(libc::SIGPIPE),
        0,
        "dlock does not ignore SIGPIPE: {said}"
    );
}

#[test]
fn arguments_are_passed_verbatim_without_a_shell() {
    let (_server, env) = file_env();
    let tricky = ["a b", "$(touch pwned)", "*", "'\"", ""];
    let mut args = vec!["run", "x", "printf", "[%s]"];
    args.extend(tricky);
    let out = env.run(&args);
    assert_eq!(
        stdout_of(&out),
        "[a b][$(touch pwned)][*]['\"][]",
        "{}",
        describe(&out)
    );
    assert!(!env.path("pwned").exists());
}

#[test]
fn unknown_config_key_is_78() {
    let (_server, env) = file_env();
    let config = env.path("config.toml");
    std::fs::write(&config, "ttl = \"5s\"\ncolour = \"red\"\n").expect("write");
    let out = env.run([
        "--config",
        config.to_str().expect("utf-8"),
        "run",
        "x",
        "true",
    ]);
    assert_fails(&out, 78, "colour");
    let out = output_within(
        {
            let mut c = env.dlock(["run", "x", "true"]);
            c.env("DLOCK_CONFIG", &config);
            c
        },
        PATIENCE,
    );
    assert_fails(&out, 78, "colour");
}

#[test]
fn missing_or_malformed_config_file_is_78() {
    let (_server, env) = file_env();
    let out = env.run(["--config", "/nonexistent/dlock.toml", "run", "x", "true"]);
    assert_fails(&out, 78, "/nonexistent/dlock.toml");
    let config = env.path("bad.toml");
    std::fs::write(&config, "ttl = [").expect("write");
    let out = env.run([
        "--config",
        config.to_str().expect("utf-8"),
        "run",
        "x",
        "true",
    ]);
    assert_fails(&out, 78, "bad config file");
    std::fs::write(&config, "ttl = \"soon\"\n").expect("write");
    let out = env.run([
        "--config",
        config.to_str().expect("utf-8"),
        "run",
        "x",
        "true",
    ]);
    assert_fails(&out, 78, "ttl");
}

#[test]
fn flags_beat_environment_beat_config_file() {
    let (_server, env) = file_env();
    let holder = env.hold("busy", &[]);
    let config_dir = env.path("xdg");
    std::fs::create_dir_all(config_dir.join("dlock")).expect("mkdir");
    std::fs::write(
        config_dir.join("dlock/config.toml"),
        "no_wait = true\nconflict_exit_code = 11\n",
    )
    .expect("write");
    let run = |extra_env: &[(&str, &str)], args: &[&str]| {
        let mut c = env.dlock(["run"]);
        c.args(args)
            .args(["busy", "true"])
            .env("XDG_CONFIG_HOME", &config_dir);
        for (k, v) in extra_env {
            c.env(k, v);
        }
        output_within(c, PATIENCE).status.code()
    };
    assert_eq!(run(&[], &[]), Some(11), "config file value");
    assert_eq!(
        run(&[("DLOCK_CONFLICT_EXIT_CODE", "12")], &[]),
        Some(12),
        "env beats file"
    );
    assert_eq!(
        run(&[("DLOCK_CONFLICT_EXIT_CODE", "12")], &["-E", "13"]),
        Some(13),
        "flag beats env"
    );
    drop(holder);
}

#[test]
fn help_and_version_exit_0() {
    let (_server, env) = file_env();
    for args in [
        vec!["--help"],
        vec!["run", "--help"],
        vec!["--version"],
        vec!["status", "-h"],
        vec!["help"],
        vec!["help", "run"],
    ] {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", describe(&out));
        assert!(!out.stdout.is_empty());
    }
}

#[test]
fn password_in_url_never_appears_in_messages() {
    let (_server, env) = file_env();
    let out = env.run([
        "run",
        "--url",
        "redis://user:hunter2@127.0.0.1:1/0",
        "x",
        "true",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(!stderr_of(&out).contains("hunter2"), "{}", describe(&out));
}

/// A parameter no backend takes is refused (64, before connecting) in one shape on every
/// backend's URL: the key, what that URL takes, where to read more.
#[test]
fn an_unknown_url_parameter_reads_one_way_on_every_backend() {
    let (_server, env) = file_env();
    for url in [
        "redis://127.0.0.1:1/0?bogus=1",
        "rediss://127.0.0.1:1/0?bogus=1",
        "redis://127.0.0.1:1,127.0.0.1:2?bogus=1",
        "redis+unix:///nonexistent/redis.sock?bogus=1",
        "redis-sentinel://127.0.0.1:1?bogus=1#m",
        "rediss-sentinel://127.0.0.1:1?bogus=1#m",
        "etcd://127.0.0.1:1?bogus=1",
        "etcds://127.0.0.1:1?bogus=1",
        "zk://127.0.0.1:1?bogus=1",
        "postgres://127.0.0.1:1/db?bogus=1",
        "postgresql://127.0.0.1:1/db?bogus=1",
        "mysql://127.0.0.1:1/db?bogus=1",
        "mariadb://127.0.0.1:1/db?bogus=1",
        "memcached://127.0.0.1:1?bogus=1",
        "memcached+unix:///nonexistent/mc.sock?bogus=1",
    ] {
        let out = env.run(["run", "--url", url, "x", "true"]);
        assert_fails(&out, 64, "dlock: --url: unknown URL parameter 'bogus'; a");
        let stderr = stderr_of(&out);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("dlock:"))
            .unwrap_or("");
        let (head, tail) = line.split_once(" takes ").unwrap_or_default();
        assert!(
            head.ends_with(" URL") && tail.ends_with("; see dlock run --help"),
            "{url}: {line}"
        );
    }
}

#[test]
fn no_wait_from_the_environment_accepts_the_usual_spellings() {
    let (_server, env) = file_env();
    let _holder = env.hold("busy", &[]);
    for value in ["1", "true", "yes", "on"] {
        let out = output_within(
            {
                let mut c = env.dlock(["run", "busy", "touch", "ran"]);
                c.env("DLOCK_NO_WAIT", value);
                c
            },
            PATIENCE,
        );
        assert_eq!(
            out.status.code(),
            Some(75),
            "DLOCK_NO_WAIT={value}: {}",
            describe(&out)
        );
    }
    assert!(!env.path("ran").exists());
}

#[test]
fn quiet_run_does_not_report_a_lock_that_was_not_acquired() {
    let (_server, env) = file_env();
    let _holder = env.hold("busy", &[]);
    let out = env.run(["run", "-q", "--no-wait", "-E", "0", "busy", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    // Without -q the same outcome is explained.
    let out = env.run(["run", "--no-wait", "-E", "0", "busy", "true"]);
    assert!(stderr_of(&out).contains("is held"), "{}", describe(&out));
}

/// Each mistake a new user makes gets a message that says what to do.
#[test]
fn errors_say_what_to_do() {
    let (_server, env) = file_env();
    let config = env.path("config.toml");
    std::fs::write(&config, "wait = \"soon\"\n").expect("write");
    let config = config.to_str().expect("utf-8");
    let both = env.path("both.toml");
    std::fs::write(&both, "wait = \"2s\"\nno_wait = true\n").expect("write");
    let both = both.to_str().expect("utf-8");
    // (arguments, environment, status, what the one line must say)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, i32, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["run", "x", "--no-wait", "true"],
            vec![],
            127,
            "options go before NAME",
        ),
        (vec!["run"], vec![], 64, "<NAME>"),
        (
            vec!["run", "x", "true"],
            vec![("DLOCK_WAIT", "soon")],
            64,
            "DLOCK_WAIT",
        ),
        (
            vec!["run", "x", "true"],
            vec![("DLOCK_MIN_HOLD", "-5s")],
            64,
            "DLOCK_MIN_HOLD",
        ),
        (
            vec!["run", "x", "true"],
            vec![("DLOCK_TTL", "1x")],
            64,
            "DLOCK_TTL",
        ),
        (
            vec!["--config", config, "run", "x", "true"],
            vec![],
            78,
            "config file: wait: 'soon' is not a duration",
        ),
        (
            vec!["run", "--wait", "1s", "--no-wait", "x", "true"],
            vec![],
            64,
            "contradict",
        ),
        (
            vec!["run", "x", "true"],
            vec![("DLOCK_WAIT", "1s"), ("DLOCK_NO_WAIT", "1")],
            64,
            "contradict",
        ),
        (
            vec!["--config", both, "run", "x", "true"],
            vec![],
            78,
            "config file: wait and no_wait contradict each other",
        ),
        (
            vec!["--config", both, "run", "--wait", "1s", "x", "true"],
            vec![],
            78,
            "config file: wait and no_wait contradict each other",
        ),
        (
            vec!["run", "--url", "http://127.0.0.1:2379", "x", "true"],
            vec![],
            64,
            "etcd://host:port",
        ),
        (
            vec!["run", "--url", "https://127.0.0.1:2379", "x", "true"],
            vec![],
            64,
            "etcds://host:port",
        ),
        (
            vec!["run", "--min-hold", "0s", "x", "true"],
            vec![],
            64,
            "--min-hold",
        ),
    ];
    for (args, vars, code, needle) in cases {
        let mut command = env.dlock(&args);
        command.envs(vars.iter().copied());
        let out = output_within(command, PATIENCE);
        assert_fails(&out, code, needle);
        let lines = stderr_of(&out).lines().count();
        assert_eq!(lines, 1, "{args:?} {vars:?}: one line: {}", describe(&out));
    }
    // A flag overrides a variable, so these do not contradict.
    let mut command = env.dlock(["run", "--wait", "1s", "x", "true"]);
    command.env("DLOCK_NO_WAIT", "1");
    let out = output_within(command, PATIENCE);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

/// A `redis://` URL that reaches something else (here a server that greets like SSH) is
/// one line saying so, 69.
#[test]
fn a_redis_url_at_something_else_says_so_in_one_line() {
    let (_server, env) = file_env();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        // Bounded: the test makes one connection (a retry or two at most).
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { break };
            use std::io::{Read, Write};
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
            let _ = stream.read(&mut [0u8; 256]);
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    let out = env.run(["run", "--wait", "5s", "--url", &url, "x", "true"]);
    assert_fails(
        &out,
        69,
        &format!(
            "127.0.0.1:{port} does not look like a Redis server (it answers like an SSH server)"
        ),
    );
    assert_eq!(stderr_of(&out).lines().count(), 1, "{}", describe(&out));
}

/// `check` and `status` on a lock directory that does not exist say so and create nothing.
#[test]
fn check_and_status_create_no_lock_directory() {
    let (_server, env) = file_env();
    let missing = env.path("missing/locks");
    let url = format!("file://{}", missing.display());
    let out = env.run(["check", "--url", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        stdout_of(&out).contains("does not exist"),
        "{}",
        describe(&out)
    );
    let out = env.run(["status", "--url", &url, "x"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("does not exist"),
        "{}",
        describe(&out)
    );
    let out = env.run(["list", "--url", &url]);
    assert!(
        stderr_of(&out).contains("does not exist"),
        "{}",
        describe(&out)
    );
    assert!(
        !missing.exists() && !env.path("missing").exists(),
        "created"
    );
}

/// A duration too long for any clock is refused before anything runs, naming the option or
/// the variable it came from (64), instead of overflowing a deadline (a panic, 70) — for
/// `--min-hold` after the command already ran.
#[test]
fn huge_durations_are_refused_before_the_command_runs() {
    let (_server, env) = file_env();
    let huge = "18446744073709551615s";
    let ran = env.path("ran");
    let touch = ["touch", ran.to_str().expect("utf-8 path")];
    for option in ["--wait", "--min-hold", "--kill-after", "--ttl"] {
        for value in [huge, "9000y"] {
            let mut args = vec!["run", option, value, "x"];
            args.extend(touch);
            let out = env.run(&args);
            assert_fails(&out, 64, option);
            assert!(!ran.exists(), "{option} {value}: the command ran");
        }
    }
    for variable in [
        "DLOCK_WAIT",
        "DLOCK_MIN_HOLD",
        "DLOCK_KILL_AFTER",
        "DLOCK_TTL",
    ] {
        let out = output_within(
            {
                let mut c = env.dlock(["run", "x"]);
                c.args(touch).env(variable, huge);
                c
            },
            PATIENCE,
        );
        assert_fails(&out, 64, variable);
        assert!(!ran.exists(), "{variable}: the command ran");
    }
    let config = env.path("huge.toml");
    std::fs::write(&config, format!("min_hold = \"{huge}\"\n")).expect("write config");
    let mut args = vec!["--config", config.to_str().expect("utf-8 path"), "run", "x"];
    args.extend(touch);
    let out = env.run(&args);
    assert_fails(&out, 78, "min_hold");
    assert!(!ran.exists(), "config min_hold: the command ran");
    // A URL's connect timeout is refused as it is parsed, before any connection.
    let url = format!(
        "mysql://dlock@127.0.0.1:1/dlock?connect-timeout={}",
        &huge[..huge.len() - 1]
    );
    let mut args = vec!["run", "--url", &url, "x"];
    args.extend(touch);
    let out = env.run(&args);
    assert_fails(&out, 64, "connect-timeout");
    assert!(!ran.exists(), "connect-timeout: the command ran");
}

/// A `DLOCK_URL` whose password is the `***` a holder's command sees, with no credentials
/// handed on, says what happened and what to do (78) instead of failing at the server.
#[test]
fn a_masked_password_in_dlock_url_says_where_it_went() {
    let (_server, env) = file_env();
    for url in [
        "mysql://app:***@127.0.0.1:1/dlock",
        "postgres://127.0.0.1:1/db?password=***",
    ] {
        let out = output_within(
            {
                let mut c = env.dlock(["status", "x"]);
                // A descriptor that is not dlock's credentials file is never read.
                c.env("DLOCK_URL", url).env("DLOCK_CREDENTIALS_FD", "0");
                c
            },
            PATIENCE,
        );
        assert_fails(&out, 78, "password_file");
    }
}

/// `--report` is checked before the lock is asked for: a path that cannot be written is 78 at
/// once and nothing runs, and the message names the setting as it was given (the flag, the
/// variable or the config file's key).
#[test]
fn an_unwritable_report_path_is_78_before_locking() {
    let (_server, env) = file_env();
    std::fs::create_dir(env.path("a-directory")).expect("mkdir");
    for path in [env.path("no-such-dir/runs.jsonl"), env.path("a-directory")] {
        let out = env.run([
            "run",
            "--report",
            path.to_str().expect("UTF-8 path"),
            "job",
            "touch",
            "ran",
        ]);
        assert_fails(&out, 78, "--report");
        assert!(!env.path("ran").exists(), "the command ran");
        assert!(env.is_free("job"));
    }
    // The same from the environment and from the config file.
    let out = output_within(
        {
            let mut command = env.dlock(["run", "job", "touch", "ran"]);
            command.env("DLOCK_REPORT", env.path("no-such-dir/x"));
            command
        },
        PATIENCE,
    );
    assert_fails(&out, 78, "DLOCK_REPORT=");
    let config = env.path("config.toml");
    std::fs::write(
        &config,
        format!("report = '{}'\n", env.path("no-such-dir/y").display()),
    )
    .expect("write config");
    let config = config.to_str().expect("UTF-8 path");
    let out = env.run(["--config", config, "run", "job", "touch", "ran"]);
    assert_fails(&out, 78, "config file: report = ");
    assert!(!env.path("ran").exists(), "the command ran");
}

/// A run refused before it starts (a bad option, a bad value in the environment, a config
/// file that does not parse) still appends its record, with the status and the message it
/// exited with: "did last night's job run?" has an answer when its settings were wrong.
#[test]
fn a_run_refused_for_its_settings_is_recorded_as_an_error() {
    let (_server, env) = file_env();
    let report = env.path("runs.jsonl");
    let to = report.to_str().expect("UTF-8 path");
    let out = env.run([
        "run", "--report", to, "--wait", "soon", "job", "touch", "ran",
    ]);
    assert_fails(&out, 64, "not a duration");
    let mut command = env.dlock(["run", "job", "touch", "ran"]);
    command.env("DLOCK_REPORT", &report).env("DLOCK_LIMIT", "0");
    assert_fails(&output_within(command, PATIENCE), 64, "DLOCK_LIMIT");
    let config = env.path("broken.toml");
    std::fs::write(&config, "wait = [\n").expect("write config");
    let config = config.to_str().expect("UTF-8 path");
    let out = env.run([
        "--config", config, "run", "--report", to, "job", "touch", "ran",
    ]);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(!env.path("ran").exists(), "the command ran");
    let lines = report_lines(&report);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (line, status) in lines.iter().zip([64, 64, 78]) {
        assert_eq!(line["outcome"], "error", "{line}");
        assert_eq!(line["exit_status"], status, "{line}");
        assert_eq!(line["name"], "job", "{line}");
        assert!(
            line["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{line}"
        );
        assert!(line.get("token").is_none(), "{line}");
    }
    assert_eq!(lines[0]["backend"], "file", "{}", lines[0]);
    assert!(lines[0]["error"]
        .as_str()
        .unwrap_or_default()
        .contains("not a duration"));
    assert!(lines[1]["error"]
        .as_str()
        .unwrap_or_default()
        .contains("DLOCK_LIMIT"));
}

#[test]
fn a_report_file_is_created_0600_and_appended_to() {
    use std::os::unix::fs::PermissionsExt;
    let (_server, env) = file_env();
    let report = env.path("runs.jsonl");
    for code in [0, 4] {
        let out = env.run([
            "run",
            "--report",
            report.to_str().expect("UTF-8 path"),
            "job",
            "sh",
            "-c",
            &format!("exit {code}"),
        ]);
        assert_eq!(out.status.code(), Some(code), "{}", describe(&out));
    }
    let mode = std::fs::metadata(&report)
        .expect("report")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "created {mode:o}");
    let lines = report_lines(&report);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["exit_status"], 4);
    // `-` is stderr.
    let out = env.run(["run", "--report", "-", "job", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let line: serde_json::Value =
        serde_json::from_str(stderr_of(&out).trim()).expect("one JSON line on stderr");
    assert_eq!(line["outcome"], "ran");
}

/// A symbolic link planted where the report goes is not followed (nothing is written through
/// it), as a lock file's would not be.
#[test]
fn a_planted_symlink_as_the_report_is_refused() {
    let (_server, env) = file_env();
    let target = env.path("victim");
    std::fs::write(&target, b"precious\n").expect("write victim");
    let link = env.path("runs.jsonl");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let out = env.run([
        "run",
        "--report",
        link.to_str().expect("UTF-8 path"),
        "job",
        "touch",
        "ran",
    ]);
    assert_fails(&out, 78, "symbolic link");
    assert!(!env.path("ran").exists(), "the command ran");
    assert_eq!(
        std::fs::read_to_string(&target).expect("victim"),
        "precious\n"
    );
}

/// Root's report is never written where another user could send it: not through a directory
/// or a symbolic link of theirs anywhere on the path, nor through a directory others can write
/// to without the sticky bit above the report's own (they could swap what is below it).
/// Nothing is created, the command does not run, and the message names what is in the way.
#[test]
fn a_report_path_another_user_controls_is_refused() {
    let (_server, env) = file_env();
    // Where a redirected report would land: a directory only root can write to.
    let root_only = dir_of_mode(&env.path("root-only"), 0o700);
    // A user who owns ~/logs replaces it with a symbolic link to root's directory.
    let home = dir_of_mode(&env.path("home"), 0o755);
    hand_to_another_user(&home);
    let logs = home.join("logs");
    std::os::unix::fs::symlink(&root_only, &logs).expect("symlink");
    hand_to_another_user(&logs);
    // A symbolic link of theirs in a directory of root's.
    let their_link = env.path("their-link");
    std::os::unix::fs::symlink(&root_only, &their_link).expect("symlink");
    hand_to_another_user(&their_link);
    // Root's directory inside a directory of theirs that only they can write to.
    let in_theirs = dir_of_mode(&home.join("sub"), 0o755);
    // Root's directory in a directory everyone can write to, without the sticky bit.
    let open = dir_of_mode(&env.path("open"), 0o777);
    let below_open = dir_of_mode(&open.join("sub"), 0o755);
    let cases = [
        (
            logs.join("runs.jsonl"),
            format!("owned by uid {ANOTHER_USER}"),
        ),
        (
            home.join("runs.jsonl"),
            format!("owned by uid {ANOTHER_USER}"),
        ),
        (
            their_link.join("runs.jsonl"),
            format!("owned by uid {ANOTHER_USER}"),
        ),
        (
            in_theirs.join("runs.jsonl"),
            format!("owned by uid {ANOTHER_USER}"),
        ),
        (below_open.join("runs.jsonl"), "sticky bit".to_owned()),
    ];
    for (report, complaint) in cases {
        let out = env.run([
            "run",
            "--report",
            report.to_str().expect("UTF-8 path"),
            "job",
            "touch",
            "ran",
        ]);
        assert_fails(&out, 78, &complaint);
        assert_fails(&out, 78, "--report");
        assert!(
            !env.path("ran").exists(),
            "{}: the command ran",
            report.display()
        );
        assert!(
            std::fs::symlink_metadata(&report).is_err(),
            "{} was created",
            report.display()
        );
    }
    assert_eq!(
        std::fs::read_dir(&root_only).expect("read_dir").count(),
        0,
        "a report was written into root's directory"
    );
}

/// What a legitimate path goes through is still followed: a symbolic link of root's (as
/// /var/run -> /run) or of the user's own, a sticky directory everyone can write to (as /tmp)
/// above the report's, `..`, and a report directory others can write to (where only the
/// user's or root's own file is used).
#[test]
fn a_report_path_through_links_and_directories_of_root_is_used() {
    let (_server, env) = file_env();
    let run = dir_of_mode(&env.path("run"), 0o755);
    let var_run = env.path("var-run");
    std::os::unix::fs::symlink("run", &var_run).expect("symlink");
    let sticky = dir_of_mode(&env.path("sticky"), 0o1777);
    let below_sticky = dir_of_mode(&sticky.join("mine"), 0o755);
    let open = dir_of_mode(&env.path("open"), 0o777);
    let dotdot = below_sticky.join("..").join("mine");
    for (report, lands_in) in [
        (var_run.join("runs.jsonl"), run.join("runs.jsonl")),
        (
            below_sticky.join("runs.jsonl"),
            below_sticky.join("runs.jsonl"),
        ),
        (dotdot.join("dots.jsonl"), below_sticky.join("dots.jsonl")),
        (open.join("runs.jsonl"), open.join("runs.jsonl")),
        (
            std::path::PathBuf::from("var-run/rel.jsonl"),
            run.join("rel.jsonl"),
        ),
    ] {
        let out = env.run([
            "run",
            "--report",
            report.to_str().expect("UTF-8 path"),
            "job",
            "true",
        ]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            report.display(),
            describe(&out)
        );
        assert_eq!(report_line(&lands_in)["outcome"], "ran");
    }
}

/// In a directory everyone can create files in, a report file another user made first is not
/// used: the run exits 78 without running its command, and the message says where reports
/// belong instead (the guide and `--report`'s help say so too).
#[test]
fn a_report_file_another_user_made_first_in_a_shared_directory_stops_the_run() {
    let (_server, env) = file_env();
    let shared = dir_of_mode(&env.path("shared"), 0o1777);
    let report = shared.join("runs.jsonl");
    std::fs::write(&report, b"").expect("plant the report");
    hand_to_another_user(&report);
    let out = env.run([
        "run",
        "--report",
        report.to_str().expect("UTF-8 path"),
        "job",
        "touch",
        "ran",
    ]);
    assert_fails(&out, 78, &format!("it is owned by uid {ANOTHER_USER}"));
    assert_fails(
        &out,
        78,
        "keep reports in a directory only you and root can write to",
    );
    assert!(!env.path("ran").exists(), "the command ran");
    assert_eq!(std::fs::read(&report).expect("report"), b"");
}

/// On a full disk the record is whole or absent, never a torn line, and the run says on
/// stderr that it could not be written; the next record starts on a line of its own, even
/// after a torn line that could not be removed (left by a crash).
#[test]
fn a_report_line_is_whole_or_absent_when_the_disk_is_full() {
    let (_server, env) = file_env();
    let disk = SmallDisk::mount(&env.path("disk"), 1024 * 1024);
    let report = disk.path.join("runs.jsonl");
    let to = report.to_str().expect("UTF-8 path");
    // A first line that leaves 100 bytes of its block free: the record's first 100 bytes fit,
    // the rest needs a block the full disk does not have.
    let pad = disk.block_size() - 100 - r#"{"pad":""}"#.len() - 1;
    let first = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(pad));
    std::fs::write(&report, &first).expect("write the first line");
    disk.fill("filler");
    let out = env.run(["run", "--report", to, "job", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(env.path("ran").exists(), "the command did not run");
    assert!(
        stderr_of(&out).contains("dlock: warning: cannot write the report to "),
        "{}",
        describe(&out)
    );
    let text = std::fs::read_to_string(&report).expect("report");
    assert!(
        text == first,
        "a part of the record was left in the report: {:?}",
        text.get(first.len()..).unwrap_or(&text)
    );
    // With room again, the next record is a line of its own.
    std::fs::remove_file(disk.path.join("filler")).expect("remove the filler");
    let out = env.run(["run", "--report", to, "job", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let lines = report_lines(&report);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1]["exit_status"], 3);
    // A torn line that stayed (a crash while writing) is ended before the next record.
    let mut text = std::fs::read_to_string(&report).expect("report");
    text.push_str("{\"name\":\"torn");
    std::fs::write(&report, &text).expect("tear the last line");
    let out = env.run(["run", "--report", to, "job", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = std::fs::read_to_string(&report).expect("report");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(lines[2], "{\"name\":\"torn", "{text}");
    let last: serde_json::Value = serde_json::from_str(lines[3]).expect("a whole last line");
    assert_eq!(last["outcome"], "ran", "{text}");
}

/// An unknown option names the command that lacks it and where its options are listed, never
/// suggesting `--` (which would make the option the lock's NAME); a value that starts with a
/// hyphen is that option's bad value, not an unknown option.
#[test]
fn an_unknown_option_says_which_command_has_none_such() {
    let (_server, env) = file_env();
    let cases: [(&[&str], &str); 6] = [
        (
            &["run", "--readers", "x", "--", "true"],
            "dlock: dlock run has no option --readers; see dlock run --help",
        ),
        (
            &["run", "--timeout", "5s", "x", "--", "true"],
            "dlock: dlock run has no option --timeout; see dlock run --help",
        ),
        (
            &["run", "--no-wiat", "x", "true"],
            "dlock: dlock run has no option --no-wiat (did you mean --no-wait?); see dlock run --help",
        ),
        (
            &["status", "--bogus", "x"],
            "dlock: dlock status has no option --bogus; see dlock status --help",
        ),
        (
            &["--bogus", "run", "x", "true"],
            "dlock: dlock has no option --bogus; see dlock --help",
        ),
        (
            &["run", "-w", "1s", "--readers=1", "x", "true"],
            "dlock: dlock run has no option --readers; see dlock run --help",
        ),
    ];
    for (args, wanted) in cases {
        let out = env.run(args.iter().copied().chain(["touch", "ran"]));
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", describe(&out));
        assert_eq!(stderr_of(&out).trim_end(), wanted, "{args:?}");
        assert!(!env.path("ran").exists(), "{args:?}: the command ran");
    }
    for (args, option) in [
        (["run", "--wait", "-1s", "x"], "--wait"),
        (["run", "-E", "-1", "x"], "--conflict-exit-code"),
    ] {
        let out = env.run(args.iter().copied().chain(["true"]));
        let stderr = stderr_of(&out);
        assert_fails(&out, 64, option);
        assert!(!stderr.contains("no option"), "{args:?}: {stderr}");
        assert!(!stderr.contains("'--"), "{args:?}: {stderr}");
    }
}

/// A bad value from a `DLOCK_*` variable names the variable, whatever parses it, and a bad
/// value of a fixed set lists the set.
#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    let (_server, env) = file_env();
    for (var, value) in [
        ("DLOCK_NO_WAIT", "maybe"),
        ("DLOCK_ON_LOST", "explode"),
        ("DLOCK_LOCAL_QUEUE", "perhaps"),
        ("DLOCK_WAIT", "soon"),
        ("DLOCK_CONFLICT_EXIT_CODE", "300"),
    ] {
        let mut command = env.dlock(["run", "x", "touch", "ran"]);
        command.env(var, value);
        let out = output_within(command, PATIENCE);
        assert_fails(&out, 64, &format!("{var} (environment)"));
        assert!(stderr_of(&out).contains(value), "{var}: {}", describe(&out));
        assert!(!env.path("ran").exists(), "{var}: the command ran");
    }
    let out = env.run(["run", "--on-lost", "explode", "x", "true"]);
    assert_fails(
        &out,
        64,
        "for '--on-lost <ACTION>'; expected term, kill, ignore",
    );
}

/// A `DLOCK_URL` whose password a parent dlock masked is refused in one line of single
/// spaces, naming the variable.
#[test]
fn a_masked_password_in_dlock_url_is_refused_in_one_even_line() {
    let (_server, env) = file_env();
    let mut command = env.dlock(["run", "x", "true"]);
    command.env("DLOCK_URL", "redis://u:***@127.0.0.1:1/0");
    let out = output_within(command, PATIENCE);
    assert_fails(&out, 78, "DLOCK_URL (environment): its password is ***");
    let stderr = stderr_of(&out);
    assert!(!stderr.contains("  "), "runs of spaces: {stderr:?}");
}

/// A bad config file is named with the line and the key, and a misspelt key with the key it
/// is closest to.
#[test]
fn config_errors_name_the_file_the_line_and_the_key() {
    let (_server, env) = file_env();
    let config = env.path("dlock.toml");
    let path = config.to_str().expect("utf-8");
    for (text, wanted) in [
        (
            "ttl = \"5s\"\nwait = true\n",
            "line 2: wait: boolean `true` is not a duration; write it quoted with its unit, or \
             as a number of seconds: wait = \"30s\"",
        ),
        ("\nurl = redis://h\n", "line 2: url: "),
        (
            "wiat = \"3s\"\n",
            "line 1: wiat: unknown key; did you mean wait? (",
        ),
        (
            "[redis]\nca_fil = \"x\"\n",
            "line 2: [redis] ca_fil: unknown key; did you mean ca_file? (",
        ),
    ] {
        std::fs::write(&config, text).expect("write");
        let out = env.run(["--config", path, "run", "x", "touch", "ran"]);
        assert_fails(&out, 78, &format!("bad config file {path}, {wanted}"));
        assert!(!env.path("ran").exists(), "{text:?}: the command ran");
    }
    // A value the file's syntax accepts but dlock does not: the key, the file and the line.
    std::fs::write(&config, "ttl = \"5s\"\nwait = \"5x\"\n").expect("write");
    let out = env.run(["--config", path, "run", "x", "touch", "ran"]);
    assert_fails(
        &out,
        78,
        &format!(
            "config file: wait: '5x' has the unknown unit 'x'; write e.g. 500ms, 30s, 5m or \
             1h30m (a bare number is seconds) (units: ms, s, m, h, d, w) (in {path}, line 2)"
        ),
    );
}

/// A whole shell line given as one word is pointed to `-c`; a script whose `#!` names a
/// missing interpreter says so, and names CRLF line endings when that is why.
#[test]
fn a_shell_line_as_one_word_and_a_bad_interpreter_are_named() {
    let (_server, env) = file_env();
    let out = env.run(["run", "x", "echo a && echo b"]);
    assert_fails(&out, 127, "did you mean -c 'echo a && echo b'?");
    let crlf = env.path("crlf.sh");
    let missing = env.path("missing.sh");
    std::fs::write(&crlf, "#!/bin/sh\r\necho ran\r\n").expect("write");
    std::fs::write(&missing, "#!/no/such/interpreter\necho ran\n").expect("write");
    for script in [&crlf, &missing] {
        std::fs::set_permissions(script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let out = env.run(["run", "x", crlf.to_str().expect("utf-8")]);
    assert_fails(
        &out,
        127,
        "bad interpreter \"/bin/sh\\r\": the script has CRLF",
    );
    let out = env.run(["run", "x", missing.to_str().expect("utf-8")]);
    assert_fails(&out, 127, "bad interpreter /no/such/interpreter");
    assert!(env.is_free("x"));
}

/// `list` keeps its columns aligned on a terminal with long and non-ASCII (wide) names.
#[test]
fn list_columns_align_by_display_width() {
    let (_server, env) = file_env();
    let names = [
        lock_name("short"),
        format!("{}-a-name-longer-than-the-column", lock_name("long")),
        format!("発行ジョブ-{}", lock_name("wide")),
    ];
    let _holders: Vec<_> = names.iter().map(|n| env.hold(n, &[])).collect();
    let list = stdout_of(&env.run(["list"]));
    // Terminal columns: the CJK characters used here take two.
    let width = |s: &str| {
        s.chars()
            .map(|c| {
                if ('\u{3000}'..='\u{9fff}').contains(&c) {
                    2
                } else {
                    1
                }
            })
            .sum::<usize>()
    };
    let pid_ends: Vec<usize> = list
        .lines()
        .filter(|l| l.starts_with("NAME") || names.iter().any(|n| l.starts_with(n.as_str())))
        .map(|l| {
            let name_end = l.find(' ').unwrap_or(l.len());
            let after = &l[name_end..];
            let pid = after.trim_start();
            let pid_end = name_end + (after.len() - pid.len()) + pid.find(' ').unwrap_or(pid.len());
            width(&l[..pid_end])
        })
        .collect();
    assert_eq!(pid_ends.len(), 4, "{list}");
    assert!(
        pid_ends.windows(2).all(|w| w[0] == w[1]),
        "{pid_ends:?}\n{list}"
    );
}

/// A bare number is seconds for every duration option, as `flock -w 1` and `timeout 0.5`
/// read it: on the command line, in the environment and in the config file.
#[test]
fn a_bare_number_is_seconds_for_every_duration_option() {
    let (_server, env) = file_env();
    let holder = env.hold("busy", &[]);
    let config = env.path("wait.toml");
    std::fs::write(&config, "wait = 0.5\n").expect("write config");
    let config = config.to_str().expect("UTF-8 path");
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>);
    let cases: [Case; 4] = [
        (vec!["run", "--wait", "1", "busy"], vec![]),
        (vec!["run", "-w", "0.5", "busy"], vec![]),
        (vec!["run", "busy"], vec![("DLOCK_WAIT", "0.5")]),
        (vec!["--config", config, "run", "busy"], vec![]),
    ];
    for (args, vars) in cases {
        let mut command = env.dlock(&args);
        command.args(["touch", "ran"]).envs(vars.iter().copied());
        let started = std::time::Instant::now();
        let out = output_within(command, PATIENCE);
        assert_fails(&out, 75, "is held");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(500) && waited < Duration::from_secs(1) + PAST_WAIT,
            "{args:?} {vars:?}: gave up after {waited:?}"
        );
        assert!(!env.path("ran").exists(), "{args:?}: the command ran");
    }
    drop(holder);
    for option in ["--ttl", "--kill-after", "--min-hold"] {
        let out = env.run(["run", option, "3", "x", "true"]);
        assert_eq!(out.status.code(), Some(0), "{option} 3: {}", describe(&out));
    }
}

/// A bad value is said in dlock's words with what would do, never in a library's
/// ("expected number at 0", "out of range 1..=1024", "expected i64", "value was not a
/// boolean"); a relative DLOCK_DIR is refused rather than ignored.
#[test]
fn a_bad_value_says_what_would_do_in_dlocks_words() {
    let (_server, env) = file_env();
    let config = env.path("limit.toml");
    std::fs::write(&config, "limit = \"2\"\n").expect("write config");
    let config = config.to_str().expect("UTF-8 path");
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, i32, String);
    let cases: Vec<Case> = vec![
        (
            vec!["run", "--wait", "-1s", "x"],
            vec![],
            64,
            "dlock: --wait: '-1s' is negative; a duration is 0 or more: write e.g. 500ms, 30s, \
             5m or 1h30m (a bare number is seconds)"
                .into(),
        ),
        (
            vec!["run", "--limit", "0", "x"],
            vec![],
            64,
            "dlock: --limit: 0 is not between 1 and 1024".into(),
        ),
        (
            vec!["run", "-E", "300", "x"],
            vec![],
            64,
            "dlock: --conflict-exit-code: 300 is not between 0 and 255".into(),
        ),
        (
            vec!["run", "--ttl", "8days", "x"],
            vec![],
            64,
            "dlock: --ttl: '8days' is longer than the limit of 7 days".into(),
        ),
        (
            vec!["--config", config, "run", "x"],
            vec![],
            78,
            format!(
                "dlock: bad config file {config}, line 1: limit: string \"2\" is not a whole \
                 number; write it without quotes: limit = 2"
            ),
        ),
        (
            vec!["run", "x"],
            vec![("DLOCK_NO_WAIT", "maybe")],
            64,
            "dlock: invalid value 'maybe' for DLOCK_NO_WAIT (environment): not a boolean; \
             expected 1, 0, true, false, yes, no, on, off (see 'dlock --help')"
                .into(),
        ),
        (
            vec!["run", "x"],
            vec![("DLOCK_DIR", "relative/locks")],
            64,
            "dlock: DLOCK_DIR (environment): 'relative/locks' is not an absolute path; give \
             the lock directory from / (DLOCK_DIR=$PWD/relative/locks)"
                .into(),
        ),
    ];
    for (args, vars, code, wanted) in cases {
        let mut command = env.dlock(&args);
        command.args(["touch", "ran"]).envs(vars.iter().copied());
        let out = output_within(command, PATIENCE);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            describe(&out)
        );
        assert_eq!(stderr_of(&out).trim_end(), wanted, "{args:?} {vars:?}");
        assert!(!env.path("ran").exists(), "{args:?}: the command ran");
    }
    assert!(
        !env.path("relative").exists(),
        "a relative DLOCK_DIR was made"
    );
}

/// A mistyped command gets the one meant; an option of `run` before `run` is pointed to
/// its place; a command taken as the lock's NAME is named as such.
#[test]
fn a_mistyped_or_misplaced_word_is_pointed_to_what_was_meant() {
    let (_server, env) = file_env();
    let cases: [(&[&str], i32, &str); 5] = [
        (
            &["rn", "x", "true"],
            64,
            "dlock: dlock has no command rn (did you mean run?); see dlock --help",
        ),
        (
            &["-n", "run", "x", "true"],
            64,
            "dlock: dlock has no option -n; it belongs to run: dlock run -n x true; see dlock \
             run --help",
        ),
        (
            &["--wait", "5s", "run", "x", "true"],
            64,
            "dlock: dlock has no option --wait; it belongs to run: dlock run --wait 5s x true; \
             see dlock run --help",
        ),
        (
            &["--ttl=5s", "-v", "run", "x", "true"],
            64,
            "dlock: dlock has no option --ttl; it belongs to run: dlock -v run --ttl=5s x true; \
             see dlock run --help",
        ),
        (
            &["run", "echo", "hello"],
            127,
            "dlock: command not found: hello (searched PATH); 'echo' was taken as the lock's \
             NAME: dlock run NAME echo hello",
        ),
    ];
    for (args, code, wanted) in cases {
        let out = env.run(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            describe(&out)
        );
        assert_eq!(stderr_of(&out).trim_end(), wanted, "{args:?}");
    }
}

/// `-V` and `--version` say `dlock`, whichever subcommand they follow.
#[test]
fn the_version_is_dlocks_after_any_subcommand() {
    let (_server, env) = file_env();
    let version = env!("CARGO_PKG_VERSION");
    for args in [["-V"], ["--version"]] {
        let top = stdout_of(&env.run(args));
        for sub in ["run", "status", "check"] {
            let out = env.run([sub, args[0]]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{sub} {args:?}: {}",
                describe(&out)
            );
            assert_eq!(stdout_of(&out), top, "{sub} {args:?}");
        }
        assert!(
            top.starts_with(&format!("dlock {version}")),
            "{args:?}: {top}"
        );
    }
}

/// `-v` says how long the acquisition took in one format, whatever the length (never µs
/// beside ms with six decimals).
#[test]
fn verbose_durations_read_one_way() {
    let (_server, env) = file_env();
    let out = env.run(["-v", "run", "x", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stderr = stderr_of(&out);
    let line = stderr
        .lines()
        .find(|l| l.contains("acquired 'x'"))
        .unwrap_or_else(|| panic!("no acquired line: {stderr}"));
    let took = line.rsplit(" in ").next().unwrap_or_default();
    let number = took.strip_suffix("ms").unwrap_or_else(|| panic!("{line}"));
    let (whole, decimals) = number.split_once('.').unwrap_or_else(|| panic!("{line}"));
    assert!(
        whole.parse::<u32>().is_ok() && decimals.len() == 3 && decimals.parse::<u32>().is_ok(),
        "{line}"
    );
}

/// The outcome record names the command (secrets masked as `status` masks them, none with
/// `--record-command off`).
#[test]
fn the_outcome_record_names_the_command_masked() {
    let (_server, env) = file_env();
    let report = env.path("runs.jsonl");
    let to = report.to_str().expect("UTF-8 path");
    let out = env.run([
        "run",
        "--report",
        to,
        "x",
        "echo",
        "--password",
        "hunter2",
        "ok",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = env.run([
        "run",
        "--report",
        to,
        "--record-command",
        "off",
        "x",
        "echo",
        "quiet",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let lines = report_lines(&report);
    assert_eq!(
        lines[0]["command"], "echo --password *** ok",
        "{}",
        lines[0]
    );
    assert!(!lines[0].to_string().contains("hunter2"), "{}", lines[0]);
    assert!(lines[1].get("command").is_none(), "{}", lines[1]);
}

/// A config file dlock may not read is said in words (never "os error 13"), naming whose it
/// is.
#[test]
fn a_config_file_dlock_may_not_read_names_whose_it_is() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const USER: u32 = 424_246;
    let (_server, env) = file_env();
    std::fs::set_permissions(env.scratch.path(), std::fs::Permissions::from_mode(0o711))
        .expect("chmod");
    let config = env.path("private.toml");
    std::fs::write(&config, "").expect("write the config file");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut command = env.dlock([
        "--config",
        &config.display().to_string(),
        "run",
        "x",
        "true",
    ]);
    command.uid(USER).current_dir("/");
    let out = output_within(command, PATIENCE);
    assert_fails(
        &out,
        78,
        &format!(
            "cannot read config file {0}: permission denied: the file {0} is root's (mode 600) \
             and dlock runs as uid {USER}",
            config.display()
        ),
    );
    assert!(!stderr_of(&out).contains("os error"), "{}", describe(&out));
}

/// A hold belongs to the shell that reads `dlock hold`'s output, also when a subshell of the
/// command substitution started dlock (its output is then the subshell's too): not to that
/// subshell, which ends at once.
#[test]
fn a_hold_belongs_to_the_shell_that_reads_its_output_through_subshells() {
    let (_server, env) = file_env();
    let mut shell = env.shell(
        "eval \"$( : ; \"$DLOCK\" hold subshells; : )\" || exit 9; \
         echo $$ > ready; exec sleep 1000",
    );
    let ready = env.path("ready");
    wait_until("the shell holds the lock", PATIENCE, || ready.exists());
    let status = env.status_json("subshells");
    assert_eq!(
        status["holders"][0]["command"].as_str(),
        Some(format!("hold for pid {}", shell.pid()).as_str()),
        "{status}"
    );
    let _ = shell.0.kill();
    shell.wait();
    wait_until("the lock is free", PATIENCE, || env.is_free("subshells"));
}

/// A signal to `dlock hold` while it waits cancels the wait as for `dlock run` (128+N), leaves
/// no keeper and no waiter behind, and says `(exit 130)` for `eval`.
#[test]
fn a_signal_while_a_hold_waits_cancels_it_and_leaves_no_keeper() {
    let (_server, env) = file_env();
    let _holder = env.hold("waited", &[]);
    let waiter = env
        .dlock(["hold", "waited"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock hold");
    wait_until("the hold waits", PATIENCE, || env.waiters("waited") >= 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("signal dlock hold");
    let out = waiter.wait_with_output().expect("dlock hold's output");
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "(exit 130)", "{}", describe(&out));
    wait_until("no waiter left", PATIENCE, || env.waiters("waited") == 0);
}

/// `--min-hold` keeps a hold's lock after its release until the time is up: the release
/// answers at once (0), the lock stays held, then comes free.
#[test]
fn min_hold_keeps_a_released_hold_until_its_time() {
    let (_server, env) = file_env();
    let started = std::time::Instant::now();
    let mut shell = env.shell(
        "eval \"$(\"$DLOCK\" hold --min-hold 2s kept)\" || exit 9; \
         \"$DLOCK\" release kept; echo $? > released; \
         \"$DLOCK\" status -q kept; echo $? > held",
    );
    assert!(shell.wait().success());
    let read = |name: &str| {
        std::fs::read_to_string(env.path(name))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    assert_eq!(read("released"), "0");
    assert_eq!(read("held"), "0", "the lock was not kept after the release");
    wait_until("the lock is free", PATIENCE, || env.is_free("kept"));
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "free after {:?}, before --min-hold",
        started.elapsed()
    );
}
