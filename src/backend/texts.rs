//! The registry's rendered texts: what `--help`, the man pages and the messages say of every
//! backend at once (the kinds' titles, schemes, URL forms, `--ttl` ranges, what `release --force`
//! removes, ...), each built from [`KINDS`] — at compile time (`const_text!`) where clap needs a
//! `&'static str`.

use crate::text::{put, put_number};

use super::{schemes, Servers, KINDS};

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
            match kind.maximum_ttl {
                Some(maximum) => {
                    at = put_number(out, at, maximum.as_secs() as u8, 0);
                    at = put(out, at, "s on ");
                }
                None => {
                    at = put_number(out, at, days, 0);
                    at = put(out, at, " days on ");
                }
            }
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
            let up_to = kind
                .maximum_ttl
                .map_or("7 days".to_owned(), |max| format!("{}s", max.as_secs()));
            let named = TTL_HELP.contains(&format!(
                "{}s to {up_to} on {}",
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
}
