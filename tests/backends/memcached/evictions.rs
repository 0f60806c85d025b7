//! A memcached that evicts (started without `-M`) can drop a held lock's item: dlock refuses
//! it (78) in `run` and `check` unless the URL opts in with `?allow-evictions=1`.

use crate::support::*;

#[test]
fn an_evicting_server_is_refused_unless_the_url_allows_it() {
    let server = MemcachedServer::start_evicting();
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let out = env.run(["run", &lock, "touch", "ran"]);
    assert_fails(&out, 78, "-M");
    assert!(!env.path("ran").exists(), "the command ran");
    let out = env.run(["check"]);
    assert_fails(&out, 78, "allow-evictions=1");

    let allowed = format!("{}?allow-evictions=1", server.url());
    let out = env.run(["run", "--url", &allowed, &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    let out = env.run(["check", "--url", &allowed]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        stdout_of(&out).contains("evict"),
        "check must warn about evictions: {}",
        describe(&out)
    );
}

#[test]
fn a_server_with_m_is_accepted_and_check_reports_its_clock() {
    let server = MemcachedServer::shared();
    let env = TestEnv::new(&server);
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains("evictions off"), "{text}");
    assert!(text.contains("server clock"), "{text}");
}
