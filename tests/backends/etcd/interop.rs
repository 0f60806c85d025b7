//! `etcdctl lock` and dlock take the same lock, each waiting for the other.

use std::process::Stdio;

use nix::sys::signal::Signal;

use crate::support::*;

use super::keys;

#[test]
fn etcdctl_lock_and_dlock_exclude_each_other() {
    let server = EtcdServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let log = env.path("log");
    let ready = env.path("ready");
    let go = env.path("go");
    // etcdctl holds `dlock/<name>`: dlock's lock of the same name is busy.
    let script = format!(
        "echo etcdctl >> {log}; touch {ready}; while [ ! -e {go} ]; do sleep 0.02; done",
        log = log.display(),
        ready = ready.display(),
        go = go.display()
    );
    let etcdctl = server_binary("etcdctl", "etcd-client");
    let mut etcdctl_holder = std::process::Command::new(&etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{}", server.endpoints()))
        .args(["lock", &format!("dlock/{lock}"), "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_until("etcdctl holds", PATIENCE, || ready.exists());
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "dlock got a lock etcdctl holds: {}",
        describe(&out)
    );
    let mut dlock_waiter = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo dlock >> {}", log.display()),
        ])
        .spawn()
        .expect("dlock waiter");
    wait_until("dlock queued", PATIENCE, || {
        keys(&server, &format!("dlock/{lock}/")).len() == 2
    });
    std::fs::write(&go, b"").expect("go");
    assert!(wait_within(&mut etcdctl_holder, PATIENCE).success());
    assert!(wait_within(&mut dlock_waiter, PATIENCE).success());

    // dlock holds: etcdctl waits for it.
    let mut holder = env.hold(&lock, &[]);
    let mut etcdctl_waiter = std::process::Command::new(&etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{}", server.endpoints()))
        .args([
            "lock",
            &format!("dlock/{lock}"),
            "--",
            "sh",
            "-c",
            &format!("echo etcdctl-2 >> {}", log.display()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_until("etcdctl queued", PATIENCE, || {
        keys(&server, &format!("dlock/{lock}/")).len() == 2
    });
    std::fs::write(env.path("marker"), b"").expect("marker");
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "etcdctl\ndlock\n",
        "etcdctl ran while dlock held"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
    assert!(wait_within(&mut etcdctl_waiter, PATIENCE).success());
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "etcdctl\ndlock\netcdctl-2\n"
    );
}
