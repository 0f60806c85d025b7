//! One connection to NATS and the bucket's stream: connecting (every server of the URL, the
//! credentials, TLS), finding or creating the bucket and refusing one that cannot give a
//! lease, and the few KV operations the backend is made of, each bounded in time:
//! a conditional write with a per-key TTL, a purge that expects a revision, the last entry of
//! a key, and a watch of a lock's keys.
//!
//! The bucket's stream is addressed directly (`$KV.BUCKET.KEY`, the KV conventions) rather
//! than through the client's KV calls: a renewal must carry the key's TTL, which the
//! client's `update` does not send.

use std::time::Duration;

use async_nats::header::{self, HeaderMap};
use async_nats::jetstream::{self, consumer, context, stream};
use bytes::Bytes;
use futures_util::TryStreamExt;

use std::sync::Arc;

use tokio::sync::OnceCell;

use super::keys::Stored;
use super::target::NatsTarget;
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::wording::Server;

mod open;
mod watch;

pub(super) use open::Unreached;
pub(super) use watch::{Watch, CLOSE_LIMIT};

/// How messages name the server.
pub(super) const SERVER: Server = Server {
    listening: "NATS server",
    name: "NATS",
    port: super::target::DEFAULT_PORT,
};

/// How long the server's marker of an expired key stays (the stream's
/// `subject_delete_marker_ttl` for a bucket dlock creates): long enough for every watcher to
/// see it, short enough that a bucket of many names does not keep them all.
pub(super) const MARKER_TTL: Duration = Duration::from_secs(60);

/// How long the marker of a key dlock removes stays: a watcher sees it as it is written, and
/// a watch opened later needs no marker of a key that is gone; every marker still there is
/// delivered to every new watch of the lock, so a thousand waiters' markers kept for a
/// minute would make each new waiter read a thousand entries.
const REMOVED_MARKER_TTL: Duration = Duration::from_secs(1);

/// A connection and the bucket's stream.
#[derive(Clone)]
pub(super) struct Conn {
    js: jetstream::Context,
    /// The bucket's stream, found (and checked, or created) at its first use: a run that takes
    /// a free lock in one write never asks for it. A write to a bucket that does not exist
    /// finds no stream, and one to a bucket without per-key TTLs is refused by the server.
    stream: Arc<OnceCell<stream::Stream>>,
    target: Arc<NatsTarget>,
    /// `$KV.BUCKET.`: what a key's subject starts with.
    subjects: String,
    pub(super) display: String,
    pub(super) version: String,
}

/// A conditional write's outcome.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Write {
    /// Written: the new revision.
    Done(u64),
    /// The key's revision was not the one expected (or it is live, for a create).
    Conflict,
}

/// The last entry of a key.
#[derive(Clone, Debug)]
pub(super) struct Found {
    pub(super) key: String,
    pub(super) revision: u64,
    /// A value, not a delete or purge marker (nor the server's marker of an expiry).
    pub(super) live: bool,
    pub(super) value: Option<Stored>,
}

/// A failed exchange (69), or the server refusing something for good.
pub(super) fn failed(display: &str, what: &str, err: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("{display}: {what} failed: {err}"))
}

impl Conn {
    /// Connect within `limit`, and find the bucket; create it (`create`) when it does not
    /// exist, else answer `None`.
    pub(super) async fn open(
        target: &NatsTarget,
        display: &str,
        create: bool,
        limit: Duration,
    ) -> Result<Option<Conn>, Unreached> {
        let connecting = async {
            let client = open::connect(target, display).await?;
            let version = client.server_info().version;
            open::check_version(display, &version)?;
            let mut js = jetstream::new(client);
            js.set_timeout(OP_TIMEOUT);
            let conn = Conn {
                js,
                stream: Arc::new(OnceCell::new()),
                target: Arc::new(target.clone()),
                subjects: format!("$KV.{}.", target.bucket),
                display: display.to_owned(),
                version,
            };
            // Without `create` the bucket must be there (else there is nothing to read).
            if !create && conn.found(false).await?.is_none() {
                return Ok(None);
            }
            Ok(Some(conn))
        };
        match tokio::time::timeout(limit, connecting).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Unreached::Again(crate::wording::no_answer_in(
                display, limit,
            ))),
        }
    }

    /// The bucket's stream, found and checked (or created, with `create`) at its first use;
    /// `None` when it does not exist and is not to be created.
    async fn found(&self, create: bool) -> Result<Option<&stream::Stream>, Error> {
        if let Some(stream) = self.stream.get() {
            return Ok(Some(stream));
        }
        let Some(stream) = open::bucket(&self.js, &self.target, &self.display, create).await?
        else {
            return Ok(None);
        };
        Ok(Some(self.stream.get_or_init(|| async { stream }).await))
    }

    /// The bucket's stream (created if it is missing), checked: what a waiter and `check`
    /// need before anything else.
    pub(super) async fn stream(&self) -> Result<&stream::Stream, Error> {
        match self.found(true).await? {
            Some(stream) => Ok(stream),
            None => Err(Error::Internal("the bucket was not created".into())),
        }
    }

    /// Publish `payload` to `key` with `headers`, within `limit`: the stream's revision, or
    /// a conflict when the expected revision was not the key's. A bucket that does not exist
    /// yet is created first (a write to it finds no stream).
    async fn publish(
        &self,
        key: &str,
        headers: HeaderMap,
        payload: Bytes,
        limit: Duration,
    ) -> Result<Write, Error> {
        let subject = format!("{}{key}", self.subjects);
        let once = |headers: HeaderMap, payload: Bytes| {
            let subject = subject.clone();
            async move {
                let ack = self
                    .js
                    .publish_with_headers(subject, headers, payload)
                    .await?;
                ack.await
            }
        };
        let exchange = async {
            match once(headers.clone(), payload.clone()).await {
                Err(e) if e.kind() == context::PublishErrorKind::StreamNotFound => {
                    if self.stream.get().is_some() {
                        return Ok(Err(e));
                    }
                    self.stream().await?;
                    Ok(once(headers, payload).await)
                }
                sent => Ok::<_, Error>(sent),
            }
        };
        match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(Ok(ack))) => Ok(Write::Done(ack.sequence)),
            Ok(Ok(Err(e))) if e.kind() == context::PublishErrorKind::WrongLastSequence => {
                Ok(Write::Conflict)
            }
            Ok(Ok(Err(e))) => {
                // A bucket without per-key TTLs refuses the write; it is named with the
                // setting when the bucket is read.
                if e.to_string().contains("TTL") {
                    self.stream().await?;
                }
                Err(failed(&self.display, "a write", e))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(crate::wording::no_answer_in(&self.display, limit)),
        }
    }

    /// Write `value` to `key` if its revision is `expected` (0: it has none), to expire
    /// `ttl` after the server stores it.
    pub(super) async fn write(
        &self,
        key: &str,
        expected: u64,
        ttl: Duration,
        value: &Stored,
        limit: Duration,
    ) -> Result<Write, Error> {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
        headers.insert(header::NATS_MESSAGE_TTL, ttl_header(ttl).as_str());
        self.publish(key, headers, value.to_bytes(), limit).await
    }

    /// Create `key` if it has no live value: at the revision `hint` (what a watch saw of it),
    /// else at the revision its last entry has (a marker, or none).
    pub(super) async fn create(
        &self,
        key: &str,
        hint: u64,
        ttl: Duration,
        value: &Stored,
        limit: Duration,
    ) -> Result<Write, Error> {
        if let Write::Done(revision) = self.write(key, hint, ttl, value, limit).await? {
            return Ok(Write::Done(revision));
        }
        let expected = match self.last(key, limit).await? {
            None => 0,
            Some(found) if !found.live => found.revision,
            Some(_) => return Ok(Write::Conflict),
        };
        if expected == hint {
            return Ok(Write::Conflict);
        }
        self.write(key, expected, ttl, value, limit).await
    }

    /// Remove `key` (a purge marker that expires by itself), if its revision is `expected`.
    pub(super) async fn remove(
        &self,
        key: &str,
        expected: Option<u64>,
        limit: Duration,
    ) -> Result<Write, Error> {
        let mut headers = HeaderMap::new();
        headers.insert("KV-Operation", "PURGE");
        headers.insert(header::NATS_ROLLUP, "sub");
        headers.insert(
            header::NATS_MESSAGE_TTL,
            ttl_header(REMOVED_MARKER_TTL).as_str(),
        );
        if let Some(expected) = expected {
            headers.insert(
                header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                expected.to_string().as_str(),
            );
        }
        self.publish(key, headers, Bytes::new(), limit).await
    }

    /// The last entry of `key` (`None`: it has none): one direct get, which any replica of
    /// the bucket answers, without reading the bucket's settings first.
    pub(super) async fn last(&self, key: &str, limit: Duration) -> Result<Option<Found>, Error> {
        let subject = format!(
            "$JS.API.DIRECT.GET.KV_{}.{}{key}",
            self.target.bucket, self.subjects
        );
        let client = self.js.client();
        let got = tokio::time::timeout(limit, client.request(subject.clone(), Bytes::new()));
        let message = match got.await {
            Ok(Ok(message)) => message,
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                // No bucket yet (or one without direct gets): it is read, or created, and
                // asked once more.
                self.stream().await?;
                let again = client.request(subject, Bytes::new());
                match tokio::time::timeout(limit, again).await {
                    Ok(Ok(message)) => message,
                    Ok(Err(e)) => return Err(failed(&self.display, "a read", e)),
                    Err(_) => return Err(crate::wording::no_answer_in(&self.display, limit)),
                }
            }
            Ok(Err(e)) => return Err(failed(&self.display, "a read", e)),
            Err(_) => return Err(crate::wording::no_answer_in(&self.display, limit)),
        };
        if message.status == Some(async_nats::StatusCode::NOT_FOUND) {
            return Ok(None);
        }
        let revision = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Sequence"))
            .and_then(|v| v.as_str().parse::<u64>().ok());
        let Some(revision) = revision else {
            let status = message.status.map(|s| s.to_string()).unwrap_or_default();
            return Err(failed(
                &self.display,
                "a read",
                format!("the server answered {status} without a revision"),
            ));
        };
        let live = is_live(message.headers.as_ref());
        Ok(Some(Found {
            key: key.to_owned(),
            revision,
            live,
            value: live.then(|| Stored::parse(&message.payload)).flatten(),
        }))
    }

    /// Watch the keys matching `filter`: the last entry of each, then every change.
    pub(super) async fn watch(&self, filter: &str, limit: Duration) -> Result<Watch, Error> {
        let config = consumer::push::OrderedConfig {
            deliver_subject: self.js.client().new_inbox(),
            filter_subject: format!("{}{filter}", self.subjects),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            replay_policy: consumer::ReplayPolicy::Instant,
            ..Default::default()
        };
        let opening = async {
            let consumer = self
                .stream()
                .await?
                .create_consumer(config)
                .await
                .map_err(|e| failed(&self.display, "a watch", e))?;
            let pending = consumer.cached_info().num_pending;
            let name = consumer.cached_info().name.clone();
            let messages = consumer
                .messages()
                .await
                .map_err(|e| failed(&self.display, "a watch", e))?;
            Ok::<_, Error>((pending, name, messages))
        };
        let (pending, name, messages) = match tokio::time::timeout(limit, opening).await {
            Ok(opened) => opened?,
            Err(_) => return Err(crate::wording::no_answer_in(&self.display, limit)),
        };
        Ok(Watch {
            messages,
            pending,
            subjects: self.subjects.clone(),
            display: self.display.clone(),
            stream: self.stream().await?.clone(),
            name,
        })
    }

    /// [`Conn::read`], tried again after a failure until `limit` is over: a cluster that just
    /// lost a server answers again once its groups have elected new leaders.
    pub(super) async fn read_within(
        &self,
        filter: &str,
        limit: Duration,
    ) -> Result<Vec<Found>, Error> {
        let end = crate::clock::BootInstant::now() + limit;
        let mut pauses =
            crate::kit::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            let left = end.remaining();
            match self.read(filter, left.min(OP_TIMEOUT)).await {
                Err(Error::Unavailable(why)) if end.remaining() > Duration::ZERO => {
                    tracing::debug!("reading the keys failed, reading again: {why}");
                    tokio::time::sleep(pauses.next_delay().min(end.remaining())).await;
                }
                read => return read,
            }
        }
    }

    /// The last entry of every key matching `filter`, live or not.
    pub(super) async fn read(&self, filter: &str, limit: Duration) -> Result<Vec<Found>, Error> {
        let reading = async {
            let mut watch = self.watch(filter, limit).await?;
            let mut found = Vec::new();
            while watch.pending > 0 {
                match watch.next().await {
                    Ok(entry) => found.push(entry),
                    Err(e) => {
                        watch.close().await;
                        return Err(e);
                    }
                }
            }
            watch.close().await;
            self.complete(filter, &mut found, limit).await?;
            Ok(found)
        };
        match tokio::time::timeout(limit, reading).await {
            Ok(read) => read,
            Err(_) => Err(crate::wording::no_answer_in(&self.display, limit)),
        }
    }

    /// Add to a watch's first delivery the keys it did not show: a key written again while the
    /// watch was delivering the others can be left out of it (its entry read at the watch's
    /// start is gone, and the new one counts as a change to come). The keys the stream has
    /// now are listed, and each one missing is read.
    pub(super) async fn complete(
        &self,
        filter: &str,
        found: &mut Vec<Found>,
        limit: Duration,
    ) -> Result<(), Error> {
        let seen: std::collections::HashSet<String> = found.iter().map(|f| f.key.clone()).collect();
        let listing = self
            .stream()
            .await?
            .info_with_subjects(format!("{}{filter}", self.subjects))
            .await
            .map_err(|e| failed(&self.display, "listing the keys", e))?;
        let subjects: Vec<(String, usize)> = listing
            .try_collect()
            .await
            .map_err(|e| failed(&self.display, "listing the keys", e))?;
        for (subject, _) in subjects {
            let Some(key) = subject.strip_prefix(&self.subjects) else {
                continue;
            };
            if !seen.contains(key) {
                if let Some(entry) = self.last(key, limit).await? {
                    found.push(entry);
                }
            }
        }
        Ok(())
    }

    /// The bucket's stream as the server describes it now: for `check`.
    pub(super) async fn stream_info(&self) -> Result<stream::Info, Error> {
        let mut stream = self.stream().await?.clone();
        match tokio::time::timeout(OP_TIMEOUT, stream.info()).await {
            Ok(Ok(info)) => Ok(info.clone()),
            Ok(Err(e)) => Err(failed(&self.display, "reading the bucket", e)),
            Err(_) => Err(crate::wording::no_answer_in(&self.display, OP_TIMEOUT)),
        }
    }
}

/// Whether an entry with `headers` is a value rather than a marker.
fn is_live(headers: Option<&HeaderMap>) -> bool {
    let Some(headers) = headers else { return true };
    if headers.get(header::NATS_MARKER_REASON).is_some() {
        return false;
    }
    !matches!(
        headers.get("KV-Operation").map(|v| v.as_str()),
        Some("DEL" | "PURGE")
    )
}

/// A TTL as the `Nats-TTL` header takes it: whole seconds, rounded up (a key that lives a
/// little longer than the holder counts on is safe; one that lives shorter is not).
fn ttl_header(ttl: Duration) -> String {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    format!("{}s", secs.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_header(Duration::from_secs(3)), "3s");
        assert_eq!(ttl_header(Duration::from_millis(2500)), "3s");
        assert_eq!(ttl_header(Duration::from_millis(10)), "1s");
    }
}
