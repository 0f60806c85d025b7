//! The ZooKeeper backend: the whole contract against a real ZooKeeper, plus FIFO, Curator
//! interop, cleanup of cancelled waiters, and a three-member ensemble (issue #5).

use crate::common::*;

crate::contract_tests!(zk_contract, ZkServer::start());
crate::lease_contract_tests!(zk_lease_contract, ZkServer::start());
