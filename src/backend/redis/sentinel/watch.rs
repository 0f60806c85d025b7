//! Following `+switch-master`: while a lock is held, a task subscribes to the event on one
//! sentinel (the next one when that connection ends: the URL's, then those found through
//! them), and when the sentinels switch the master it looks at once whether the new master
//! has the hold, instead of at the next renewal (up to TTL/3 later). A hold the failover lost is reported lost there and then (124); one it
//! carried over is left to the next renewal, which moves to the new master.
//!
//! The subscription is made [`FIRST_LOOK`] after the grant, not at once: most held commands
//! are short, and a sentinel connection opened beside the command's own start costs every
//! run a connection and CPU on the host for nothing. A failover is not missed meanwhile: the
//! renewals ask the sentinels anyway, and a `+switch-master` sent before any subscription
//! exists would be missed at any delay.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::lock::Lost;

use super::super::conn::Conn;
use super::super::topology::{Addr, Locator, Sentinel, ASK_TIMEOUT};

/// How long to wait for the new master to answer `ROLE` with `master`.
const PROMOTION_PATIENCE: Duration = Duration::from_secs(2);
/// How long after the grant the subscription is made.
const FIRST_LOOK: Duration = Duration::from_millis(300);

/// The `+switch-master` follower of one held lock; dropping it stops the task.
pub(in crate::backend::redis) struct SwitchWatch {
    lost: watch::Receiver<Option<Lost>>,
    task: JoinHandle<()>,
}

impl SwitchWatch {
    /// Start following failovers for the hold of `owner` in `owners` (the lock's `B:owners`;
    /// `None` unless `conn` is behind Sentinel).
    pub(in crate::backend::redis) fn start(
        conn: &Conn,
        owners: &str,
        owner: &str,
    ) -> Option<SwitchWatch> {
        let locator = conn.sentinel.as_ref()?.detached();
        let (tx, lost) = watch::channel(None);
        let task = tokio::spawn(follow(locator, owners.to_owned(), owner.to_owned(), tx));
        Some(SwitchWatch { lost, task })
    }

    /// Resolves when a failover is seen to have lost the hold; never otherwise. Cancel-safe.
    pub(in crate::backend::redis) async fn lost(&mut self) -> Lost {
        if let Ok(lost) = self.lost.wait_for(Option::is_some).await {
            if let Some(lost) = lost.clone() {
                return lost;
            }
        }
        // The task ended without a loss: the renewals decide.
        std::future::pending().await
    }
}

impl Drop for SwitchWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn follow(
    locator: Locator,
    owners: String,
    owner: String,
    lost: watch::Sender<Option<Lost>>,
) {
    let sentinels: Arc<[Sentinel]> = locator.sentinels.clone();
    tokio::time::sleep(FIRST_LOOK).await;
    // For as long as the lock is held (the task is aborted at release): one sentinel after the
    // other, a pause after each full round that found none to subscribe to.
    loop {
        let found = locator.found.lock().map(|f| f.clone()).unwrap_or_default();
        for sentinel in sentinels.iter().chain(found.iter()) {
            let Some(new_master) = next_switch(sentinel, &locator.master).await else {
                continue;
            };
            if let Some(reason) = check(&locator, &new_master, &owners, &owner).await {
                lost.send_replace(Some(Lost::gone(reason)));
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Subscribe on `sentinel` and wait for the next `+switch-master` of `master`: the new
/// master's address (`None` when the subscription could not be made or ended).
async fn next_switch(sentinel: &Sentinel, master: &str) -> Option<Addr> {
    let mut pubsub = tokio::time::timeout(ASK_TIMEOUT, sentinel.client.get_async_pubsub())
        .await
        .ok()?
        .ok()?;
    tokio::time::timeout(ASK_TIMEOUT, pubsub.subscribe("+switch-master"))
        .await
        .ok()?
        .ok()?;
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        // "<name> <old ip> <old port> <new ip> <new port>"
        let Ok(payload) = message.get_payload::<String>() else {
            continue;
        };
        let parts: Vec<&str> = payload.split(' ').collect();
        if let [name, _, _, ip, port] = parts[..] {
            if name == master {
                if let Ok(port) = port.parse::<u16>() {
                    return Some((ip.to_owned(), port));
                }
            }
        }
    }
    None
}

/// Does the new master have our hold? `Some(reason)` when it plainly does not; `None` when it
/// does, or when that cannot be told now (the next renewal looks again).
async fn check(locator: &Locator, addr: &Addr, owners: &str, owner: &str) -> Option<String> {
    let shown = crate::kit::url::join_host_port(&addr.0, addr.1);
    // The sentinels announce the switch when the replica reports itself master; allow a
    // moment in case this one is ahead of it. Bounded: a few attempts within the patience.
    let deadline = tokio::time::Instant::now() + PROMOTION_PATIENCE;
    let mut connection = loop {
        match locator.connect_to(addr).await {
            Ok((_, connection)) => break connection,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                tracing::debug!("after +switch-master, {shown}: {e}");
                return None;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let member = tokio::time::timeout(
        ASK_TIMEOUT,
        redis::cmd("ZSCORE")
            .arg(owners)
            .arg(owner)
            .query_async::<Option<String>>(&mut connection),
    )
    .await;
    match member {
        Ok(Ok(None)) => Some(format!(
            "the sentinels failed '{}' over to {shown}, which does not have this hold \
             (replication had not carried it over before the failover; ?replicas=N prevents that)",
            locator.master
        )),
        _ => None,
    }
}
