//! A page of ListObjectsV2 as dlock reads it: each object's key and `LastModified`, the
//! common prefixes, the continuation token, and the answer's `Date`.

use super::unix_seconds;
use crate::kit::xml::{elements, unescape};

/// One page of a listing.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// Each object's key and `LastModified` (Unix seconds).
    pub objects: Vec<(String, u64)>,
    /// The common prefixes (with a delimiter).
    pub prefixes: Vec<String>,
    pub next: Option<String>,
    /// The answer's `Date`.
    pub date: u64,
    /// The answer's `Server` header.
    pub server: Option<String>,
}

impl Listing {
    pub(super) fn parse(xml: &str, date: u64) -> Listing {
        let mut listing = Listing {
            date,
            ..Listing::default()
        };
        for contents in elements(xml, "Contents") {
            let key = elements(contents, "Key").next().map(unescape);
            let modified = elements(contents, "LastModified")
                .next()
                .and_then(|t| humantime::parse_rfc3339_weak(t.trim()).ok())
                .map_or(0, unix_seconds);
            if let Some(key) = key {
                listing.objects.push((key, modified));
            }
        }
        for common in elements(xml, "CommonPrefixes") {
            if let Some(prefix) = elements(common, "Prefix").next() {
                listing.prefixes.push(unescape(prefix));
            }
        }
        let truncated = elements(xml, "IsTruncated").next() == Some("true");
        listing.next = elements(xml, "NextContinuationToken")
            .next()
            .filter(|_| truncated)
            .map(unescape);
        listing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_are_read() {
        let xml = "<ListBucketResult><IsTruncated>true</IsTruncated>\
            <Contents><Key>p/a%2Fb</Key><LastModified>2024-05-01T10:00:05.000Z</LastModified></Contents>\
            <Contents><Key>p/x&amp;y</Key><LastModified>2024-05-01T10:00:06Z</LastModified></Contents>\
            <CommonPrefixes><Prefix>p/a/</Prefix></CommonPrefixes>\
            <NextContinuationToken>t0k</NextContinuationToken></ListBucketResult>";
        let l = Listing::parse(xml, 7);
        assert_eq!(l.objects.len(), 2);
        assert_eq!(l.objects[0].0, "p/a%2Fb");
        assert_eq!(l.objects[1], ("p/x&y".to_owned(), 1_714_557_606));
        assert_eq!(l.prefixes, vec!["p/a/".to_owned()]);
        assert_eq!(l.next.as_deref(), Some("t0k"));
    }
}
