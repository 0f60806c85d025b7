//! The backends, and the one registry that knows them all: [`KINDS`].
//!
//! Each backend lives in `backend/<name>/`, implements [`crate::lock::Backend`] and describes
//! itself in one [`Kind`] (`backend/<name>/kind.rs`): its schemes, config table, capabilities,
//! how to parse its URL and how to open it. Nothing outside this folder names a backend:
//! settings hand a URL to [`Target::parse`], which finds the kind by scheme, and a subcommand
//! runs over the `dyn` backend the target opens. Everything that lists the backends (the
//! unknown-scheme message, `--version`, the `--url` help, the man pages, the refusal of
//! several URLs, the servers `sniff` can tell) is derived from [`KINDS`], the texts in
//! `texts.rs`. Adding a backend is ARCHITECTURE.md's checklist ("Adding a backend").

pub mod azure;
pub mod etcd;
pub mod file;
pub mod memcached;
pub mod mysql;
pub mod nats;
pub mod postgres;
pub mod redis;
pub mod s3;
mod texts;
pub mod zk;

pub use crate::kind::{Capabilities, Kind, Servers, Target, MIN_LEASE_TTL};
pub use texts::{
    config_notes, environment, one_url_of_several, scheme_list, CHECK_WARNS, KINDS_WITH_SCHEMES,
    LIST_NOTES, PASSWORD_TITLES, RELEASE_REMOVES, SHOWN_AS, TITLES, TTL_HELP, URL_FORMS,
};

/// Every backend of this build, the default (file) first: the one list.
pub const KINDS: &[&Kind] = &[
    &file::kind::KIND,
    &redis::kind::KIND,
    &redis::kind::SENTINEL_KIND,
    &etcd::kind::KIND,
    &zk::kind::KIND,
    &postgres::kind::KIND,
    &mysql::kind::KIND,
    &memcached::kind::KIND,
    &azure::kind::KIND,
    &s3::kind::KIND,
    &nats::kind::KIND,
];

/// The kind that answers to `scheme` (lower case).
pub fn kind_of_scheme(scheme: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .copied()
        .find(|kind| kind.schemes.contains(&scheme))
}

/// The config file's per-backend tables (secrets and TLS material).
pub fn config_tables() -> impl Iterator<Item = &'static str> {
    KINDS.iter().filter_map(|kind| kind.config_table)
}

/// Every scheme of every kind, in the registry's order.
pub fn schemes() -> impl Iterator<Item = &'static str> {
    KINDS.iter().flat_map(|kind| kind.schemes.iter().copied())
}

impl Target {
    /// The file backend in its default directory (no URL given).
    pub fn default_file() -> Target {
        Target::new(file::FileTarget::default_dir())
    }

    /// Parse a `--url`. Messages never quote text that may be part of a password.
    pub fn parse(url: &str) -> Result<Target, String> {
        for kind in KINDS {
            if kind.recognises.is_some_and(|recognises| recognises(url)) {
                return (kind.parse)("", url);
            }
        }
        let Some((scheme, _)) = url.split_once(':') else {
            // Never echo text that is not a URL: it may be a password pasted in the wrong place.
            return Err("this is not a URL; expected e.g. file:///var/lock/dlock".into());
        };
        let lower = scheme.to_ascii_lowercase();
        if let Some(kind) = kind_of_scheme(&lower) {
            return (kind.parse)(&lower, url);
        }
        if let Some(hint) = foreign_scheme_hint(&lower) {
            return Err(hint);
        }
        // A scheme is letters, digits, `+`, `-` and `.`; anything else before the first `:`
        // is part of something else (perhaps `user:password@host` without a scheme).
        let shown = if !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        {
            format!(" '{scheme}'")
        } else {
            String::new()
        };
        Err(format!(
            "unknown URL scheme{shown}; expected {}",
            scheme_list()
        ))
    }
}

/// The refusal of a URL in a scheme a server's own tools write (etcd's `http://host:port`):
/// dlock names the backend by its scheme, so say how to write it, for each kind that has
/// such a scheme ([`Words::foreign_schemes`](crate::kind::Words::foreign_schemes)).
fn foreign_scheme_hint(scheme: &str) -> Option<String> {
    let ways: Vec<String> = KINDS
        .iter()
        .flat_map(|kind| {
            kind.words
                .foreign_schemes
                .iter()
                .filter(|(theirs, _)| *theirs == scheme)
                .map(move |(_, ours)| {
                    format!(
                        "{}'s {scheme}://host:port is {ours}://host:port in dlock",
                        kind.title
                    )
                })
        })
        .collect();
    (!ways.is_empty()).then(|| {
        format!(
            "unknown URL scheme '{scheme}'; {}; for the other backends see --url in 'dlock run \
             --help'",
            ways.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheme belongs to one kind, and each kind's help names each of its schemes.
    #[test]
    fn every_scheme_has_one_kind_and_its_url_form() {
        let all: Vec<&str> = schemes().collect();
        for kind in KINDS {
            for scheme in kind.schemes {
                assert_eq!(
                    all.iter().filter(|s| *s == scheme).count(),
                    1,
                    "{scheme} twice"
                );
                assert!(
                    kind.url_forms
                        .iter()
                        .any(|form| form.contains(&format!("{scheme}://"))),
                    "{}'s url_forms do not show {scheme}://",
                    kind.name
                );
            }
            assert_eq!(kind.schemes.first(), Some(&kind.name));
            for shown in kind.shown_as {
                assert!(kind.schemes.contains(shown), "{shown} is not a scheme");
            }
        }
    }

    /// A scheme another tool writes for a backend's endpoints is none of dlock's, maps to one of
    /// that backend's own, and is refused with the way to write it.
    #[test]
    fn a_foreign_scheme_is_refused_with_the_backends_own() {
        let all: Vec<&str> = schemes().collect();
        let mut seen = 0;
        for kind in KINDS {
            for (theirs, ours) in kind.words.foreign_schemes {
                seen += 1;
                assert!(!all.contains(theirs), "{theirs} is one of dlock's schemes");
                assert!(kind.schemes.contains(ours), "{ours} is not {}'s", kind.name);
                let Err(said) = Target::parse(&format!("{theirs}://127.0.0.1:1")) else {
                    panic!("{theirs}:// was taken");
                };
                assert!(
                    said.contains(&format!("{theirs}://host:port is {ours}://host:port")),
                    "{said}"
                );
            }
        }
        assert!(seen > 0, "no kind names a foreign scheme");
    }

    /// Every backend that has a URL query refuses a key it does not take in one shape.
    #[test]
    fn every_scheme_refuses_an_unknown_key_alike() {
        for scheme in schemes().filter(|s| *s != "file") {
            let url = if scheme.ends_with("+unix") {
                format!("{scheme}:///run/x.sock?bogus=1")
            } else if scheme.ends_with("-sentinel") {
                format!("{scheme}://127.0.0.1?bogus=1#m")
            } else {
                format!("{scheme}://127.0.0.1/?bogus=1")
            };
            let Err(e) = Target::parse(&url) else {
                panic!("{url} was accepted");
            };
            let (head, tail) = e.split_once(" takes ").unwrap_or_default();
            assert!(
                head.starts_with("unknown URL parameter 'bogus'; a")
                    && head.ends_with(" URL")
                    && tail.ends_with("; see dlock run --help"),
                "{url}: {e}"
            );
        }
    }

    /// Every kind with a server (every kind that queues on this host first) says how its
    /// server is told at its port (`sniff`), and its example answers are read as its server's,
    /// not another kind's, whatever probe they answer.
    #[test]
    fn every_remote_kind_has_a_recognisable_answer() {
        let sent: Vec<&[u8]> = KINDS
            .iter()
            .filter_map(|kind| kind.server)
            .flat_map(|server| server.probes.iter().filter_map(|probe| probe.send))
            .collect();
        for kind in KINDS {
            let Some(server) = kind.server else {
                assert!(!kind.capabilities.host_queue, "{} has no server", kind.name);
                continue;
            };
            assert!(!server.probes.is_empty(), "{}", kind.name);
            let (article, rest) = server.called.split_once(' ').unwrap_or_default();
            assert!(
                matches!(article, "a" | "an") && rest.ends_with(" server"),
                "{}",
                server.called
            );
            for probe in server.probes {
                assert!((probe.read)(probe.example), "{}", kind.name);
                let asked = probe.send.map_or(sent.clone(), |send| vec![send]);
                for bytes in asked {
                    assert_eq!(
                        crate::sniff::what_it_tells(bytes, probe.example),
                        Some(server.called),
                        "{}",
                        kind.name
                    );
                }
            }
        }
    }

    /// A kind has a minimum TTL exactly when it has a lease.
    #[test]
    fn a_lease_comes_with_a_minimum_ttl() {
        for kind in KINDS {
            assert_eq!(
                kind.capabilities.lease,
                !kind.minimum_ttl.is_zero(),
                "{}",
                kind.name
            );
        }
    }

    /// What a parsed URL reports as DLOCK_BACKEND and as its kind agrees with the registry.
    #[test]
    fn parsed_targets_report_their_kind_and_scheme() {
        for kind in KINDS {
            for scheme in kind.schemes {
                let url = match *scheme {
                    "file" => "file:///tmp/x".to_owned(),
                    s if s.ends_with("+unix") => format!("{s}:///run/x.sock"),
                    s if s.ends_with("sentinel") => format!("{s}://127.0.0.1#master"),
                    s => format!("{s}://127.0.0.1"),
                };
                // Object stores name a bucket or container where the others name a host.
                let target = Target::parse(&url)
                    .or_else(|_| Target::parse(&format!("{scheme}://dlock-locks")))
                    .unwrap_or_else(|e| panic!("{url}: {e}"));
                assert_eq!(target.kind().name, kind.name, "{url}");
                assert!(kind.shown_as.contains(&target.scheme()), "{url}");
            }
        }
    }
}
