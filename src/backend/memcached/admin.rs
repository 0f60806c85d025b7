//! What `status`, `list`, `release --force` and `check` ask of memcached, and the settings
//! that make a server unfit for locks.
//!
//! `status` reads the counter item (the last token, and the `--limit` in use), the holder
//! slots (metadata, token, TTL left in whole seconds) and the waiter registrations (a count;
//! see `wait.rs` for what it misses).
//!
//! `list` needs the server to enumerate its keys, which memcached does only through its LRU
//! crawler. dlock asks for the walk over the hash table (`lru_crawler metadump hash`), never
//! the walk over the LRU lists (`metadump all`): an item that is read or rewritten during an
//! LRU walk moves between lists and can be passed over (a held lock missing from `list`),
//! while the hash walk holds off table growth for its whole length and visits each bucket
//! under that bucket's lock, so every item that lives throughout the walk is listed once,
//! also when it is rewritten meanwhile. A lock is listed when its counter or one of its
//! holder slots is. A server that cannot do the hash walk (crawler off, or too old) makes
//! `list` fail (69) rather than answer incompletely.

use std::time::Duration;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::round_trip::median_round_trip;
use crate::lock::{CheckReport, Holder, HolderStatus, LockName, LockStatus};

use super::client::{md, mg, ms, Conn, Failure};
use super::keys::{parse_fence, Keys, Stored, WAITER_SLOTS};
use super::target::Server;
use super::token::now_micros;
use super::MemcachedBackend;
use crate::kit::timeouts::OP_TIMEOUT;

/// The most keys `list` reads from one server's listing.
const MAX_LISTED: usize = 10_000_000;
/// Bound for one server's key listing: a walk over every item, paced by the crawler (about
/// 10 µs an item with its default sleep), so millions of items fit; not on a path anybody
/// waits on for a lock.
const LISTING_TIMEOUT: Duration = Duration::from_secs(60);
/// Pauses before asking a busy crawler again: short at first (a walk over a few thousand
/// items takes milliseconds), growing to a ceiling that keeps a long walk from being asked
/// about hundreds of times a second.
const CRAWLER_BUSY_FIRST_PAUSE: Duration = Duration::from_millis(10);
const CRAWLER_BUSY_MAX_PAUSE: Duration = Duration::from_millis(250);

/// Why a server whose settings are `settings` cannot hold locks: it evicts (unless the URL
/// allows it), or its CAS values are off.
pub(super) fn refusal(
    settings: &[(String, String)],
    display: &str,
    allow_evictions: bool,
) -> Option<Error> {
    if stat(settings, "cas_enabled") == "no" {
        return Some(cas_disabled(display));
    }
    if stat(settings, "evictions") == "on" && !allow_evictions {
        return Some(evicting(display));
    }
    None
}

/// A server started with `-C`: no CAS values, so no compare-and-swap renewal or release.
pub(super) fn cas_disabled(display: &str) -> Error {
    Error::Config(format!(
        "{display} runs with CAS disabled (memcached -C); dlock renews and releases a lock by \
         compare-and-swap: start memcached without -C"
    ))
}

fn evicting(display: &str) -> Error {
    Error::Config(format!(
        "{display} evicts items when its memory is full (it runs without -M), and an evicted \
         lock item lets a second holder in; start memcached with -M, or accept the risk with \
         ?allow-evictions=1 in the URL"
    ))
}

/// The warning for a server that may move memory between slab classes: `slabs reassign`
/// (and the automover) drops the items of a page it moves when it cannot re-home them, even
/// with -M, and counts no eviction.
fn slab_reassign_warning(display: &str) -> String {
    format!(
        "{display} allows slab reassignment (slab_reassign yes): an admin's `slabs reassign`, \
         or the automover (slab_automove), can drop held lock items when memory is full, even \
         with -M; start memcached with -o no_slab_reassign"
    )
}

fn stat<'a>(pairs: &'a [(String, String)], name: &str) -> &'a str {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// The lock's state: counter, holder slots, waiter registrations (two round trips).
async fn status_at(
    conn: &mut Conn,
    keys: &Keys,
    name: Option<&LockName>,
    display: &str,
) -> Result<LockStatus, Error> {
    let fail = |f: Failure| f.into_error(display);
    let fence = conn
        .one(&mg(&keys.fence(), "v"), OP_TIMEOUT)
        .await
        .map_err(fail)?;
    let (last_token, limit) = match fence.value.as_deref().map(parse_fence) {
        Some(Some((token, limit))) => (Some(token), limit.clamp(1, crate::lock::MAX_LIMIT)),
        _ => (None, 1),
    };
    let mut request = Vec::new();
    for i in 0..limit {
        request.extend(mg(&keys.slot(i), "v t"));
    }
    for i in 0..WAITER_SLOTS {
        request.extend(mg(&keys.waiter(i), "s"));
    }
    let count = limit as usize + WAITER_SLOTS;
    let replies = conn.meta(&request, count, OP_TIMEOUT).await.map_err(fail)?;
    let (slots, waiters) = replies.split_at(limit as usize);
    let holders: Vec<HolderStatus> = slots
        .iter()
        .filter_map(|reply| {
            let stored = reply.value.as_deref().and_then(Stored::parse)?;
            let ttl_left_ms = reply
                .flag('t')
                .and_then(|t| t.parse::<u64>().ok())
                .map(|s| s * 1000);
            Some(HolderStatus {
                holder: stored.record.holder,
                ttl_left_ms,
                session: None,
            })
        })
        .collect();
    let shown = name
        .map(LockName::to_string)
        .or_else(|| keys.name().map(|n| n.to_string()))
        .or_else(|| holders.first().map(|h| h.holder.name.clone()))
        .unwrap_or_else(|| keys.base.clone());
    Ok(LockStatus {
        name: shown,
        held: !holders.is_empty(),
        holders,
        waiters: Some(waiters.iter().filter(|r| r.is("HD")).count() as u64),
        queue: Vec::new(),
        last_token,
        waiting_here: Vec::new(),
        location: None,
    })
}

pub(super) async fn status(
    backend: &MemcachedBackend,
    name: &LockName,
) -> Result<LockStatus, Error> {
    let server = backend.target.server_for(name, OP_TIMEOUT).await?;
    let mut conn = Conn::new(&server.at);
    status_at(
        &mut conn,
        &backend.keys(name),
        Some(name),
        &server.display(),
    )
    .await
}

pub(super) async fn list(backend: &MemcachedBackend) -> Result<Vec<LockStatus>, Error> {
    let mut held = Vec::new();
    for server in backend.target.resolve(OP_TIMEOUT).await? {
        let display = server.display();
        let mut conn = Conn::new(&server.at);
        for keys in lock_keys(&mut conn, &backend.prefix, &display).await? {
            let status = status_at(&mut conn, &keys, None, &display).await?;
            if status.held {
                held.push(status);
            }
        }
    }
    held.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(held)
}

/// The locks on one server: the keys of their counter and holder items, from the crawler's
/// walk over the hash table (see the module doc).
async fn lock_keys(conn: &mut Conn, prefix: &str, display: &str) -> Result<Vec<Keys>, Error> {
    let lines = crawled_lines(conn).await.map_err(|f| match f {
        Failure::Protocol(answer) => Error::Unavailable(format!(
            "{display} cannot list its keys (lru_crawler metadump hash answered {answer}); \
             `list` needs memcached's LRU crawler with its hash-table walk (memcached 1.6 \
             without -o no_lru_crawler); `dlock status NAME` works without it"
        )),
        other => other.into_error(display),
    })?;
    let mut found: Vec<Keys> = lines
        .iter()
        .filter_map(|line| line.split(' ').find_map(|w| w.strip_prefix("key=")))
        .filter_map(crate::lock::decode_component)
        .filter_map(|key| Keys::from_listed_key(prefix, &key))
        .collect();
    found.sort_by(|a, b| a.base.cmp(&b.base));
    found.dedup();
    Ok(found)
}

/// The crawler's walk over the hash table. The crawler does one walk at a time and answers
/// `BUSY` while another is under way (another `dlock list`, or the server's own background
/// crawl): that walk ends by itself, so the request is repeated, with a growing pause, until
/// [`LISTING_TIMEOUT`] from the first try.
async fn crawled_lines(conn: &mut Conn) -> Result<Vec<String>, Failure> {
    let give_up = BootInstant::now() + LISTING_TIMEOUT;
    let mut pause = CRAWLER_BUSY_FIRST_PAUSE;
    loop {
        let budget = give_up.remaining();
        match conn
            .lines("lru_crawler metadump hash", MAX_LISTED, budget)
            .await
        {
            Err(Failure::Protocol(answer))
                if answer.starts_with("BUSY") && BootInstant::now() + pause < give_up =>
            {
                tracing::debug!("the crawler is busy ({answer}); asking again in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(CRAWLER_BUSY_MAX_PAUSE);
            }
            other => return other,
        }
    }
}

pub(super) async fn force_release(
    backend: &MemcachedBackend,
    name: &LockName,
) -> Result<Vec<Holder>, Error> {
    let server = backend.target.server_for(name, OP_TIMEOUT).await?;
    let display = server.display();
    let fail = |f: Failure| f.into_error(&display);
    let keys = backend.keys(name);
    let mut conn = Conn::new(&server.at);
    let fence = conn
        .one(&mg(&keys.fence(), "v"), OP_TIMEOUT)
        .await
        .map_err(fail)?;
    let limit = match fence.value.as_deref().and_then(parse_fence) {
        Some((_, limit)) => limit.clamp(1, crate::lock::MAX_LIMIT),
        None => 1,
    };
    let mut removed = Vec::new();
    for i in 0..limit {
        let key = keys.slot(i);
        let reply = conn.one(&mg(&key, "v c"), OP_TIMEOUT).await.map_err(fail)?;
        let (Some(value), Some(cas)) = (reply.value.as_deref(), reply.cas()) else {
            continue;
        };
        let deleted = conn
            .one(&md(&key, &format!("C{cas}")), OP_TIMEOUT)
            .await
            .map_err(fail)?;
        if deleted.is("HD") {
            removed.push(
                Stored::parse(value)
                    .map(|s| s.record.holder)
                    .unwrap_or_default(),
            );
        }
    }
    Ok(removed)
}

pub(super) async fn check(backend: &MemcachedBackend) -> Result<CheckReport, Error> {
    let mut warnings = Vec::new();
    let mut details = Vec::new();
    let mut version = String::new();
    let mut round_trip = Duration::ZERO;
    let servers = backend.target.resolve(OP_TIMEOUT).await?;
    for server in &servers {
        let (v, rtt) = check_server(backend, server, &mut warnings, &mut details).await?;
        if version.is_empty() {
            version = v;
        }
        round_trip = round_trip.max(rtt);
    }
    if backend.target.servers.len() > 1 {
        details.push((
            "servers".into(),
            format!(
                "{}: each lock lives on one of them, chosen by a hash of its name; no failover",
                backend.target.servers.len()
            ),
        ));
    }
    let location: Vec<String> = servers.iter().map(Server::display).collect();
    Ok(CheckReport {
        backend: backend.target.scheme().into(),
        location: location.join(","),
        version,
        round_trip_us: u64::try_from(round_trip.as_micros()).unwrap_or(u64::MAX),
        warnings,
        details,
    })
}

/// Check one server: reachable, memcached ≥ 1.6, no evictions (or opted in), its clock, and
/// a test item created and deleted. Returns its version and median round trip.
async fn check_server(
    backend: &MemcachedBackend,
    server: &Server,
    warnings: &mut Vec<String>,
    details: &mut Vec<(String, String)>,
) -> Result<(String, Duration), Error> {
    let display = server.display();
    let fail = |f: Failure| f.into_error(&display);
    let mut conn = Conn::new(&server.at);
    let started = BootInstant::now();
    conn.ensure(OP_TIMEOUT).await.map_err(fail)?;
    let connect = BootInstant::now().saturating_since(started);
    let stats = conn.stats("", OP_TIMEOUT).await.map_err(fail)?;
    let version = meta_protocol_version(&stats, &display)?;
    let settings = conn.stats("settings", OP_TIMEOUT).await.map_err(fail)?;
    if let Some(refusal) = refusal(&settings, &display, backend.target.allow_evictions) {
        return Err(refusal);
    }
    let evictions = stat(&settings, "evictions");
    warn_of_settings(&settings, &display, warnings);
    let median = median_round_trip(5, async || {
        conn.one(&mg(&format!("{}:check", backend.prefix), "s"), OP_TIMEOUT)
            .await
            .map(drop)
            .map_err(|f| f.into_error(&display))
    })
    .await?;
    add_and_delete_test_item(&mut conn, &backend.prefix, &display).await?;
    let label = server.at.label();
    details.push((
        format!("server {label}"),
        format!("memcached {version}, evictions {evictions}"),
    ));
    details.push((
        format!("connect {label}"),
        humantime::format_duration(Duration::from_micros(connect.as_micros() as u64)).to_string(),
    ));
    compare_clocks(&stats, &display, &label, warnings, details);
    Ok((version, median))
}

/// The server's version from its `stats`; a server older than 1.6 (no meta protocol) is
/// refused.
fn meta_protocol_version(stats: &[(String, String)], display: &str) -> Result<String, Error> {
    let version = stat(stats, "version").to_owned();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    if (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (1, 6) {
        return Err(Error::Config(format!(
            "{display} runs memcached {version}; dlock needs 1.6 or later (the meta protocol)"
        )));
    }
    Ok(version)
}

/// Warns of the settings a server is accepted with but that weaken locks or `list`: slab
/// reassignment, evictions allowed by the URL, the LRU crawler off.
fn warn_of_settings(settings: &[(String, String)], display: &str, warnings: &mut Vec<String>) {
    if stat(settings, "slab_reassign") != "no" {
        warnings.push(slab_reassign_warning(display));
    }
    if stat(settings, "evictions") == "on" {
        warnings.push(format!(
            "{display} may evict lock items (allowed by ?allow-evictions=1): an evicted hold is \
             a broken lock; run memcached with -M"
        ));
    }
    if stat(settings, "lru_crawler") != "yes" {
        warnings.push(format!(
            "{display} has its LRU crawler off: `dlock list` cannot enumerate locks there"
        ));
    }
}

/// Adds a test item under the prefix that no lock's key can be, and deletes it with its CAS
/// value; a server that does not let both happen is refused.
async fn add_and_delete_test_item(
    conn: &mut Conn,
    prefix: &str,
    display: &str,
) -> Result<(), Error> {
    let fail = |f: Failure| f.into_error(display);
    let probe = format!("{prefix}:check:{}", uuid::Uuid::new_v4().simple());
    let added = conn
        .one(&ms(&probe, "ME T5 c", b"1"), OP_TIMEOUT)
        .await
        .map_err(fail)?;
    let deleted = match added.cas() {
        Some(cas) if added.is("HD") => {
            let reply = conn.one(&md(&probe, &format!("C{cas}")), OP_TIMEOUT).await;
            reply.map_err(fail)?.is("HD")
        }
        _ => false,
    };
    if !deleted {
        return Err(Error::Unavailable(format!(
            "{display}: a test item could not be added and deleted with its CAS value"
        )));
    }
    Ok(())
}

/// Reports how far the server's clock (its `stats` time) is from this host's, and warns
/// when it is more than 2 s off.
fn compare_clocks(
    stats: &[(String, String)],
    display: &str,
    label: &str,
    warnings: &mut Vec<String>,
    details: &mut Vec<(String, String)>,
) {
    let Ok(server_time) = stat(stats, "time").parse::<i64>() else {
        return;
    };
    let ours = i64::try_from(now_micros() / 1_000_000).unwrap_or(i64::MAX);
    let skew = server_time - ours;
    let told = match skew {
        0 => "same second as this host".to_owned(),
        s if s > 0 => format!("{s} s ahead of this host"),
        s => format!("{} s behind this host", -s),
    };
    details.push((format!("server clock {label}"), told));
    if skew.abs() > 2 {
        warnings.push(format!(
            "{display}'s clock is {} s off this host's: after a server restart, fencing tokens \
             come from the clients' clocks and increase only if those are synchronised (NTP)",
            skew.abs()
        ));
    }
}
