//! The commands besides `run`: `status` and `list` (holders, and waiters in queue order),
//! `release --force` (deleting the holders' nodes), and `check` (round trips, a test node, the
//! negotiated session timeout, the server's version).

use std::time::Duration;

use zookeeper_client::{self as zk, Client, CreateMode};

use super::conn::{server_info, timed};
use super::nodes::{name_of_component, Entry};
use super::ZkBackend;
use crate::error::Error;
use crate::kit::held::list_held;
use crate::kit::round_trip::median_round_trip;
use crate::lock::{CheckReport, Holder, LockName, LockStatus};

impl ZkBackend {
    /// Holders and waiters of a lock.
    pub(super) async fn status_with(
        &self,
        client: &Client,
        name: &LockName,
    ) -> Result<LockStatus, Error> {
        let (holders, queue): (Vec<Entry>, Vec<Entry>) = self
            .read_queue(client, name)
            .await?
            .into_iter()
            .partition(|e| e.holds);
        Ok(LockStatus {
            name: name.to_string(),
            held: !holders.is_empty(),
            waiters: Some(queue.len() as u64),
            queue: queue.into_iter().map(|e| e.status).collect(),
            holders: holders.into_iter().map(|e| e.status).collect(),
            last_token: None,
            waiting_here: Vec::new(),
            location: None,
        })
    }

    /// Round trips, a test node and the session `check` reports.
    pub(super) async fn check_with(
        &self,
        client: &Client,
        root: &str,
        connect_time: Duration,
    ) -> Result<CheckReport, Error> {
        let median = median_round_trip(5, async || {
            timed(client.check_stat("/"))
                .await
                .map(drop)
                .map_err(|e| self.classify(&e, "reading /"))
        })
        .await?;
        self.probe(client, root).await?;
        let granted = client.session_timeout();
        let warnings = self.check_warnings(granted);
        let (version, mode) = server_info(&self.target.endpoints).await;
        Ok(CheckReport {
            backend: "zk".into(),
            location: self.display.clone(),
            version,
            round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
            warnings,
            details: self.check_details(client, mode, granted, connect_time),
        })
    }

    /// Create and delete a test node under the prefix (`!` never starts a lock's component).
    async fn probe(&self, client: &Client, root: &str) -> Result<(), Error> {
        let acls = self.acls();
        self.make_parents(client, root).await?;
        let probe = format!("{root}/!check-{}", uuid::Uuid::new_v4());
        let probe_options = CreateMode::Ephemeral.with_acls(acls);
        timed(client.create(&probe, b"check", &probe_options))
            .await
            .map_err(|e| self.classify(&e, &format!("creating {probe}")))?;
        timed(client.delete(&probe, None))
            .await
            .map_err(|e| self.classify(&e, &format!("deleting {probe}")))?;
        Ok(())
    }

    /// An even-sized ensemble, and a session timeout other than `--ttl`.
    fn check_warnings(&self, granted: Duration) -> Vec<String> {
        let mut warnings = Vec::new();
        let members = self.target.endpoints.len();
        if members > 1 && members.is_multiple_of(2) {
            warnings.push(format!(
                "the URL names {members} servers; an odd-sized ensemble tolerates the same failures with fewer"
            ));
        }
        if granted != self.ttl {
            warnings.push(format!(
                "the server negotiated a {} session timeout for --ttl {}; dlock run would use {}",
                humantime::format_duration(granted),
                humantime::format_duration(self.ttl),
                humantime::format_duration(granted)
            ));
        }
        warnings
    }

    /// The `key: value` lines of `check`.
    fn check_details(
        &self,
        client: &Client,
        mode: String,
        granted: Duration,
        connect_time: Duration,
    ) -> Vec<(String, String)> {
        vec![
            ("mode".into(), mode),
            (
                "members".into(),
                self.target
                    .endpoints
                    .iter()
                    .map(|(h, p)| format!("{h}:{p}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            (
                "chroot".into(),
                self.target.chroot.clone().unwrap_or_else(|| "/".into()),
            ),
            (
                "auth".into(),
                self.target
                    .user
                    .as_ref()
                    .map_or_else(|| "none".into(), |u| format!("digest user {u}")),
            ),
            (
                "session".into(),
                format!(
                    "{:x}, timeout {} (requested {})",
                    client.session_id().0,
                    humantime::format_duration(granted),
                    humantime::format_duration(self.ttl)
                ),
            ),
            (
                "connect".into(),
                humantime::format_duration(Duration::from_micros(
                    u64::try_from(connect_time.as_micros()).unwrap_or(u64::MAX),
                ))
                .to_string(),
            ),
        ]
    }

    /// The held locks under `root`.
    pub(super) async fn list_with(
        &self,
        client: &Client,
        root: &str,
    ) -> Result<Vec<LockStatus>, Error> {
        let children = match timed(client.list_children(root)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(self.classify(&e, &format!("listing {root}"))),
        };
        let names: Vec<LockName> = children
            .iter()
            .filter_map(|c| name_of_component(c))
            .collect();
        list_held(names, async |name: &LockName| {
            self.status_with(client, name).await
        })
        .await
    }

    /// Delete the holders' nodes of `name` (in `dir`); waiters' nodes are left alone.
    pub(super) async fn force_release_with(
        &self,
        client: &Client,
        name: &LockName,
        dir: &str,
    ) -> Result<Vec<Holder>, Error> {
        let entries = self.read_queue(client, name).await?;
        let (holders, waiting): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| e.holds);
        if holders.is_empty() && !waiting.is_empty() {
            tracing::warn!(
                "'{name}' has no holder, but {} waiting; waiters' nodes are left alone (a \
                 killed waiter's node goes when its session expires)",
                waiting.len()
            );
        }
        for entry in &holders {
            let path = format!("{dir}/{}", entry.child);
            match timed(client.delete(&path, None)).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.classify(&e, &format!("deleting {path}"))),
            }
        }
        Ok(holders.into_iter().map(|e| e.status.holder).collect())
    }
}
