//! Where a ZooKeeper ensemble is: `zk://` URLs with members and a chroot, and the digest
//! password of the config file's `[zookeeper]` table.

use crate::config::FileConfig;
use crate::error::Error;
use crate::kit::url::{parse_query, sorted_endpoints, split_host_port, split_userinfo, Params};
use crate::secrets::{credentials_for_user, Secret, TlsFiles};

/// A ZooKeeper ensemble: its members, the chroot and the digest credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkTarget {
    pub endpoints: Vec<(String, u16)>,
    /// Absolute, without a trailing `/`; `None` for the root.
    pub chroot: Option<String>,
    pub user: Option<String>,
    pub password: Option<Secret>,
}

impl ZkTarget {
    /// The ensemble and chroot, for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        format!(
            "zk://{}{}",
            sorted_endpoints(&self.endpoints),
            self.chroot.as_deref().unwrap_or("")
        )
    }
}

/// A query takes nothing: what else a connection needs goes in the config file.
const PARAMS: Params = Params {
    url: "a ZooKeeper URL",
    keys: &[],
    aliases: &[],
    fold: false,
    note: "passwords go in the config file",
};

/// `zk://[user[:password]@]host[:port][,host[:port]…][/chroot]`.
pub fn parse(rest: &str) -> Result<ZkTarget, String> {
    let after = rest
        .strip_prefix("//")
        .ok_or("expected zk://host[:port][,host[:port]…][/chroot]")?;
    if after.contains('#') {
        return Err("ZooKeeper URLs take no fragment; put passwords in the config file".into());
    }
    let (after, query) = after.split_once('?').unwrap_or((after, ""));
    parse_query(query, &PARAMS)?;
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let (user, password, hosts) = split_userinfo(authority)?;
    let endpoints = hosts
        .split(',')
        .map(|h| split_host_port(h, 2181))
        .collect::<Result<Vec<_>, _>>()?;
    let chroot = match path {
        "" | "/" => None,
        chroot => {
            let chroot = chroot.strip_suffix('/').unwrap_or(chroot);
            if chroot
                .split('/')
                .skip(1)
                .any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Err(
                    "the URL's path is not a ZooKeeper chroot (empty, '.' and '..' components are not allowed)"
                        .into(),
                );
            }
            Some(chroot.to_owned())
        }
    };
    if password.is_some() && user.is_none() {
        return Err("ZooKeeper digest authentication needs a user: zk://user:password@host".into());
    }
    Ok(ZkTarget {
        endpoints,
        chroot,
        user,
        password,
    })
}

/// The digest password for ZooKeeper, from the `[zookeeper]` table (see [`crate::secrets::credentials`]).
pub fn complete(target: &mut ZkTarget, file: &FileConfig) -> Result<(), Error> {
    // Without a user there is no digest authentication: no password is looked up then.
    let (password, tls_files) = credentials_for_user(
        "ZooKeeper",
        "zookeeper",
        file,
        target.user.as_deref(),
        target.password.take(),
    )?;
    target.password = password;
    if tls_files != TlsFiles::default() {
        return Err(Error::Config(
            "TLS to ZooKeeper is not supported by this build; remove ca_file/cert_file/key_file from the [zookeeper] table".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    #[test]
    fn zk_urls() {
        let Ok(t) =
            Target::parse_as::<ZkTarget>("zk://u:p%40w@127.0.0.1:2182,[::1],h:1/app/locks/")
        else {
            panic!("zk URL rejected");
        };
        assert_eq!(
            t.endpoints,
            vec![
                ("127.0.0.1".to_owned(), 2182),
                ("::1".to_owned(), 2181),
                ("h".to_owned(), 1)
            ]
        );
        assert_eq!(t.chroot.as_deref(), Some("/app/locks"));
        assert_eq!(t.user.as_deref(), Some("u"));
        assert_eq!(t.password.as_ref().map(Secret::expose), Some("p@w"));
        let Ok(t) = Target::parse_as::<ZkTarget>("zk://h/") else {
            panic!("zk URL rejected");
        };
        assert_eq!((t.chroot, t.user, t.password), (None, None, None));
        for bad in [
            "zk://",
            "zk://h,",
            "zk://h?x",
            "zk://h:0",
            "zk://h//x",
            "zk://h/a/../b",
            "zk://:pw@h",
            "zk:h",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} accepted");
        }
        let url = "//h?password=x";
        assert_eq!(
            parse(url).err().as_deref(),
            Some(
                "unknown URL parameter 'password'; a ZooKeeper URL takes no parameters; \
                 passwords go in the config file; see dlock run --help"
            )
        );
        assert_eq!(
            crate::secrets::redact_url("zk://u:pw@h:2181/x"),
            "zk://u:***@h:2181/x"
        );
    }
}
