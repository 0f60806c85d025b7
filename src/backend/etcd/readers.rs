//! What a shared holder (a *reader*, `--shared`) waits for (module docs of `etcd`): not the
//! key just before its own, as a writer does, but the nearest older *writer's* key, and
//! whether anything is before that one. A key is a reader's when its value is dlock's and
//! says `"mode": "shared"`; every other key is a writer's: an exclusive dlock's, an older
//! dlock's, `etcdctl lock`'s (an empty value) or another client's. Pure, but for the paging
//! ([`nearest_writer`]).
//!
//! The answer takes the shape a writer's re-check gives (`recheck::recheck`): the keys before
//! ours that matter, newest first — here the nearest older writer `W` and a key before `W`,
//! none when `W` is the oldest — so that the same waiting protocol serves both: the reader
//! holds when no key is left (no writer before it), and otherwise watches `W` and that key
//! together with its own (`watch::Target::Line`). `W`'s deletion when nothing was before it
//! means the lock is ours: every key still before ours is a reader's, and no key can ever be
//! created before ours.

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};

use super::conn::Conn;
use super::key::is_reader;
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;

/// Keys (with their values, which say their mode) read per request while looking for the
/// nearest older writer: a reader behind more readers than this pages on.
pub(super) const PAGE: i64 = 64;

/// The newest [`PAGE`] keys (`extra` more) under a prefix created before `before` (all
/// keys when `None`), with their values.
pub(super) fn older_with_values(before: Option<i64>, extra: i64) -> GetOptions {
    let mut options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(PAGE + extra);
    if let Some(rev) = before {
        options = options.with_max_create_revision(rev - 1);
    }
    options
}

/// The lock's oldest key, without its value.
pub(super) fn oldest_key_only() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
        .with_keys_only()
}

/// What one page of keys before ours says.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Scan {
    /// The keys a reader waits on, newest first: the nearest older writer and a key before
    /// it; none when no writer is before ours.
    Found(Vec<Vec<u8>>),
    /// Only readers in this page, and there are older keys: read on, before this create
    /// revision.
    More(i64),
}

/// Look for the nearest writer in `page` (keys before ours, newest first; `more`: older keys
/// were left out), `oldest` being the lock's oldest key, read with the page.
///
/// The key before the writer is the next one in the page; at the end of a page that left
/// keys out, the lock's oldest key stands in for it: its deletion, like that of the key just
/// before the writer, is a reason to look again (the writer may be at the head now), and the
/// writer cannot be at the head while it lives.
pub(super) fn scan(page: &[Listed], more: bool, oldest: Option<&[u8]>) -> Scan {
    let Some(at) = page.iter().position(|listed| !listed.reader) else {
        return match page.last() {
            Some(last) if more => Scan::More(last.created),
            _ => Scan::Found(Vec::new()),
        };
    };
    let writer = page[at].key.as_slice();
    let ahead = match page.get(at + 1) {
        Some(listed) => Some(listed.key.as_slice()),
        None if more => oldest.filter(|o| *o != writer),
        None => None,
    };
    Scan::Found(
        std::iter::once(writer)
            .chain(ahead)
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

/// A key as [`scan`] sees it.
#[derive(Debug)]
pub(super) struct Listed {
    pub(super) key: Vec<u8>,
    pub(super) reader: bool,
    pub(super) created: i64,
}

/// The keys of `kvs` created before `before`, as [`scan`] sees them.
pub(super) fn listed(kvs: &[KeyValue], before: i64) -> Vec<Listed> {
    kvs.iter()
        .filter(|kv| kv.create_revision() < before)
        .map(|kv| Listed {
            key: kv.key().to_vec(),
            reader: is_reader(kv.value()),
            created: kv.create_revision(),
        })
        .collect()
}

/// From a first page (see [`scan`]), read on as far as needed, every page at revision
/// `read_at` (the first page's), so that all of them show the queue at one moment.
pub(super) async fn nearest_writer(
    conn: &mut Conn,
    pfx: &str,
    read_at: i64,
    first: Scan,
    oldest: Option<&[u8]>,
) -> Result<Vec<Vec<u8>>, Error> {
    let mut scanned = first;
    loop {
        let before = match scanned {
            Scan::Found(keys) => return Ok(keys),
            Scan::More(before) => before,
        };
        let options = older_with_values(Some(before), 0).with_revision(read_at);
        let page = conn
            .call(OP_TIMEOUT, |mut c| {
                let (pfx, options) = (pfx.to_owned(), options.clone());
                async move { c.get(pfx, Some(options)).await }
            })
            .await?;
        // Each page ends further back in the queue: this ends with its oldest key.
        scanned = scan(&listed(page.kvs(), before), page.more(), oldest);
    }
}

/// etcd no longer has the revision a reader's pages were read at (compacted meanwhile):
/// read again from the start.
pub(super) fn compacted(e: &Error) -> bool {
    e.to_string().contains("compacted")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys newest first: `r` a reader's, `w` a writer's; named by position.
    fn page(modes: &str) -> Vec<Listed> {
        modes
            .chars()
            .enumerate()
            .map(|(i, mode)| Listed {
                key: format!("k{i}").into_bytes(),
                reader: mode == 'r',
                created: 100 - i as i64,
            })
            .collect()
    }

    fn found(keys: &[&str]) -> Scan {
        Scan::Found(keys.iter().map(|k| k.as_bytes().to_vec()).collect())
    }

    #[test]
    fn a_reader_with_only_readers_before_it_holds() {
        assert_eq!(scan(&page(""), false, None), found(&[]));
        assert_eq!(scan(&page("rrr"), false, Some(b"k2")), found(&[]));
    }

    #[test]
    fn a_reader_waits_for_the_nearest_older_writer_and_the_key_before_it() {
        assert_eq!(
            scan(&page("rrwr"), false, Some(b"k3")),
            found(&["k2", "k3"])
        );
        assert_eq!(
            scan(&page("rwwr"), false, Some(b"k3")),
            found(&["k1", "k2"])
        );
        // The writer is the oldest key: its deletion hands over.
        assert_eq!(scan(&page("rrw"), false, Some(b"k2")), found(&["k2"]));
        assert_eq!(scan(&page("w"), false, Some(b"k0")), found(&["k0"]));
    }

    #[test]
    fn a_page_that_left_keys_out_reads_on_or_watches_the_oldest_key() {
        assert_eq!(scan(&page("rrr"), true, Some(b"old")), Scan::More(98));
        assert_eq!(
            scan(&page("rrw"), true, Some(b"old")),
            found(&["k2", "old"])
        );
        assert_eq!(scan(&page("rw"), true, Some(b"k1")), found(&["k1"]));
    }
}
