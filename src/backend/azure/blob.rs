//! The requests dlock makes of the Blob service, on one keep-alive connection
//! (`kit::http`): each is addressed, dated, versioned and signed (Shared Key) or carries the
//! SAS, and its answer is read into what happened ([`Failure`]): not sent, sent with no whole
//! answer (its outcome unknown), or the service's own error code.
//!
//! Every request is logged at `-vv` (`azure: <operation> -> <status>`), never its query
//! (which may carry the SAS) nor its headers (the signature): that log is how the requests
//! of an operation are counted (docs/backends/azure.md).

use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::kit::http::{Client, Origin, Request, Response, SendError};

use super::account::{Account, Credential};
use super::sign;
use super::target::AzureTarget;

/// The Blob service version dlock speaks: it has leases with proposed ids, conditional
/// headers on every operation, and `x-ms-error-code` on every error.
pub const VERSION: &str = "2021-08-06";

/// The Blob service in messages.
pub const SERVER: crate::wording::Server = crate::wording::Server {
    listening: "Azure Blob service",
    name: "Azure Blob",
    port: 443,
};

/// What went wrong with one request.
#[derive(Debug)]
pub enum Failure {
    /// The request never reached the service (connecting failed).
    NotSent(String),
    /// Sent, and no whole answer came: what it did is unknown.
    Unknown(String),
    /// The service answered `status` with its error `code` (empty when it gave none).
    Answer { status: u16, code: String },
}

impl Failure {
    /// The service's error code, when it answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            Failure::Answer { code, .. } => Some(code.as_str()),
            _ => None,
        }
    }

    /// Whether asking again may answer otherwise: no answer, or the service busy or failing.
    pub fn is_transient(&self) -> bool {
        match self {
            Failure::NotSent(_) | Failure::Unknown(_) => true,
            Failure::Answer { status, .. } => *status == 408 || *status == 429 || *status >= 500,
        }
    }

    /// In words, for a renewal's failure (the keeper's log).
    pub fn describe(&self) -> String {
        match self {
            Failure::NotSent(why) => format!("not sent: {why}"),
            Failure::Unknown(why) => format!("no answer: {why}"),
            Failure::Answer { status, code } => format!("HTTP {status} {code}"),
        }
    }

    /// The error for the user: 77 for refused credentials, 78 for a missing container or a
    /// request the service calls invalid, 69 for the rest; with the service's own code.
    pub fn into_error(self, blobs: &Blobs) -> Error {
        let display = &blobs.display;
        match self {
            Failure::NotSent(why) => Error::Unavailable(format!("cannot reach {display}: {why}")),
            Failure::Unknown(why) => Error::Unavailable(format!("{display}: no answer: {why}")),
            Failure::Answer { status: 403, code } => Error::Permission(format!(
                "{display} refused the request ({code}): check the account's key or SAS \
                 (AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN) \
                 and what it permits (read, write, delete and list on the container's blobs)"
            )),
            Failure::Answer { status: 404, code } if code == "ContainerNotFound" => {
                Error::Config(format!(
                    "{display}: the container '{}' does not exist ({code}); dlock never creates \
                     one: create it (az storage container create --name {})",
                    blobs.container, blobs.container
                ))
            }
            Failure::Answer { status, code } if code.is_empty() => Error::Unavailable(format!(
                "{display} answered HTTP {status} without an Azure error code: is the \
                 endpoint an Azure Blob service?"
            )),
            Failure::Answer { status: 400, code } => Error::Config(format!(
                "{display} refused the request as invalid (HTTP 400 {code})"
            )),
            Failure::Answer { status, code } => {
                Error::Unavailable(format!("{display} answered HTTP {status} {code}"))
            }
        }
    }
}

/// One request about a blob (`blob: None`: the container itself), with `query` (decoded
/// pairs) and `headers`; `operation` names it in the log.
pub struct Call<'a> {
    operation: &'a str,
    method: http::Method,
    blob: Option<&'a str>,
    query: &'a [(&'a str, &'a str)],
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// One container of one account, on one connection.
#[derive(Clone)]
pub struct Blobs {
    client: Client,
    account: Account,
    pub container: String,
    /// The container as messages name it (`az://c at http://…`).
    pub display: String,
}

impl Blobs {
    pub fn new(target: &AzureTarget) -> Result<Blobs, Error> {
        let Some(account) = target.account.clone() else {
            return Err(Error::Internal(
                "an Azure target without its account".into(),
            ));
        };
        let origin = Origin::parse(&account.endpoint.origin()).map_err(Error::Config)?;
        Ok(Blobs {
            client: Client::new(origin),
            account,
            container: target.container.clone(),
            display: target.display(),
        })
    }

    /// The error for `failure`; a request that got no HTTP answer at all may have reached
    /// another kind of server, and then that is the message (asked within `left`).
    pub async fn explain(&self, failure: Failure, left: Duration) -> Error {
        if matches!(failure, Failure::NotSent(_) | Failure::Unknown(_)) && !left.is_zero() {
            let endpoint = &self.account.endpoint;
            let (host, port) = (&endpoint.host, endpoint.port);
            if let Some(what) = crate::sniff::other_than(host, port, left, &super::kind::KIND).await
            {
                return crate::wording::not_a(
                    &crate::kit::url::join_host_port(host, port),
                    &SERVER,
                    &format!("it answers like {what}"),
                );
            }
        }
        failure.into_error(self)
    }

    /// Send `call` within `limit`.
    async fn send(&self, call: Call<'_>, limit: Duration) -> Result<Response, Failure> {
        let Call {
            operation,
            method,
            blob,
            query,
            mut headers,
            body,
        } = call;
        let mut path = format!("{}/{}", self.account.endpoint.base, self.container);
        if let Some(blob) = blob {
            path.push('/');
            path.push_str(&encode_path(blob));
        }
        let mut query_text: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", encode_value(v)))
            .collect();
        headers.push(("x-ms-version".into(), VERSION.into()));
        headers.push((
            "x-ms-date".into(),
            httpdate::fmt_http_date(SystemTime::now()),
        ));
        match &self.account.credential {
            Credential::Key(key) => {
                let mut signed = headers.clone();
                signed.push(("Content-Length".into(), body.len().to_string()));
                let pairs: Vec<(String, String)> = query
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
                let to_sign = sign::string_to_sign(
                    method.as_str(),
                    &signed,
                    &self.account.name,
                    &path,
                    &pairs,
                );
                headers.push((
                    "Authorization".into(),
                    sign::authorization(&self.account.name, &key.0, &to_sign),
                ));
            }
            Credential::Sas(sas) => query_text.push(sas.expose().to_owned()),
        }
        let path_and_query = if query_text.is_empty() {
            path
        } else {
            format!("{path}?{}", query_text.join("&"))
        };
        let request = Request {
            method,
            path_and_query,
            headers,
            body,
        };
        let sent = self.client.send(request, limit).await;
        let answer = match sent {
            Ok(response) => response,
            Err(SendError::NotSent(why)) => {
                tracing::debug!("azure: {operation} -> not sent ({why})");
                return Err(Failure::NotSent(why));
            }
            Err(SendError::Unknown(why)) => {
                tracing::debug!("azure: {operation} -> no answer ({why})");
                return Err(Failure::Unknown(why));
            }
        };
        tracing::debug!("azure: {operation} -> {}", answer.status);
        if answer.status < 300 {
            return Ok(answer);
        }
        let code = answer
            .header("x-ms-error-code")
            .or_else(|| answer.error_code())
            .map(|code| crate::logging::printable(code).into_owned())
            .unwrap_or_default();
        Err(Failure::Answer {
            status: answer.status,
            code,
        })
    }

    /// A lease operation (`x-ms-lease-action: action`) with more headers.
    pub async fn lease(
        &self,
        blob: &str,
        action: &str,
        mut headers: Vec<(String, String)>,
        limit: Duration,
    ) -> Result<Response, Failure> {
        headers.push(("x-ms-lease-action".into(), action.into()));
        let operation = format!("lease {action}");
        self.send(
            Call {
                operation: &operation,
                method: http::Method::PUT,
                blob: Some(blob),
                query: &[("comp", "lease")],
                headers,
                body: Vec::new(),
            },
            limit,
        )
        .await
    }

    /// Put a block blob `body` with `headers` (a lease id, metadata, conditions).
    pub async fn put(
        &self,
        blob: &str,
        mut headers: Vec<(String, String)>,
        body: Vec<u8>,
        limit: Duration,
    ) -> Result<Response, Failure> {
        headers.push(("x-ms-blob-type".into(), "BlockBlob".into()));
        headers.push(("Content-Type".into(), "application/json".into()));
        self.send(
            Call {
                operation: "put blob",
                method: http::Method::PUT,
                blob: Some(blob),
                query: &[],
                headers,
                body,
            },
            limit,
        )
        .await
    }

    /// Get a blob: its body, metadata and lease state.
    pub async fn get(&self, blob: &str, limit: Duration) -> Result<Response, Failure> {
        self.send(
            Call {
                operation: "get blob",
                method: http::Method::GET,
                blob: Some(blob),
                query: &[],
                headers: Vec::new(),
                body: Vec::new(),
            },
            limit,
        )
        .await
    }

    /// A blob's properties: its metadata and lease state, without its body.
    pub async fn head(&self, blob: &str, limit: Duration) -> Result<Response, Failure> {
        self.send(
            Call {
                operation: "get blob properties",
                method: http::Method::HEAD,
                blob: Some(blob),
                query: &[],
                headers: Vec::new(),
                body: Vec::new(),
            },
            limit,
        )
        .await
    }

    /// The container's properties (that it exists, and that the credential may read it).
    pub async fn container_properties(&self, limit: Duration) -> Result<Response, Failure> {
        self.send(
            Call {
                operation: "get container properties",
                method: http::Method::GET,
                blob: None,
                query: &[("restype", "container")],
                headers: Vec::new(),
                body: Vec::new(),
            },
            limit,
        )
        .await
    }

    /// One page of the blobs whose names begin with `prefix`, from `marker`.
    pub async fn list_page(
        &self,
        prefix: &str,
        marker: &str,
        limit: Duration,
    ) -> Result<Response, Failure> {
        let mut query = vec![
            ("comp", "list"),
            ("include", "metadata"),
            ("prefix", prefix),
            ("restype", "container"),
        ];
        if !marker.is_empty() {
            query.push(("marker", marker));
        }
        self.send(
            Call {
                operation: "list blobs",
                method: http::Method::GET,
                blob: None,
                query: &query,
                headers: Vec::new(),
                body: Vec::new(),
            },
            limit,
        )
        .await
    }

    /// Delete a blob (`check`'s probe).
    pub async fn delete(
        &self,
        blob: &str,
        headers: Vec<(String, String)>,
        limit: Duration,
    ) -> Result<Response, Failure> {
        self.send(
            Call {
                operation: "delete blob",
                method: http::Method::DELETE,
                blob: Some(blob),
                query: &[],
                headers,
                body: Vec::new(),
            },
            limit,
        )
        .await
    }
}

/// A blob name as a URL path: `/` kept, everything but unreserved characters escaped.
fn encode_path(blob: &str) -> String {
    let mut out = String::with_capacity(blob.len());
    for byte in blob.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A query value, escaped.
fn encode_value(value: &str) -> String {
    encode_path(value).replace('/', "%2F")
}

/// A header `name` of `response` as a number.
pub fn number(response: &Response, name: &str) -> Option<u64> {
    response.header(name)?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_once_into_the_path() {
        assert_eq!(encode_path("f/dlock/a%2Fb c"), "f/dlock/a%252Fb%20c");
        assert_eq!(encode_value("dlock/x"), "dlock%2Fx");
    }
}
