//! The Azure Blob backend as the registry knows it.

use super::{AzureBackend, AzureTarget, MAX_TTL, MIN_TTL};
use crate::config::FileConfig;
use crate::error::Error;
use crate::kind::{
    after_scheme, Capabilities, Common, DynBackend, Kind, Place, Probe, Recognition, Servers,
    Target, Words,
};

/// The Blob service answers any HTTP request with its request id (Azure) or names itself
/// (Azurite, which answers a request it cannot route with its `Server` header only).
const RECOGNISED: Recognition = Recognition {
    called: "an Azure Blob server",
    probes: &[Probe {
        send: Some(b"GET /?comp=list HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
        after_others: true,
        read: names_azure,
        example: b"HTTP/1.1 400 Bad Request\r\nServer: Azurite-Blob/3.37.0\r\n\r\n",
    }],
};

fn names_azure(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer).to_ascii_lowercase();
    text.starts_with("http/")
        && (text.contains("\r\nx-ms-request-id:")
            || text.contains("\r\nserver: azurite-blob")
            || text.contains("\r\nserver: windows-azure-blob"))
}

pub const KIND: Kind = Kind {
    name: "az",
    title: "Azure Blob",
    schemes: &["az"],
    shown_as: &["az"],
    url_forms: &["az://container[/folder]"],
    config_table: None,
    capabilities: Capabilities {
        lease: true,
        // Waiters poll; whoever asks first after a release gets the lock.
        fifo: false,
        records_finished: true,
        limit: true,
        shared: false,
        host_queue: true,
        servers: Servers::Quorum,
    },
    minimum_ttl: MIN_TTL,
    maximum_ttl: Some(MAX_TTL),
    parse: |_, url| super::target::parse(after_scheme(url)).map(Target::new),
    recognises: None,
    no_shared_because: "a blob has one lease at a time, and the service keeps no list of \
                        readers a writer could wait out",
    words: Words {
        holders_are: "leases",
        environment: &[
            (
                "AZURE_STORAGE_CONNECTION_STRING",
                "The Azure Storage account, its blob endpoint and its key or SAS (az:// URLs).",
            ),
            (
                "AZURE_STORAGE_ACCOUNT",
                "The Azure Storage account, with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN \
                 (az:// URLs).",
            ),
            ("AZURE_STORAGE_KEY", "The account's key (az:// URLs)."),
            (
                "AZURE_STORAGE_SAS_TOKEN",
                "A shared access signature for the container (az:// URLs).",
            ),
        ],
        one_url: "az://container (Azure Storage keeps every blob in three synchronous copies)",
        ..Words::NONE
    },
    server: Some(RECOGNISED),
};

impl Place for AzureTarget {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn identity(&self) -> String {
        AzureTarget::identity(self)
    }

    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        let _ = file;
        AzureTarget::complete(self)
    }

    fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        if prefix.is_empty() || prefix.len() > 200 {
            return Err(format!(
                "'{prefix}' must be 1 to 200 bytes (it is part of the blobs' names)"
            ));
        }
        Ok(())
    }

    fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        Box::new(AzureBackend::new(self, &common.prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blob_service_is_told_by_its_answers() {
        assert!(names_azure(
            b"HTTP/1.1 403 Server failed to authenticate\r\nx-ms-request-id: 1\r\n\r\n"
        ));
        assert!(names_azure(
            KIND.server.map_or(b"", |s| s.probes[0].example)
        ));
        assert!(!names_azure(
            b"HTTP/1.1 404 Not Found\r\nServer: nginx\r\n\r\n"
        ));
        assert!(!names_azure(b"-ERR unknown command\r\n"));
    }
}
