//! Reading the service's blob listings (`List Blobs`, XML): each blob's name, lease state and
//! dlock's metadata, and the marker of the next page; and the blobs of one lock among them:
//! its own blob and its `--limit` slots (`NAME~I`).

use std::time::Duration;

use super::blob::{Blobs, Failure};
use crate::kit::xml::{element, elements, unescape};

/// The most listing pages read for one answer (5000 blobs each).
pub const MAX_PAGES: usize = 2000;

/// One blob of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub leased: bool,
    /// Its `dlocklimit` metadata, where it has one.
    pub limit: Option<u32>,
}

/// Every blob whose name begins with `prefix` (bounded by [`MAX_PAGES`]).
pub async fn listed(blobs: &Blobs, prefix: &str, limit: Duration) -> Result<Vec<Listed>, Failure> {
    let mut found = Vec::new();
    let mut marker = String::new();
    for _ in 0..MAX_PAGES {
        let page = blobs.list_page(prefix, &marker, limit).await?;
        let text = String::from_utf8_lossy(&page.body);
        for entry in elements(&text, "Blob") {
            found.push(Listed {
                name: element(entry, "Name").map(unescape).unwrap_or_default(),
                leased: element(entry, "LeaseState") == Some("leased"),
                limit: element(entry, "dlocklimit").and_then(|l| l.trim().parse().ok()),
            });
        }
        marker = element(&text, "NextMarker")
            .map(unescape)
            .unwrap_or_default();
        if marker.is_empty() {
            return Ok(found);
        }
    }
    Err(Failure::Answer {
        status: 507,
        code: format!("MoreThan{MAX_PAGES}Pages"),
    })
}

/// The slot blob `index` of the lock whose blob is `base`.
pub fn slot(base: &str, index: u32) -> String {
    format!("{base}~{index}")
}

/// Which slot of the lock `base` the blob `name` is (`None` for another lock's blob).
pub fn slot_of(base: &str, name: &str) -> Option<u32> {
    name.strip_prefix(base)?.strip_prefix('~')?.parse().ok()
}

/// The lock a blob under `prefix` belongs to: its encoded name (its own blob, or one of its
/// slots), `None` for anything else (`check`'s probe).
pub fn lock_of(prefix: &str, name: &str) -> Option<String> {
    let rest = name.strip_prefix(prefix)?;
    let encoded = match rest.split_once('~') {
        Some((encoded, index)) => {
            index.parse::<u32>().ok()?;
            encoded
        }
        None => rest,
    };
    (!encoded.is_empty() && !encoded.contains('/')).then(|| encoded.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read_blob_by_blob() {
        let page = "<EnumerationResults><Blobs><Blob><Name>d/a</Name><Properties>\
                    <LeaseState>leased</LeaseState></Properties><Metadata><dlocklimit>2\
                    </dlocklimit></Metadata></Blob><Blob><Name>d/b&amp;c</Name><Properties>\
                    <LeaseState>available</LeaseState></Properties></Blob></Blobs>\
                    <NextMarker>m&amp;1</NextMarker></EnumerationResults>";
        let blobs: Vec<&str> = elements(page, "Blob").collect();
        assert_eq!(blobs.len(), 2);
        assert_eq!(element(blobs[0], "LeaseState"), Some("leased"));
        assert_eq!(element(blobs[0], "dlocklimit"), Some("2"));
        assert_eq!(
            element(blobs[1], "Name").map(unescape).as_deref(),
            Some("d/b&c")
        );
        assert_eq!(
            element(page, "NextMarker").map(unescape).as_deref(),
            Some("m&1")
        );
        assert_eq!(element("<NextMarker />", "NextMarker"), None);
    }

    /// A lock's slots are told from another lock whose name begins the same way, and a
    /// probe or a deeper blob is no lock.
    #[test]
    fn slots_belong_to_their_lock_only() {
        assert_eq!(slot("p/a", 3), "p/a~3");
        assert_eq!(slot_of("p/a", "p/a~3"), Some(3));
        assert_eq!(slot_of("p/a", "p/ab~3"), None);
        assert_eq!(slot_of("p/a", "p/a"), None);
        assert_eq!(lock_of("p/", "p/a~3").as_deref(), Some("a"));
        assert_eq!(lock_of("p/", "p/a").as_deref(), Some("a"));
        assert_eq!(lock_of("p/", "p/~check-1"), None);
        assert_eq!(lock_of("p/", "p/q/a"), None);
        assert_eq!(lock_of("p/", "p/a~x"), None);
    }
}
