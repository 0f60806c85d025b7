//! The NATS backend as the registry knows it.

use super::{NatsBackend, NatsTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words, MIN_LEASE_TTL,
};

/// A NATS server greets every connection with `INFO {…}` before it is asked anything.
const RECOGNISED: Recognition = Recognition {
    called: "a NATS server",
    probes: &[Probe {
        send: None,
        after_others: false,
        read: names_nats,
        example: b"INFO {\"server_id\":\"NCXVS\",\"server_name\":\"n1\",\"version\":\"2.15.1\",\"proto\":1,\"headers\":true,\"max_payload\":1048576}\r\n",
    }],
};

fn names_nats(answer: &[u8]) -> bool {
    answer.starts_with(b"INFO {") && answer.windows(11).any(|w| w == b"\"server_id\"")
}

pub const KIND: Kind = Kind {
    name: "nats",
    title: "NATS",
    schemes: &["nats", "tls", "nats+tls"],
    shown_as: &["nats", "tls"],
    url_forms: &[
        "nats://[user:password@]host[:port][,host[:port]…][/bucket][?replicas=N]",
        "tls://… or nats+tls://…",
    ],
    config_table: None,
    capabilities: Capabilities {
        lease: true,
        fifo: true,
        records_finished: true,
        limit: true,
        shared: false,
        host_queue: true,
        servers: Servers::Quorum,
    },
    minimum_ttl: MIN_LEASE_TTL,
    maximum_ttl: None,
    parse: |scheme, url| super::target::parse(scheme, after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "dlock's NATS queue has no reader mode yet",
    words: Words {
        holders_are: "entries",
        one_url: "nats://n1,n2,n3",
        environment: &[
            ("NATS_CREDS", "a NATS .creds file to connect with (nats://)"),
            (
                "NATS_NKEY",
                "a NATS NKey seed file to connect with (nats://)",
            ),
        ],
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

impl Place for NatsTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn scheme(&self) -> &'static str {
        NatsTarget::scheme(self)
    }

    fn identity(&self) -> String {
        NatsTarget::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        let _ = file;
        NatsTarget::complete(self)
    }

    fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        if prefix.is_empty() {
            return Err("the prefix is empty; NATS keys need one".into());
        }
        if prefix.len() > 100 {
            return Err(format!("'{prefix}' is longer than 100 bytes"));
        }
        Ok(())
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(NatsBackend::new(self, &common.prefix, &common.display_url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_is_told_by_its_greeting() {
        assert!(names_nats(RECOGNISED.probes[0].example));
        assert!(!names_nats(b"INFO\r\n"));
        assert!(!names_nats(b"-ERR unknown command\r\n"));
    }
}
