//! A lock's keys, as etcd's `concurrency` package lays them out (its `key.go`): the key
//! prefix `<prefix>/<encoded name>/`, one key per waiter or holder, named after its hold
//! lease, valued with the holder's [`Record`] (JSON); reading them back in queue order, and
//! the request options that the waiting protocol reads them with.

use std::time::Duration;

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};

use super::conn::Conn;
use crate::error::Error;
use crate::kit::limit;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{AcquireRequest, Holder, LockName, Record};

/// Bound for reading who is ahead, for the message once `--wait` is over.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);

/// What a key's value holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Value {
    #[serde(flatten)]
    record: Record,
    /// The key is on its waiter's lease: a place in the queue, not (yet) a hold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    waiting: bool,
}

/// Our key's value: the holder metadata, and whether it is a place in the queue only. A
/// value that is not a place in the queue is written at the grant, which `since` says.
pub(super) fn value_json(request: &AcquireRequest, waiting: bool) -> Result<String, Error> {
    let mut holder = request.holder.clone();
    if !waiting {
        holder.granted_now();
    }
    serde_json::to_string(&Value {
        record: Record {
            holder,
            limit: request.limit,
        },
        waiting,
    })
    .map_err(|e| Error::Internal(e.to_string()))
}

/// A holder's value rewritten during the hold (`Lease::finished`): its metadata as held.
pub(super) fn held_value_json(holder: &Holder, limit: u32) -> Result<String, Error> {
    serde_json::to_string(&Value {
        record: Record {
            holder: holder.clone(),
            limit,
        },
        waiting: false,
    })
    .map_err(|e| Error::Internal(e.to_string()))
}

/// Whether a key's value is a shared holder's or waiter's (a reader's): dlock's value with
/// `"mode": "shared"`. Every other key is a writer's, `etcdctl lock`'s (an empty value) too.
pub(super) fn is_reader(value: &[u8]) -> bool {
    serde_json::from_slice::<Value>(value).is_ok_and(|v| v.record.holder.mode.is_shared())
}

/// The keys of a lock, oldest first.
pub(super) struct Queue {
    pub(super) entries: Vec<Entry>,
}

/// One key of a lock.
pub(super) struct Entry {
    pub(super) key: Vec<u8>,
    pub(super) lease: i64,
    pub(super) holder: Holder,
    /// Among the first `--limit` keys and on its holder's lease (or foreign): a holder.
    pub(super) holds: bool,
}

/// The keys under `pfx` (the lock `name`'s prefix), oldest first.
pub(super) async fn read_queue(
    conn: &mut Conn,
    pfx: &str,
    name: &LockName,
) -> Result<Queue, Error> {
    let range = conn
        .call(OP_TIMEOUT, |mut c| {
            let pfx = pfx.to_owned();
            async move {
                c.get(
                    pfx,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                )
                .await
            }
        })
        .await?;
    let kvs = range.kvs();
    let limit = kvs
        .first()
        .and_then(|kv| serde_json::from_slice::<Value>(kv.value()).ok())
        .map_or(1, |v| v.record.limit.max(1)) as usize;
    // With `--limit 1`, the oldest key holds, and so does each reader's key with no
    // writer's before it: the readers at the head of the queue hold together.
    let mut writer_ahead = false;
    let entries = kvs
        .iter()
        .enumerate()
        .map(|(position, kv)| {
            let value = serde_json::from_slice::<Value>(kv.value()).ok();
            let waiting = value.as_ref().is_some_and(|v| v.waiting);
            let reader = value
                .as_ref()
                .is_some_and(|v| v.record.holder.mode.is_shared());
            let granted = if limit > 1 {
                position < limit
            } else {
                position == 0 || (reader && !writer_ahead)
            };
            writer_ahead |= !reader;
            let mut holder = value.map(|v| v.record.holder).unwrap_or_else(|| Holder {
                name: name.to_string(),
                command: "(foreign holder: etcdctl lock or another client)".into(),
                ..Holder::default()
            });
            holder.token = u64::try_from(kv.create_revision()).unwrap_or(0);
            Entry {
                key: kv.key().to_vec(),
                lease: kv.lease(),
                holder,
                // Among the first `limit` (or the readers at the head), a key still on its
                // waiter lease is a waiter between the grant and the re-attach, or one that
                // died there.
                holds: granted && !waiting,
            }
        })
        .collect();
    Ok(Queue { entries })
}

/// Why a waiter whose key is `own` (none: not queued) cannot have the lock, for a message:
/// "is held by pid N on host since T" or "is free, N waiting ahead". Bounded: it runs after
/// `--wait` is over.
pub(super) async fn why_busy(
    conn: &mut Conn,
    pfx: &str,
    name: &LockName,
    own: Option<&str>,
) -> String {
    let read = tokio::time::timeout(REPORT_TIMEOUT, read_queue(conn, pfx, name)).await;
    let Ok(Ok(queue)) = read else {
        return "is held".into();
    };
    queue.why_busy(own.map(str::as_bytes))
}

impl Queue {
    /// See [`why_busy`].
    fn why_busy(self, own: Option<&[u8]>) -> String {
        let ahead = self
            .entries
            .into_iter()
            .take_while(|e| Some(e.key.as_slice()) != own);
        let (holders, waiting): (Vec<Entry>, Vec<Entry>) = ahead.partition(|e| e.holds);
        // With no holder ahead, the first waiter is taking the lock right now, or it was
        // killed while it waited and its key goes with its waiter lease.
        crate::kit::held::busy_reason(
            holders.into_iter().map(|e| e.holder).collect(),
            waiting.len(),
        )
    }
}

/// The newest `n` keys under `pfx` created before `before` (all keys when `before` is None).
pub(super) fn older_keys(before: Option<i64>, n: usize) -> GetOptions {
    let mut options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(n as i64)
        .with_keys_only();
    if let Some(rev) = before {
        options = options.with_max_create_revision(rev - 1);
    }
    options
}

/// The oldest key under a prefix, with its value.
pub(super) fn oldest_key() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// A usage error when the oldest key says its holders use another `--limit` than ours.
pub(super) fn same_limit(oldest: &[KeyValue], request: &AcquireRequest) -> Result<(), Error> {
    let theirs = oldest
        .first()
        .and_then(|kv| serde_json::from_slice::<Value>(kv.value()).ok())
        .map(|v| v.record.limit);
    match theirs {
        Some(theirs) => limit::agrees(&request.name, request.limit, theirs),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value as dlock wrote it before the shared [`Record`]: it must read the same.
    #[derive(serde::Serialize)]
    struct EarlierValue {
        #[serde(flatten)]
        holder: Holder,
        limit: u32,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        waiting: bool,
    }

    #[test]
    fn values_are_written_and_read_as_before() {
        let holder = Holder {
            name: "deploy".into(),
            pid: 7,
            token: 3,
            ..Holder::default()
        };
        for waiting in [false, true] {
            let earlier = EarlierValue {
                holder: holder.clone(),
                limit: 2,
                waiting,
            };
            let value = Value {
                record: Record {
                    holder: holder.clone(),
                    limit: 2,
                },
                waiting,
            };
            let written = serde_json::to_string(&value).unwrap();
            assert_eq!(written, serde_json::to_string(&earlier).unwrap());
            let read: Value = serde_json::from_str(&written).unwrap();
            // The holder read back carries the record's limit, for `status`.
            let with_limit = Holder {
                limit: 2,
                ..holder.clone()
            };
            assert_eq!(read.record.holder, with_limit);
            assert_eq!((read.record.limit, read.waiting), (2, waiting));
        }
    }

    #[test]
    fn foreign_values_are_not_dlocks() {
        // `etcdctl lock` leaves its key's value empty.
        assert!(serde_json::from_slice::<Value>(b"").is_err());
        assert!(serde_json::from_slice::<Value>(b"{\"limit\": 1}").is_err());
        assert!(!is_reader(b""));
        assert!(!is_reader(b"{\"mode\": \"shared\"}"));
    }

    #[test]
    fn only_a_shared_dlock_value_is_a_readers() {
        let mut holder = Holder {
            name: "data".into(),
            pid: 7,
            ..Holder::default()
        };
        let written = |holder: &Holder| held_value_json(holder, 1).unwrap().into_bytes();
        assert!(!is_reader(&written(&holder)));
        holder.mode = crate::lock::Mode::Shared;
        let shared = written(&holder);
        assert!(String::from_utf8_lossy(&shared).contains("\"mode\":\"shared\""));
        assert!(is_reader(&shared));
    }
}
