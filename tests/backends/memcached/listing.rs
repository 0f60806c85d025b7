//! `list` on memcached is complete every time: it enumerates keys with the crawler's walk over
//! the hash table, which items being read or rewritten meanwhile cannot escape.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn every_list_shows_every_held_lock_while_other_clients_read_them() {
    let server = MemcachedServer::start();
    let env = TestEnv::new(&server);
    let locks: Vec<String> = (0..3).map(|_| lock_name("mc")).collect();
    let _holders: Vec<Holding> = locks.iter().map(|l| env.hold(l, &[])).collect();
    // Other clients reading the locks' items (as `status` does) move them between
    // memcached's LRU lists, which is what a listing must survive.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, port) = (stop.clone(), server.port);
        let mut request: String = locks
            .iter()
            .map(|l| format!("mg dlock:{l}:f v\r\nmg dlock:{l}:0 v\r\n"))
            .collect();
        request.push_str("mn\r\n");
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                let _ = memcached_request(port, &request, "MN\r\n");
            }
        })
    };
    let mut missing = Vec::new();
    for round in 0..20 {
        let out = env.run(["list", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let text = stdout_of(&out);
        for lock in &locks {
            if !text.contains(&format!("\"{lock}\"")) {
                missing.push(format!("round {round}: {lock} missing from {text}"));
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = reader.join();
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The crawler does one walk at a time and answers `BUSY` to another meanwhile: lists run at
/// the same time (several users, or a script and a terminal) each still get the whole list.
#[test]
fn lists_at_the_same_time_all_succeed() {
    let server = MemcachedServer::start();
    let env = Arc::new(TestEnv::new(&server));
    let locks: Vec<String> = (0..3).map(|_| lock_name("mc")).collect();
    let _holders: Vec<Holding> = locks.iter().map(|l| env.hold(l, &[])).collect();
    let listers: Vec<_> = (0..6)
        .map(|_| {
            let env = env.clone();
            std::thread::spawn(move || {
                (0..10)
                    .map(|_| env.run(["list", "--json"]))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for lister in listers {
        for out in lister.join().expect("lister thread") {
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
            let text = stdout_of(&out);
            for lock in &locks {
                assert!(
                    text.contains(&format!("\"{lock}\"")),
                    "{lock} missing: {text}"
                );
            }
        }
    }
}
