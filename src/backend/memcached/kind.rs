//! The memcached backend as the registry knows it.

use std::time::Duration;

use super::{MemcachedBackend, MemcachedTarget};
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words,
};

/// The shortest `--ttl` on memcached: its whole-second expiry may tick one second early, so
/// 3 s leaves a 2 s lease.
pub const MIN_TTL: Duration = Duration::from_secs(3);

/// memcached answers `PING`, no command of its protocol, with an error line of its own.
const RECOGNISED: Recognition = Recognition {
    called: "a memcached server",
    probes: &[Probe {
        send: Some(b"PING\r\n"),
        after_others: false,
        read: |answer| answer.starts_with(b"ERROR") || answer.starts_with(b"CLIENT_ERROR"),
        example: b"ERROR\r\n",
    }],
};

pub const KIND: Kind = Kind {
    name: "memcached",
    title: "memcached",
    schemes: &["memcached", "memcached+unix"],
    shown_as: &["memcached", "memcached+unix"],
    url_forms: &[
        "memcached://host:port[,host:port…]",
        "memcached+unix:///path",
    ],
    config_table: None,
    capabilities: Capabilities {
        lease: true,
        // Waiters poll; whoever asks first after a release gets the lock.
        fifo: false,
        records_finished: true,
        limit: true,
        shared: false,
        host_queue: true,
        servers: Servers::One,
    },
    minimum_ttl: MIN_TTL,
    maximum_ttl: None,
    parse: |scheme, url| super::target::parse(scheme, after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "memcached cannot list its keys, so a writer could not find every reader's expiring share, and it has no queue to keep readers from starving a writer",
    words: Words {
        holders_are: "entries",
        check_warns: "a memcached that may evict",
        list_note: "On memcached it needs the server's LRU crawler (on by default) and fails rather than give an incomplete answer.",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

impl Place for MemcachedTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn scheme(&self) -> &'static str {
        MemcachedTarget::scheme(self)
    }

    fn identity(&self) -> String {
        MemcachedTarget::identity(self)
    }

    fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        MemcachedTarget::check_prefix(self, prefix)
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(MemcachedBackend::new(self, &common.prefix))
    }
}
