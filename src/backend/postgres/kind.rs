//! The PostgreSQL backend as the registry knows it.

use super::{PgBackend, PgTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers, Target, Words,
    MIN_LEASE_TTL,
};

/// PostgreSQL answers its TLS request (SSLRequest: length 8, code 80877103) with one byte,
/// `S` (go ahead) or `N` (no TLS here), and first bytes it cannot read with an error.
const RECOGNISED: Recognition = Recognition {
    called: "a PostgreSQL server",
    probes: &[
        Probe {
            send: Some(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]),
            after_others: false,
            read: |answer| matches!(answer, b"S" | b"N"),
            example: b"N",
        },
        Probe {
            send: None,
            after_others: false,
            read: is_error_response,
            example: b"E\0\0\0\x5aSFATAL\0",
        },
    ],
};

/// An ErrorResponse ('E', then a 4-byte length, then fields starting with 'S'), as
/// PostgreSQL sends to a startup packet it cannot read.
fn is_error_response(answer: &[u8]) -> bool {
    answer.len() > 5 && answer[0] == b'E' && answer[5] == b'S'
}

pub const KIND: Kind = Kind {
    name: "postgres",
    title: "PostgreSQL",
    schemes: &["postgres", "postgresql"],
    shown_as: &["postgres"],
    url_forms: &[
        "postgres://[user@][host][:port][/dbname][?sslmode=…] (postgresql://…, or libpq's key=value form)",
    ],
    config_table: Some("postgres"),
    capabilities: Capabilities {
        // The session lock lives with the session; its holder heartbeat is the lease.
        lease: true,
        fifo: true,
        records_finished: true,
        limit: true,
        // `pg_advisory_lock_shared` on the same key; the server queues it behind a waiting
        // exclusive request.
        shared: true,
        host_queue: true,
        servers: Servers::One,
    },
    minimum_ttl: MIN_LEASE_TTL,
    maximum_ttl: None,
    parse: |scheme, url| {
        if scheme.is_empty() {
            super::target::parse_key_value(url).map(Target::new)
        } else {
            super::target::parse_url(url).map(Target::new)
        }
    },
    recognises: Some(super::target::is_key_value),
    no_shared_because: "",
    words: Words {
        password: true,
        holders_are: "sessions",
        check_warns: "a PostgreSQL that cannot drop a silent holder",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

impl Place for PgTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn identity(&self) -> String {
        PgTarget::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        super::target::complete(self, file)
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(PgBackend::new(self, &common.prefix, &common.display_url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgresql_is_told_by_its_tls_answer_or_its_error() {
        let [tls, error] = RECOGNISED.probes else {
            panic!("two probes");
        };
        assert!((tls.read)(b"N"));
        assert!((tls.read)(b"S"));
        assert!(!(tls.read)(b"NO"));
        assert!((error.read)(b"E\0\0\0\x5aSFATAL\0"));
        assert!(!(error.read)(b"\0\0\0\x10"));
        assert!(!(error.read)(b"ERROR\r\n"));
    }
}
