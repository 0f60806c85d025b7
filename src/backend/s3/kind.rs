//! The S3 backend as the registry knows it.

use std::time::Duration;

use super::{S3Backend, S3Target};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words,
};

/// The shortest `--ttl` on S3: expiry is judged in the server's whole seconds, so a waiter
/// sees a dead holder's lease end up to TTL + 2 s after its last write; and a renewal (every
/// TTL/3, each attempt given TTL/6) is an HTTPS request to a remote service: 5 s gives each
/// attempt 0.8 s.
pub const MIN_TTL: Duration = Duration::from_secs(5);

/// S3 answers a request it cannot read with an XML error naming its code.
const RECOGNISED: Recognition = Recognition {
    called: "an S3 server",
    probes: &[Probe {
        send: Some(b"GET / HTTP/1.0\r\n\r\n"),
        after_others: true,
        read: |answer| {
            let text = String::from_utf8_lossy(answer);
            text.starts_with("HTTP/1.")
                && (text.contains("<ListAllMyBucketsResult")
                    || text.contains("<Code>AccessDenied</Code>")
                    || text.contains("<Code>InvalidRequest</Code>")
                    || text.contains("AmazonS3"))
        },
        example: b"HTTP/1.1 403 Forbidden\r\nServer: AmazonS3\r\n\r\n<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code></Error>",
    }],
};

pub const KIND: Kind = Kind {
    name: "s3",
    title: "S3",
    schemes: &["s3"],
    shown_as: &["s3"],
    url_forms: &["s3://bucket[/prefix][?region=…&endpoint=URL]"],
    config_table: None,
    capabilities: Capabilities {
        lease: true,
        // Waiters poll; whoever reads first after a release gets the lock.
        fifo: false,
        records_finished: true,
        limit: true,
        shared: false,
        host_queue: true,
        servers: Servers::One,
    },
    minimum_ttl: MIN_TTL,
    maximum_ttl: None,
    parse: |_, url| super::target::parse(after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "S3 keeps no queue, so polling readers could keep a writer waiting for ever",
    words: Words {
        holders_are: "entries",
        environment: &[
            (
                "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN",
                "S3 credentials (s3://)",
            ),
            (
                "AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE",
                "the AWS profile and shared files S3 credentials and region are read from (s3://)",
            ),
            (
                "AWS_REGION, AWS_DEFAULT_REGION",
                "the S3 region (s3://; ?region= in the URL overrides it)",
            ),
            (
                "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL",
                "an S3-compatible server's URL (s3://; ?endpoint= in the URL overrides it)",
            ),
        ],
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

impl Place for S3Target {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn identity(&self) -> String {
        S3Target::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        let _ = file;
        S3Target::complete(self)
    }

    fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        if prefix.len() > 100 {
            return Err(format!("'{prefix}' is longer than 100 bytes"));
        }
        Ok(())
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(S3Backend::new(self, &common.prefix))
    }
}
