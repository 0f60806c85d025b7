//! Where the locks are: `az://CONTAINER[/FOLDER…][?endpoint=URL]` (the form fsspec and
//! `object_store` write), the container existing already; the account from the environment
//! (`account.rs`), read when the settings are completed, before anything is contacted.
//!
//! A lock's blob is `FOLDER/PREFIX/NAME` in the container: the URL's folder (if any), the
//! `--prefix` and the lock name, each name and prefix encoded as one path component
//! (`lock::encode_component`), so no name reaches outside its prefix.

use crate::error::Error;
use crate::kit::url::Params;
use crate::lock::{encode_component, LockName};

use super::account::Account;

/// An `az://` URL, completed with the account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AzureTarget {
    pub container: String,
    /// The folder in the container, without slashes at either end (`""` for none).
    pub folder: String,
    /// `?endpoint=`: the blob service endpoint, over the environment's.
    pub endpoint: Option<String>,
    /// Filled in by [`AzureTarget::complete`].
    pub account: Option<Account>,
}

impl AzureTarget {
    /// The same container of the same account however the URL was spelled, for reentrancy.
    pub fn identity(&self) -> String {
        let at = self.account.as_ref().map_or(String::new(), |account| {
            format!("{}@{}", account.name, account.endpoint.display())
        });
        format!("az://{at}/{}/{}", self.container, self.folder)
    }

    /// The account from the environment (78 when there is none).
    pub fn complete(&mut self) -> Result<(), Error> {
        let account = Account::from_env(|name| std::env::var(name).ok(), self.endpoint.as_deref())?;
        self.account = Some(account);
        Ok(())
    }

    /// Where `prefix`'s blobs begin: `FOLDER/PREFIX/`.
    pub fn blob_prefix(&self, prefix: &str) -> String {
        let prefix = encode_component(prefix);
        if self.folder.is_empty() {
            format!("{prefix}/")
        } else {
            format!("{}/{prefix}/", self.folder)
        }
    }

    /// The blob of the lock `name` under `prefix`.
    pub fn blob(&self, prefix: &str, name: &LockName) -> String {
        format!("{}{}", self.blob_prefix(prefix), name.encoded())
    }

    /// The URL as messages show it (the account and endpoint are no secrets).
    pub fn display(&self) -> String {
        let folder = if self.folder.is_empty() {
            String::new()
        } else {
            format!("/{}", self.folder)
        };
        match &self.account {
            Some(account) => format!(
                "az://{}{folder} at {}",
                self.container,
                account.endpoint.display()
            ),
            None => format!("az://{}{folder}", self.container),
        }
    }
}

/// What the query takes.
const PARAMS: Params = Params {
    url: "an az URL",
    keys: &[("endpoint", "endpoint=URL")],
    aliases: &[],
    fold: false,
    note: "; the account and its credential come from AZURE_STORAGE_CONNECTION_STRING, or \
           AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN",
};

/// `//CONTAINER[/FOLDER…][?endpoint=URL]`.
pub fn parse(rest: &str) -> Result<AzureTarget, String> {
    let form = "expected az://CONTAINER[/FOLDER]";
    let after = rest.strip_prefix("//").ok_or(form)?;
    if after.contains('#') {
        return Err("az URLs take no fragment".into());
    }
    let (location, query) = after.split_once('?').unwrap_or((after, ""));
    if location.contains('@') {
        return Err(
            "az URLs take no account or key: the account comes from AZURE_STORAGE_CONNECTION_STRING \
             or AZURE_STORAGE_ACCOUNT"
                .into(),
        );
    }
    let mut endpoint = None;
    for (_, value) in crate::kit::url::parse_query(query, &PARAMS)? {
        endpoint = Some(value);
    }
    let (container, folder) = location.split_once('/').unwrap_or((location, ""));
    check_container(container)?;
    let folder = folder.trim_matches('/');
    if folder
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
        && !folder.is_empty()
    {
        return Err("the folder of an az URL has an empty, '.' or '..' part".into());
    }
    if folder.len() > 512 || folder.contains(['\\', '%']) || folder.chars().any(char::is_control) {
        return Err(
            "the folder of an az URL must be at most 512 characters, without '\\', '%' or \
             control characters"
                .into(),
        );
    }
    Ok(AzureTarget {
        container: container.to_owned(),
        folder: folder.to_owned(),
        endpoint,
        account: None,
    })
}

/// Azure's rule for container names: 3 to 63 lower-case letters, digits and hyphens, starting
/// with a letter or digit, no two hyphens in a row.
fn check_container(name: &str) -> Result<(), String> {
    let ok = (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        return Ok(());
    }
    if name.is_empty() {
        return Err("expected az://CONTAINER[/FOLDER]: the URL names no container".into());
    }
    Err(format!(
        "'{}' is not a container name: Azure's are 3 to 63 lower-case letters, digits and \
         single hyphens, starting and ending with a letter or digit",
        crate::logging::printable(name)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    fn parse_ok(url: &str) -> AzureTarget {
        match Target::parse_as::<AzureTarget>(url) {
            Ok(t) => t,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn az_urls() {
        let t = parse_ok("az://ci-locks");
        assert_eq!((t.container.as_str(), t.folder.as_str()), ("ci-locks", ""));
        let name = LockName::new("a/b").unwrap();
        assert_eq!(t.blob("dlock", &name), "dlock/a%2Fb");
        let t = parse_ok("az://ci-locks/team/x/?endpoint=http%3A%2F%2F127.0.0.1%3A10000");
        assert_eq!(t.folder, "team/x");
        assert_eq!(t.endpoint.as_deref(), Some("http://127.0.0.1:10000"));
        assert_eq!(t.blob("p/q", &name), "team/x/p%2Fq/a%2Fb");
        for bad in [
            "az://",
            "az:ci-locks",
            "az://CI",
            "az://ab",
            "az://a--b",
            "az://-ab",
            "az://cis/a//b",
            "az://cis/../b",
            "az://cis?sig=x",
            "az://acct:key@ci",
            "az://cis#x",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    /// A wrong URL is refused naming what Azure allows, and a query key that might be part
    /// of a SAS is never shown.
    #[test]
    fn refusals_say_why_and_show_no_secret() {
        let err = Target::parse("az://Locks").unwrap_err();
        assert!(err.contains("'Locks' is not a container name"), "{err}");
        let err = Target::parse("az://cis?sv=2021&sig=s3cret").unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("endpoint=URL"), "{err}");
    }
}
