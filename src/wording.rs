//! The words every backend shares, written once so that a lock reads the same on every
//! backend: who holds it ([`holder`]), why a run did not get it ([`not_acquired`],
//! [`gave_up`]), a server that did not answer within `--wait` ([`no_answer`]), and the
//! durations in them ([`short_duration`]).
//!
//! A backend says *what* it saw (the holders, how many wait ahead) and calls these; it never
//! formats a holder itself. A new backend gets the same conflict line, `status` and `list`
//! for free (docs/guide.md: "Looking at locks").

use std::time::{Duration, SystemTime};

use crate::budget::{Wait, WaitBudget, MIN_ANSWER};
use crate::error::Error;
use crate::lock::{Holder, LockName, LockStatus};
use crate::logging::capped;

/// One holder, for a message: `pid 14028 on ci-3 (deploy: ./deploy.sh) for 4m12s`. A holder
/// that is not a dlock is named for what it is: `etcdctl lock or another client (not dlock)`.
/// Each field is cut to [`crate::logging::MAX_SHOWN`] characters (the metadata may have been written
/// by anyone); the line is escaped where it is printed.
pub fn holder(h: &Holder) -> String {
    let h = &capped_holder(h);
    let held_for = held_for(&h.since)
        .map(|d| format!(" for {}", short_duration(d)))
        .unwrap_or_default();
    if h.is_foreign() {
        let what = h
            .command
            .strip_prefix("(foreign holder: ")
            .and_then(|c| c.strip_suffix(')'))
            .unwrap_or("another client");
        let host = if h.host.is_empty() {
            String::new()
        } else {
            format!(" on {}", h.host)
        };
        return format!("{what} (not dlock){host}{held_for}");
    }
    if h.version.is_empty() && h.host.is_empty() && h.command.is_empty() {
        return format!("pid {} on this host, a flock(1) holder (not dlock)", h.pid);
    }
    let gone = if is_gone(h) { ", gone" } else { "" };
    let host = if h.host.is_empty() { "?" } else { &h.host };
    let what = match (h.user.is_empty(), h.command.is_empty()) {
        (false, false) => format!(" ({}: {})", h.user, h.command),
        (true, false) => format!(" ({})", h.command),
        (false, true) => format!(" ({})", h.user),
        (true, true) => String::new(),
    };
    format!("pid {} on {host}{what}{held_for}{gone}", h.pid)
}

/// `h` with each of its texts cut to [`crate::logging::MAX_SHOWN`] characters ([`capped`]):
/// what dlock shows and records of a holder, whose metadata comes from a server or a lock
/// file that others may write.
pub fn capped_holder(h: &Holder) -> Holder {
    let cap = |text: &str| capped(text).into_owned();
    // Every field named: a new text field must be capped too.
    Holder {
        name: cap(&h.name),
        host: cap(&h.host),
        pid: h.pid,
        user: cap(&h.user),
        command: cap(&h.command),
        since: cap(&h.since),
        ttl_ms: h.ttl_ms,
        token: h.token,
        version: cap(&h.version),
        min_hold_ms: h.min_hold_ms,
        kept_until: cap(&h.kept_until),
        mode: h.mode,
        limit: h.limit,
    }
}

/// What a holder is when it is not a live dlock: not dlock at all (`etcdctl lock`, a
/// Curator client, a `flock(1)` on the lock file), or a dlock of this host whose process is
/// gone (SIGKILLed: its entry stays until its lease runs out).
pub fn holder_kind(h: &Holder) -> Option<String> {
    if h.is_foreign() {
        let what = h
            .command
            .strip_prefix("(foreign holder: ")
            .and_then(|c| c.strip_suffix(')'))
            .unwrap_or("another client");
        return Some(format!("not dlock: {what}"));
    }
    if h.version.is_empty() && h.host.is_empty() && h.command.is_empty() {
        // A kernel lock on the lock file without dlock's record in it.
        return Some("not dlock: a flock(1) holder or another program on this host".into());
    }
    if is_gone(h) {
        return Some(format!(
            "gone: no process {} on this host any more; the lock is freed when its lease runs \
             out, and dlock release --force may free it now",
            h.pid
        ));
    }
    None
}

/// A holder recorded by this host whose process no longer exists.
fn is_gone(h: &Holder) -> bool {
    let Ok(pid) = i32::try_from(h.pid) else {
        return false;
    };
    if pid <= 0 || h.version.is_empty() {
        return false;
    }
    let here = nix::unistd::gethostname()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    here == h.host
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
}

/// ` by <holder>, <holder>` for a held lock, `""` when `holders` is empty.
pub fn held_by<'a>(holders: impl IntoIterator<Item = &'a Holder>) -> String {
    let who: Vec<String> = holders.into_iter().map(holder).collect();
    if who.is_empty() {
        String::new()
    } else {
        format!(" by {}", who.join(", "))
    }
}

impl LockStatus {
    /// " by pid N on host (user: command) for 4m12s, …" for messages about a held lock
    /// ("" when free): [`held_by`] of its holders.
    pub fn held_by(&self) -> String {
        held_by(self.holders.iter().map(|h| &h.holder))
    }
}

/// The state of a lock a run cannot have, from the queue ahead of it: "is held by …[, N
/// waiting ahead]", "is free, N waiting ahead" (the first waiter is taking it, or was killed
/// and its entry is about to go), or "was held a moment ago".
pub fn busy_state(holders: &[Holder], waiting_ahead: usize) -> String {
    let ahead = waiting_ahead_text(waiting_ahead);
    if holders.is_empty() {
        return if waiting_ahead > 0 {
            format!("is free{ahead}")
        } else {
            "was held a moment ago".into()
        };
    }
    format!("is held{}{ahead}", held_by(holders))
}

/// `, N waiting ahead` (or nothing for none).
pub fn waiting_ahead_text(n: usize) -> String {
    if n > 0 {
        format!(", {n} waiting ahead")
    } else {
        String::new()
    }
}

/// Why a run gave up, after the lock's state: `not waiting (--no-wait)` or `gave up after
/// waiting 5s (--wait)`.
pub fn gave_up(wait: Wait) -> String {
    match wait {
        Wait::No => "not waiting (--no-wait)".into(),
        Wait::For(_) => format!("gave up after waiting {} (--wait)", wait.describe()),
        Wait::Forever => "gave up".into(),
    }
}

/// The conflict line every backend reports when a run did not get the lock:
/// `lock 'NAME' <state>; <why it gave up>`, where `state` is [`busy_state`]'s (or a
/// backend's own, starting with a verb: `is held by 2 of --limit 2 …`).
pub fn not_acquired(name: &LockName, state: &str, wait: Wait) -> Error {
    Error::Busy(format!("lock '{name}' {state}; {}", gave_up(wait)))
}

/// `no answer from SERVER[ (WHAT)] within --wait 5s`: a server that did not answer (`what`:
/// to which request) in the time a run gave it, `given`. That time is named beside the wait
/// when it was longer (a short `--wait` still gives a server [`MIN_ANSWER`]: `within 2s
/// (--wait 1ms)`), with `--no-wait` (`within 5s (--no-wait)`), and alone without a wait.
pub fn no_answer_within(server: &str, what: Option<&str>, wait: Wait, given: Duration) -> String {
    let length = |d: Duration| humantime::format_duration(d).to_string();
    let within = match wait {
        Wait::For(asked) if given > asked => {
            format!("{} (--wait {})", length(given), length(asked))
        }
        Wait::For(asked) => format!("--wait {}", length(asked)),
        Wait::No => format!("{} (--no-wait)", length(given)),
        Wait::Forever => length(given),
    };
    let what = what.map_or_else(String::new, |what| format!(" ({what})"));
    format!("no answer from {server}{what} within {within}")
}

/// `no answer from SERVER within D`: a bound of dlock's own (connecting, one call), not
/// `--wait`, ran out before the server answered (69).
pub fn no_answer_in(server: &str, given: Duration) -> Error {
    Error::Unavailable(no_answer_within(server, None, Wait::Forever, given))
}

/// [`no_answer_within`] the server's time to answer of `budget` ([`WaitBudget::answer_by`]):
/// the server is unavailable (69).
pub fn no_answer(server: &str, what: Option<&str>, budget: &WaitBudget) -> Error {
    Error::Unavailable(no_answer_within(server, what, budget.wait(), MIN_ANSWER))
}

/// How long ago an RFC 3339 time was (`None` when it is not one, or in the future).
pub fn held_for(since: &str) -> Option<Duration> {
    let then = humantime::parse_rfc3339(since).ok()?;
    SystemTime::now().duration_since(then).ok()
}

/// A duration to the second in at most two units: `12s`, `4m12s`, `2h3m`, `3d4h`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, minutes, seconds) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{minutes}m")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// A duration measured, for `status` and `check`: `0.3 ms`, `5.7 ms`, `290 ms`, `2.9 s`,
/// then as [`short_duration`] (`4m12s`) from a minute on. One form wherever dlock reports a
/// measured time, with the precision that matters at its size.
pub fn measured_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if d < Duration::from_secs(60) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        short_duration(d)
    }
}

/// How many columns `text` takes on a terminal: 2 for the wide characters of East Asian
/// scripts and emoji, 0 for combining marks and zero-width characters, 1 for the rest (the
/// common cases; a terminal may differ on rare ones).
pub fn display_width(text: &str) -> usize {
    text.chars()
        .map(|c| match u32::from(c) {
            0x0300..=0x036F | 0x200B..=0x200F | 0x20D0..=0x20FF | 0xFE00..=0xFE0F => 0,
            0x1100..=0x115F
            | 0x2E80..=0x303E
            | 0x3041..=0x33FF
            | 0x3400..=0x4DBF
            | 0x4E00..=0x9FFF
            | 0xA000..=0xA4CF
            | 0xAC00..=0xD7A3
            | 0xF900..=0xFAFF
            | 0xFE30..=0xFE4F
            | 0xFF00..=0xFF60
            | 0xFFE0..=0xFFE6
            | 0x1F300..=0x1F64F
            | 0x1F900..=0x1F9FF
            | 0x20000..=0x3FFFD => 2,
            _ => 1,
        })
        .sum()
}

/// `text` followed by spaces up to `width` terminal columns (see [`display_width`]).
pub fn pad(text: &str, width: usize) -> String {
    let fill = width.saturating_sub(display_width(text));
    format!("{text}{}", " ".repeat(fill))
}

/// Whether a connection was refused somewhere in `err`'s chain of causes (an `io::Error` of
/// kind `ConnectionRefused`, also where a client shared it behind an `Arc`).
pub fn refused_in(err: &(dyn std::error::Error + 'static)) -> bool {
    let refused = |io: &std::io::Error| io.kind() == std::io::ErrorKind::ConnectionRefused;
    let mut cause = Some(err);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>().is_some_and(refused)
            || e.downcast_ref::<std::sync::Arc<std::io::Error>>()
                .is_some_and(|io| refused(io))
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// How messages name a backend's server, and the port its URLs reach when they name none.
/// Each backend states its own (`SERVER` in its folder), so these words know no backend.
#[derive(Clone, Copy, Debug)]
pub struct Server {
    /// What is not listening when a connection is refused: "Redis server", "memcached".
    pub listening: &'static str,
    /// What the server at the URL does not look like: "Redis" (… a Redis server).
    pub name: &'static str,
    /// The port a URL without one reaches.
    pub port: u16,
}

/// `cannot connect to HOST:PORT: connection refused`: nothing listens where the URL points
/// (the same words on every backend; 69, waited out within `--wait` like any unreachable
/// server).
pub fn connection_refused(display: &str, server: &Server) -> Error {
    let endpoint = endpoint_of(display, server.port);
    // A Unix socket's path that does not exist: clients report it as refused.
    if endpoint.starts_with('/') && !std::path::Path::new(&endpoint).exists() {
        return no_socket(&endpoint, server);
    }
    Error::Unavailable(format!(
        "cannot connect to {endpoint}: connection refused (no {} is listening there)",
        server.listening
    ))
}

/// Where a password may be given, for the messages about one: `more` names a backend's own
/// places (PostgreSQL's `~/.pgpass`).
fn password_places(more: &[&str]) -> String {
    let mut places = vec!["the URL", "DLOCK_PASSWORD", "password_file"];
    places.extend_from_slice(more);
    let last = places.pop().unwrap_or_default();
    format!("{} or {last}", places.join(", "))
}

/// `ENDPOINT wants a password for user 'USER', and none was given`: the same words on every
/// backend that has passwords (77); `more`: the backend's own places for one.
pub fn password_missing(endpoint: &str, user: &str, more: &[&str]) -> Error {
    if user.is_empty() {
        return Error::Permission(format!(
            "{endpoint} wants a user and a password, and none was given: give the user in the \
             URL (USER@HOST) and the password in {}",
            password_places(more)
        ));
    }
    Error::Permission(format!(
        "{endpoint} wants a password for user '{user}', and none was given: give it in {}",
        password_places(more)
    ))
}

/// `ENDPOINT refused user 'USER' with the password given`: a wrong password, or a user the
/// server does not know, in the same words on every backend that has passwords (77).
pub fn password_refused(endpoint: &str, user: &str, more: &[&str]) -> Error {
    Error::Permission(format!(
        "{endpoint} refused user '{user}' with the password given: check the user, and the \
         password in {}",
        password_places(more)
    ))
}

/// `ENDPOINT has no database 'NAME'`: the URL names a database (a Redis DB index) the
/// server does not have, or that its user may not see; the same words and status (78) on
/// every backend with databases. `fix` says how to choose another.
pub fn no_database(endpoint: &str, name: &str, fix: &str) -> Error {
    Error::Config(format!("{endpoint} has no database '{name}'{fix}"))
}

/// `cannot connect to PATH: no such socket`: a Unix socket URL whose path does not exist
/// (69, waited out within `--wait` like any unreachable server).
pub fn no_socket(path: &str, server: &Server) -> Error {
    Error::Unavailable(format!(
        "cannot connect to {path}: no such socket (no {} is listening there)",
        server.listening
    ))
}

/// Whether a file was not found somewhere in `err`'s chain of causes (a Unix socket's path
/// that does not exist).
pub fn not_found_in(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The user a (credential-free) URL names: `redis://app:***@host` → `app`; `None` without.
pub fn user_in(display: &str) -> Option<&str> {
    let rest = display.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let (userinfo, _) = authority.rsplit_once('@')?;
    let user = userinfo.split(':').next().unwrap_or(userinfo);
    (!user.is_empty()).then_some(user)
}

/// `HOST:PORT does not look like a SERVER server (WHAT IT DID)`: something else listens
/// where the URL points (a Redis URL at an etcd port, say).
pub fn not_a(display: &str, server: &Server, seen: &str) -> Error {
    Error::Unavailable(format!(
        "{} does not look like {} {} server ({seen}); check the URL's host and port",
        endpoint_of(display, server.port),
        article(server.name),
        server.name
    ))
}

/// `HOST:PORT did not answer the TLS handshake; is it serving plain text? (use redis:// …)`:
/// a TLS URL at a server that does not speak TLS; `plain` says how to ask for no TLS.
pub fn no_tls_handshake(display: &str, server: &Server, plain: &str) -> String {
    format!(
        "{} did not answer the TLS handshake; is it serving plain text? ({plain})",
        endpoint_of(display, server.port)
    )
}

fn article(word: &str) -> &'static str {
    match word.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u' | 'A' | 'E' | 'I' | 'O' | 'U') => "an",
        _ => "a",
    }
}

/// The `host:port` list of a (credential-free) URL: `redis://127.0.0.1:6380/0` →
/// `127.0.0.1:6380`, with `port` where the URL names none; a Unix socket's path
/// (`redis+unix:///run/redis.sock`, `…?socket=PATH`, `…?host=/DIR`) where it names one.
pub fn endpoint_of(display: &str, port: u16) -> String {
    let (scheme, rest) = display.split_once("://").unwrap_or(("", display));
    let without_fragment = rest.split('#').next().unwrap_or(rest);
    let (before_query, query) = without_fragment
        .split_once('?')
        .unwrap_or((without_fragment, ""));
    if scheme.ends_with("+unix") || scheme == "unix" {
        return before_query.to_owned();
    }
    let socket = query
        .split('&')
        .find_map(|pair| match pair.split_once('=') {
            Some(("socket" | "unix_socket", path)) => Some(path),
            Some(("host", path)) if path.starts_with('/') => Some(path),
            _ => None,
        });
    if let Some(path) = socket {
        return path.to_owned();
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts
        .split(',')
        .map(|h| {
            let has_port = match h.rsplit_once(']') {
                Some((_, after)) => after.starts_with(':'),
                None => h.contains(':'),
            };
            if has_port || h.is_empty() {
                h.to_owned()
            } else {
                format!("{h}:{port}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder_since(secs_ago: u64) -> Holder {
        let since = SystemTime::now() - Duration::from_secs(secs_ago);
        Holder {
            host: "ci-3".into(),
            pid: 14028,
            user: "deploy".into(),
            command: "./deploy.sh".into(),
            since: humantime::format_rfc3339_seconds(since).to_string(),
            version: "1.0.0".into(),
            ..Holder::default()
        }
    }

    #[test]
    fn a_holder_reads_as_in_the_readme() {
        assert_eq!(
            holder(&holder_since(252)),
            "pid 14028 on ci-3 (deploy: ./deploy.sh) for 4m12s"
        );
    }

    #[test]
    fn a_foreign_holder_is_named_as_such() {
        let foreign = Holder {
            command: "(foreign holder: etcdctl lock or another client)".into(),
            ..Holder::default()
        };
        let text = holder(&foreign);
        assert_eq!(text, "etcdctl lock or another client (not dlock)");
        assert!(!text.contains("pid 0"), "{text}");
    }

    #[test]
    fn the_conflict_line_has_one_shape() {
        let name = LockName::new("job").unwrap();
        let undated = Holder {
            since: String::new(),
            ..holder_since(0)
        };
        let state = busy_state(&[undated], 2);
        let Error::Busy(line) = not_acquired(&name, &state, Wait::No) else {
            panic!("not Busy");
        };
        assert_eq!(
            line,
            "lock 'job' is held by pid 14028 on ci-3 (deploy: ./deploy.sh), 2 waiting ahead; \
             not waiting (--no-wait)"
        );
    }

    #[test]
    fn a_server_that_did_not_answer_within_the_wait() {
        let ms = Duration::from_millis;
        let server = "etcd://127.0.0.1:2379";
        let no_answer_text = |what, wait| match no_answer(server, what, &WaitBudget::start(wait)) {
            Error::Unavailable(text) => text,
            other => panic!("not Unavailable: {other:?}"),
        };
        assert_eq!(
            no_answer_text(None, Wait::For(ms(2500))),
            "no answer from etcd://127.0.0.1:2379 within --wait 2s 500ms"
        );
        assert_eq!(
            no_answer_text(None, Wait::For(MIN_ANSWER)),
            "no answer from etcd://127.0.0.1:2379 within --wait 2s"
        );
        assert_eq!(
            no_answer_text(Some("LISTEN"), Wait::For(ms(1))),
            "no answer from etcd://127.0.0.1:2379 (LISTEN) within 2s (--wait 1ms)"
        );
        assert_eq!(
            no_answer_within("redis://h:1", None, Wait::For(ms(1)), ms(1)),
            "no answer from redis://h:1 within --wait 1ms"
        );
        assert_eq!(
            no_answer_within("redis://h:1", None, Wait::No, Duration::from_secs(5)),
            "no answer from redis://h:1 within 5s (--no-wait)"
        );
        assert_eq!(
            no_answer_within("zk://h:1", None, Wait::Forever, Duration::from_secs(5)),
            "no answer from zk://h:1 within 5s"
        );
    }

    #[test]
    fn why_a_run_gave_up() {
        assert_eq!(gave_up(Wait::No), "not waiting (--no-wait)");
        assert_eq!(
            gave_up(Wait::For(Duration::from_millis(300))),
            "gave up after waiting 300ms (--wait)"
        );
    }

    #[test]
    fn widths_on_a_terminal() {
        assert_eq!(display_width("deploy"), 6);
        assert_eq!(display_width("déploiement"), 11);
        assert_eq!(display_width("e\u{301}"), 1);
        assert_eq!(display_width("発行"), 4);
        assert_eq!(pad("発行", 6), "発行  ");
    }

    #[test]
    fn users_of_urls_and_where_passwords_go() {
        assert_eq!(user_in("redis://app:***@h:1/0"), Some("app"));
        assert_eq!(user_in("redis://:***@h:1/0"), None);
        assert_eq!(user_in("zk://u@h/chroot"), Some("u"));
        assert_eq!(user_in("etcd://h:2379"), None);
        let missing = password_missing("h:1", "app", &["~/.pgpass"]).to_string();
        assert_eq!(
            missing,
            "h:1 wants a password for user 'app', and none was given: give it in the URL, \
             DLOCK_PASSWORD, password_file or ~/.pgpass"
        );
        let refused = password_refused("h:1", "app", &[]);
        assert_eq!(refused.code(), crate::exit::Code::NoPermission);
        assert!(refused
            .to_string()
            .ends_with("the URL, DLOCK_PASSWORD or password_file"));
        assert_eq!(
            no_database("h:1", "x", "").code(),
            crate::exit::Code::Config
        );
    }

    #[test]
    fn endpoints_of_urls() {
        assert_eq!(
            endpoint_of("redis://127.0.0.1:6380/0", 6379),
            "127.0.0.1:6380"
        );
        assert_eq!(endpoint_of("postgres://u@db/x", 5432), "db:5432");
        assert_eq!(endpoint_of("zk://a:1,b/chroot", 2181), "a:1,b:2181");
        assert_eq!(endpoint_of("etcds://[::1]", 2379), "[::1]:2379");
        assert_eq!(endpoint_of("mysql://[::1]:3307/d", 3306), "[::1]:3307");
        assert_eq!(
            endpoint_of("memcached+unix:///run/m.sock", 11211),
            "/run/m.sock"
        );
        assert_eq!(endpoint_of("redis+unix:///missing?db=2", 6379), "/missing");
        assert_eq!(
            endpoint_of("mysql://app@localhost/dlock?socket=/run/my.sock", 3306),
            "/run/my.sock"
        );
        assert_eq!(endpoint_of("postgres:///app?host=/run/pg", 5432), "/run/pg");
    }

    #[test]
    fn a_refused_connection_and_another_server_are_named_by_the_backends_words() {
        const SERVER: Server = Server {
            listening: "Redis server",
            name: "Redis",
            port: 6379,
        };
        assert_eq!(
            connection_refused("redis://h/0", &SERVER).to_string(),
            "cannot connect to h:6379: connection refused (no Redis server is listening there)"
        );
        assert_eq!(
            not_a("redis://h:7/0", &SERVER, "it answered HTTP").to_string(),
            "h:7 does not look like a Redis server (it answered HTTP); check the URL's host and port"
        );
    }

    #[test]
    fn measured_durations_read_alike_at_every_size() {
        let us = Duration::from_micros;
        assert_eq!(measured_duration(us(290)), "0.3 ms");
        assert_eq!(measured_duration(us(5_676)), "5.7 ms");
        assert_eq!(measured_duration(us(290_400)), "290 ms");
        assert_eq!(measured_duration(us(2_940_000)), "2.9 s");
        assert_eq!(measured_duration(Duration::from_secs(252)), "4m12s");
    }

    #[test]
    fn short_durations() {
        assert_eq!(short_duration(Duration::from_secs(0)), "0s");
        assert_eq!(short_duration(Duration::from_secs(59)), "59s");
        assert_eq!(short_duration(Duration::from_secs(3 * 3600 + 125)), "3h2m");
        assert_eq!(short_duration(Duration::from_secs(86_400 + 7200)), "1d2h");
    }
}
