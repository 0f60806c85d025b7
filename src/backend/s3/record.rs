//! The lock object's body: the token counter, the `--limit` in use, a nonce that makes every
//! body (and so its ETag) unique, and the holders, each with the server time of its last
//! write; and the rule that judges a holder expired on the server's clock alone.
//!
//! ```json
//! {"v":1,"token":17,"limit":1,"nonce":"5f0c…","holders":[{"id":"…","renewed":null,
//!  "name":"deploy","host":"ci-7","pid":4242,"user":"ci","command":"make test",
//!  "since":"…","ttl_ms":30000,"token":17,"version":"…"}]}
//! ```
//!
//! `renewed` is the `Last-Modified` (Unix seconds) of the write that last created or renewed
//! the entry; `null` means that write is the one that produced the object as it is now, so
//! its stamp is the object's own `Last-Modified`. Whoever rewrites the object first fills in
//! every `null` with that `Last-Modified`, then writes its own entry as `null`.

use serde::{Deserialize, Serialize};

use crate::lock::{HolderStatus, Record};

/// The body's format version.
pub const VERSION: u32 = 1;

/// One holder of the lock.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    /// Random per acquisition: "is it still ours?".
    pub id: String,
    /// Server time (Unix seconds, `Last-Modified`) of its last write; `None`: the object's.
    pub renewed: Option<u64>,
    #[serde(flatten)]
    pub record: Record,
}

/// The lock object's body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Body {
    pub v: u32,
    /// The last fencing token handed out (kept by every write, release included).
    pub token: u64,
    /// The `--limit` of the holders (of the last ones, when free).
    pub limit: u32,
    /// Fresh for every write, so that no two bodies, and no two ETags, are alike.
    pub nonce: String,
    pub holders: Vec<Entry>,
}

/// The whole seconds the lease `ttl_ms` lasts at most, rounded up.
fn ttl_seconds(ttl_ms: u64) -> u64 {
    ttl_ms.div_ceil(1000)
}

impl Entry {
    /// The server time of the entry's last write, in the object last modified at `lm`.
    pub fn stamp(&self, lm: u64) -> u64 {
        self.renewed.unwrap_or(lm)
    }

    /// Whether the entry has expired by the server's clock: its holder sent its last write
    /// before the write happened, in `[stamp, stamp + 1)`, and stops its command within the
    /// TTL of that send; an answer dated `date` (floored too, and later than the write) with
    /// `date ≥ stamp + ttl + 1` was made more than a TTL after that send.
    pub fn expired(&self, lm: u64, date: u64) -> bool {
        // `date ≥ stamp + ttl + 1` in whole seconds.
        date > self.stamp(lm) + ttl_seconds(self.record.holder.ttl_ms)
    }

    /// The lease left by the server's clock, in milliseconds, for `status`.
    pub fn ttl_left_ms(&self, lm: u64, date: u64) -> u64 {
        let ends = self.stamp(lm) + ttl_seconds(self.record.holder.ttl_ms) + 1;
        ends.saturating_sub(date) * 1000
    }

    pub fn status(&self, lm: u64, date: u64) -> HolderStatus {
        HolderStatus {
            holder: self.record.holder.clone(),
            ttl_left_ms: Some(self.ttl_left_ms(lm, date)),
            session: None,
        }
    }
}

/// A new nonce.
pub fn nonce() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

impl Body {
    /// `None` for a body dlock did not write (or a later format).
    pub fn parse(bytes: &[u8]) -> Option<Body> {
        serde_json::from_slice::<Body>(bytes)
            .ok()
            .filter(|b| b.v == VERSION)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The holders that have not expired, in the object last modified at `lm`, as an answer
    /// dated `date` sees them.
    pub fn live(&self, lm: u64, date: u64) -> impl Iterator<Item = &Entry> {
        self.holders.iter().filter(move |e| !e.expired(lm, date))
    }

    /// Make the object read (last modified at `lm`, seen at `date`) ready to be rewritten:
    /// expired holders dropped, every other holder's stamp written out, a fresh nonce.
    /// Returns the holders dropped as expired.
    pub fn prepare(&mut self, lm: u64, date: u64) -> Vec<Entry> {
        let (expired, live): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut self.holders)
            .into_iter()
            .partition(|e| e.expired(lm, date));
        self.holders = live
            .into_iter()
            .map(|mut e| {
                e.renewed = Some(e.stamp(lm));
                e
            })
            .collect();
        self.nonce = nonce();
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Holder;

    fn entry(id: &str, renewed: Option<u64>, ttl_ms: u64) -> Entry {
        Entry {
            id: id.into(),
            renewed,
            record: Record {
                holder: Holder {
                    ttl_ms,
                    token: 3,
                    ..Holder::default()
                },
                limit: 1,
            },
        }
    }

    /// An entry expires a TTL and a second after its stamp, by the server's clock only.
    #[test]
    fn expiry_is_judged_on_the_servers_seconds() {
        let e = entry("a", None, 5000);
        assert!(!e.expired(100, 105));
        assert!(e.expired(100, 106));
        let e = entry("a", Some(90), 4500);
        assert!(!e.expired(100, 95));
        assert!(e.expired(100, 96));
        assert_eq!(entry("a", None, 5000).ttl_left_ms(100, 103), 3000);
    }

    /// A rewrite drops the expired holders, pins every other holder's stamp and makes the body
    /// new; the body round-trips.
    #[test]
    fn a_rewrite_pins_stamps_and_changes_the_nonce() {
        let mut body = Body {
            v: VERSION,
            token: 7,
            limit: 2,
            nonce: nonce(),
            holders: vec![entry("old", Some(10), 3000), entry("new", None, 3000)],
        };
        let before = body.to_bytes();
        let dropped = body.prepare(50, 52);
        assert_eq!(dropped.len(), 1);
        assert_eq!(body.holders.len(), 1);
        assert_eq!(body.holders[0].renewed, Some(50));
        assert_ne!(body.to_bytes(), before);
        let parsed = Body::parse(&body.to_bytes()).unwrap();
        assert_eq!(parsed.token, 7);
        assert!(parsed.holders.iter().any(|e| e.id == "new"));
        assert!(Body::parse(b"{}").is_none());
        assert!(Body::parse(b"not json").is_none());
    }
}
