//! What `status`, `list`, `release --force` and `check` ask of S3.
//!
//! `status` reads the lock object (holders live by the server's clock, the last token) and
//! lists the waiters' registrations (those written within `wait::STALE_AFTER` server seconds
//! count). `list` lists the lock objects under the prefix (ListObjectsV2, page by page) and
//! reads each, with its waiters. `release --force` rewrites the object without holders, on the ETag read, so
//! the token counter stays. `check` checks the credentials and the bucket, that the server
//! honours conditional writes (a probe object created, created again, written on an ETag
//! nobody has, deleted), and how far this host's clock is from the server's.

use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::kit::round_trip::median_round_trip;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{CheckReport, Holder, LockName, LockStatus};

use super::acquire::ignores_conditions;
use super::client::{unix_seconds, Cond, Failure, Got, Put, S3};
use super::record::Body;
use super::wait::STALE_AFTER;
use super::S3Backend;

/// The most pages `list` reads (1000 keys each).
const MAX_PAGES: usize = 1000;
/// Rewrites lost to other writers in a row before `release --force` gives up.
const ROUNDS: usize = 20;
/// A clock further off the server's than this is worth a warning (S3 refuses signatures
/// beyond 15 minutes).
const CLOCK_WARNING: Duration = Duration::from_secs(300);

fn fail(s3: &S3) -> impl Fn(Failure) -> Error + '_ {
    |f| f.into_error(&s3.display)
}

/// The lock `name` as its object and `key` say (`name` shown as its holders record it).
fn status_of(object: Option<(&Body, u64, u64)>, name: String, waiters: Option<u64>) -> LockStatus {
    let (holders, last_token) = match object {
        Some((body, lm, date)) => (
            body.live(lm, date).map(|e| e.status(lm, date)).collect(),
            Some(body.token),
        ),
        None => (Vec::new(), None),
    };
    LockStatus {
        name,
        held: !holders.is_empty(),
        holders,
        waiters,
        queue: Vec::new(),
        last_token,
        waiting_here: Vec::new(),
        location: None,
    }
}

pub(super) async fn status(backend: &S3Backend, name: &LockName) -> Result<LockStatus, Error> {
    let s3 = backend.s3()?;
    let key = backend.keys.lock(name);
    let got = s3.get(&key, OP_TIMEOUT).await.map_err(fail(s3))?;
    let waiters = waiters(s3, &backend.keys.waiters(name)).await?;
    match got {
        Got::Missing { .. } => Ok(status_of(None, name.to_string(), Some(waiters))),
        Got::Found(object) => {
            let body = Body::parse(&object.body).ok_or_else(|| foreign(s3, &key))?;
            let lm_date = (object.last_modified, object.date);
            Ok(status_of(
                Some((&body, lm_date.0, lm_date.1)),
                name.to_string(),
                Some(waiters),
            ))
        }
    }
}

fn foreign(s3: &S3, key: &str) -> Error {
    Error::Unavailable(format!(
        "{}: the object '{key}' holds data dlock did not write; remove it or use another \
         --prefix",
        s3.display
    ))
}

/// The waiters registered under `prefix` recently enough, by the server's clock.
async fn waiters(s3: &S3, prefix: &str) -> Result<u64, Error> {
    let mut count = 0;
    let mut next: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let page = s3
            .list(prefix, false, next.as_deref(), OP_TIMEOUT)
            .await
            .map_err(fail(s3))?;
        count += page
            .objects
            .iter()
            .filter(|(_, modified)| page.date < modified + STALE_AFTER)
            .count() as u64;
        next = page.next;
        if next.is_none() {
            break;
        }
    }
    Ok(count)
}

pub(super) async fn list(backend: &S3Backend) -> Result<Vec<LockStatus>, Error> {
    let s3 = backend.s3()?;
    let mut held = Vec::new();
    let mut next: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let page = s3
            .list(&backend.keys.base, true, next.as_deref(), OP_TIMEOUT)
            .await
            .map_err(fail(s3))?;
        for (key, _) in &page.objects {
            let Got::Found(object) = s3.get(key, OP_TIMEOUT).await.map_err(fail(s3))? else {
                continue;
            };
            let Some(body) = Body::parse(&object.body) else {
                tracing::warn!("{}", foreign(s3, key));
                continue;
            };
            let (lm, date) = (object.last_modified, object.date);
            let Some(first) = body.live(lm, date).next() else {
                continue;
            };
            let name = first.record.holder.name.clone();
            let waiting = waiters(s3, &format!("{key}/w/")).await?;
            held.push(status_of(Some((&body, lm, date)), name, Some(waiting)));
        }
        next = page.next;
        if next.is_none() {
            break;
        }
    }
    held.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(held)
}

pub(super) async fn force_release(
    backend: &S3Backend,
    name: &LockName,
) -> Result<Vec<Holder>, Error> {
    let s3 = backend.s3()?;
    let key = backend.keys.lock(name);
    for _ in 0..ROUNDS {
        let Got::Found(object) = s3.get(&key, OP_TIMEOUT).await.map_err(fail(s3))? else {
            return Ok(Vec::new());
        };
        let mut body = Body::parse(&object.body).ok_or_else(|| foreign(s3, &key))?;
        let (lm, date) = (object.last_modified, object.date);
        let removed: Vec<Holder> = body
            .live(lm, date)
            .map(|e| e.record.holder.clone())
            .collect();
        if body.holders.is_empty() {
            return Ok(removed);
        }
        body.prepare(lm, date);
        body.holders.clear();
        let put = s3
            .put(
                &key,
                body.to_bytes(),
                &Cond::Matches(object.etag),
                OP_TIMEOUT,
            )
            .await
            .map_err(fail(s3))?;
        if let Put::Done(_) = put {
            return Ok(removed);
        }
    }
    Err(Error::Unavailable(format!(
        "{}: the lock object changed under {ROUNDS} writes in a row",
        s3.display
    )))
}

pub(super) async fn check(backend: &S3Backend) -> Result<CheckReport, Error> {
    let s3 = backend.s3()?;
    let mut warnings = Vec::new();
    let mut details = Vec::new();
    let page = s3
        .list(&backend.keys.base, true, None, OP_TIMEOUT)
        .await
        .map_err(fail(s3))?;
    let here = unix_seconds(SystemTime::now());
    let (ahead, off) = if here >= page.date {
        ("ahead of", here - page.date)
    } else {
        ("behind", page.date - here)
    };
    let clock = format!(
        "this host's clock is {off}s {ahead} the server's (leases are judged on the server's \
         clock; signatures need 15 minutes)"
    );
    if Duration::from_secs(off) > CLOCK_WARNING {
        warnings.push(format!("{}: {clock}", s3.display));
    }
    let probe = backend.keys.probe();
    let median = median_round_trip(3, async || {
        s3.get(&probe, OP_TIMEOUT).await.map(drop).map_err(fail(s3))
    })
    .await?;
    conditional_writes(s3, &probe).await?;
    details.push(("endpoint".into(), s3.endpoint.clone()));
    details.push(("region".into(), s3.region().to_owned()));
    details.push(("credentials".into(), s3.credentials_from.clone()));
    details.push((
        "conditional writes".into(),
        "honoured (If-None-Match: *, If-Match)".into(),
    ));
    details.push(("clock".into(), clock));
    Ok(CheckReport {
        backend: "s3".into(),
        location: s3.display.clone(),
        version: page.server.clone().unwrap_or_else(|| "S3".into()),
        round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
        warnings,
        details,
    })
}

/// Create `probe`, create it again and write it on an ETag nobody has (both must fail),
/// then delete it.
async fn conditional_writes(s3: &S3, probe: &str) -> Result<(), Error> {
    let body = super::record::nonce().into_bytes();
    let created = s3
        .put(probe, body.clone(), &Cond::Absent, OP_TIMEOUT)
        .await
        .map_err(fail(s3))?;
    let mut refusal = None;
    if let Put::Done(_) = created {
        for (cond, header) in [
            (Cond::Absent, "If-None-Match: *"),
            (
                Cond::Matches("\"00000000000000000000000000000000\"".into()),
                "If-Match",
            ),
        ] {
            let put = s3.put(probe, body.clone(), &cond, OP_TIMEOUT).await;
            match put {
                Ok(Put::Done(_)) => {
                    refusal = Some(ignores_conditions(&s3.display, header));
                    break;
                }
                Ok(Put::Lost) => {}
                Err(f) => {
                    refusal = Some(f.into_error(&s3.display));
                    break;
                }
            }
        }
    } else {
        refusal = Some(Error::Unavailable(format!(
            "{}: a new probe object could not be created (If-None-Match: * failed on a key \
             nobody has)",
            s3.display
        )));
    }
    let deleted = s3.delete(probe, OP_TIMEOUT).await.map_err(fail(s3));
    match refusal {
        Some(e) => Err(e),
        None => deleted,
    }
}
