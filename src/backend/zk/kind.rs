//! The ZooKeeper backend as the registry knows it.

use super::{ZkBackend, ZkTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words, MIN_LEASE_TTL,
};

/// ZooKeeper answers its `srvr` command with its version, or, where the command is not
/// allowed (`4lw.commands.whitelist`), says so.
const RECOGNISED: Recognition = Recognition {
    called: "a ZooKeeper server",
    probes: &[Probe {
        send: Some(b"srvr"),
        after_others: false,
        read: answers_srvr,
        example: b"Zookeeper version: 3.8.4-9316c2a7a97e1666d8f4593f34dd6fc36ecc436c",
    }],
};

fn answers_srvr(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    text.starts_with("Zookeeper version") || text.contains("is not in the whitelist")
}

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
        servers: Servers::Quorum,
    },
    minimum_ttl: MIN_LEASE_TTL,
    maximum_ttl: None,
    parse: |_, url| super::target::parse(after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "",
    words: Words {
        password: true,
        holders_are: "nodes",
        config_note: "ZooKeeper speaks no TLS: its table takes only `password_file`.",
        one_url: "zk://z1,z2,z3",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zookeeper_is_told_by_its_answer_to_srvr() {
        assert!(answers_srvr(
            b"Zookeeper version: 3.8.4-9316c2a7a97e1666d8f4593f34dd6fc36ecc436c"
        ));
        assert!(answers_srvr(
            b"srvr is not executed because it is not in the whitelist.\n"
        ));
        assert!(!answers_srvr(b"+PONG\r\n"));
    }
}
