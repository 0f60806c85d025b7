//! Where the file backend keeps its lock files: `file:///dir`, or the default directory.

use std::path::PathBuf;

/// A lock directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileTarget {
    pub dir: PathBuf,
    /// Whether dlock chose the directory (it then creates it, mode 0700).
    pub default: bool,
}

impl FileTarget {
    /// dlock's own directory (`kit::lock_dir::default_dir`), which dlock creates.
    pub fn default_dir() -> FileTarget {
        FileTarget {
            dir: crate::kit::lock_dir::default_dir(),
            default: true,
        }
    }

    /// The directory, for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        format!("file://{}", self.dir.display())
    }
}

/// `file:///dir`, `file://localhost/dir`; `file://` alone is the default directory.
pub fn parse(rest: &str) -> Result<FileTarget, String> {
    let path = match rest.strip_prefix("//") {
        Some(after) => {
            let (host, path) = after.split_at(after.find('/').unwrap_or(after.len()));
            if !host.is_empty() && host != "localhost" {
                return Err(format!(
                    "file URLs name a local directory; '{host}' is not this host (use file:///dir)"
                ));
            }
            path
        }
        None => rest,
    };
    if path.contains(['?', '#']) {
        return Err("file URLs take no query or fragment".into());
    }
    if path.is_empty() {
        return Ok(FileTarget::default_dir());
    }
    let decoded = crate::lock::decode_component(path)
        .ok_or_else(|| format!("bad percent-encoding in '{path}'"))?;
    let dir = PathBuf::from(decoded);
    if !dir.is_absolute() {
        return Err(format!(
            "the lock directory must be absolute: file://{path} (use file:///dir)"
        ));
    }
    Ok(FileTarget {
        dir,
        default: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Target;

    #[test]
    fn file_urls() {
        assert_eq!(
            Target::parse_as::<FileTarget>("file:///var/lock/x"),
            Ok(FileTarget {
                dir: "/var/lock/x".into(),
                default: false
            })
        );
        assert!(matches!(
            Target::parse_as::<FileTarget>("file://"),
            Ok(FileTarget { default: true, .. })
        ));
        assert!(Target::parse("file://otherhost/x").is_err());
        assert!(Target::parse("file:relative").is_err());
        assert!(Target::parse("gopher://x").is_err());
        assert!(Target::parse("nourl").is_err());
    }
}
