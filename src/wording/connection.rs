//! The words of a connection that failed, the same on every backend: a refused connection,
//! a missing socket, another kind of server at the port, a missing or refused password, a
//! database that does not exist, no TLS handshake; and the `host:port` or socket a URL
//! reaches, which they name.

use crate::error::Error;

/// Whether a connection was refused somewhere in `err`'s chain of causes (an `io::Error` of
/// kind `ConnectionRefused`, also where a client shared it behind an `Arc`).
pub fn refused_in(err: &(dyn std::error::Error + 'static)) -> bool {
    let refused = |io: &std::io::Error| io.kind() == std::io::ErrorKind::ConnectionRefused;
    let mut cause = Some(err);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>().is_some_and(refused)
            || e.downcast_ref::<std::sync::Arc<std::io::Error>>()
                .is_some_and(|io| refused(io))
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// How messages name a backend's server, and the port its URLs reach when they name none.
/// Each backend states its own (`SERVER` in its folder), so these words know no backend.
#[derive(Clone, Copy, Debug)]
pub struct Server {
    /// What is not listening when a connection is refused: "Redis server", "memcached".
    pub listening: &'static str,
    /// What the server at the URL does not look like: "Redis" (… a Redis server).
    pub name: &'static str,
    /// The port a URL without one reaches.
    pub port: u16,
}

/// `cannot connect to HOST:PORT: connection refused`: nothing listens where the URL points
/// (the same words on every backend; 69, waited out within `--wait` like any unreachable
/// server).
pub fn connection_refused(display: &str, server: &Server) -> Error {
    let endpoint = endpoint_of(display, server.port);
    // A Unix socket's path that does not exist: clients report it as refused.
    if endpoint.starts_with('/') && !std::path::Path::new(&endpoint).exists() {
        return no_socket(&endpoint, server);
    }
    Error::Unavailable(format!(
        "cannot connect to {endpoint}: connection refused (no {} is listening there)",
        server.listening
    ))
}

/// Where a password may be given, for the messages about one: `more` names a backend's own
/// places (PostgreSQL's `~/.pgpass`).
fn password_places(more: &[&str]) -> String {
    let mut places = vec!["the URL", "DLOCK_PASSWORD", "password_file"];
    places.extend_from_slice(more);
    let last = places.pop().unwrap_or_default();
    format!("{} or {last}", places.join(", "))
}

/// `ENDPOINT wants a password for user 'USER', and none was given`: the same words on every
/// backend that has passwords (77); `more`: the backend's own places for one.
pub fn password_missing(endpoint: &str, user: &str, more: &[&str]) -> Error {
    if user.is_empty() {
        return Error::Permission(format!(
            "{endpoint} wants a user and a password, and none was given: give the user in the \
             URL (USER@HOST) and the password in {}",
            password_places(more)
        ));
    }
    Error::Permission(format!(
        "{endpoint} wants a password for user '{user}', and none was given: give it in {}",
        password_places(more)
    ))
}

/// `ENDPOINT refused user 'USER' with the password given`: a wrong password, or a user the
/// server does not know, in the same words on every backend that has passwords (77).
pub fn password_refused(endpoint: &str, user: &str, more: &[&str]) -> Error {
    Error::Permission(format!(
        "{endpoint} refused user '{user}' with the password given: check the user, and the \
         password in {}",
        password_places(more)
    ))
}

/// `ENDPOINT has no database 'NAME'`: the URL names a database (a Redis DB index) the
/// server does not have, or that its user may not see; the same words and status (78) on
/// every backend with databases. `fix` says how to choose another.
pub fn no_database(endpoint: &str, name: &str, fix: &str) -> Error {
    Error::Config(format!("{endpoint} has no database '{name}'{fix}"))
}

/// `cannot connect to PATH: no such socket`: a Unix socket URL whose path does not exist
/// (69, waited out within `--wait` like any unreachable server).
pub fn no_socket(path: &str, server: &Server) -> Error {
    Error::Unavailable(format!(
        "cannot connect to {path}: no such socket (no {} is listening there)",
        server.listening
    ))
}

/// Whether a file was not found somewhere in `err`'s chain of causes (a Unix socket's path
/// that does not exist).
pub fn not_found_in(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The user a (credential-free) URL names: `redis://app:***@host` → `app`; `None` without.
pub fn user_in(display: &str) -> Option<&str> {
    let rest = display.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let (userinfo, _) = authority.rsplit_once('@')?;
    let user = userinfo.split(':').next().unwrap_or(userinfo);
    (!user.is_empty()).then_some(user)
}

/// `HOST:PORT does not look like a SERVER server (WHAT IT DID)`: something else listens
/// where the URL points (a Redis URL at an etcd port, say).
pub fn not_a(display: &str, server: &Server, seen: &str) -> Error {
    Error::Unavailable(format!(
        "{} does not look like {} {} server ({seen}); check the URL's host and port",
        endpoint_of(display, server.port),
        article(server.name),
        server.name
    ))
}

/// `HOST:PORT did not answer the TLS handshake; is it serving plain text? (use redis:// …)`:
/// a TLS URL at a server that does not speak TLS; `plain` says how to ask for no TLS.
pub fn no_tls_handshake(display: &str, server: &Server, plain: &str) -> String {
    format!(
        "{} did not answer the TLS handshake; is it serving plain text? ({plain})",
        endpoint_of(display, server.port)
    )
}

fn article(word: &str) -> &'static str {
    match word.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u' | 'A' | 'E' | 'I' | 'O' | 'U') => "an",
        _ => "a",
    }
}

/// The `host:port` list of a (credential-free) URL: `redis://127.0.0.1:6380/0` →
/// `127.0.0.1:6380`, with `port` where the URL names none; a Unix socket's path
/// (`redis+unix:///run/redis.sock`, `…?socket=PATH`, `…?host=/DIR`) where it names one.
pub fn endpoint_of(display: &str, port: u16) -> String {
    let (scheme, rest) = display.split_once("://").unwrap_or(("", display));
    let without_fragment = rest.split('#').next().unwrap_or(rest);
    let (before_query, query) = without_fragment
        .split_once('?')
        .unwrap_or((without_fragment, ""));
    if scheme.ends_with("+unix") || scheme == "unix" {
        return before_query.to_owned();
    }
    let socket = query
        .split('&')
        .find_map(|pair| match pair.split_once('=') {
            Some(("socket" | "unix_socket", path)) => Some(path),
            Some(("host", path)) if path.starts_with('/') => Some(path),
            _ => None,
        });
    if let Some(path) = socket {
        return path.to_owned();
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts
        .split(',')
        .map(|h| {
            let has_port = match h.rsplit_once(']') {
                Some((_, after)) => after.starts_with(':'),
                None => h.contains(':'),
            };
            if has_port || h.is_empty() {
                h.to_owned()
            } else {
                format!("{h}:{port}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_of_urls_and_where_passwords_go() {
        assert_eq!(user_in("redis://app:***@h:1/0"), Some("app"));
        assert_eq!(user_in("redis://:***@h:1/0"), None);
        assert_eq!(user_in("zk://u@h/chroot"), Some("u"));
        assert_eq!(user_in("etcd://h:2379"), None);
        let missing = password_missing("h:1", "app", &["~/.pgpass"]).to_string();
        assert_eq!(
            missing,
            "h:1 wants a password for user 'app', and none was given: give it in the URL, \
             DLOCK_PASSWORD, password_file or ~/.pgpass"
        );
        let refused = password_refused("h:1", "app", &[]);
        assert_eq!(refused.code(), crate::exit::Code::NoPermission);
        assert!(refused
            .to_string()
            .ends_with("the URL, DLOCK_PASSWORD or password_file"));
        assert_eq!(
            no_database("h:1", "x", "").code(),
            crate::exit::Code::Config
        );
    }

    #[test]
    fn endpoints_of_urls() {
        assert_eq!(
            endpoint_of("redis://127.0.0.1:6380/0", 6379),
            "127.0.0.1:6380"
        );
        assert_eq!(endpoint_of("postgres://u@db/x", 5432), "db:5432");
        assert_eq!(endpoint_of("zk://a:1,b/chroot", 2181), "a:1,b:2181");
        assert_eq!(endpoint_of("etcds://[::1]", 2379), "[::1]:2379");
        assert_eq!(endpoint_of("mysql://[::1]:3307/d", 3306), "[::1]:3307");
        assert_eq!(
            endpoint_of("memcached+unix:///run/m.sock", 11211),
            "/run/m.sock"
        );
        assert_eq!(endpoint_of("redis+unix:///missing?db=2", 6379), "/missing");
        assert_eq!(
            endpoint_of("mysql://app@localhost/dlock?socket=/run/my.sock", 3306),
            "/run/my.sock"
        );
        assert_eq!(endpoint_of("postgres:///app?host=/run/pg", 5432), "/run/pg");
    }

    #[test]
    fn a_refused_connection_and_another_server_are_named_by_the_backends_words() {
        const SERVER: Server = Server {
            listening: "Redis server",
            name: "Redis",
            port: 6379,
        };
        assert_eq!(
            connection_refused("redis://h/0", &SERVER).to_string(),
            "cannot connect to h:6379: connection refused (no Redis server is listening there)"
        );
        assert_eq!(
            not_a("redis://h:7/0", &SERVER, "it answered HTTP").to_string(),
            "h:7 does not look like a Redis server (it answered HTTP); check the URL's host and port"
        );
    }
}
