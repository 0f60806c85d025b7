//! A watch of a lock's keys: an ordered consumer on the server, read entry by entry and
//! deleted when done.

use std::time::Duration;

use async_nats::jetstream::{consumer, stream};
use futures_util::StreamExt;

use super::{failed, is_live, Found};
use crate::backend::nats::keys::Stored;
use crate::error::Error;

/// The changes of a lock's keys, as a watch delivers them: an ordered consumer on the
/// server, which [`Watch::close`] deletes. One left behind (a killed dlock) is deleted by the
/// server after 30 s without a listener; until then it counts towards the stream's limit of
/// consumers (1000 by default since nats-server 2.15).
pub(in crate::backend::nats) struct Watch {
    pub(in crate::backend::nats) messages: consumer::push::Ordered,
    /// Entries of the first read still to come.
    pub(in crate::backend::nats) pending: u64,
    pub(in crate::backend::nats) subjects: String,
    pub(in crate::backend::nats) display: String,
    pub(in crate::backend::nats) stream: stream::Stream,
    /// The consumer's name on the server.
    pub(in crate::backend::nats) name: String,
}

/// How long deleting a watch's consumer may take.
pub(in crate::backend::nats) const CLOSE_LIMIT: Duration = Duration::from_secs(1);

impl Watch {
    /// Delete the watch's consumer (best effort, within [`CLOSE_LIMIT`]).
    pub(in crate::backend::nats) async fn close(self) {
        let Watch {
            messages,
            stream,
            name,
            ..
        } = self;
        drop(messages);
        let deleted = tokio::time::timeout(CLOSE_LIMIT, stream.delete_consumer(&name)).await;
        if !matches!(deleted, Ok(Ok(_))) {
            tracing::debug!("a watch's consumer {name} was not deleted; the server will");
        }
    }

    /// The next entry (cancel-safe).
    pub(in crate::backend::nats) async fn next(&mut self) -> Result<Found, Error> {
        loop {
            let message = match self.messages.next().await {
                Some(Ok(message)) => message,
                Some(Err(e)) => return Err(failed(&self.display, "a watch", e)),
                None => return Err(failed(&self.display, "a watch", "it ended")),
            };
            let Ok(info) = message.info() else { continue };
            let revision = info.stream_sequence;
            let pending = info.pending;
            let Some(key) = message.subject.as_str().strip_prefix(&self.subjects) else {
                continue;
            };
            let key = key.to_owned();
            if self.pending > 0 {
                self.pending = pending;
            }
            let live = is_live(message.headers.as_ref());
            return Ok(Found {
                key,
                revision,
                live,
                value: live.then(|| Stored::parse(&message.payload)).flatten(),
            });
        }
    }
}
