//! Redis (one server, or a Redis Cluster) and Redis behind Sentinel as the registry knows
//! them: two kinds of one backend, told apart by their schemes.

use super::{target, RedisBackend, RedisTarget};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words, MIN_LEASE_TTL,
};

/// What both kinds can honour: the same scripts serve both.
const CAPABILITIES: Capabilities = Capabilities {
    lease: true,
    fifo: true,
    records_finished: true,
    limit: true,
    shared: true,
    host_queue: true,
    // A Redis Cluster's replicas, Sentinel's failover; a one-server URL has neither.
    servers: Servers::Failover,
};

/// A Redis server answers `PING` with `+PONG`, or refuses it in its own words (no password
/// yet, a user without the command, protected mode); a sentinel does too.
const RECOGNISED: Recognition = Recognition {
    called: "a Redis server",
    probes: &[Probe {
        send: Some(b"PING\r\n"),
        after_others: false,
        read: answers_ping,
        example: b"+PONG\r\n",
    }],
};

fn answers_ping(answer: &[u8]) -> bool {
    let redis: [&[u8]; 4] = [b"+PONG", b"-NOAUTH", b"-ERR", b"-DENIED"];
    redis.iter().any(|start| answer.starts_with(start))
}

pub const KIND: Kind = Kind {
    name: "redis",
    title: "Redis",
    schemes: &["redis", "rediss", "redis+unix"],
    shown_as: &["redis", "rediss", "redis+unix"],
    url_forms: &[
        "redis://[user[:password]@]host[:port][/db]",
        "rediss://…",
        "redis+unix:///path",
        "redis://host:port,host:port[,…] (a Redis Cluster; rediss://… with TLS)",
    ],
    config_table: Some("redis"),
    capabilities: CAPABILITIES,
    minimum_ttl: MIN_LEASE_TTL,
    maximum_ttl: None,
    parse: |scheme, url| super::target::parse(scheme, after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "",
    words: Words {
        password: true,
        holders_are: "entries",
        check_warns: "a Redis that may evict keys or lose them on restart",
        config_note:
            "The [redis] table serves Redis, Redis Cluster and the data nodes behind Sentinel.",
        one_url: "a Redis Cluster URL (redis://n1,n2,n3)",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

/// The sentinels' own password, a variable of Sentinel's alone.
const SENTINEL_PASSWORD: (&str, &str) = (
    "DLOCK_SENTINEL_PASSWORD",
    "The Redis sentinels' own password (redis-sentinel://); never taken from the URL.",
);

pub const SENTINEL_KIND: Kind = Kind {
    name: "redis-sentinel",
    title: "Redis Sentinel",
    schemes: &["redis-sentinel", "rediss-sentinel"],
    shown_as: &["redis-sentinel", "rediss-sentinel"],
    url_forms: &[
        "redis-sentinel://host[:port][,host[:port]…][/db]#master",
        "rediss-sentinel://…",
    ],
    config_table: Some(target::sentinel::CONFIG_TABLE),
    capabilities: CAPABILITIES,
    minimum_ttl: MIN_LEASE_TTL,
    maximum_ttl: None,
    parse: |scheme, url| target::sentinel::parse(scheme, after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "",
    words: Words {
        password: true,
        holders_are: "entries",
        config_note: "The [redis-sentinel] table's `password_file` is the sentinels' own password.",
        environment: &[SENTINEL_PASSWORD],
        one_url: "Redis behind Sentinel (redis-sentinel://s1,s2,s3#master)",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

impl Place for RedisTarget {
    fn kind(&self) -> &'static Kind {
        if self.sentinel.is_some() {
            &SENTINEL_KIND
        } else {
            &KIND
        }
    }

    fn scheme(&self) -> &'static str {
        RedisTarget::scheme(self)
    }

    fn identity(&self) -> String {
        RedisTarget::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        super::target::complete(self, file)
    }

    fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        RedisTarget::check_prefix(self, prefix)
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(RedisBackend::new(self, &common.prefix, &common.display_url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_server_is_told_by_its_answer_to_ping() {
        assert!(answers_ping(b"+PONG\r\n"));
        assert!(answers_ping(b"-NOAUTH Authentication required.\r\n"));
        assert!(!answers_ping(b"ERROR\r\n"));
        assert!(!answers_ping(b"HTTP/1.1 400 Bad Request\r\n"));
    }
}
