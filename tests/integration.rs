//! Integration tests against the real `dlock` binary, in one test binary.

mod common;
#[macro_use]
mod contract;

mod cli;
mod docs;
mod etcd_backend;
mod file_backend;
mod pg_backend;
mod pg_server;
mod redis_backend;
mod safety;
mod terminal;
mod zk_backend;
