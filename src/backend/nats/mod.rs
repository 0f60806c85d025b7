//! The NATS backend (`nats://host[:port][,host…][/bucket]`): a lock is keys in a JetStream
//! key-value bucket, each with a per-key TTL as its lease, and waiters line up in the order
//! of their keys' revisions, watching the lock's keys.
//!
//! - **A holder** is the key `P.NAME.h.I` (slot `I` of `--limit`), created only if it has no
//!   live value (a write that expects the key's last revision: none, or the marker a release
//!   or an expiry left), with the holder's record and a TTL of `--ttl` (`Nats-TTL`, whole
//!   seconds rounded up, counted by the server from when it stores the write: after our
//!   send). Two creates of one slot cannot both succeed: the stream checks the expected
//!   revision under its lock (under Raft on a replicated bucket), so at most `--limit`
//!   keys, one per slot, are live at once.
//! - **The lease**: the holder writes its key again at the revision it holds, with the TTL,
//!   every TTL/3 (`keeper`); the server keeps the key at least TTL past the write, so
//!   counting from the write's send on our monotonic clock is safe (the keeper's rule stops
//!   the command before the key can expire). A write that finds another revision means the
//!   key expired and was taken or was removed by `release --force`: the hold is gone (a lost
//!   answer of our own write is told apart by the acquisition's id in the value).
//! - **The token** is the revision of the slot's creation: the stream's sequence number,
//!   which only grows while the stream exists, across releases, expiries, purges and
//!   restarts of the server with its store. A bucket dlock creates starts its sequence at
//!   the clock in µs (`first_seq`), so a bucket deleted and created again by dlock gives
//!   tokens above the old ones (as long as the old bucket had taken fewer writes than
//!   microseconds passed, and the clock does not step back); one created by hand starts at 1.
//! - **Waiting** (`queue.rs`): a waiter's key with a 2 s TTL rewritten while it waits, a
//!   watch of the lock's keys, and a create when fewer waiters are ahead than slots are free:
//!   FIFO among the waiters, a dead waiter gone within 2 s.
//! - **Release** purges the key at the held revision (a marker that expires after a second:
//!   live watchers see it as it is written), so a release never removes a key that became
//!   someone else's.
//! - **A bucket** that does not exist is created with history 1, per-key TTLs
//!   (`allow_msg_ttl`), markers of expired keys (`subject_delete_marker_ttl`) and
//!   `?replicas=N`; an existing one without those is refused (78), as is a server older than
//!   2.11 (no per-key TTLs). The bucket is read when it is first needed (a waiter's watch,
//!   `check`): a run that takes a free lock in one write does not ask for it, and a server
//!   refuses a key with a TTL in a bucket without per-key TTLs all the same.
//!
//! The parts: `target.rs` (the URL), `conn.rs` (connecting, the bucket, each KV exchange),
//! `keys.rs` (key names and values), `queue.rs` (taking a lock), `lease.rs`, `admin.rs`.

mod admin;
mod conn;
mod keys;
pub mod kind;
mod lease;
mod queue;
pub mod target;

use std::time::Duration;

use tokio::sync::Mutex;

use crate::error::Error;
use crate::kit::backoff::Backoff;
use crate::kit::timeouts::{CONNECT_TIMEOUT, OP_TIMEOUT};
use crate::lock::{AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus};

use conn::{Conn, Unreached};
use keys::Keys;

pub use lease::NatsLease;
pub use target::NatsTarget;

pub struct NatsBackend {
    target: NatsTarget,
    keys: Keys,
    display: String,
    /// The connection once made (with a bucket that exists).
    conn: Mutex<Option<Conn>>,
}

impl NatsBackend {
    pub fn new(target: &NatsTarget, prefix: &str, display: &str) -> NatsBackend {
        NatsBackend {
            target: target.clone(),
            keys: Keys::new(prefix),
            display: display.to_owned(),
            conn: Mutex::new(None),
        }
    }

    /// The connection, made within `limit`; `None` when the bucket does not exist and is
    /// not to be created.
    async fn conn_within(&self, create: bool, limit: Duration) -> Result<Option<Conn>, Unreached> {
        let mut cached = self.conn.lock().await;
        if let Some(conn) = cached.as_ref() {
            return Ok(Some(conn.clone()));
        }
        let conn = Conn::open(&self.target, &self.display, create, limit).await?;
        cached.clone_from(&conn);
        Ok(conn)
    }

    async fn conn(&self, create: bool) -> Result<Option<Conn>, Error> {
        self.conn_within(create, CONNECT_TIMEOUT + OP_TIMEOUT)
            .await
            .map_err(Unreached::into_error)
    }

    /// The connection of an acquisition: a server that cannot be reached is tried again
    /// until the server's time to answer (`--wait`, at least `MIN_ANSWER`) is over.
    async fn conn_for(&self, request: &AcquireRequest) -> Result<Conn, Error> {
        let budget = request
            .budget
            .answering_within(CONNECT_TIMEOUT + OP_TIMEOUT);
        let mut pauses = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            let limit = budget.call_limit(CONNECT_TIMEOUT + OP_TIMEOUT);
            match self.conn_within(true, limit).await {
                Ok(Some(conn)) => return Ok(conn),
                Ok(None) => return Err(Error::Internal("the bucket was not created".into())),
                Err(Unreached::Again(e)) if !budget.answer_is_over() => {
                    tracing::debug!("connecting failed, trying again: {e}");
                    let pause = budget
                        .answer_by()
                        .map_or(Duration::ZERO, |by| by.remaining())
                        .min(pauses.next_delay());
                    if pause.is_zero() {
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                }
                Err(unreached) => return Err(unreached.into_error()),
            }
        }
    }
}

impl Backend for NatsBackend {
    type Lease = NatsLease;

    /// The exchange in flight at the end of the wait, and a grant's confirmation before
    /// the command starts ([`crate::keeper::confirm_bound`]).
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        queue::WAIT_GRACE + crate::keeper::confirm_bound(request.ttl)
    }

    async fn acquire(&self, request: &AcquireRequest, cancel: Cancel) -> Result<NatsLease, Error> {
        let conn = self.conn_for(request).await?;
        queue::Acquisition {
            conn: &conn,
            keys: &self.keys,
            request,
            id: uuid::Uuid::new_v4().simple().to_string(),
        }
        .run(cancel)
        .await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        admin::status(self, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        admin::list(self).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        admin::force_release(self, name).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        admin::check(self).await
    }
}
