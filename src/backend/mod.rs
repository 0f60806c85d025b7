//! The backends, one module each. They implement [`crate::lock::Backend`]; `lib.rs` picks one
//! by the URL's scheme and runs the subcommand generically over it.

pub mod etcd;
pub mod file;
pub mod postgres;
pub mod redis;
pub mod zk;
