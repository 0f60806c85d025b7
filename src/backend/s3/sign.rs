//! AWS Signature Version 4 for S3 requests (the header form: `Authorization`,
//! `x-amz-date`, `x-amz-content-sha256`), written against AWS's published description and
//! checked against its example (the S3 documentation's GET Object example, in the tests).
//!
//! The signature covers the method, the path and query, every header sent (Host included)
//! and the body's SHA-256, under a key derived from the secret, the day, the region and the
//! service. The date is this host's clock: S3 accepts a signature within 15 minutes of its
//! own, and a host further off is told so (`client.rs`, `RequestTimeTooSkewed`).

use std::time::SystemTime;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::secrets::Secret;

/// What signs: an access key and its secret, with the session token of temporary
/// credentials.
#[derive(Clone, Debug)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

/// The hex SHA-256 of `bytes` (the payload hash S3 checks against the body).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

/// `20130524T000000Z`: the `x-amz-date` form of `at` (UTC, whole seconds).
pub fn amz_date(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect()
}

/// Percent-encode as SigV4 wants it: unreserved characters (`A-Za-z0-9-._~`) stay, every
/// other byte is `%XX` in upper case; `/` stays where `keep_slash` (a path).
pub fn uri_encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && byte == b'/')
        {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// One request to sign: `path` already URI-encoded, `query` already in canonical form
/// (pairs encoded and sorted by key), `headers` every header that will be sent but
/// `Authorization`, Host and `x-amz-*` included.
pub struct ToSign<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub headers: &'a [(String, String)],
    pub payload_sha256: &'a str,
    pub amz_date: &'a str,
    pub region: &'a str,
}

/// The `Authorization` header's value for `request`.
pub fn authorization(credentials: &Credentials, request: &ToSign<'_>) -> String {
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    headers.sort();
    let canonical_headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let signed_headers = headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_request = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        request.method, request.path, request.query, request.payload_sha256
    );
    let day = request.amz_date.get(..8).unwrap_or_default();
    let scope = format!("{day}/{}/s3/aws4_request", request.region);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        request.amz_date,
        sha256_hex(canonical_request.as_bytes())
    );
    let secret = format!("AWS4{}", credentials.secret_access_key.expose());
    let key = hmac(secret.as_bytes(), day.as_bytes());
    let key = hmac(&key, request.region.as_bytes());
    let key = hmac(&key, b"s3");
    let key = hmac(&key, b"aws4_request");
    let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope},SignedHeaders={signed_headers},Signature={signature}",
        credentials.access_key_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The S3 documentation's example "GET Object" (sig-v4-header-based-auth).
    #[test]
    fn signs_the_s3_documentations_get_object_example() {
        let credentials = Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into()),
            session_token: None,
        };
        let empty = sha256_hex(b"");
        assert_eq!(
            empty,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let headers = vec![
            (
                "Host".to_owned(),
                "examplebucket.s3.amazonaws.com".to_owned(),
            ),
            ("Range".to_owned(), "bytes=0-9".to_owned()),
            ("x-amz-content-sha256".to_owned(), empty.clone()),
            ("x-amz-date".to_owned(), "20130524T000000Z".to_owned()),
        ];
        let value = authorization(
            &credentials,
            &ToSign {
                method: "GET",
                path: "/test.txt",
                query: "",
                headers: &headers,
                payload_sha256: &empty,
                amz_date: "20130524T000000Z",
                region: "us-east-1",
            },
        );
        assert_eq!(
            value,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,\
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn dates_and_encodings_are_sigv4s() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_369_353_600);
        assert_eq!(amz_date(at), "20130524T000000Z");
        assert_eq!(uri_encode("a b/c~%", true), "a%20b/c~%25");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }
}
