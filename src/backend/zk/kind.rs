//! The ZooKeeper backend as the registry knows it.

use super::{ZkBackend, ZkTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Target, Words, MIN_LEASE_TTL,
};

pub const KIND: Kind = Kind {
    name: "zk",
    title: "ZooKeeper",
    schemes: &["zk"],
    shown_as: &["zk"],
    url_forms: &["zk://[user@]host:port[,host:port…][/chroot]"],
    config_table: Some("zookeeper"),
    capabilities: Capabilities {
        lease: true,
        fifo: true,
        records_finished: true,
        limit: true,
        shared: true,
        host_queue: true,
    },
    minimum_ttl: MIN_LEASE_TTL,
    parse: |_, url| super::target::parse(after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "",
    words: Words {
        password: true,
        holders_are: "nodes",
        config_note: "ZooKeeper speaks no TLS: its table takes only `password_file`.",
        ..Words::NONE
    },
};

impl Place for ZkTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn identity(&self) -> String {
        ZkTarget::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        super::target::complete(self, file)
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(ZkBackend::new(
            self,
            &common.prefix,
            &common.display_url,
            common.ttl,
        ))
    }
}
