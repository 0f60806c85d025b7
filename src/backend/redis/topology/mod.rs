//! Where a call goes, as the connection keeps it: in a Redis Cluster the slot of a key
//! ([`slot_of`]) and which master serves each slot ([`SlotMap`]); behind Sentinel the master a
//! majority of the sentinels name ([`Locator`]). Nothing here holds a `Conn`: `conn.rs` keeps
//! these in its state, and `cluster/` (routing a call by the slot table) and `sentinel/`
//! (asking again at a renewal, following a failover) act on them from above it.

mod locator;
mod map;
mod slot;

pub(super) use locator::{Addr, Answer, Locator, Round, Sentinel, ASK_TIMEOUT};
pub(super) use map::{parse_node, NodeAddr, SlotMap};
pub(super) use slot::{slot_of, SLOTS};
