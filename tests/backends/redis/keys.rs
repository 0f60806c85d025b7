//! What dlock keeps on Redis: the fencing counter (across restarts and crashes, beyond 2^53,
//! at its maximum, of the wrong type), the holders' entries and their metadata.

use super::key;
use crate::support::*;

#[test]
fn tokens_keep_increasing_when_a_crash_loses_recent_writes() {
    // With AOF `everysec` (the default) or snapshots, a crash loses the last writes, counter
    // increments included: the counter comes back older than tokens already handed out.
    let mut server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let first = env.token(&lock);
    assert_eq!(server.command("SAVE"), "+OK");
    let second = env.token(&lock);
    assert!(second > first, "{second} <= {first}");
    // SIGKILL, then start again from the snapshot taken before `second`.
    server.restart();
    let third = env.token(&lock);
    assert!(
        third > second,
        "token repeated after a crash that lost writes: {first}, {second}, then {third}"
    );
}

#[test]
fn deleting_the_entry_by_hand_stops_the_holder() {
    let server = RedisServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut holder = env.hold(&lock, &[]);
    let deleted = server.command(&format!("DEL dlock:{{{lock}}}:owners"));
    assert_eq!(deleted, ":1");
    assert_eq!(holder.wait().code(), Some(124));
}

#[test]
fn a_retried_acquire_finds_its_own_hold() {
    // The acquire script is idempotent for one owner token: a retry after a lost reply gets
    // the same grant (same fence), not a second entry.
    let server = RedisServer::shared();
    // As dlock sends it: the modes' helpers first (without the replica check).
    let script = [
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/backend/redis/scripts/modes.lua"
        )),
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/backend/redis/scripts/acquire.lua"
        )),
    ]
    .concat();
    let base = format!("dlock:{{{}}}", lock_name("retry"));
    let keys = [
        "fence", "owners", "hold", "queue", "qdl", "w:tok1", "holders",
    ]
    .map(|k| format!("{base}:{k}"));
    let mut args: Vec<&str> = vec!["EVAL", &script, "7"];
    args.extend(keys.iter().map(String::as_str));
    args.extend(["tok1", "1", "3000", "3000", "{}", "wait", "0"]);
    let first = redis_resp(server.port, &args).expect("first acquire");
    let second = redis_resp(server.port, &args).expect("retried acquire");
    // {1, "<fence>", ttl, next}: the fence is a bulk string (exact beyond 2^53)
    let fence = |reply: &str| reply.lines().nth(3).map(str::to_owned);
    assert!(first.starts_with("*4\r\n:1\r\n$"), "not granted: {first:?}");
    assert_eq!(
        fence(&first),
        fence(&second),
        "the retry was granted a second time: {first:?} {second:?}"
    );
    assert_eq!(server.command(&format!("ZCARD {base}:owners")), ":1");
}

#[test]
fn tokens_stay_exact_and_increasing_beyond_2_pow_53() {
    // Lua numbers are doubles: 2^53 + 1 == 2^53 there, so the counter must never pass
    // through one.
    let server = RedisServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let at = 9_007_199_254_740_992_u64; // 2^53
    assert_eq!(
        server.command(&format!("SET {} {at}", key(&lock, "fence"))),
        "+OK"
    );
    let tokens: Vec<u64> = (0..3).map(|_| env.token(&lock)).collect();
    assert_eq!(
        tokens,
        [at + 1, at + 2, at + 3],
        "tokens repeated or skipped"
    );
    let out = env.run(["status", "--json", &lock]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(json["last_token"].as_u64(), Some(at + 3), "{json}");
}

#[test]
fn a_fencing_counter_at_its_maximum_refuses_rather_than_repeat_or_wrap() {
    let server = RedisServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let fence = key(&lock, "fence");
    assert_eq!(
        server.command(&format!("SET {fence} 9223372036854775806")),
        "+OK"
    );
    assert_eq!(env.token(&lock), 9_223_372_036_854_775_807);
    for _ in 0..2 {
        let out = env.run(["run", &lock, "touch", "ran"]);
        assert_fails(&out, 69, &fence);
        assert!(stderr_of(&out).contains("maximum"), "{}", describe(&out));
        assert!(
            !env.path("ran").exists(),
            "the command ran: {}",
            describe(&out)
        );
    }
    // Nothing was left behind: no holder, no waiter, and the counter is where it was.
    assert_eq!(
        redis_resp(server.port, &["GET", &fence]).expect("GET"),
        "$19\r\n9223372036854775807\r\n",
        "the counter changed"
    );
    assert_eq!(
        server.command(&format!("EXISTS {}", key(&lock, "owners"))),
        ":0"
    );
    assert_eq!(
        server.command(&format!("EXISTS {}", key(&lock, "queue"))),
        ":0"
    );
}

#[test]
fn a_fencing_counter_of_the_wrong_type_or_content_is_69_naming_the_key() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let listed = lock_name("r");
    let fence = key(&listed, "fence");
    assert_eq!(server.command(&format!("RPUSH {fence} x")), ":1");
    let out = env.run(["run", &listed, "touch", "ran"]);
    assert_fails(&out, 69, &fence);
    assert!(stderr_of(&out).contains("a list"), "{}", describe(&out));
    let out = env.run(["status", &listed]);
    assert_fails(&out, 69, &fence);

    let text = lock_name("r");
    let fence = key(&text, "fence");
    assert_eq!(server.command(&format!("SET {fence} abc")), "+OK");
    let out = env.run(["run", &text, "touch", "ran"]);
    assert_fails(&out, 69, &fence);
    assert!(stderr_of(&out).contains("\"abc\""), "{}", describe(&out));
    assert!(!env.path("ran").exists());
}

#[test]
fn a_holders_key_of_the_wrong_type_is_69_and_does_not_break_list() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let bad = lock_name("r");
    let holders = key(&bad, "owners");
    assert_eq!(server.command(&format!("RPUSH {holders} x")), ":1");
    let out = env.run(["run", &bad, "touch", "ran"]);
    assert_fails(&out, 69, &holders);
    assert!(!env.path("ran").exists());
    let out = env.run(["release", "--force", &bad]);
    assert_fails(&out, 69, &holders);

    let good = lock_name("r");
    let _holder = env.hold(&good, &[]);
    let out = env.run(["list"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains(&good), "{}", describe(&out));
    assert!(stderr_of(&out).contains(&holders), "{}", describe(&out));
}

#[test]
fn holder_metadata_that_is_not_utf8_is_shown_and_released() {
    let server = RedisServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut holder = env.hold(&lock, &[]);
    // Put a byte that is not UTF-8 into the holder's host name.
    let script = r#"local n = 0
for _, h in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local m = string.gsub(redis.call('HGET', KEYS[2], h .. ':meta'), '"host":"', '"host":"\255')
  redis.call('HSET', KEYS[2], h .. ':meta', m)
  n = n + 1
end
return n"#;
    let (owners, hold) = (key(&lock, "owners"), key(&lock, "hold"));
    let reply = redis_resp(server.port, &["EVAL", script, "2", &owners, &hold]).expect("EVAL");
    assert_eq!(reply, ":1\r\n");
    let out = env.run(["status", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains('\u{FFFD}'), "{}", describe(&out));
    assert!(
        stdout_of(&out).contains(&holder.pid().to_string()),
        "{}",
        describe(&out)
    );
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stderr_of(&out).contains("released"), "{}", describe(&out));
    assert_eq!(holder.wait().code(), Some(124));
}

/// A holder whose metadata was rewritten on the server by another client, megabytes long, is
/// shown cut and escaped.
#[test]
fn oversized_holder_metadata_is_cut_and_escaped() {
    let server = RedisServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("oversized");
    let _holder = env.hold(&lock, &[]);
    let script = r#"local n = 0
for _, h in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local m = cjson.decode(redis.call('HGET', KEYS[2], h .. ':meta'))
  m.command = ARGV[1] .. string.rep('x', 2 * 1024 * 1024)
  m.host = string.rep('h', 100000)
  m.user = string.rep('u', 100000)
  m.version = string.rep('v', 100000)
  redis.call('HSET', KEYS[2], h .. ':meta', cjson.encode(m))
  n = n + 1
end
return n"#;
    let (owners, hold) = (key(&lock, "owners"), key(&lock, "hold"));
    let reply = redis_resp(
        server.port,
        &[
            "EVAL",
            script,
            "2",
            &owners,
            &hold,
            crate::contract::INVISIBLE,
        ],
    )
    .expect("EVAL");
    assert_eq!(reply, ":1\r\n");
    crate::contract::oversized_holder_metadata_is_cut_and_escaped(&env, &lock);
}
