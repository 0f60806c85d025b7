//! Which master serves which slot: the reply of `CLUSTER SLOTS`, and what `MOVED` replies
//! teach afterwards. A lookup that finds nothing sends the call to the node at hand, whose
//! `MOVED` then says where the slot is.

use redis::Value;

use super::slot::SLOTS;

/// A node's address as the cluster announces it.
pub(in crate::backend::redis) type NodeAddr = (String, u16);

/// A range of slots and the master that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::backend::redis) struct SlotRange {
    pub(in crate::backend::redis) first: u16,
    pub(in crate::backend::redis) last: u16,
    pub(in crate::backend::redis) master: NodeAddr,
    pub(in crate::backend::redis) replicas: usize,
}

/// The slot table as far as dlock knows it.
#[derive(Clone, Debug, Default)]
pub(in crate::backend::redis) struct SlotMap {
    /// From `CLUSTER SLOTS`; `learned` (from `MOVED`) overrides it.
    ranges: Vec<SlotRange>,
    learned: Vec<(u16, NodeAddr)>,
}

impl SlotMap {
    /// Parse a `CLUSTER SLOTS` reply; an empty host means the node that was asked (`asked`).
    pub(in crate::backend::redis) fn parse(reply: &Value, asked: &str) -> Option<SlotMap> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(fields) = entry else {
                return None;
            };
            let int = |i: usize| match fields.get(i) {
                Some(Value::Int(n)) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (first, last) = (int(0)?, int(1)?);
            let Some(Value::Array(master)) = fields.get(2) else {
                return None;
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return None,
            };
            let host = if host.is_empty() || host == "?" {
                asked.to_owned()
            } else {
                host
            };
            let port = match master.get(1) {
                Some(Value::Int(n)) => u16::try_from(*n).ok()?,
                _ => return None,
            };
            if first > last || last >= SLOTS {
                return None;
            }
            ranges.push(SlotRange {
                first,
                last,
                master: (host, port),
                replicas: fields.len().saturating_sub(3),
            });
        }
        Some(SlotMap {
            ranges,
            learned: Vec::new(),
        })
    }

    /// The master of `slot`, if known.
    pub(in crate::backend::redis) fn master_of(&self, slot: u16) -> Option<&NodeAddr> {
        self.learned
            .iter()
            .rev()
            .find(|(s, _)| *s == slot)
            .map(|(_, node)| node)
            .or_else(|| {
                self.ranges
                    .iter()
                    .find(|r| (r.first..=r.last).contains(&slot))
                    .map(|r| &r.master)
            })
    }

    /// A `MOVED` reply: `slot` is served by `node` now.
    pub(in crate::backend::redis) fn learn(&mut self, slot: u16, node: NodeAddr) {
        self.learned.retain(|(s, _)| *s != slot);
        // Bounded: a few locks per process, but a `list` may visit many slots.
        if self.learned.len() >= 1024 {
            self.learned.remove(0);
        }
        self.learned.push((slot, node));
    }

    /// Forget what is known about `slot` (its master stopped answering).
    pub(in crate::backend::redis) fn forget(&mut self, slot: u16) {
        self.learned.retain(|(s, _)| *s != slot);
        self.ranges.retain(|r| !(r.first..=r.last).contains(&slot));
    }

    /// The masters, each once, in the order of their first slot.
    pub(in crate::backend::redis) fn masters(&self) -> Vec<NodeAddr> {
        let mut ranges: Vec<&SlotRange> = self.ranges.iter().collect();
        ranges.sort_by_key(|r| r.first);
        let mut masters: Vec<NodeAddr> = Vec::new();
        for range in ranges {
            if !masters.contains(&range.master) {
                masters.push(range.master.clone());
            }
        }
        masters
    }

    /// The ranges from `CLUSTER SLOTS`, by first slot.
    pub(in crate::backend::redis) fn ranges(&self) -> Vec<SlotRange> {
        let mut ranges = self.ranges.clone();
        ranges.sort_by_key(|r| r.first);
        ranges
    }

    /// How many slots have a master.
    pub(in crate::backend::redis) fn covered(&self) -> usize {
        let mut seen = vec![false; usize::from(SLOTS)];
        for range in &self.ranges {
            for slot in range.first..=range.last {
                seen[usize::from(slot)] = true;
            }
        }
        seen.iter().filter(|&&s| s).count()
    }
}

/// `host:port` of a `MOVED`/`ASK` reply (an IPv6 host is not bracketed there).
pub(in crate::backend::redis) fn parse_node(text: &str) -> Option<NodeAddr> {
    let (host, port) = text.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_owned(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn cluster_slots_replies_and_moved_replies_route_slots() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![Value::Int(8192), Value::Int(16000), node("", 7001)]),
        ]);
        let mut map = SlotMap::parse(&reply, "10.0.0.9").unwrap();
        assert_eq!(map.master_of(5), Some(&("127.0.0.1".to_owned(), 7000)));
        assert_eq!(map.master_of(9000), Some(&("10.0.0.9".to_owned(), 7001)));
        assert_eq!(map.master_of(16100), None);
        assert_eq!(map.covered(), 16001);
        assert_eq!(map.masters().len(), 2);
        assert_eq!(map.ranges()[0].replicas, 1);
        map.learn(5, ("127.0.0.1".into(), 7002));
        assert_eq!(map.master_of(5), Some(&("127.0.0.1".to_owned(), 7002)));
        map.forget(5);
        assert_eq!(map.master_of(5), None);
        assert_eq!(parse_node("::1:7000"), Some(("::1".to_owned(), 7000)));
        assert!(SlotMap::parse(&Value::Int(1), "h").is_none());
    }
}
