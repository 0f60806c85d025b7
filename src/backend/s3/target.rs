//! Where the locks are: `s3://BUCKET[/PREFIX][?region=…&endpoint=…&path-style=1]`, and the
//! settings the AWS tools read from the environment and the shared files (`settings.rs`),
//! filled in by [`S3Target::complete`]: credentials, region, endpoint, addressing.
//!
//! Path-style addressing (`https://endpoint/BUCKET/key`) is used where the endpoint's host is
//! an IP address or `localhost`, as the AWS CLI does, or where `?path-style=1` asks for it;
//! else virtual-hosted (`https://BUCKET.endpoint/key`).

use std::net::IpAddr;

use crate::error::Error;
use crate::kit::http::Origin;
use crate::kit::url::Params;

use super::settings::{self, Settings};

/// What the URL's query takes.
const PARAMS: Params = Params {
    url: "an s3 URL",
    keys: &[
        ("region", "region=REGION"),
        ("endpoint", "endpoint=URL"),
        ("path-style", "path-style=1"),
    ],
    aliases: &[],
    fold: false,
    note: "credentials come from the AWS variables or shared files",
};

/// A validated `s3://` URL, completed with the settings ([`S3Target::complete`]).
#[derive(Clone, Debug)]
pub struct S3Target {
    pub bucket: String,
    /// The URL's path after the bucket, without slashes at either end (may be empty).
    pub prefix: String,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub path_style: Option<bool>,
    /// Filled in by `complete`.
    pub settings: Option<Settings>,
}

/// `//BUCKET[/PREFIX][?query]` (what follows `s3:`).
pub fn parse(rest: &str) -> Result<S3Target, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or("expected s3://BUCKET[/PREFIX]")?;
    if after.contains('#') {
        return Err("s3 URLs take no fragment".into());
    }
    let (location, query) = after.split_once('?').unwrap_or((after, ""));
    let mut target = S3Target {
        bucket: String::new(),
        prefix: String::new(),
        region: None,
        endpoint: None,
        path_style: None,
        settings: None,
    };
    for (key, value) in crate::kit::url::parse_query(query, &PARAMS)? {
        match key {
            "region" => {
                if value.is_empty()
                    || !value
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                {
                    return Err("region takes a region name such as us-east-1".into());
                }
                target.region = Some(value);
            }
            "endpoint" => {
                Origin::parse(&value).map_err(|e| format!("endpoint: {e}"))?;
                target.endpoint = Some(value);
            }
            _ => {
                target.path_style = Some(match value.as_str() {
                    "1" | "true" | "yes" => true,
                    "0" | "false" | "no" => false,
                    _ => return Err("path-style takes 1 or 0".into()),
                });
            }
        }
    }
    if location.contains('@') {
        return Err(
            "s3 URLs take no user or password: credentials come from AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY, or AWS_PROFILE and the shared files"
                .into(),
        );
    }
    let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
    check_bucket(bucket)?;
    let prefix = crate::lock::decode_component(prefix.trim_matches('/'))
        .ok_or("bad percent-encoding in the URL's path")?;
    if prefix.split('/').any(|part| part == "." || part == "..") && !prefix.is_empty() {
        return Err("the URL's prefix may not contain . or .. parts".into());
    }
    target.bucket = bucket.to_owned();
    target.prefix = prefix;
    Ok(target)
}

/// S3's bucket naming rules (general purpose buckets): 3 to 63 characters of lower-case
/// letters, digits, `.` and `-`, beginning and ending with a letter or a digit, no `..`.
fn check_bucket(bucket: &str) -> Result<(), String> {
    let rule = "a bucket name is 3 to 63 lower-case letters, digits, '.' and '-', beginning \
                and ending with a letter or digit";
    if bucket.is_empty() {
        return Err("expected s3://BUCKET[/PREFIX]: the URL names no bucket".into());
    }
    let plain = bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if !plain {
        // Not shown: the text may be something else pasted in the wrong place.
        return Err(format!("the URL's bucket name is not valid: {rule}"));
    }
    let ends_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !(3..=63).contains(&bucket.len())
        || !ends_ok(bucket.bytes().next())
        || !ends_ok(bucket.bytes().last())
        || bucket.contains("..")
    {
        return Err(format!("'{bucket}' is not a valid bucket name: {rule}"));
    }
    Ok(())
}

/// Where requests for a bucket go.
#[derive(Clone, Debug)]
pub struct Addressing {
    /// The URL requests are sent to (`https://BUCKET.s3.us-east-1.amazonaws.com` or the
    /// endpoint itself for path style).
    pub origin: String,
    /// What comes before a key in the path: `/BUCKET/` for path style, `/` else.
    pub path_base: String,
}

impl S3Target {
    /// The same bucket and prefix on the same endpoint, for reentrancy.
    pub fn identity(&self) -> String {
        let endpoint = self
            .settings
            .as_ref()
            .map(|s| s.endpoint.clone())
            .or_else(|| self.endpoint.clone())
            .unwrap_or_default();
        format!("s3://{}/{}|{endpoint}", self.bucket, self.prefix)
    }

    /// Read the settings from the environment and the AWS shared files.
    pub fn complete(&mut self) -> Result<(), Error> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let settings = settings::resolve(
            &env,
            self.region.as_deref(),
            self.endpoint.as_deref(),
            self.path_style,
        )?;
        self.settings = Some(settings);
        Ok(())
    }

    /// `s3://bucket/prefix` as messages name it.
    pub fn display(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// How `bucket` is reached at `endpoint`.
pub fn addressing(
    endpoint: &Origin,
    scheme_https: bool,
    bucket: &str,
    path_style: bool,
) -> Addressing {
    let scheme = if scheme_https { "https" } else { "http" };
    let path_style = path_style || wants_path_style(&endpoint.host) || bucket.contains('.');
    if path_style {
        Addressing {
            origin: format!("{scheme}://{}", endpoint.host_header()),
            path_base: format!("/{bucket}/"),
        }
    } else {
        Addressing {
            origin: format!("{scheme}://{bucket}.{}", endpoint.host_header()),
            path_base: "/".into(),
        }
    }
}

/// An endpoint whose host is an IP address or `localhost` has no names for buckets under it.
fn wants_path_style(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok() || host.eq_ignore_ascii_case("localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_a_prefix_and_options() {
        let t = parse("//ci-locks/dlock/x").unwrap();
        assert_eq!(
            (t.bucket.as_str(), t.prefix.as_str()),
            ("ci-locks", "dlock/x")
        );
        let t = parse("//ci-locks").unwrap();
        assert_eq!(t.prefix, "");
        let t =
            parse("//b-1?region=eu-west-1&endpoint=http://127.0.0.1:9000&path-style=1").unwrap();
        assert_eq!(t.region.as_deref(), Some("eu-west-1"));
        assert_eq!(t.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(t.path_style, Some(true));
    }

    #[test]
    fn bad_buckets_and_options_are_refused() {
        for bad in [
            "//",
            "//ab",
            "//Caps",
            "//a..b",
            "//-ab",
            "//ab-",
            "//under_score",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse(&format!("//{}", "a".repeat(64))).is_err());
        assert!(parse("//bucket?region=EU").is_err());
        assert!(parse("//bucket?endpoint=ftp://x").is_err());
        assert!(parse("//key:secret@bucket").is_err());
        let e = parse("//bucket?bogus=1").unwrap_err();
        assert!(
            e.starts_with("unknown URL parameter 'bogus'; an s3 URL takes"),
            "{e}"
        );
    }

    #[test]
    fn ip_and_localhost_endpoints_use_path_style() {
        let local = Origin::parse("http://127.0.0.1:9000").unwrap();
        let a = addressing(&local, false, "b", false);
        assert_eq!(
            (a.origin.as_str(), a.path_base.as_str()),
            ("http://127.0.0.1:9000", "/b/")
        );
        let aws = Origin::parse("https://s3.us-east-1.amazonaws.com").unwrap();
        let a = addressing(&aws, true, "b", false);
        assert_eq!(a.origin, "https://b.s3.us-east-1.amazonaws.com");
        assert_eq!(a.path_base, "/");
        let a = addressing(&aws, true, "b", true);
        assert_eq!(a.path_base, "/b/");
    }
}
