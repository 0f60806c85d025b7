//! The etcd backend as the registry knows it.

use super::{EtcdBackend, EtcdTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Target, Words, MIN_LEASE_TTL,
};

pub const KIND: Kind = Kind {
    name: "etcd",
    title: "etcd",
    schemes: &["etcd", "etcds"],
    shown_as: &["etcd", "etcds"],
    url_forms: &["etcd://[user@]host:port[,host:port…]", "etcds://…"],
    config_table: Some("etcd"),
    capabilities: Capabilities {
        lease: true,
        fifo: true,
        records_finished: true,
        limit: true,
        shared: true,
        host_queue: true,
    },
    minimum_ttl: MIN_LEASE_TTL,
    parse: |scheme, url| super::target::parse(scheme, after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "",
    words: Words {
        foreign_schemes: &[("http", "etcd"), ("https", "etcds")],
        password: true,
        holders_are: "leases",
        ..Words::NONE
    },
};

impl Place for EtcdTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn scheme(&self) -> &'static str {
        EtcdTarget::scheme(self)
    }

    fn identity(&self) -> String {
        EtcdTarget::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        super::target::complete(self, file)
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(EtcdBackend::new(self, &common.prefix, &common.display_url))
    }
}
