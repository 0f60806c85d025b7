//! The password from a `.pgpass` file, as libpq finds and reads it.

use std::path::{Path, PathBuf};

use super::target::PgTarget;
use crate::error::Error;
use crate::secrets::Secret;

/// The password for `target` from a `.pgpass` file: `passfile` from the URL, else
/// `$PGPASSFILE`, else `~/.pgpass`. A file readable by group or others is refused (78) when it
/// was named, and skipped with a warning when it is the default `~/.pgpass` (as libpq does).
pub fn pgpass_password(target: &PgTarget) -> Result<Option<Secret>, Error> {
    let (path, explicit) = match target
        .passfile
        .clone()
        .or_else(|| std::env::var_os("PGPASSFILE").map(PathBuf::from))
    {
        Some(path) => (path, true),
        None => match std::env::var_os("HOME") {
            Some(home) => (Path::new(&home).join(".pgpass"), false),
            None => return Ok(None),
        },
    };
    if !explicit && std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    // A regular file of bounded size only: `passfile=/dev/zero` or a FIFO is refused at once.
    let text = match crate::files::read_small_file(&path, crate::files::MAX_CONFIG_BYTES) {
        Ok(text) => text,
        Err(e) if !explicit => {
            tracing::warn!("ignoring {}: {e}", path.display());
            return Ok(None);
        }
        Err(e) => {
            return Err(Error::Config(format!(
                "cannot read password file {}: {e}",
                path.display()
            )))
        }
    };
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path)
        .map(|m| m.permissions().mode())
        .unwrap_or(0);
    if mode & 0o077 != 0 && !explicit {
        // Like libpq: the default file is skipped with a warning (no password may be needed).
        tracing::warn!(
            "ignoring {}: it is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        );
        return Ok(None);
    }
    if mode & 0o077 != 0 {
        return Err(Error::Config(format!(
            "password file {} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        )));
    }
    let Some(first) = target.hosts.first() else {
        return Ok(None);
    };
    let wanted = [
        first.pgpass_host().to_owned(),
        first.port().to_string(),
        target.dbname(),
        target.user(),
    ];
    Ok(text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass_line(line)?;
            let matches = fields[..4]
                .iter()
                .zip(&wanted)
                .all(|(field, want)| field == "*" || field == want);
            matches.then(|| Secret::new(fields[4].clone()))
        }))
}

/// `host:port:db:user:password` with `\:` and `\\` escapes; `None` for a malformed line.
fn split_pgpass_line(line: &str) -> Option<[String; 5]> {
    let mut fields: Vec<String> = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut()?.push(chars.next().unwrap_or('\\')),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut()?.push(c),
        }
    }
    fields.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_honour_escapes_and_wildcards() {
        let fields = split_pgpass_line(r"db\:1:*:app:u:pa\:ss\\").unwrap();
        assert_eq!(fields[0], "db:1");
        assert_eq!(fields[1], "*");
        assert_eq!(fields[4], r"pa:ss\");
        assert!(split_pgpass_line("too:few:fields").is_none());
    }
}
