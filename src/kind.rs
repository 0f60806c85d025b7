//! What a backend says about itself: its [`Kind`] (schemes, config table, capabilities, how
//! to parse its URL, its [`Words`], how its server is told at a port) and its validated
//! [`Target`] (how to open it, with the [`Common`] settings). It sits below the registry and
//! the settings layer: it names no backend and reads no flag.
//!
//! Each backend folder exports one `KIND`; the registry (`backend::KINDS`) lists them, and
//! everything that names the backends (the scheme table, the unknown-scheme message,
//! `--version`, the `--url` help, `DLOCK_BACKEND`, the man pages, the refusal of several
//! URLs, what answers at a port in `sniff`) is derived from that list.
//! The callers never branch on a backend: they read a [`Capabilities`] or call the target.
//!
//! Opening a target gives a [`DynBackend`] behind a pointer (`kind/pointer.rs`).

use std::any::Any;
use std::fmt;
use std::time::Duration;

use crate::config::FileConfig;
use crate::error::Error;
use crate::kit::local_queue::LocalQueued;

mod pointer;

pub use self::pointer::{BoxFuture, BoxedLease, DynBackend, DynLease};

/// The shortest lease a server-side backend accepts: a lease is renewed at least every TTL/3
/// and the command is stopped a safety margin of at least 500 ms before it can expire (see
/// `keeper`); below 2 s that leaves no time for one renewal and a retry, and etcd itself
/// grants no lease under 2 s.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// One kind of backend, as its folder describes it.
#[derive(Debug)]
pub struct Kind {
    /// The backend's name, as `--version` lists it first (its main scheme).
    pub name: &'static str,
    /// What a reader calls the server, for `--help`: "Redis", "PostgreSQL".
    pub title: &'static str,
    /// Every URL scheme it answers to, its own name first.
    pub schemes: &'static [&'static str],
    /// What `DLOCK_BACKEND` says for it: its schemes without the mere synonyms
    /// (`postgresql://` is `postgres`, `rediss://` stays `rediss`).
    pub shown_as: &'static [&'static str],
    /// The URL forms the `--url` help shows, one per way of reaching it.
    pub url_forms: &'static [&'static str],
    /// The config file's table for its secrets and TLS files, if it has one.
    pub config_table: Option<&'static str>,
    pub capabilities: Capabilities,
    /// The shortest `--ttl` it can keep (zero where it has no lease).
    pub minimum_ttl: Duration,
    /// The longest `--ttl` its server grants, where the server bounds its leases.
    pub maximum_ttl: Option<Duration>,
    /// Parse a URL of one of `schemes` (`scheme` lower-cased; `url` whole, as given).
    /// Messages never quote text that may be part of a password.
    pub parse: fn(scheme: &str, url: &str) -> Result<Target, String>,
    /// A form of its own that is not `scheme:…` (libpq's `key=value …`), recognised before
    /// the scheme is looked at; parsed by `parse` with an empty scheme.
    pub recognises: Option<fn(url: &str) -> bool>,
    /// Without the `shared` capability: why, for the refusal of `--shared` (what the server
    /// lacks that a safe shared lock needs); empty with it.
    pub no_shared_because: &'static str,
    /// What the help, the man pages and the messages say of it beyond its name.
    pub words: Words,
    /// How its server is told at a TCP port (`sniff`), for the message of a client of another
    /// kind that reached it; `None` for a kind without a server.
    pub server: Option<Recognition>,
}

/// How a kind's server is told from other servers at a TCP port: the sniffer (`sniff`) sends
/// every kind's probes, each on a connection of its own, and reads each answer with the
/// readers of the kinds that asked for it.
#[derive(Clone, Copy, Debug)]
pub struct Recognition {
    /// What the messages call the server: "a Redis server" (… it answers like a Redis server).
    pub called: &'static str,
    /// The answers that tell it, each with what is sent to get it.
    pub probes: &'static [Probe],
}

/// One answer that tells a kind's server: what is sent to get it, and how it is read.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// The first bytes sent; `None` for an answer to anything (a greeting the server sends
    /// unasked, an error to any first bytes it cannot read), read after the answers to a
    /// particular probe. The server must take them for no request to change anything.
    pub send: Option<&'static [u8]>,
    /// Sent only where the other probes named no server (or only an HTTP one): an HTTP
    /// request is what a server of another protocol may take for an attack (Redis logs one).
    pub after_others: bool,
    /// Whether an answer (its first bytes; an HTTP answer whole, up to 1 KiB) is its server's.
    pub read: fn(&[u8]) -> bool,
    /// An answer of its server, which `read` takes and no other kind's probe does (the
    /// registry's tests hold them to it).
    pub example: &'static [u8],
}

/// What a kind says of itself for the help, the man pages and the messages, where it has
/// something to say: a kind lists only its own (`..Words::NONE`), and the lists that name
/// several kinds are rendered from the registry.
#[derive(Debug)]
pub struct Words {
    /// Schemes the server's own tools write for its endpoints, each with the scheme dlock
    /// takes instead (etcd's `http://host:port` is dlock's `etcd://host:port`): a URL with one
    /// of them is refused with that hint rather than as an unknown scheme.
    pub foreign_schemes: &'static [(&'static str, &'static str)],
    /// Whether it takes the server's password (from the URL, `DLOCK_PASSWORD` or
    /// `password_file`), for the man pages' list.
    pub password: bool,
    /// What `release --force` removes of a holder on it ("entries", "leases", "sessions"),
    /// for the man page; empty where a hold cannot be broken from outside.
    pub holders_are: &'static str,
    /// The setting `check` warns about on it, as the man page lists it ("a memcached that may
    /// evict"); empty for none.
    pub check_warns: &'static str,
    /// What the config file's page says of its table, beyond the keys every table takes.
    pub config_note: &'static str,
    /// What `list` needs of the server or does differently on it, for its man page; empty
    /// for nothing particular.
    pub list_note: &'static str,
    /// Variables of its own, each with its description, for the man pages.
    pub environment: &'static [(&'static str, &'static str)],
    /// Where its servers are not [`Servers::One`]: how one URL names several of them, for the
    /// refusal of several URLs ("etcd://e1,e2,e3").
    pub one_url: &'static str,
}

impl Words {
    /// Nothing to say: every list leaves the kind out.
    pub const NONE: Words = Words {
        foreign_schemes: &[],
        password: false,
        holders_are: "",
        check_warns: "",
        config_note: "",
        list_note: "",
        environment: &[],
        one_url: "",
    };
}

/// What a backend can honour. A flag that needs a capability the backend lacks is refused
/// (64, naming the backend) before anything is contacted; the contract tests choose their
/// cases by these too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The hold is a lease the server lets lapse unless it is renewed (`--ttl` applies, the
    /// keeper renews it, Ctrl-Z warns); without one the hold lives as long as the process.
    pub lease: bool,
    /// Waiters are served in arrival order.
    pub fifo: bool,
    /// The hold's metadata can be rewritten in place: `status` says when the command has
    /// finished and `--min-hold` keeps the lock ([`Lease::finished`]).
    pub records_finished: bool,
    /// `--limit N`: up to N holders at once.
    pub limit: bool,
    /// Shared (reader) holds beside exclusive ones.
    pub shared: bool,
    /// Waiters on one host line up in this host's queue first, so that one of them at a time
    /// waits on the server (`kit::local_queue`; `--local-queue`). A server's waiters come from
    /// many hosts; the file backend's are all on this one, in the kernel's queue already.
    pub host_queue: bool,
    /// What a lock on it outlives of its servers (the refusal of several URLs names the
    /// kinds whose one URL reaches servers that go on without one).
    pub servers: Servers,
}

/// What a lock outlives of the servers it is kept on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Servers {
    /// Each lock is on one server (or in one file), and gone with it.
    One,
    /// A replica takes over from a failed server; replication is asynchronous, so a failover
    /// may lose a hold.
    Failover,
    /// A majority of the servers agrees on every change: the lock outlives a minority's loss
    /// and its safety needs no timing assumptions.
    Quorum,
}

impl Kind {
    /// Refuse a `--limit` above 1 where the backend cannot honour it (64, naming the backend;
    /// `option` is where the limit came from: `--limit`, `DLOCK_LIMIT`).
    pub fn check_limit(&self, limit: u32, option: &str) -> Result<(), Error> {
        if limit > 1 && !self.capabilities.limit {
            return Err(self.not_available(&format!("{option} {limit}")));
        }
        Ok(())
    }

    /// Refuse `--shared` where the backend does not offer shared locks, and beside a
    /// `--limit` above 1, whose meaning with shared holders is not defined (64; `option` is
    /// where `--shared` came from: `--shared`, `DLOCK_SHARED`). The refusal names the kinds of
    /// `registry` that do offer them.
    pub fn check_shared(
        &self,
        shared: bool,
        limit: u32,
        option: &str,
        registry: &[&Kind],
    ) -> Result<(), Error> {
        if !shared {
            return Ok(());
        }
        if !self.capabilities.shared {
            let why = match self.no_shared_because {
                "" => String::new(),
                why => format!(": {why}"),
            };
            let instead = match shared_titles(registry) {
                titles if titles.is_empty() => String::new(),
                titles => format!(" (shared locks: {titles})"),
            };
            return Err(Error::Usage(format!(
                "{option}: the {} backend ({}://) does not offer shared locks{why}{instead}",
                self.title, self.name
            )));
        }
        if limit > 1 {
            return Err(Error::Usage(format!(
                "{option} and --limit {limit} cannot be combined: a shared lock has any number \
                 of shared holders or one exclusive holder"
            )));
        }
        Ok(())
    }

    /// The refusal of `what` (a flag and its value) that this kind cannot honour.
    fn not_available(&self, what: &str) -> Error {
        Error::Usage(format!(
            "{what} is not available on the {} backend ({}://)",
            self.title, self.name
        ))
    }
}

/// "local file, Redis, … and PostgreSQL": the kinds of `registry` that offer shared locks, for
/// the refusal of `--shared` elsewhere.
fn shared_titles(registry: &[&Kind]) -> String {
    let mut titles: Vec<&str> = registry
        .iter()
        .filter(|kind| kind.capabilities.shared)
        .map(|kind| kind.title)
        .collect();
    match titles.pop() {
        None => String::new(),
        Some(last) if titles.is_empty() => last.to_owned(),
        Some(last) => format!("{} and {last}", titles.join(", ")),
    }
}

/// Settings every subcommand shares, and what a backend is opened with ([`Target::open`]).
/// The settings layer fills them in (`settings`); the backends only read them.
#[derive(Clone, Debug)]
pub struct Common {
    pub target: Target,
    pub prefix: String,
    pub ttl: Duration,
    /// The URL as given, with any password replaced by `***` (safe to print or pass on).
    pub display_url: String,
    /// Queue on this host before the server (`kit::local_queue`); `run` only.
    pub local_queue: bool,
}

impl Common {
    /// The scheme name shown in DLOCK_BACKEND.
    pub fn scheme(&self) -> &'static str {
        self.target.scheme()
    }

    /// Identifies "the same backend and namespace" for reentrancy (DLOCK_HELD).
    pub fn identity(&self) -> String {
        let prefix = crate::lock::encode_component(&self.prefix);
        format!("{}|{prefix}", self.target.identity())
    }
}

/// A backend's validated target: what its URL and config table say, and how to open it.
pub trait Place: AnyPlace + fmt::Debug + Send + Sync + 'static {
    /// The kind this target is of.
    fn kind(&self) -> &'static Kind;

    /// The scheme shown in DLOCK_BACKEND (`rediss`, not `redis`, for a TLS URL); by default
    /// the kind's name.
    fn scheme(&self) -> &'static str {
        self.kind().name
    }

    /// The same server (and database or chroot) however the URL spelled it, for reentrancy.
    fn identity(&self) -> String;

    /// Fill in what the URL did not say from the config file and the environment: passwords,
    /// TLS files (checked here, before any backend is contacted).
    fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        let _ = file;
        Ok(())
    }

    /// Whether `prefix` can name this backend's namespace.
    fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        let _ = prefix;
        Ok(())
    }

    /// The backend for `common` (whose target this is).
    fn open(&self, common: &Common) -> Box<dyn DynBackend>;
}

/// What every [`Place`] that is `Clone` has: a copy behind a pointer, and its concrete type.
pub trait AnyPlace {
    fn clone_place(&self) -> Box<dyn Place>;
    fn as_any(&self) -> &dyn Any;
}

impl<T: Place + Clone> AnyPlace for T {
    fn clone_place(&self) -> Box<dyn Place> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Where the locks live: one backend's target.
#[derive(Debug)]
pub struct Target(Box<dyn Place>);

impl Target {
    pub fn new(place: impl Place) -> Target {
        Target(Box::new(place))
    }

    pub fn kind(&self) -> &'static Kind {
        self.0.kind()
    }

    pub fn capabilities(&self) -> Capabilities {
        self.kind().capabilities
    }

    pub fn scheme(&self) -> &'static str {
        self.0.scheme()
    }

    pub fn identity(&self) -> String {
        self.0.identity()
    }

    pub fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        self.0.complete(file)
    }

    pub fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        self.0.check_prefix(prefix)
    }

    /// The shortest `--ttl` the backend can keep, where it has a lease.
    pub fn minimum_ttl(&self) -> Option<Duration> {
        let kind = self.kind();
        kind.capabilities.lease.then_some(kind.minimum_ttl)
    }

    /// The longest `--ttl` the backend's server grants, where it bounds its leases.
    pub fn maximum_ttl(&self) -> Option<Duration> {
        let kind = self.kind();
        kind.maximum_ttl.filter(|_| kind.capabilities.lease)
    }

    /// The backend, behind this host's queue where its kind has one.
    pub fn open(&self, common: &Common) -> Box<dyn DynBackend> {
        let backend = self.0.open(common);
        if !self.kind().capabilities.host_queue {
            return backend;
        }
        let queue = common.local_queue.then(|| common.identity());
        Box::new(LocalQueued::new(backend, queue))
    }

    /// The backend's own target type, where a caller (a test) needs its fields.
    pub fn downcast_ref<T: Place>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }

    /// Parse `url` (`Target::parse`) into the backend's own target type `T`.
    #[cfg(test)]
    pub fn parse_as<T: Place + Clone>(url: &str) -> Result<T, String> {
        let target = Target::parse(url)?;
        target
            .downcast_ref::<T>()
            .cloned()
            .ok_or_else(|| format!("{url} is a {} URL", target.kind().name))
    }
}

impl Clone for Target {
    fn clone(&self) -> Target {
        Target(self.0.clone_place())
    }
}

/// What follows the scheme and its `:` in `url` (all of it if there is no `:`).
pub fn after_scheme(url: &str) -> &str {
    url.split_once(':').map_or(url, |(_, rest)| rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_LIMIT: Kind = Kind {
        name: "plain",
        title: "plain",
        schemes: &["plain"],
        shown_as: &["plain"],
        url_forms: &["plain://host"],
        config_table: None,
        capabilities: Capabilities {
            lease: true,
            fifo: false,
            records_finished: false,
            limit: false,
            shared: false,
            host_queue: true,
            servers: Servers::One,
        },
        minimum_ttl: MIN_LEASE_TTL,
        maximum_ttl: None,
        parse: |_, _| Err("no".into()),
        recognises: None,
        no_shared_because: "it cannot",
        words: Words::NONE,
        server: None,
    };

    /// A `--limit` the backend cannot honour is a usage error (64) naming the backend and
    /// the option; `--limit 1` is every backend's.
    #[test]
    fn a_limit_without_the_capability_is_refused_naming_the_backend() {
        let Err(err) = NO_LIMIT.check_limit(3, "DLOCK_LIMIT") else {
            panic!("--limit 3 accepted without the capability");
        };
        assert_eq!(err.code().value(), 64);
        assert_eq!(
            err.to_string(),
            "DLOCK_LIMIT 3 is not available on the plain backend (plain://)"
        );
        assert!(NO_LIMIT.check_limit(1, "--limit").is_ok());
        for kind in crate::backend::KINDS {
            assert!(kind.check_limit(3, "--limit").is_ok(), "{}", kind.name);
        }
    }

    /// `--shared` on a backend without the capability is a usage error (64) naming the
    /// backend; with it, only `--limit` above 1 is refused.
    #[test]
    fn shared_without_the_capability_is_refused_naming_the_backend() {
        let Err(err) = NO_LIMIT.check_shared(true, 1, "DLOCK_SHARED", crate::backend::KINDS) else {
            panic!("--shared accepted without the capability");
        };
        assert_eq!(err.code().value(), 64);
        assert_eq!(
            err.to_string(),
            format!(
                "DLOCK_SHARED: the plain backend (plain://) does not offer shared locks: it \
                 cannot (shared locks: {})",
                shared_titles(crate::backend::KINDS)
            )
        );
        assert!(NO_LIMIT
            .check_shared(false, 1, "--shared", crate::backend::KINDS)
            .is_ok());
        let shared = Kind {
            capabilities: Capabilities {
                shared: true,
                ..NO_LIMIT.capabilities
            },
            ..NO_LIMIT
        };
        assert!(shared
            .check_shared(true, 1, "--shared", crate::backend::KINDS)
            .is_ok());
        let Err(err) = shared.check_shared(true, 2, "--shared", crate::backend::KINDS) else {
            panic!("--shared --limit 2 accepted");
        };
        assert_eq!(err.code().value(), 64);
    }
}
