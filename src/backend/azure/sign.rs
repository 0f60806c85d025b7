//! Azure Storage's Shared Key authorization: the string a request is signed over (its verb,
//! the eleven standard headers, the `x-ms-*` headers, the account and the resource) and its
//! HMAC-SHA256 under the account key. A shared access signature (SAS) is a query string the
//! request carries instead, with no `Authorization` header (`blob.rs`).

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The standard headers the string to sign lists by value, in its order (after the verb).
const STANDARD: [&str; 11] = [
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
];

/// The string Shared Key signs for a request: `verb`, `headers` (names in any case, as sent;
/// `Content-Length` as the client sends it), `path` (the URL's path as sent, percent-encoded)
/// and `query` (decoded pairs) of `account`'s resource.
pub fn string_to_sign(
    verb: &str,
    headers: &[(String, String)],
    account: &str,
    path: &str,
    query: &[(String, String)],
) -> String {
    let value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| v.as_str())
    };
    let mut out = String::new();
    out.push_str(verb);
    out.push('\n');
    for name in STANDARD {
        let v = value(name);
        // Since version 2015-02-21 a zero length is signed as an empty string.
        if !(name == "content-length" && v == "0") {
            out.push_str(v);
        }
        out.push('\n');
    }
    let mut ms: Vec<(String, &str)> = headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
        .filter(|(n, _)| n.starts_with("x-ms-"))
        .collect();
    ms.sort();
    for (name, v) in ms {
        out.push_str(&name);
        out.push(':');
        out.push_str(v);
        out.push('\n');
    }
    out.push('/');
    out.push_str(account);
    out.push_str(path);
    let mut params: Vec<(String, &str)> = query
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
        .collect();
    params.sort();
    for (name, v) in params {
        out.push('\n');
        out.push_str(&name);
        out.push(':');
        out.push_str(v);
    }
    out
}

/// The `Authorization` header's value for `to_sign` under `account`'s decoded `key`.
pub fn authorization(account: &str, key: &[u8], to_sign: &str) -> String {
    let signature = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(to_sign.as_bytes());
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        }
        // HMAC takes a key of any length: not reached.
        Err(_) => String::new(),
    };
    format!("SharedKey {account}:{signature}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Azurite's well-known development key (published in Azure's documentation).
    const AZURITE_KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// The string and signature of a container creation, as Python's `hmac` computes them
    /// from Azure's rules (the benchmark's `AzureServer`, which Azurite accepts).
    #[test]
    fn signs_as_the_reference_implementation_does() {
        let headers = pairs(&[
            ("x-ms-version", "2021-08-06"),
            ("x-ms-date", "Mon, 07 Dec 2026 18:00:00 GMT"),
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", "0"),
        ]);
        let to_sign = string_to_sign(
            "PUT",
            &headers,
            "devstoreaccount1",
            "/devstoreaccount1/dlock-locks",
            &pairs(&[("restype", "container")]),
        );
        assert_eq!(
            to_sign,
            "PUT\n\n\n\n\napplication/octet-stream\n\n\n\n\n\n\n\
             x-ms-date:Mon, 07 Dec 2026 18:00:00 GMT\nx-ms-version:2021-08-06\n\
             /devstoreaccount1/devstoreaccount1/dlock-locks\nrestype:container"
        );
        let key = base64::engine::general_purpose::STANDARD
            .decode(AZURITE_KEY)
            .unwrap();
        assert_eq!(
            authorization("devstoreaccount1", &key, &to_sign),
            "SharedKey devstoreaccount1:6vw+twzXT2dfwEORR9s0VbCughtni1aemUAAFh2FNbo="
        );
    }

    /// Query names are lower-cased and sorted; standard headers are signed by value in their
    /// order, whatever order they were given in.
    #[test]
    fn query_and_headers_are_canonical() {
        let headers = pairs(&[
            ("If-None-Match", "*"),
            ("Content-Length", "12"),
            ("x-ms-meta-dlocktoken", " 7 "),
            ("X-MS-Lease-Action", "acquire"),
        ]);
        let to_sign = string_to_sign(
            "PUT",
            &headers,
            "acct",
            "/c/b",
            &pairs(&[("comp", "lease"), ("Alpha", "1")]),
        );
        assert_eq!(
            to_sign,
            "PUT\n\n\n12\n\n\n\n\n\n*\n\n\nx-ms-lease-action:acquire\nx-ms-meta-dlocktoken:7\n\
             /acct/c/b\nalpha:1\ncomp:lease"
        );
    }
}
