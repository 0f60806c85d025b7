//! Where an etcd cluster is: `etcd://` and `etcds://` URLs with one or more endpoints, and
//! the password and TLS files of the config file's `[etcd]` table.

use crate::config::FileConfig;
use crate::error::Error;
use crate::kit::url::{parse_query, sorted_endpoints, split_host_port, split_userinfo, Params};
use crate::secrets::{check_tls_files, credentials_for_user, Secret, TlsFiles};

/// An etcd cluster: its client endpoints and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTarget {
    pub endpoints: Vec<(String, u16)>,
    pub tls: bool,
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub tls_files: TlsFiles,
}

impl EtcdTarget {
    /// The scheme name shown in DLOCK_BACKEND.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "etcds"
        } else {
            "etcd"
        }
    }

    /// The cluster, for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        format!("etcd://{}", sorted_endpoints(&self.endpoints))
    }
}

/// A query takes nothing: what else a connection needs goes in the config file.
const PARAMS: Params = Params {
    url: "an etcd URL",
    keys: &[],
    aliases: &[],
    fold: false,
    note: "TLS files and passwords go in the config file",
};

/// `etcd://[user[:password]@]host[:port][,host[:port]…][/]`, `etcds://…`.
pub fn parse(scheme: &str, rest: &str) -> Result<EtcdTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or_else(|| format!("expected {scheme}://host[:port][,host[:port]…]"))?;
    if after.contains('#') {
        return Err(
            "etcd URLs take no fragment; put TLS files and passwords in the config file".into(),
        );
    }
    let (after, query) = after.split_once('?').unwrap_or((after, ""));
    parse_query(query, &PARAMS)?;
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    if !path.is_empty() && path != "/" {
        // The path is not shown: a password with an unencoded `/` ends up here.
        return Err(
            "etcd URLs take no path; use --prefix for a namespace (a '/' in a password must be written %2F)"
                .into(),
        );
    }
    let (user, password, hosts) = split_userinfo(authority)?;
    let endpoints = hosts
        .split(',')
        .map(|h| split_host_port(h, 2379))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EtcdTarget {
        endpoints,
        tls: scheme == "etcds",
        user,
        password,
        tls_files: TlsFiles::default(),
    })
}

/// Password and TLS files for etcd, from the `[etcd]` table (see [`crate::secrets::credentials`]).
pub fn complete(target: &mut EtcdTarget, file: &FileConfig) -> Result<(), Error> {
    // etcd without a user runs without authentication: no password is looked up then.
    let (password, tls_files) = credentials_for_user(
        "etcd",
        "etcd",
        file,
        target.user.as_deref(),
        target.password.take(),
    )?;
    target.password = password;
    target.tls_files = tls_files;
    if target.tls {
        check_tls_files(&target.tls_files)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    #[test]
    fn etcd_urls() {
        let Ok(t) = Target::parse_as::<EtcdTarget>("etcd://u:pw@127.0.0.1:2379,[::1]:2380,h")
        else {
            panic!()
        };
        assert_eq!(
            t.endpoints,
            vec![
                ("127.0.0.1".into(), 2379),
                ("::1".into(), 2380),
                ("h".into(), 2379)
            ]
        );
        assert_eq!(
            (
                t.tls,
                t.user.as_deref(),
                t.password.as_ref().map(Secret::expose)
            ),
            (false, Some("u"), Some("pw"))
        );
        assert!(matches!(
            Target::parse_as::<EtcdTarget>("etcds://h/"),
            Ok(EtcdTarget { tls: true, .. })
        ));
        for bad in [
            "etcd://",
            "etcd://h,",
            "etcd://h/x",
            "etcd://h?x",
            "etcd://h:0",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} was accepted");
        }
        let url = "//h?ca_file=x";
        assert_eq!(
            parse("etcd", url).err().as_deref(),
            Some(
                "unknown URL parameter 'ca_file'; an etcd URL takes no parameters; TLS files \
                 and passwords go in the config file; see dlock run --help"
            )
        );
    }
}
