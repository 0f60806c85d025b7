//! The storage account a lock's container lives in, read the way the Azure CLI reads it:
//! `AZURE_STORAGE_CONNECTION_STRING`, else `AZURE_STORAGE_ACCOUNT` with `AZURE_STORAGE_KEY`
//! or `AZURE_STORAGE_SAS_TOKEN`; the blob endpoint from the connection string
//! (`BlobEndpoint`, or `DefaultEndpointsProtocol` + `AccountName` + `EndpointSuffix`;
//! `UseDevelopmentStorage=true` is Azurite's well-known account on 127.0.0.1:10000), else
//! `https://ACCOUNT.blob.core.windows.net`, and the URL's `?endpoint=` over both.
//!
//! An endpoint whose host is an IP address or `localhost` (an emulator) is path-style: the
//! account is the first segment of every path (`http://127.0.0.1:10000/ACCOUNT/CONTAINER`),
//! as the Azure SDKs do. Neither the key nor the SAS ever appears in a message or a log line
//! (their `Debug` is `***`).

use base64::Engine;

use crate::error::Error;
use crate::secrets::Secret;

/// Azurite's development account and its published key (`UseDevelopmentStorage=true`).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const DEV_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// The variables that name an account, for the message when none is set.
pub const VARIABLES: &str = "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT with \
                             AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN";

/// How requests prove who sends them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// The account key, decoded: every request is signed (Shared Key).
    Key(KeyBytes),
    /// A shared access signature: appended to every request's query.
    Sas(Secret),
}

/// An account key's bytes; never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyBytes(pub Vec<u8>);

impl std::fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// A blob service endpoint: where requests go, and the path every container hangs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// `""`, or `/ACCOUNT` on a path-style endpoint.
    pub base: String,
}

impl Endpoint {
    /// `http[s]://host[:port][/path]`; a host that is an IP address or `localhost` without a
    /// path gets `/ACCOUNT` (path-style).
    pub fn parse(text: &str, account: &str) -> Result<Endpoint, String> {
        let (https, rest) = if let Some(rest) = text.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err("the blob endpoint must be an http:// or https:// URL".into());
        };
        if rest.contains(['?', '#', '@']) {
            return Err("the blob endpoint takes no query, fragment or user".into());
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let default = if https { 443 } else { 80 };
        let (host, port) = crate::kit::url::split_host_port(authority, default)
            .map_err(|e| format!("the blob endpoint: {e}"))?;
        let path = path.trim_end_matches('/');
        let base = if path.is_empty() && path_style(&host) {
            format!("/{account}")
        } else {
            path.to_owned()
        };
        Ok(Endpoint {
            https,
            host,
            port,
            base,
        })
    }

    /// The endpoint as a URL, for messages (no credentials are part of it).
    pub fn display(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        let default = if self.https { 443 } else { 80 };
        let host = crate::kit::url::join_host_port(&self.host, self.port);
        let host = if self.port == default {
            host.rsplit_once(':')
                .map_or(host.clone(), |(h, _)| h.to_owned())
        } else {
            host
        };
        format!("{scheme}://{host}{}", self.base)
    }

    /// `scheme://host:port`, for the HTTP client.
    pub fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!(
            "{scheme}://{}",
            crate::kit::url::join_host_port(&self.host, self.port)
        )
    }
}

/// Whether a host is addressed path-style (an emulator on an address or `localhost`).
fn path_style(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok()
}

/// The account, its endpoint and its credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub endpoint: Endpoint,
    pub credential: Credential,
}

impl Account {
    /// From the environment (`var` reads one variable), the URL's `endpoint` over the one
    /// found there. No account at all is 78 naming the variables.
    pub fn from_env(
        var: impl Fn(&str) -> Option<String>,
        endpoint: Option<&str>,
    ) -> Result<Account, Error> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let (name, found, credential) = if let Some(text) = var("AZURE_STORAGE_CONNECTION_STRING") {
            connection_string(&text)?
        } else if let Some(name) = var("AZURE_STORAGE_ACCOUNT") {
            let credential = if let Some(key) = var("AZURE_STORAGE_KEY") {
                Credential::Key(decode_key(&key, "AZURE_STORAGE_KEY")?)
            } else if let Some(sas) = var("AZURE_STORAGE_SAS_TOKEN") {
                Credential::Sas(sas_of(&sas))
            } else {
                return Err(Error::Config(
                    "AZURE_STORAGE_ACCOUNT is set without a credential: set AZURE_STORAGE_KEY \
                     or AZURE_STORAGE_SAS_TOKEN (or AZURE_STORAGE_CONNECTION_STRING)"
                        .into(),
                ));
            };
            let endpoint = format!("https://{name}.blob.core.windows.net");
            (name, endpoint, credential)
        } else {
            return Err(Error::Config(format!(
                "no Azure Storage account is configured: {VARIABLES}"
            )));
        };
        check_account_name(&name)?;
        let text = endpoint.unwrap_or(&found);
        let endpoint = Endpoint::parse(text, &name).map_err(Error::Config)?;
        Ok(Account {
            name,
            endpoint,
            credential,
        })
    }
}

/// An account name: 3 to 24 lower-case letters and digits (Azure's rule; Azurite's is the
/// same), so that it can be part of a host name and a signed string.
fn check_account_name(name: &str) -> Result<(), Error> {
    if (3..=24).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Ok(());
    }
    Err(Error::Config(
        "the Azure Storage account name must be 3 to 24 lower-case letters and digits".into(),
    ))
}

fn decode_key(key: &str, from: &str) -> Result<KeyBytes, Error> {
    base64::engine::general_purpose::STANDARD
        .decode(key.trim())
        .map(KeyBytes)
        .map_err(|_| Error::Config(format!("{from} is not an account key (base64)")))
}

fn sas_of(text: &str) -> Secret {
    Secret::new(text.trim().trim_start_matches('?').to_owned())
}

/// `key=value;…` as the Azure portal and `az storage account show-connection-string` give
/// it: the account, its blob endpoint and its credential. Values are never shown.
fn connection_string(text: &str) -> Result<(String, String, Credential), Error> {
    let bad = |what: &str| Error::Config(format!("AZURE_STORAGE_CONNECTION_STRING {what}"));
    let mut fields: Vec<(String, String)> = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| bad("has a part without '=' (expected Key=Value;…)"))?;
        fields.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if field("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        let endpoint = field("developmentstorageproxyuri")
            .map_or(DEV_ENDPOINT.to_owned(), |proxy| {
                format!("{}/{DEV_ACCOUNT}", proxy.trim_end_matches('/'))
            });
        let key = decode_key(DEV_KEY, "Azurite's key")?;
        return Ok((DEV_ACCOUNT.to_owned(), endpoint, Credential::Key(key)));
    }
    let credential = if let Some(key) = field("accountkey") {
        Credential::Key(decode_key(
            key,
            "AZURE_STORAGE_CONNECTION_STRING's AccountKey",
        )?)
    } else if let Some(sas) = field("sharedaccesssignature") {
        Credential::Sas(sas_of(sas))
    } else {
        return Err(bad(
            "has neither AccountKey nor SharedAccessSignature (dlock signs with one of them)",
        ));
    };
    let blob_endpoint = field("blobendpoint").map(|e| e.trim_end_matches('/').to_owned());
    let name = match field("accountname") {
        Some(name) => name.to_owned(),
        // A SAS connection string may name only the endpoint: the account is its host's
        // first label, or its path's first segment on a path-style endpoint.
        None => blob_endpoint
            .as_deref()
            .and_then(account_of_endpoint)
            .ok_or_else(|| bad("names no AccountName"))?,
    };
    let endpoint = match blob_endpoint {
        Some(endpoint) => endpoint,
        None => {
            let protocol = field("defaultendpointsprotocol").unwrap_or("https");
            if protocol != "https" && protocol != "http" {
                return Err(bad(
                    "has a DefaultEndpointsProtocol other than https or http",
                ));
            }
            let suffix = field("endpointsuffix").unwrap_or("core.windows.net");
            format!("{protocol}://{name}.blob.{suffix}")
        }
    };
    Ok((name, endpoint, credential))
}

/// The account an endpoint URL names: `https://ACCOUNT.blob…`, or `http://host/ACCOUNT`.
fn account_of_endpoint(endpoint: &str) -> Option<String> {
    let rest = endpoint.split_once("://")?.1;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let name = if path_style(host) {
        path.trim_start_matches('/').split('/').next()?
    } else {
        host.split('.').next()?
    };
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_connection_string_names_account_endpoint_and_key() {
        let text = format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};\
             BlobEndpoint=http://127.0.0.1:4321/{DEV_ACCOUNT};"
        );
        let pairs = [("AZURE_STORAGE_CONNECTION_STRING", text.as_str())];
        let account = Account::from_env(env(&pairs), None).unwrap();
        assert_eq!(account.name, DEV_ACCOUNT);
        assert_eq!(account.endpoint.port, 4321);
        assert_eq!(account.endpoint.base, "/devstoreaccount1");
        assert!(!account.endpoint.https);
        assert!(matches!(account.credential, Credential::Key(_)));
        assert_eq!(
            account.endpoint.display(),
            "http://127.0.0.1:4321/devstoreaccount1"
        );

        let dev = [(
            "AZURE_STORAGE_CONNECTION_STRING",
            "UseDevelopmentStorage=true",
        )];
        let account = Account::from_env(env(&dev), None).unwrap();
        assert_eq!(account.endpoint.display(), DEV_ENDPOINT);

        let cloud = [(
            "AZURE_STORAGE_CONNECTION_STRING",
            "DefaultEndpointsProtocol=https;AccountName=cistore;AccountKey=AAAA;EndpointSuffix=core.chinacloudapi.cn",
        )];
        let account = Account::from_env(env(&cloud), None).unwrap();
        assert_eq!(
            account.endpoint.display(),
            "https://cistore.blob.core.chinacloudapi.cn"
        );
        assert_eq!(account.endpoint.base, "");

        let sas = [(
            "AZURE_STORAGE_CONNECTION_STRING",
            "BlobEndpoint=https://cistore.blob.core.windows.net/;SharedAccessSignature=sv=2021&sig=x",
        )];
        let account = Account::from_env(env(&sas), None).unwrap();
        assert_eq!(account.name, "cistore");
        assert_eq!(
            account.credential,
            Credential::Sas(Secret::new("sv=2021&sig=x".into()))
        );
    }

    #[test]
    fn the_cli_variables_and_the_urls_endpoint() {
        let pairs = [
            ("AZURE_STORAGE_ACCOUNT", "cistore"),
            ("AZURE_STORAGE_SAS_TOKEN", "?sv=1&sig=abc"),
        ];
        let account = Account::from_env(env(&pairs), None).unwrap();
        assert_eq!(
            account.endpoint.display(),
            "https://cistore.blob.core.windows.net"
        );
        assert_eq!(
            account.credential,
            Credential::Sas(Secret::new("sv=1&sig=abc".into()))
        );
        let account = Account::from_env(env(&pairs), Some("http://localhost:9")).unwrap();
        assert_eq!(account.endpoint.display(), "http://localhost:9/cistore");
    }

    /// What is missing or wrong is 78, and no message shows a key or a SAS.
    #[test]
    fn missing_or_bad_settings_are_78_without_the_secret() {
        for pairs in [
            vec![],
            vec![("AZURE_STORAGE_ACCOUNT", "cistore")],
            vec![
                ("AZURE_STORAGE_ACCOUNT", "cistore"),
                ("AZURE_STORAGE_KEY", "s3cret!!"),
            ],
            vec![
                ("AZURE_STORAGE_ACCOUNT", "Bad_Name"),
                ("AZURE_STORAGE_KEY", "AAAA"),
            ],
            vec![(
                "AZURE_STORAGE_CONNECTION_STRING",
                "AccountName=cistore;s3cret!!",
            )],
            vec![(
                "AZURE_STORAGE_CONNECTION_STRING",
                "AccountName=cistore;AccountKey=s3cret!!",
            )],
            vec![("AZURE_STORAGE_CONNECTION_STRING", "AccountName=ci")],
        ] {
            let Err(err) = Account::from_env(env(&pairs), None) else {
                panic!("{pairs:?} accepted");
            };
            assert_eq!(err.code().value(), 78, "{err}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        let pairs = [
            ("AZURE_STORAGE_ACCOUNT", "cistore"),
            ("AZURE_STORAGE_KEY", "AAAA"),
        ];
        assert!(Account::from_env(env(&pairs), Some("ftp://x")).is_err());
        let account = Account::from_env(env(&pairs), None).unwrap();
        assert_eq!(format!("{:?}", account.credential), "Key(***)");
    }
}
