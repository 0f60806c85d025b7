//! The etcd backend as the registry knows it.

use super::{EtcdBackend, EtcdTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words, MIN_LEASE_TTL,
};

/// etcd answers an HTTP request for `/version` (on the port that serves gRPC too) with its
/// version in JSON, which names it.
const RECOGNISED: Recognition = Recognition {
    called: "an etcd server",
    probes: &[Probe {
        send: Some(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
        after_others: true,
        read: names_etcd,
        example: b"HTTP/1.1 200 OK\r\n\r\n{\"etcdserver\":\"3.5.17\",\"etcdcluster\":\"3.5.0\"}",
    }],
};

fn names_etcd(answer: &[u8]) -> bool {
    answer.starts_with(b"HTTP/") && answer.windows(12).any(|w| w == b"\"etcdserver\"")
}

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
        servers: Servers::Quorum,
    },
    minimum_ttl: MIN_LEASE_TTL,
    maximum_ttl: None,
    parse: |scheme, url| super::target::parse(scheme, after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "",
    words: Words {
        foreign_schemes: &[("http", "etcd"), ("https", "etcds")],
        password: true,
        holders_are: "leases",
        one_url: "etcd://e1,e2,e3",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_is_told_by_its_version_over_http() {
        assert!(names_etcd(
            b"HTTP/1.1 200 OK\r\n\r\n{\"etcdserver\":\"3.5.17\",\"etcdcluster\":\"3.5.0\"}"
        ));
        assert!(!names_etcd(b"HTTP/1.1 404 Not Found\r\n\r\n"));
        assert!(!names_etcd(b"{\"etcdserver\":\"3.5.17\"}"));
    }
}
