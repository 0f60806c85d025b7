//! The backends, and the one registry that knows them all: [`KINDS`].
//!
//! Each backend lives in `backend/<name>/`, implements [`crate::lock::Backend`] and describes
//! itself in one [`Kind`] (`backend/<name>/kind.rs`): its schemes, config table, capabilities,
//! how to parse its URL and how to open it. Nothing outside this folder names a backend:
//! settings hand a URL to [`Target::parse`], which finds the kind by scheme, and a subcommand
//! runs over the `dyn` backend the target opens. Everything that lists the backends (the
//! unknown-scheme message, `--version`, the `--url` help, the man pages, the refusal of
//! several URLs, the servers `sniff` can tell) is derived from [`KINDS`]. Adding a backend is ARCHITECTURE.md's checklist ("Adding a backend").

pub mod etcd;
pub mod file;
pub mod memcached;
pub mod mysql;
pub mod postgres;
pub mod redis;
pub mod zk;

use crate::text::{put, put_number};

pub use crate::kind::{Capabilities, Kind, Servers, Target, MIN_LEASE_TTL};

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

/// "a Redis Cluster URL (…) or Redis behind Sentinel (…) for a lock that survives a failed
/// server, or etcd://e1,e2,e3 or zk://z1,z2,z3 for a lock that needs no timing assumptions":
/// the kinds whose one URL reaches several servers, by what a lock on them outlives
/// ([`Servers`]), each in its own words, for the refusal of several URLs.
pub fn one_url_of_several() -> String {
    let group = |servers: Servers, outlives: &str| {
        let urls: Vec<String> = KINDS
            .iter()
            .filter(|kind| kind.capabilities.servers == servers)
            .map(|kind| kind.words.one_url.to_owned())
            .collect();
        (!urls.is_empty()).then(|| format!("{} for a lock that {outlives}", or_list(urls)))
    };
    let groups: Vec<String> = [
        group(Servers::Failover, "survives a failed server"),
        group(Servers::Quorum, "needs no timing assumptions"),
    ]
    .into_iter()
    .flatten()
    .collect();
    groups.join(", or ")
}

/// "file, redis, …, memcached or memcached+unix": every scheme, for messages.
pub fn scheme_list() -> String {
    or_list(schemes().map(str::to_owned).collect())
}

/// "file, redis, … or memcached+unix": every value of `DLOCK_BACKEND`, for `--help`.
pub const SHOWN_AS: &str = const_text!(render_shown_as);

/// "local file, Redis, …, memcached": what each kind is called, for `--help`.
pub const TITLES: &str = const_text!(render_titles);

/// "file://, redis:// (rediss://, redis+unix://), … and memcached:// (memcached+unix://)":
/// every kind with its schemes, for `--help`.
pub const KINDS_WITH_SCHEMES: &str = const_text!(render_kinds_with_schemes);

/// Every URL form of every kind, for the `--url` help.
pub const URL_FORMS: &str = const_text!(render_url_forms);

/// `--ttl`'s long help: the range of a lease, the kinds whose shortest lease is longer than
/// the others', and the kinds that have none.
pub const TTL_HELP: &str = const_text!(render_ttl_help);

const fn render_ttl_help(out: &mut [u8]) -> usize {
    let days = (crate::settings::MAX_TTL.as_secs() / 86_400) as u8;
    let least = crate::kind::MIN_LEASE_TTL.as_secs() as u8;
    let mut at = put(
        out,
        0,
        "Lease length [default: 15s].\n\nRenewed at least every TTL/3 while the command runs; ",
    );
    at = put_number(out, at, least, 0);
    at = put(out, at, "s to ");
    at = put_number(out, at, days, 0);
    at = put(out, at, " days");
    let (mut k, mut first) = (0, true);
    while k < KINDS.len() {
        let kind = &KINDS[k];
        if kind.capabilities.lease && kind.minimum_ttl.as_secs() > least as u64 {
            at = put(out, at, if first { " (" } else { "; " });
            at = put_number(out, at, kind.minimum_ttl.as_secs() as u8, 0);
            at = put(out, at, "s to ");
            at = put_number(out, at, days, 0);
            at = put(out, at, " days on ");
            at = put(out, at, kind.title);
            first = false;
        }
        k += 1;
    }
    if !first {
        at = put(out, at, ")");
    }
    at = put(out, at, ".");
    k = 0;
    while k < KINDS.len() {
        if !KINDS[k].capabilities.lease {
            at = put(out, at, " The ");
            at = put(out, at, KINDS[k].title);
            at = put(out, at, " backend has no lease and only records it.");
        }
        k += 1;
    }
    at
}

/// "Redis, Redis Sentinel, …": every kind that takes the server's password, for the man pages.
pub const PASSWORD_TITLES: &str = const_text!(render_password_titles);

/// "their entries on Redis, Redis Sentinel and memcached, their leases on etcd, …": what
/// `release --force` removes, kind by kind, for its man page.
pub const RELEASE_REMOVES: &str = const_text!(render_release_removes);

/// "a Redis that may evict keys or lose them on restart, a memcached that may evict, …": the
/// settings `check` warns about, for its man page.
pub const CHECK_WARNS: &str = const_text!(render_check_warns);

/// What `list`'s man page says of particular backends (" On memcached it needs …").
pub const LIST_NOTES: &str = const_text!(render_list_notes);

const fn render_list_notes(out: &mut [u8]) -> usize {
    let (mut at, mut k) = (0, 0);
    while k < KINDS.len() {
        if !KINDS[k].words.list_note.is_empty() {
            at = put(out, at, " ");
            at = put(out, at, KINDS[k].words.list_note);
        }
        k += 1;
    }
    at
}

/// What the config file's page says of the backends' tables: each kind's note, then the
/// kinds that need no table.
pub fn config_notes() -> String {
    let notes = KINDS
        .iter()
        .map(|kind| kind.words.config_note)
        .filter(|note| !note.is_empty());
    let without: Vec<String> = KINDS
        .iter()
        .filter(|kind| kind.config_table.is_none())
        .map(|kind| kind.title.to_owned())
        .collect();
    let mut text = notes.collect::<Vec<_>>().join(" ");
    if !without.is_empty() {
        text.push_str(&format!(
            " The {} backends need no secrets.",
            and_list(without)
        ));
    }
    text.trim_start().to_owned()
}

/// Variables of the backends' own, for the man pages.
pub fn environment() -> impl Iterator<Item = (&'static str, &'static str)> {
    KINDS
        .iter()
        .flat_map(|kind| kind.words.environment.iter().copied())
}

/// Whether two strings are the same, in a `const fn`.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn render_password_titles(out: &mut [u8]) -> usize {
    let count = {
        let (mut n, mut k) = (0, 0);
        while k < KINDS.len() {
            if KINDS[k].words.password {
                n += 1;
            }
            k += 1;
        }
        n
    };
    let (mut at, mut i, mut k) = (0, 0, 0);
    while k < KINDS.len() {
        if KINDS[k].words.password {
            at = put(out, at, separator(i, count, " and "));
            at = put(out, at, KINDS[k].title);
            i += 1;
        }
        k += 1;
    }
    at
}

/// Whether kind `k` is the first with its `holders_are` (each is listed once, with every
/// kind that shares it).
const fn first_with_holders(k: usize) -> bool {
    let mut j = 0;
    while j < k {
        if same(KINDS[j].words.holders_are, KINDS[k].words.holders_are) {
            return false;
        }
        j += 1;
    }
    true
}

const fn render_release_removes(out: &mut [u8]) -> usize {
    let groups = {
        let (mut n, mut k) = (0, 0);
        while k < KINDS.len() {
            if !KINDS[k].words.holders_are.is_empty() && first_with_holders(k) {
                n += 1;
            }
            k += 1;
        }
        n
    };
    let (mut at, mut g, mut k) = (0, 0, 0);
    while k < KINDS.len() {
        let what = KINDS[k].words.holders_are;
        if !what.is_empty() && first_with_holders(k) {
            at = put(out, at, separator(g, groups, ", "));
            at = put(out, at, "their ");
            at = put(out, at, what);
            at = put(out, at, " on ");
            let members = {
                let (mut n, mut m) = (0, k);
                while m < KINDS.len() {
                    if same(KINDS[m].words.holders_are, what) {
                        n += 1;
                    }
                    m += 1;
                }
                n
            };
            let (mut i, mut m) = (0, k);
            while m < KINDS.len() {
                if same(KINDS[m].words.holders_are, what) {
                    at = put(out, at, separator(i, members, " and "));
                    at = put(out, at, KINDS[m].title);
                    i += 1;
                }
                m += 1;
            }
            g += 1;
        }
        k += 1;
    }
    at
}

const fn render_check_warns(out: &mut [u8]) -> usize {
    let (mut at, mut first, mut k) = (0, true, 0);
    while k < KINDS.len() {
        if !KINDS[k].words.check_warns.is_empty() {
            at = put(out, at, if first { "" } else { ", " });
            at = put(out, at, KINDS[k].words.check_warns);
            first = false;
        }
        k += 1;
    }
    at
}

/// The separator before item `i` of `count` in a list that ends "… `last` z".
const fn separator(i: usize, count: usize, last: &'static str) -> &'static str {
    if i == 0 {
        ""
    } else if i + 1 == count {
        last
    } else {
        ", "
    }
}

const fn render_shown_as(out: &mut [u8]) -> usize {
    let count = {
        let (mut n, mut k) = (0, 0);
        while k < KINDS.len() {
            n += KINDS[k].shown_as.len();
            k += 1;
        }
        n
    };
    let (mut at, mut i, mut k) = (0, 0, 0);
    while k < KINDS.len() {
        let mut s = 0;
        while s < KINDS[k].shown_as.len() {
            at = put(out, at, separator(i, count, " or "));
            at = put(out, at, KINDS[k].shown_as[s]);
            i += 1;
            s += 1;
        }
        k += 1;
    }
    at
}

const fn render_titles(out: &mut [u8]) -> usize {
    let (mut at, mut k) = (0, 0);
    while k < KINDS.len() {
        at = put(out, at, separator(k, KINDS.len(), ", "));
        at = put(out, at, KINDS[k].title);
        k += 1;
    }
    at
}

const fn render_kinds_with_schemes(out: &mut [u8]) -> usize {
    let (mut at, mut k) = (0, 0);
    while k < KINDS.len() {
        at = put(out, at, separator(k, KINDS.len(), " and "));
        let schemes = KINDS[k].schemes;
        let mut s = 0;
        while s < schemes.len() {
            at = put(
                out,
                at,
                if s == 1 {
                    " ("
                } else if s > 1 {
                    ", "
                } else {
                    ""
                },
            );
            at = put(out, at, schemes[s]);
            at = put(out, at, "://");
            s += 1;
        }
        if schemes.len() > 1 {
            at = put(out, at, ")");
        }
        k += 1;
    }
    at
}

const fn render_url_forms(out: &mut [u8]) -> usize {
    let (mut at, mut first, mut k) = (0, true, 0);
    while k < KINDS.len() {
        let mut f = 0;
        while f < KINDS[k].url_forms.len() {
            at = put(out, at, if first { "" } else { ", " });
            at = put(out, at, KINDS[k].url_forms[f]);
            first = false;
            f += 1;
        }
        k += 1;
    }
    at
}

fn or_list(words: Vec<String>) -> String {
    list(words, "or")
}

fn and_list(words: Vec<String>) -> String {
    list(words, "and")
}

/// "a, b `last` c".
fn list(mut words: Vec<String>, last_word: &str) -> String {
    let Some(last) = words.pop() else {
        return String::new();
    };
    if words.is_empty() {
        return last;
    }
    format!("{} {last_word} {last}", words.join(", "))
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

    /// What the man pages say of the backends is every kind's own word, each said once.
    #[test]
    fn the_pages_lists_say_what_each_kind_says_of_itself() {
        for kind in KINDS {
            assert_eq!(
                PASSWORD_TITLES.matches(kind.title).count() > 0,
                kind.words.password,
                "{}: {PASSWORD_TITLES}",
                kind.name
            );
            if !kind.words.holders_are.is_empty() {
                assert!(RELEASE_REMOVES.contains(kind.title), "{RELEASE_REMOVES}");
            }
            assert_eq!(
                CHECK_WARNS.matches(kind.words.check_warns).count(),
                if kind.words.check_warns.is_empty() {
                    CHECK_WARNS.len() + 1
                } else {
                    1
                },
                "{CHECK_WARNS}"
            );
            assert!(config_notes().contains(kind.words.config_note));
            assert!(LIST_NOTES.contains(kind.words.list_note), "{LIST_NOTES}");
        }
        // Kinds that remove the same thing share one "their … on A, B and C".
        for kind in KINDS.iter().filter(|k| !k.words.holders_are.is_empty()) {
            let group = format!("their {} on ", kind.words.holders_are);
            assert_eq!(
                RELEASE_REMOVES.matches(&group).count(),
                1,
                "{RELEASE_REMOVES}"
            );
        }
    }

    /// `--ttl`'s help names every kind whose shortest lease is longer than the others', and
    /// every kind without a lease.
    #[test]
    fn the_ttl_help_names_the_kinds_whose_lease_differs() {
        for kind in KINDS {
            let longer = kind.capabilities.lease && kind.minimum_ttl > crate::kind::MIN_LEASE_TTL;
            let named = TTL_HELP.contains(&format!(
                "{}s to 7 days on {}",
                kind.minimum_ttl.as_secs(),
                kind.title
            ));
            assert_eq!(named, longer, "{}: {TTL_HELP}", kind.name);
            let lease_less = format!("The {} backend has no lease", kind.title);
            assert_eq!(
                TTL_HELP.contains(&lease_less),
                !kind.capabilities.lease,
                "{TTL_HELP}"
            );
        }
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
                let target = Target::parse(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
                assert_eq!(target.kind().name, kind.name, "{url}");
                assert!(kind.shown_as.contains(&target.scheme()), "{url}");
            }
        }
    }
}
