//! The PostgreSQL backend as the registry knows it.

use super::{PgBackend, PgTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{Capabilities, Common, DynBackend, Kind, Place, Target, Words, MIN_LEASE_TTL};

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
    },
    minimum_ttl: MIN_LEASE_TTL,
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
