//! Where a lock lives in the tree and what its nodes hold: the prefix and lock paths, the
//! escaping of `.` and `..`, Curator's node names and queue order, the node data (holder
//! metadata as JSON), which nodes hold, and reading a lock's queue with every child's data in
//! one round trip.

use zookeeper_client::{self as zk, Acls, Client, CreateMode};

use super::conn::timed;
use super::ZkBackend;
use crate::error::Error;
use crate::lock::{Holder, HolderStatus, LockName, Mode, Record};

/// What precedes the sequence in an exclusive node's name: Curator's `InterProcessMutex`.
pub(super) const EXCLUSIVE_MARK: &str = "lock-";
/// What precedes the sequence in a shared node's name: the read lock of Curator's
/// `InterProcessReadWriteLock`.
pub(super) const READ_MARK: &str = "__READ__";
/// The write lock of Curator's `InterProcessReadWriteLock`: an exclusive node for dlock.
pub(super) const WRITE_MARK: &str = "__WRIT__";

/// What a lock node's data holds: the [`Record`] of etcd's values and lock files, plus the
/// waiting mark.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Meta {
    #[serde(flatten)]
    pub(super) record: Record,
    /// A waiter's mark (`--limit 1`): a place in the queue, not (yet) a hold.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) waiting: bool,
}

/// One child of a lock's node.
pub(super) struct Entry {
    pub(super) child: String,
    pub(super) status: HolderStatus,
    /// Its turn by its place ([`has_turn`]) and not marked waiting (or foreign): a holder.
    pub(super) holds: bool,
}

/// The path component of a lock name.
pub fn zk_component(name: &LockName) -> String {
    match name.encoded().as_str() {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        other => other.to_owned(),
    }
}

/// The name a path component stands for, if dlock could have written it.
pub(super) fn name_of_component(component: &str) -> Option<LockName> {
    let raw = match component {
        "%2E" => ".".to_owned(),
        "%2E%2E" => "..".to_owned(),
        other => crate::lock::decode_component(other)?,
    };
    let name = LockName::new(&raw).ok()?;
    (zk_component(&name) == component).then_some(name)
}

/// The mark that ends a node's name, just before the sequence, and where it starts.
fn last_mark(child: &str) -> Option<(usize, &'static str)> {
    [EXCLUSIVE_MARK, READ_MARK, WRITE_MARK]
        .into_iter()
        .filter_map(|mark| child.rfind(mark).map(|i| (i, mark)))
        .max_by_key(|&(i, _)| i)
}

/// The sort key: what follows the last `lock-`, `__READ__` or `__WRIT__` (the sequence), else
/// the whole name. Curator's mutex and read-write lock cut their own marks the same way; all
/// children of one node share one sequence counter, so the order is the order of creation.
pub(super) fn sequence_key(child: &str) -> &str {
    last_mark(child).map_or(child, |(i, mark)| &child[i + mark.len()..])
}

/// How a node holds: shared when its name ends in `__READ__` and the sequence (dlock's
/// `--shared` runs, Curator's read locks); every other node excludes (dlock's exclusive runs,
/// Curator's mutexes and write locks, and anything unknown, to be safe).
pub(super) fn mode_of(child: &str) -> Mode {
    match last_mark(child) {
        Some((_, READ_MARK)) => Mode::Shared,
        _ => Mode::Exclusive,
    }
}

/// Whether the node at `index` of the sorted queue `children` holds the lock by its place
/// (a waiter at that place has its turn): an exclusive node when it is among the first
/// `limit` and no shared node is ahead of it, a shared node when no exclusive node is ahead of
/// it.
pub(super) fn has_turn<S: AsRef<str>>(children: &[S], index: usize, limit: usize) -> bool {
    let ahead = &children[..index];
    match mode_of(children[index].as_ref()) {
        Mode::Shared => ahead.iter().all(|c| mode_of(c.as_ref()).is_shared()),
        Mode::Exclusive => index < limit && !ahead.iter().any(|c| mode_of(c.as_ref()).is_shared()),
    }
}

pub(super) fn sort_queue(children: &mut [String]) {
    children.sort_by(|a, b| sequence_key(a).cmp(sequence_key(b)).then_with(|| a.cmp(b)));
}

impl ZkBackend {
    /// `/<prefix>`: the prefix's `/`-separated parts as path components.
    pub(super) fn root(&self) -> Result<String, Error> {
        let parts: Vec<&str> = self.prefix.split('/').filter(|p| !p.is_empty()).collect();
        if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") {
            return Err(Error::Usage(format!(
                "--prefix: '{}' cannot be a ZooKeeper path (it needs a name other than '.' and '..')",
                self.prefix
            )));
        }
        if parts[0] == "zookeeper" {
            return Err(Error::Usage(format!(
                "--prefix: '{}' would put locks under /zookeeper, which ZooKeeper reserves for itself",
                self.prefix
            )));
        }
        Ok(format!("/{}", parts.join("/")))
    }

    /// The lock's node, parent of its waiters and holders.
    pub(super) fn dir(&self, name: &LockName) -> Result<String, Error> {
        Ok(format!("{}/{}", self.root()?, zk_component(name)))
    }

    /// With digest authentication, nodes are readable and writable by their creator only (the
    /// same user); without it, by anyone (as Curator does).
    pub(super) fn acls(&self) -> Acls<'static> {
        if self.target.user.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// Create `path` and its missing parents as container nodes (ZooKeeper removes them once
    /// empty). A missing chroot is the user's to create.
    pub(super) async fn make_parents(&self, client: &Client, path: &str) -> Result<(), Error> {
        let options = CreateMode::Container.with_acls(self.acls());
        match timed(client.mkdir(path, &options)).await {
            Ok(()) => Ok(()),
            Err(zk::Error::NoNode) => Err(Error::Config(format!(
                "the chroot {} does not exist on {}; create it first",
                self.target.chroot.as_deref().unwrap_or("/"),
                self.display
            ))),
            Err(e) => Err(self.classify(&e, &format!("creating {path}"))),
        }
    }

    /// The children of a lock in queue order, with their data; `holds` marks the holders.
    pub(super) async fn read_queue(
        &self,
        client: &Client,
        name: &LockName,
    ) -> Result<Vec<Entry>, Error> {
        let dir = self.dir(name)?;
        let mut children = match timed(client.list_children(&dir)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(self.classify(&e, &format!("listing {dir}"))),
        };
        sort_queue(&mut children);
        // Every read is sent before the first reply is awaited: one round trip.
        let reads: Vec<_> = children
            .iter()
            .map(|child| client.get_data(&format!("{dir}/{child}")))
            .collect();
        let mut nodes = Vec::new();
        for (child, read) in children.into_iter().zip(reads) {
            match timed(read).await {
                Ok((data, stat)) => nodes.push((child, data, stat)),
                // Released between the listing and the read.
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(self.classify(&e, &format!("reading {dir}"))),
            }
        }
        let limit = nodes
            .first()
            .and_then(|(_, data, _)| serde_json::from_slice::<Meta>(data).ok())
            .map_or(1, |m| m.record.limit.max(1)) as usize;
        let order: Vec<String> = nodes.iter().map(|(child, _, _)| child.clone()).collect();
        let entries = nodes
            .into_iter()
            .enumerate()
            .map(|(position, (child, data, stat))| {
                let meta = serde_json::from_slice::<Meta>(&data).ok();
                let waiting = meta.as_ref().is_some_and(|m| m.waiting);
                let mut holder = meta.map(|m| m.record.holder).unwrap_or_else(|| Holder {
                    name: name.to_string(),
                    // Curator stores the client's IP address as the node's data.
                    host: String::from_utf8_lossy(&data)
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(64)
                        .collect(),
                    command: "(foreign holder: Curator or another client)".into(),
                    ..Holder::default()
                });
                holder.token = u64::try_from(stat.czxid).unwrap_or(0);
                // The name says how the node holds, whoever wrote it.
                holder.mode = mode_of(&child);
                Entry {
                    child,
                    status: HolderStatus {
                        holder,
                        ttl_left_ms: None,
                        session: Some(format!("ZooKeeper session 0x{:x}", stat.ephemeral_owner)),
                    },
                    // At the head, a node still marked waiting is a waiter between the grant
                    // and its rewrite, or one that died there (its session not expired yet).
                    holds: has_turn(&order, position, limit) && !waiting,
                }
            })
            .collect();
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_data_is_the_json_dlock_always_wrote() {
        let holder = Holder {
            name: "a".into(),
            host: "h".into(),
            pid: 42,
            user: "u".into(),
            command: "sleep 1".into(),
            since: "2026-01-01T00:00:00Z".into(),
            ttl_ms: 10_000,
            token: 7,
            version: "0.1.0".into(),
            ..Holder::default()
        };
        let fields = r#""name":"a","host":"h","pid":42,"user":"u","command":"sleep 1","since":"2026-01-01T00:00:00Z","ttl_ms":10000,"token":7,"version":"0.1.0","limit":3"#;
        for (waiting, tail) in [(false, ""), (true, r#","waiting":true"#)] {
            let meta = Meta {
                record: Record {
                    holder: holder.clone(),
                    limit: 3,
                },
                waiting,
            };
            let json = serde_json::to_string(&meta).expect("serialize");
            assert_eq!(json, format!("{{{fields}{tail}}}"));
            let read: Meta = serde_json::from_str(&json).expect("deserialize");
            assert_eq!((read.record.limit, read.waiting), (3, waiting));
        }
    }

    #[test]
    fn dot_names_become_valid_distinct_components() {
        let names = [".", "..", "%2E", "a", "a.b", "..."];
        let components: Vec<String> = names
            .iter()
            .map(|n| zk_component(&LockName::new(n).expect("name")))
            .collect();
        assert_eq!(components[0], "%2E");
        assert_eq!(components[1], "%2E%2E");
        let unique: std::collections::HashSet<&String> = components.iter().collect();
        assert_eq!(unique.len(), names.len(), "{components:?}");
        for (name, component) in names.iter().zip(&components) {
            assert_eq!(
                name_of_component(component).as_ref().map(LockName::as_str),
                Some(*name)
            );
        }
        assert!(name_of_component("!check-x").is_none());
    }

    #[test]
    fn mutex_read_and_write_nodes_share_one_order_and_each_has_its_mode() {
        let mut children = vec![
            "_c_ddd-__WRIT__0000000004".to_owned(),
            "_c_aaa-lock-0000000002".to_owned(),
            "_c_bbb-__READ__0000000003".to_owned(),
            "_c_ccc-__READ__0000000001".to_owned(),
        ];
        sort_queue(&mut children);
        assert_eq!(
            children,
            [
                "_c_ccc-__READ__0000000001",
                "_c_aaa-lock-0000000002",
                "_c_bbb-__READ__0000000003",
                "_c_ddd-__WRIT__0000000004"
            ]
        );
        let modes: Vec<Mode> = children.iter().map(|c| mode_of(c)).collect();
        assert_eq!(
            modes,
            [Mode::Shared, Mode::Exclusive, Mode::Shared, Mode::Exclusive]
        );
        // A name without a mark (not dlock's, not Curator's) excludes.
        assert_eq!(mode_of("something-else"), Mode::Exclusive);
    }

    #[test]
    fn readers_share_until_an_exclusive_node_and_none_passes_it() {
        let queue = |kinds: &str| -> Vec<String> {
            kinds
                .chars()
                .enumerate()
                .map(|(i, k)| match k {
                    'r' => format!("_c_{i}-__READ__{i:010}"),
                    'w' => format!("_c_{i}-__WRIT__{i:010}"),
                    _ => format!("_c_{i}-lock-{i:010}"),
                })
                .collect()
        };
        let turns = |kinds: &str, limit: usize| -> String {
            let children = queue(kinds);
            (0..children.len())
                .map(|i| {
                    if has_turn(&children, i, limit) {
                        'Y'
                    } else {
                        '.'
                    }
                })
                .collect()
        };
        assert_eq!(turns("rrr", 1), "YYY");
        assert_eq!(turns("rrxrr", 1), "YY...");
        assert_eq!(turns("xrrx", 1), "Y...");
        assert_eq!(turns("wrr", 1), "Y..");
        assert_eq!(turns("rwr", 1), "Y..");
        // A semaphore's holders exclude readers, and readers hold its slots off.
        assert_eq!(turns("xxr", 2), "YY.");
        assert_eq!(turns("rxx", 2), "Y..");
    }

    #[test]
    fn queue_sorts_by_sequence_like_curator() {
        let mut children = vec![
            "_c_bbb-lock-0000000003".to_owned(),
            "_c_aaa-lock-0000000010".to_owned(),
            "_c_ccc-lock-0000000001".to_owned(),
        ];
        sort_queue(&mut children);
        assert_eq!(
            children,
            [
                "_c_ccc-lock-0000000001",
                "_c_bbb-lock-0000000003",
                "_c_aaa-lock-0000000010"
            ]
        );
    }
}
