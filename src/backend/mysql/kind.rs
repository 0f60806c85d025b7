//! The MySQL/MariaDB backend as the registry knows it.

use super::{MysqlBackend, MysqlTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words, MIN_LEASE_TTL,
};

/// A MySQL/MariaDB server speaks first: its handshake packet comes back on any connection.
const RECOGNISED: Recognition = Recognition {
    called: "a MySQL server",
    probes: &[Probe {
        send: None,
        after_others: false,
        read: is_handshake,
        example: &[0x4a, 0, 0, 0, 10, b'8', b'.'],
    }],
};

/// A handshake packet: 3-byte length, sequence 0, protocol version 10.
fn is_handshake(answer: &[u8]) -> bool {
    answer.len() > 4 && answer[3] == 0 && answer[4] == 10
}

pub const KIND: Kind = Kind {
    name: "mysql",
    title: "MySQL/MariaDB",
    schemes: &["mysql", "mariadb"],
    shown_as: &["mysql"],
    url_forms: &["mysql://[user@][host][:port][/database][?ssl-mode=…] (mariadb://…)"],
    config_table: Some("mysql"),
    capabilities: Capabilities {
        // GET_LOCK lives with the session; its holder heartbeat (PostgreSQL's schedule, over
        // a server TTL in whole seconds) is the lease.
        lease: true,
        fifo: true,
        records_finished: true,
        limit: true,
        shared: false,
        host_queue: true,
        servers: Servers::One,
    },
    minimum_ttl: MIN_LEASE_TTL,
    maximum_ttl: None,
    parse: |_, url| super::target::parse(after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "MySQL's named locks (GET_LOCK) are exclusive only",
    words: Words {
        password: true,
        holders_are: "sessions",
        check_warns: "a MySQL user without PROCESS",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

impl Place for MysqlTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn identity(&self) -> String {
        MysqlTarget::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        super::target::complete(self, file)
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(MysqlBackend::new(self, &common.prefix, &common.display_url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_is_told_by_its_greeting() {
        assert!(is_handshake(&[0x4a, 0, 0, 0, 10, b'8', b'.']));
        assert!(!is_handshake(b""));
        assert!(!is_handshake(b"SSH-2.0-OpenSSH_9.2"));
    }
}
