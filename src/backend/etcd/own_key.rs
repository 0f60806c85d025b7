//! The holder's watch on its own key. The lease keeper notices a lease that expires, but not
//! a key deleted while its lease lives (`etcdctl del`), and a revoked lease only at the next
//! keep-alive: without this watch the command would run on while another holder has the lock.

use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchFilterType, WatchOptions, WatchStream};

use super::conn::Conn;
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;

/// Our key, watched for its deletion while the command runs.
pub(super) struct OwnKey {
    /// Our key; its deletion ends the lock at once.
    key: String,
    /// A watch that covers our key; `None` until (re)opened.
    stream: Option<WatchStream>,
    /// Our key existed at this revision; events up to it are accounted for.
    seen: i64,
    /// Our key's create revision (the fencing token).
    created: i64,
    /// Failed attempts to watch in a row, for the back-off; a stream that broke counts too.
    failures: u32,
    /// When to try again after a failure.
    retry_at: Option<BootInstant>,
}

impl OwnKey {
    /// `key`, created at revision `created` and known to exist at `seen`; `stream`, if
    /// waiting left one open that covers it.
    pub(super) fn new(key: String, stream: Option<WatchStream>, seen: i64, created: i64) -> OwnKey {
        OwnKey {
            key,
            stream,
            seen,
            created,
            failures: 0,
            retry_at: None,
        }
    }

    /// Wait until our key is deleted; returns why. Cancel-safe: the supervisor polls this
    /// afresh on every turn of its loop, and all state lives in `self`.
    pub(super) async fn deleted(&mut self, conn: &mut Conn) -> String {
        let gone = {
            let key = &self.key;
            format!("our etcd key {key} was deleted (by `etcdctl del`, or its lease was revoked)")
        };
        loop {
            let Some(stream) = self.stream.as_mut() else {
                if !self.reopen(conn).await {
                    return gone;
                }
                continue;
            };
            let response = match stream.message().await {
                Ok(Some(response)) if !response.canceled() => response,
                Ok(Some(response)) => {
                    let reason = response.cancel_reason().to_owned();
                    self.failed(&format!("etcd ended the watch on our key ({reason})"));
                    continue;
                }
                Ok(None) => {
                    self.failed("the watch on our etcd key ended");
                    continue;
                }
                Err(e) => {
                    self.failed(&format!("the watch on our etcd key broke: {e}"));
                    continue;
                }
            };
            if response.created() {
                // A watch that works again: the back-off starts over next time.
                self.failures = self.failures.min(1);
            }
            let deleted = response.events().iter().any(|event| {
                event.event_type() == EventType::Delete
                    && event.kv().is_some_and(|kv| {
                        kv.key() == self.key.as_bytes() && kv.mod_revision() > self.seen
                    })
            });
            if deleted {
                return gone;
            }
        }
    }

    /// Open the watch again, after the back-off if it failed before. False when our key
    /// turned out to be gone meanwhile.
    async fn reopen(&mut self, conn: &mut Conn) -> bool {
        let key = self.key.clone();
        let key = key.as_str();
        if let Some(at) = self.retry_at {
            sleep_until(at).await;
        }
        if self.failures > 0 {
            // Watch from now on, not from `seen`: etcd would replay every revision since, of
            // the whole cluster, and history may be compacted. So first make sure the key is
            // still ours.
            match key_revision(conn, key).await {
                Ok((Some(created), at)) if created == self.created => self.seen = at,
                Ok(_) => return false,
                Err(e) => {
                    self.failed(&format!("cannot read our etcd key: {e}"));
                    return true;
                }
            }
        }
        let options = WatchOptions::new()
            .with_start_revision(self.seen + 1)
            .with_filters([WatchFilterType::NoPut]);
        let open = conn.call(OP_TIMEOUT, |mut c| {
            let options = options.clone();
            async move { c.watch(key, Some(options)).await }
        });
        match open.await {
            Ok(stream) => {
                self.stream = Some(stream);
                self.retry_at = None;
            }
            Err(e) => self.failed(&format!("cannot watch our etcd key: {e}")),
        }
        true
    }

    /// Note a failure: drop the stream, wait 1 s, doubling up to 30 s while failures go on.
    /// The keeper still stops the command if the lease itself cannot be kept.
    fn failed(&mut self, what: &str) {
        self.stream = None;
        self.failures = self.failures.saturating_add(1);
        let delay = Duration::from_secs(1 << self.failures.min(6).saturating_sub(1))
            .min(Duration::from_secs(30));
        if self.failures == 3 {
            tracing::warn!(
                "{what}; a deletion of our key may go unnoticed until the watch works again"
            );
        } else {
            tracing::debug!("{what}");
        }
        self.retry_at = Some(BootInstant::now() + delay);
    }
}

/// Our key's create revision (None when it does not exist) and the revision read at.
async fn key_revision(conn: &mut Conn, key: &str) -> Result<(Option<i64>, i64), Error> {
    let response = conn
        .call(OP_TIMEOUT, |mut c| async move {
            c.get(key, Some(GetOptions::new().with_keys_only())).await
        })
        .await?;
    let at = response.header().map_or(0, |h| h.revision());
    Ok((response.kvs().first().map(|kv| kv.create_revision()), at))
}
