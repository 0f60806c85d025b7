//! The file backend as the registry knows it.

use std::time::Duration;

use super::{FileBackend, FileTarget};
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Servers, Target, Words,
};

pub const KIND: Kind = Kind {
    name: "file",
    title: "local file",
    schemes: &["file"],
    shown_as: &["file"],
    url_forms: &["file:///dir"],
    config_table: None,
    capabilities: Capabilities {
        // The kernel frees the lock when the holder dies: nothing to renew.
        lease: false,
        // Waiters block in flock(2), which wakes them in no particular order.
        fifo: false,
        records_finished: true,
        limit: true,
        // flock(LOCK_SH) on the same file, behind a turnstile for waiting exclusive runs.
        shared: true,
        host_queue: false,
        servers: Servers::One,
    },
    minimum_ttl: Duration::ZERO,
    maximum_ttl: None,
    parse: |_, url| super::target::parse(after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "",
    words: Words::NONE,
    server: None,
};

impl Place for FileTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn identity(&self) -> String {
        FileTarget::identity(self)
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(FileBackend::new(&self.dir, self.default, &common.prefix))
    }
}
