//! A slow link (or a busy machine) delays answers, not the lock: a grant that waited is
//! confirmed by a heartbeat before the command starts, and that round trip may take what the
//! lease allows (the keeper's give-up point for the hold it proves), not a fixed part of the
//! TTL.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::*;

#[test]
fn a_slow_confirmation_within_the_lease_still_starts_the_command() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("slow");
    let mut holder = env.hold(&lock, &[]);
    // 400 ms each way: the confirmation's round trip takes 0.8 s, more than a renewal attempt
    // of a running command (TTL/6: 0.67 s at --ttl 4s) and well within the 2.1 s the keeper
    // keeps a hold that round trip proved.
    let proxy = Proxy::with_delay(server.port, Duration::from_millis(400));
    let url = server.url_via(proxy.port);
    let waiter = {
        let command = env.dlock([
            "run", "--url", &url, "--ttl", "4s", &lock, "echo", "started",
        ]);
        std::thread::spawn(move || output_within(command, PATIENCE))
    };
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let out = waiter.join().expect("the waiter's thread");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out), "started\n");
}
