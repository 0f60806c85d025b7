//! What is particular to each backend, beside the contract every backend passes
//! (`crate::contract`): one module per backend, each invoking `contract_tests!` with its test
//! server from `crate::support`.

mod etcd;
mod file;
mod memcached;
mod mysql;
mod postgres;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod zk;
