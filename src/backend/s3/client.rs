//! S3's requests as dlock sends them (GetObject, conditional PutObject, DeleteObject,
//! ListObjectsV2), signed (`sign.rs`) and sent over the kit's HTTP client, and what their
//! answers mean: an object with its ETag and the server's `Last-Modified` and `Date` (whole
//! seconds), a condition that failed, a server to retry (throttling, its own errors), or an
//! error in dlock's words with the server's own code.

use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::kit::http::{Client, Origin, Request, Response, SendError};

use super::settings::Settings;
use super::sign::{self, Credentials, ToSign};
use super::target::{addressing, S3Target};

pub use listing::Listing;

mod listing;

/// The most bytes a lock object may hold (a `--limit 1024` lock's holders fit many times).
pub const MAX_BODY: usize = 4 << 20;

/// An object as a GET found it.
#[derive(Clone, Debug)]
pub struct Object {
    pub body: Vec<u8>,
    pub etag: String,
    /// `Last-Modified`, Unix seconds (the server's clock).
    pub last_modified: u64,
    /// The answer's `Date`, Unix seconds (the server's clock).
    pub date: u64,
}

/// What a GET found.
#[derive(Clone, Debug)]
pub enum Got {
    Found(Object),
    /// No such object; the answer's `Date`.
    Missing {
        date: u64,
    },
}

/// The condition a PUT is made on.
#[derive(Clone, Debug)]
pub enum Cond {
    /// Create only: `If-None-Match: *`.
    Absent,
    /// Replace only this version: `If-Match: ETAG`.
    Matches(String),
    /// None: only for objects no lock depends on (a waiter's registration, check's probe).
    Always,
}

/// What a conditional PUT did.
#[derive(Clone, Debug)]
pub enum Put {
    /// Written; the new ETag.
    Done(String),
    /// The condition failed (412 PreconditionFailed), or a concurrent conditional write won
    /// (409 ConditionalRequestConflict): somebody wrote in between.
    Lost,
}

/// Why a request did not give an answer dlock can use.
#[derive(Debug)]
pub enum Failure {
    /// The request never reached the server (connecting failed).
    NotSent(String),
    /// Sent, and no whole answer: what it did is unknown.
    Unknown(String),
    /// The server asks to be tried again later (503 SlowDown, 500 InternalError, 503).
    Retry(String),
    /// An answer that ends the operation.
    Refused(Error),
}

impl Failure {
    /// The failure as the operation's error, where it ends it.
    pub fn into_error(self, display: &str) -> Error {
        match self {
            Failure::NotSent(why) => Error::Unavailable(format!("cannot reach {display}: {why}")),
            Failure::Unknown(why) => Error::Unavailable(format!("{display}: {why}")),
            Failure::Retry(why) => Error::Unavailable(format!("{display}: {why}")),
            Failure::Refused(e) => e,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Failure::NotSent(why) | Failure::Unknown(why) | Failure::Retry(why) => why.clone(),
            Failure::Refused(e) => e.to_string(),
        }
    }
}

/// The client of one bucket.
#[derive(Clone)]
pub struct S3 {
    http: Client,
    host: String,
    path_base: String,
    credentials: Credentials,
    region: String,
    /// `s3://bucket/prefix` for messages.
    pub display: String,
    /// The endpoint as configured, for `check`.
    pub endpoint: String,
    pub credentials_from: String,
}

impl S3 {
    /// The client of `target` (completed: its settings read).
    pub fn new(target: &S3Target) -> Result<S3, Error> {
        let settings: &Settings = target.settings.as_ref().ok_or_else(|| {
            Error::Internal("the s3 target was opened before its settings were read".into())
        })?;
        let endpoint = Origin::parse(&settings.endpoint)
            .map_err(|e| Error::Config(format!("the S3 endpoint: {e}")))?;
        let https = endpoint.https;
        let at = addressing(&endpoint, https, &target.bucket, settings.path_style);
        let origin = Origin::parse(&at.origin)
            .map_err(|e| Error::Config(format!("the S3 endpoint: {e}")))?;
        Ok(S3 {
            host: origin.host_header(),
            http: Client::new(origin),
            path_base: at.path_base,
            credentials: settings.credentials.clone(),
            region: settings.region.clone(),
            display: target.display(),
            endpoint: settings.endpoint.clone(),
            credentials_from: settings.credentials_from.clone(),
        })
    }

    /// The region requests are signed for.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// Sign and send one request; `query` pairs unencoded.
    async fn send(
        &self,
        method: http::Method,
        key: &str,
        query: &[(&str, &str)],
        extra: Vec<(String, String)>,
        body: Vec<u8>,
        limit: Duration,
    ) -> Result<Response, Failure> {
        let path = format!("{}{}", self.path_base, sign::uri_encode(key, true));
        let mut pairs: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (sign::uri_encode(k, false), sign::uri_encode(v, false)))
            .collect();
        pairs.sort();
        let canonical_query = pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let payload = sign::sha256_hex(&body);
        let date = sign::amz_date(SystemTime::now());
        let mut headers = vec![
            ("x-amz-content-sha256".to_owned(), payload.clone()),
            ("x-amz-date".to_owned(), date.clone()),
        ];
        if let Some(token) = &self.credentials.session_token {
            headers.push(("x-amz-security-token".to_owned(), token.expose().to_owned()));
        }
        headers.extend(extra);
        let mut signed = headers.clone();
        signed.push(("host".to_owned(), self.host.clone()));
        let authorization = sign::authorization(
            &self.credentials,
            &ToSign {
                method: method.as_str(),
                path: &path,
                query: &canonical_query,
                headers: &signed,
                payload_sha256: &payload,
                amz_date: &date,
                region: &self.region,
            },
        );
        headers.push(("authorization".to_owned(), authorization));
        let path_and_query = if canonical_query.is_empty() {
            path
        } else {
            format!("{path}?{canonical_query}")
        };
        let shown = match query.iter().find(|(k, _)| *k == "prefix") {
            Some((_, prefix)) => format!("LIST {prefix}"),
            None => format!("{method} {key}"),
        };
        let answer = self
            .http
            .send(
                Request {
                    method,
                    path_and_query,
                    headers,
                    body,
                },
                limit,
            )
            .await;
        match answer {
            Ok(response) => {
                tracing::debug!("s3 request: {shown} -> {}", response.status);
                Ok(response)
            }
            Err(SendError::NotSent(why)) => {
                tracing::debug!("s3 request: {shown} -> not sent");
                Err(Failure::NotSent(why))
            }
            Err(SendError::Unknown(why)) => {
                tracing::debug!("s3 request: {shown} -> no answer");
                Err(Failure::Unknown(why))
            }
        }
    }

    /// GetObject.
    pub async fn get(&self, key: &str, limit: Duration) -> Result<Got, Failure> {
        let response = self
            .send(http::Method::GET, key, &[], Vec::new(), Vec::new(), limit)
            .await?;
        let date = self.date_of(&response)?;
        match response.status {
            200 => {
                if response.body.len() > MAX_BODY {
                    return Err(Failure::Refused(Error::Unavailable(format!(
                        "{}: the object '{key}' is larger than a lock object can be; remove it \
                         or use another --prefix",
                        self.display
                    ))));
                }
                let etag = etag_of(&response, &self.display)?;
                let last_modified = response
                    .last_modified()
                    .map(unix_seconds)
                    .ok_or_else(|| missing_header(&self.display, "Last-Modified"))?;
                Ok(Got::Found(Object {
                    body: response.body,
                    etag,
                    last_modified,
                    date,
                }))
            }
            404 if response.error_code() != Some("NoSuchBucket") => Ok(Got::Missing { date }),
            _ => Err(self.failure(&response)),
        }
    }

    /// PutObject on `cond`; `Put::Lost` when the condition failed.
    pub async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        cond: &Cond,
        limit: Duration,
    ) -> Result<Put, Failure> {
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        match cond {
            Cond::Absent => headers.push(("if-none-match".to_owned(), "*".to_owned())),
            Cond::Matches(etag) => headers.push(("if-match".to_owned(), etag.clone())),
            Cond::Always => {}
        }
        let response = self
            .send(http::Method::PUT, key, &[], headers, body, limit)
            .await?;
        match response.status {
            200 => Ok(Put::Done(etag_of(&response, &self.display)?)),
            412 => Ok(Put::Lost),
            409 if response.error_code() == Some("ConditionalRequestConflict") => Ok(Put::Lost),
            _ => Err(self.failure(&response)),
        }
    }

    /// DeleteObject (unconditional: only for objects no lock depends on).
    pub async fn delete(&self, key: &str, limit: Duration) -> Result<(), Failure> {
        let response = self
            .send(
                http::Method::DELETE,
                key,
                &[],
                Vec::new(),
                Vec::new(),
                limit,
            )
            .await?;
        match response.status {
            200 | 204 | 404 => Ok(()),
            _ => Err(self.failure(&response)),
        }
    }

    /// One page of ListObjectsV2 under `prefix` (`delimiter` `/` or none).
    pub async fn list(
        &self,
        prefix: &str,
        delimiter: bool,
        continuation: Option<&str>,
        limit: Duration,
    ) -> Result<Listing, Failure> {
        let mut query = vec![("list-type", "2"), ("prefix", prefix)];
        if delimiter {
            query.push(("delimiter", "/"));
        }
        if let Some(token) = continuation {
            query.push(("continuation-token", token));
        }
        let response = self
            .send(http::Method::GET, "", &query, Vec::new(), Vec::new(), limit)
            .await?;
        if response.status != 200 {
            return Err(self.failure(&response));
        }
        let date = self.date_of(&response)?;
        let mut listing = Listing::parse(&String::from_utf8_lossy(&response.body), date);
        listing.server = response.header("server").map(str::to_owned);
        Ok(listing)
    }

    /// The answer's `Date` in Unix seconds; an answer without one is not S3's.
    fn date_of(&self, response: &Response) -> Result<u64, Failure> {
        response
            .date()
            .map(unix_seconds)
            .ok_or_else(|| self.failure_or(response, missing_header(&self.display, "Date")))
    }

    /// The error answer `response` in dlock's words, with the server's code.
    fn failure_or(&self, response: &Response, otherwise: Failure) -> Failure {
        if response.status >= 300 {
            self.failure(response)
        } else {
            otherwise
        }
    }

    /// What an error answer means.
    pub fn failure(&self, response: &Response) -> Failure {
        let display = &self.display;
        let status = response.status;
        let code = response.error_code().unwrap_or_default().to_owned();
        let said = if code.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("{code} (HTTP {status})")
        };
        match (status, code.as_str()) {
            (503, _) | (500, _) | (429, _) => {
                Failure::Retry(format!("the server asks to retry later: {said}"))
            }
            (_, "RequestTimeTooSkewed") => {
                Failure::Refused(Error::Config(skewed(response, display)))
            }
            (
                _,
                "InvalidAccessKeyId"
                | "SignatureDoesNotMatch"
                | "AccessDenied"
                | "InvalidToken"
                | "ExpiredToken"
                | "TokenRefreshRequired",
            )
            | (403, _) => Failure::Refused(Error::Permission(format!(
                "{display}: the server refused the credentials ({said}): check the AWS \
                 credentials and the bucket's permissions (dlock needs s3:GetObject, \
                 s3:PutObject, s3:ListBucket)"
            ))),
            (_, "NoSuchBucket") => Failure::Refused(Error::Config(format!(
                "{display}: the bucket does not exist ({said}); dlock never creates one"
            ))),
            (
                _,
                "PermanentRedirect"
                | "AuthorizationHeaderMalformed"
                | "IllegalLocationConstraintException",
            )
            | (301, _) => Failure::Refused(Error::Config(format!(
                "{display}: the bucket is in another region than the one dlock signs for \
                 ({said}); set AWS_REGION or ?region= in the URL"
            ))),
            (501, _) | (_, "NotImplemented") => Failure::Refused(Error::Config(format!(
                "{display}: the server does not implement conditional writes ({said}); dlock \
                 needs If-Match and If-None-Match on PutObject and never writes without them"
            ))),
            _ => Failure::Refused(Error::Unavailable(format!(
                "{display}: unexpected answer {said}"
            ))),
        }
    }
}

/// The refusal of a request signed with a date too far from the server's.
fn skewed(response: &Response, display: &str) -> String {
    let skew = response.date().map(|server| {
        let here = SystemTime::now();
        match here.duration_since(server) {
            Ok(ahead) => format!("{} ahead of", humantime::format_duration(whole(ahead))),
            Err(behind) => format!(
                "{} behind",
                humantime::format_duration(whole(behind.duration()))
            ),
        }
    });
    let skew = skew.map_or("far from".to_owned(), |s| s);
    format!(
        "{display}: this host's clock is {skew} the server's (RequestTimeTooSkewed: S3 takes \
         a request's signature only within 15 minutes of its own clock); set this host's \
         clock right (NTP)"
    )
}

fn whole(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

fn missing_header(display: &str, header: &str) -> Failure {
    Failure::Refused(Error::Unavailable(format!(
        "{display}: the server's answer has no {header} header; dlock judges leases on the \
         server's clock and needs it"
    )))
}

/// The ETag of an answer, quotes kept (it is sent back as it came).
fn etag_of(response: &Response, display: &str) -> Result<String, Failure> {
    response
        .header("etag")
        .map(str::to_owned)
        .ok_or_else(|| missing_header(display, "ETag"))
}

/// Unix seconds of `at` (0 before the epoch).
pub fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
