//! The commands around the lock: `status`, `list`, `release --force` and `check`, each from
//! one read of the keys (a watch's first delivery: the last entry of each key).

use std::collections::BTreeMap;
use std::time::Duration;

use super::conn::Write;
use super::keys::{Keys, Stored};
use super::queue::{holder_of, View, WAITER_TTL};
use super::NatsBackend;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::round_trip::median_round_trip;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{CheckReport, Holder, HolderStatus, LockName, LockStatus};

/// How long `status`, `list` and `release --force` try to read the keys: two exchanges'
/// time, so that a cluster electing new leaders after losing a server still answers.
const READ_LIMIT: Duration = Duration::from_secs(10);

/// Each lock's keys, from the entries of one read.
fn views(keys: &Keys, found: Vec<super::conn::Found>) -> BTreeMap<String, (LockName, View)> {
    let mut views: BTreeMap<String, (LockName, View)> = BTreeMap::new();
    for entry in found {
        let Some((name, _)) = keys.parse(&entry.key) else {
            continue;
        };
        views
            .entry(name.as_str().to_owned())
            .or_insert_with(|| (name, View::default()))
            .1
            .add(entry);
    }
    views
}

/// One lock's state from its keys.
fn status_of(keys: &Keys, name: &LockName, view: &View) -> LockStatus {
    let holders: Vec<HolderStatus> = view
        .holders(keys)
        .map(|(_, found, value)| HolderStatus {
            holder: holder_of(found, value),
            ttl_left_ms: None,
            session: None,
        })
        .collect();
    let queue: Vec<HolderStatus> = view
        .waiters(keys)
        .into_iter()
        .map(|(_, value): (u64, &Stored)| HolderStatus {
            holder: value.holder.clone(),
            ttl_left_ms: None,
            session: None,
        })
        .collect();
    LockStatus {
        name: name.to_string(),
        held: !holders.is_empty(),
        holders,
        waiters: Some(queue.len() as u64),
        queue,
        last_token: None,
        waiting_here: Vec::new(),
        location: None,
    }
}

fn free(name: &LockName) -> LockStatus {
    status_of(&Keys::new("-"), name, &View::default())
}

pub(super) async fn status(backend: &NatsBackend, name: &LockName) -> Result<LockStatus, Error> {
    let Some(conn) = backend.conn(false).await? else {
        return Ok(free(name));
    };
    let found = conn
        .read_within(&backend.keys.of_lock(name), READ_LIMIT)
        .await?;
    let mut views = views(&backend.keys, found);
    Ok(match views.remove(name.as_str()) {
        Some((_, view)) => status_of(&backend.keys, name, &view),
        None => free(name),
    })
}

pub(super) async fn list(backend: &NatsBackend) -> Result<Vec<LockStatus>, Error> {
    let Some(conn) = backend.conn(false).await? else {
        return Ok(Vec::new());
    };
    let found = conn.read_within(&backend.keys.all(), READ_LIMIT).await?;
    Ok(views(&backend.keys, found)
        .into_values()
        .map(|(name, view)| status_of(&backend.keys, &name, &view))
        .filter(|status| status.held)
        .collect())
}

/// Purge each holder's key at the revision read: its holder, watching its key, stops its
/// command. Waiters' keys are left alone (a killed waiter's key expires within its TTL).
pub(super) async fn force_release(
    backend: &NatsBackend,
    name: &LockName,
) -> Result<Vec<Holder>, Error> {
    let Some(conn) = backend.conn(false).await? else {
        return Ok(Vec::new());
    };
    let found = conn
        .read_within(&backend.keys.of_lock(name), READ_LIMIT)
        .await?;
    let mut views = views(&backend.keys, found);
    let Some((_, view)) = views.remove(name.as_str()) else {
        return Ok(Vec::new());
    };
    let mut removed = Vec::new();
    for (_, found, value) in view.holders(&backend.keys) {
        if conn
            .remove(&found.key, Some(found.revision), OP_TIMEOUT)
            .await?
            == Write::Conflict
        {
            // Renewed or released meanwhile: ours to break only as it is now.
            if let Some(now) = conn.last(&found.key, OP_TIMEOUT).await? {
                if now.live {
                    conn.remove(&found.key, Some(now.revision), OP_TIMEOUT)
                        .await?;
                }
            }
        }
        removed.push(holder_of(found, value));
    }
    Ok(removed)
}

/// Connect (creating the bucket if it is missing, as a run would), measure, and write and
/// remove a test key with a TTL.
pub(super) async fn check(backend: &NatsBackend) -> Result<CheckReport, Error> {
    let started = BootInstant::now();
    let Some(conn) = backend.conn(true).await? else {
        return Err(Error::Internal("the bucket was not created".into()));
    };
    let connect_time = BootInstant::now().saturating_since(started);
    let probe = backend
        .keys
        .probe(&uuid::Uuid::new_v4().simple().to_string());
    let median =
        median_round_trip(5, async || conn.last(&probe, OP_TIMEOUT).await.map(drop)).await?;
    let value = Stored {
        holder: Holder::default(),
        id: String::new(),
        arrival: 0,
    };
    match conn
        .create(&probe, 0, WAITER_TTL, &value, OP_TIMEOUT)
        .await?
    {
        Write::Done(_) => {}
        Write::Conflict => return Err(Error::Internal("the test key existed already".into())),
    }
    conn.remove(&probe, None, OP_TIMEOUT).await?;
    let info = conn.stream_info().await?;
    let mut warnings = Vec::new();
    let replicas = info.config.num_replicas;
    if replicas < 3 {
        warnings.push(format!(
            "the bucket has {replicas} replica{}: a lock lives on one server; ?replicas=3 \
             on a cluster outlives one",
            if replicas == 1 { "" } else { "s" }
        ));
    }
    let mut details = vec![
        ("bucket".to_owned(), backend.target.bucket.clone()),
        ("replicas".to_owned(), replicas.to_string()),
        (
            "connect".to_owned(),
            humantime::format_duration(Duration::from_micros(connect_time.as_micros() as u64))
                .to_string(),
        ),
        (
            "lease".to_owned(),
            "per-key TTLs (allow_msg_ttl), expiry markers on".to_owned(),
        ),
    ];
    if let Some(cluster) = info.cluster.as_ref() {
        if let Some(leader) = &cluster.leader {
            details.push(("leader".to_owned(), leader.clone()));
        }
    }
    Ok(CheckReport {
        backend: "nats".into(),
        location: conn.display.clone(),
        version: conn.version.clone(),
        round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
        warnings,
        details,
    })
}
