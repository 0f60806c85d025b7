//! Redis Cluster: locks on a sharded cluster. One lock's keys share the hash tag
//! `{<encoded name>}`, so one lock lives in one slot, and every call of it goes to that slot's
//! master.
//!
//! Cost: nothing for a standalone server. With one host in the URL, calls go to it; only a
//! `MOVED` or `ASK` reply (the host is a cluster node that does not serve the slot) turns the
//! connection into a cluster one. With several hosts, `CLUSTER SLOTS` is asked once per
//! connection first (it also refuses a node that is not in cluster mode: 78).
//!
//! Slot migration (`redis-cli --cluster reshard`): while a slot moves, a script whose keys are
//! not all on one side gets `TRYAGAIN` (asked again after a pause), a script whose keys have
//! all moved gets `ASK` (sent once to the importing node after `ASKING`), and after the
//! migration `MOVED` (remembered). A script that declares a key the slot does not hold (an
//! empty mailbox) meets `TRYAGAIN`, or `ASK` then `TRYAGAIN`, until the migration ends: the
//! pauses back off to 200 ms and last as long as the call's budget, and a waiter asks again
//! until `--wait` runs out. A waiter blocked in `BLPOP` on the old master is unblocked
//! with `MOVED` and blocks again on the new one. Master failover: the connection to the dead
//! master fails; the slot table is read again from the other nodes until the promoted replica
//! serves the slot (`CLUSTERDOWN` meanwhile is waited out, bounded by the call's budget).
//!
//! Fencing tokens stay increasing: the counter moves with its slot (`MIGRATE` copies it
//! exactly), and a token is never less than the serving master's clock in µs, which covers a
//! promoted replica that had not yet received the last increments (as long as the masters'
//! clocks agree within the time a failover takes).
//!
//! The slot of a key and the slot table are `topology/`, kept by the connection; this folder
//! routes calls by them (`route.rs`), checks the URL's hosts (`seeds.rs`) and reports the
//! masters and their coverage for `list` and `check` (`admin.rs`).

mod admin;
mod route;
mod seeds;

pub(super) use admin::{check_details, masters};
