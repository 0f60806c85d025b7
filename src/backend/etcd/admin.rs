//! The commands around the lock, like `etcdctl lock`'s neighbours: `status`, `list`,
//! `release --force` and `check`.

use std::time::Duration;

use etcd_client::{GetOptions, PutOptions};

use super::conn::Conn;
use super::key::{read_queue, Entry};
use super::lease::WAITER_TTL_S;
use super::EtcdBackend;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::held::list_held;
use crate::kit::round_trip::median_round_trip;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{decode_component, CheckReport, Holder, HolderStatus, LockName, LockStatus};

/// Holders and waiters of a lock.
pub(super) async fn status(
    backend: &EtcdBackend,
    conn: &mut Conn,
    name: &LockName,
) -> Result<LockStatus, Error> {
    let queue = read_queue(conn, &backend.lock_prefix(name), name).await?;
    let mut holders = Vec::new();
    let mut waiting = Vec::new();
    for entry in queue.entries {
        if !entry.holds {
            waiting.push(HolderStatus {
                holder: entry.holder,
                ttl_left_ms: None,
                session: None,
            });
            continue;
        }
        let lease = entry.lease;
        let ttl_left_ms = if lease == 0 {
            None
        } else {
            conn.call(OP_TIMEOUT, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await
            .ok()
            .and_then(|r| u64::try_from(r.ttl()).ok())
            .map(|s| s * 1000)
        };
        holders.push(HolderStatus {
            holder: entry.holder,
            ttl_left_ms,
            session: None,
        });
    }
    Ok(LockStatus {
        name: name.to_string(),
        held: !holders.is_empty(),
        waiters: Some(waiting.len() as u64),
        queue: waiting,
        holders,
        last_token: None,
        waiting_here: Vec::new(),
        location: None,
    })
}

/// Every held lock under the namespace.
pub(super) async fn list(backend: &EtcdBackend) -> Result<Vec<LockStatus>, Error> {
    let mut conn = backend.conn()?;
    let root = format!("{}/", backend.prefix);
    let range = conn
        .call(OP_TIMEOUT, |mut c| {
            let root = root.clone();
            async move {
                c.get(root, Some(GetOptions::new().with_prefix().with_keys_only()))
                    .await
            }
        })
        .await?;
    let mut names: Vec<LockName> = Vec::new();
    for kv in range.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        let Some(component) = key
            .strip_prefix(&root)
            .and_then(|rest| rest.split_once('/'))
            .map(|(c, _)| c)
        else {
            continue;
        };
        let Some(name) = decode_component(component).and_then(|n| LockName::new(&n).ok()) else {
            continue;
        };
        // Only canonical encodings are dlock's (etcdctl could have used any prefix).
        if name.encoded() == component {
            names.push(name);
        }
    }
    list_held(names, async |name| status(backend, &mut conn, name).await).await
}

/// Break the holds on `name`: revoke each holder's lease (a foreign key without one is
/// deleted). Returns the holders.
pub(super) async fn force_release(
    backend: &EtcdBackend,
    name: &LockName,
) -> Result<Vec<Holder>, Error> {
    let mut conn = backend.conn()?;
    let queue = read_queue(&mut conn, &backend.lock_prefix(name), name).await?;
    let (holders, waiting): (Vec<Entry>, Vec<Entry>) =
        queue.entries.into_iter().partition(|e| e.holds);
    if holders.is_empty() && !waiting.is_empty() {
        // Removing a waiter's key would only cost a live waiter its place: a killed
        // waiter's key goes with its waiter lease within seconds anyway.
        tracing::warn!(
            "'{name}' has no holder, but {} waiting; waiters' keys are left alone (a killed \
             waiter's key expires with its {WAITER_TTL_S}s waiter lease)",
            waiting.len()
        );
    }
    for entry in &holders {
        let lease = entry.lease;
        if lease != 0 {
            // Revoke, not delete: the holder then finds its lease gone at its next renewal.
            conn.revoke(lease, OP_TIMEOUT).await?;
        } else {
            conn.call(OP_TIMEOUT, |mut c| {
                let key = entry.key.clone();
                async move { c.delete(key, None).await }
            })
            .await?;
        }
    }
    Ok(holders.into_iter().map(|e| e.holder).collect())
}

/// Connect, measure, and create and delete a test entry under the prefix.
pub(super) async fn check(backend: &EtcdBackend) -> Result<CheckReport, Error> {
    let mut conn = backend.conn()?;
    let started = BootInstant::now();
    let server = conn
        .call(OP_TIMEOUT, |mut c| async move { c.status().await })
        .await?;
    let connect_time = BootInstant::now().saturating_since(started);
    let members = conn
        .call(OP_TIMEOUT, |mut c| async move { c.member_list().await })
        .await?;
    let probe_root = format!("{}/!check", backend.prefix);
    let median = median_round_trip(5, async || {
        conn.call(OP_TIMEOUT, |mut c| {
            let key = probe_root.clone();
            async move { c.get(key, Some(GetOptions::new().with_count_only())).await }
        })
        .await
        .map(drop)
    })
    .await?;
    // Create and delete a test entry under the prefix (`!` never occurs in a lock's name).
    let grant = conn
        .call(
            OP_TIMEOUT,
            |mut c| async move { c.lease_grant(2, None).await },
        )
        .await?;
    let id = grant.id();
    let key = format!("{probe_root}/{id:x}");
    conn.call(OP_TIMEOUT, |mut c| {
        let key = key.clone();
        async move {
            c.put(key, "check", Some(PutOptions::new().with_lease(id)))
                .await
        }
    })
    .await?;
    conn.call(OP_TIMEOUT, |mut c| async move { c.lease_revoke(id).await })
        .await?;
    let mut warnings = Vec::new();
    let count = members.members().len();
    if count % 2 == 0 {
        warnings.push(format!(
            "the cluster has {count} members; an odd number tolerates the same failures with fewer"
        ));
    }
    let names: Vec<String> = members
        .members()
        .iter()
        .map(|m| format!("{} {}", m.name(), m.client_urls().join(",")))
        .collect();
    Ok(CheckReport {
        backend: "etcd".into(),
        location: backend.display.clone(),
        version: server.version().to_owned(),
        round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
        warnings,
        details: vec![
            ("members".into(), names.join("; ")),
            ("leader".into(), format!("{:x}", server.leader())),
            (
                "connect".into(),
                humantime::format_duration(Duration::from_micros(connect_time.as_micros() as u64))
                    .to_string(),
            ),
            (
                "lease".into(),
                format!("a 2s test lease was granted {}s", grant.ttl()),
            ),
        ],
    })
}
