//! The `dlock --version` text: the version, the git commit of the build and the backends this
//! build supports, e.g.
//!
//! ```text
//! dlock 0.1.0
//! commit: 2691a2a
//! backends: file, redis (rediss, redis+unix), etcd (etcds), zk, postgres (postgresql)
//! ```
//!
//! The backends come from [`backend::KINDS`](crate::backend::KINDS), the registry's list,
//! so a new backend shows up here by itself; the commit comes from `build.rs`. The text is
//! assembled by `const fn`s at compile time: start-up, dlock's hot path, does no work for it.
//! (`-V` prints the version alone, and so do the man pages, which must not change with every
//! commit.)

use crate::backend::KINDS;
use crate::text::put;

/// The commit the binary was built from, or "unknown" (see `build.rs`).
pub const COMMIT: &str = env!("DLOCK_BUILD_COMMIT");

/// What `dlock --version` prints after "dlock ".
pub const LONG_VERSION: &str = match std::str::from_utf8(&LONG_VERSION_BYTES) {
    Ok(text) => text,
    Err(_) => panic!("the version text is not UTF-8"),
};

const LONG_VERSION_LEN: usize = render(&mut []);

const LONG_VERSION_BYTES: [u8; LONG_VERSION_LEN] = {
    let mut bytes = [0; LONG_VERSION_LEN];
    render(&mut bytes);
    bytes
};

/// Write the text into `out` and return its length; an `out` too short (e.g. empty) is left
/// alone, so a first call measures and a second one writes.
const fn render(out: &mut [u8]) -> usize {
    let mut at = put(out, 0, env!("CARGO_PKG_VERSION"));
    at = put(out, at, "\ncommit: ");
    at = put(out, at, COMMIT);
    at = put(out, at, "\nbackends: ");
    let mut backend = 0;
    while backend < KINDS.len() {
        let schemes = KINDS[backend].schemes;
        if backend > 0 {
            at = put(out, at, ", ");
        }
        let mut scheme = 0;
        while scheme < schemes.len() {
            at = put(out, at, schemes[scheme]);
            let last = scheme + 1 == schemes.len();
            at = put(
                out,
                at,
                if scheme == 0 && !last {
                    " ("
                } else if scheme == 0 {
                    ""
                } else if last {
                    ")"
                } else {
                    ", "
                },
            );
            scheme += 1;
        }
        backend += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{schemes, Target};

    #[test]
    fn long_version_names_the_version_the_commit_and_every_scheme() {
        let mut lines = LONG_VERSION.lines();
        assert_eq!(lines.next(), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(lines.next(), Some(format!("commit: {COMMIT}").as_str()));
        let backends = lines.next().expect("a backends line");
        assert!(
            backends.starts_with("backends: file, redis (rediss, redis+unix), "),
            "{backends}"
        );
        for scheme in schemes() {
            assert!(backends.contains(scheme), "{scheme} missing: {backends}");
        }
        assert_eq!(lines.next(), None);
        assert!(!COMMIT.is_empty() && !COMMIT.contains(char::is_whitespace));
    }

    /// Each listed scheme is one `--url` accepts, so `--version` never claims a backend the
    /// build lacks.
    #[test]
    fn every_listed_scheme_is_parsed() {
        for scheme in schemes() {
            if let Err(err) = Target::parse(&format!("{scheme}://127.0.0.1/x")) {
                assert!(!err.starts_with("unknown URL scheme"), "{scheme}: {err}");
            }
        }
    }

    /// The other direction: every scheme the unknown-scheme message offers is listed, so a new
    /// backend that `Target::parse` offers but `--version` does not list fails here.
    #[test]
    fn every_scheme_parse_offers_is_listed() {
        let err = Target::parse("nosuchscheme://x").expect_err("an unknown scheme");
        let (_, offered) = err
            .split_once("expected ")
            .expect("the message lists schemes");
        let listed: Vec<&str> = schemes().collect();
        for word in offered
            .split([',', ' '])
            .filter(|w| !w.is_empty() && *w != "or")
        {
            assert!(listed.contains(&word), "'{word}' is not in backend::KINDS");
        }
    }
}
