//! The URL grammar the network backends share: user info, `host:port` lists with bracketed
//! IPv6 hosts, percent-decoding, and the query (`?key=value&…`) with one refusal of a key a
//! backend does not take. Messages never quote URL text but a plain key: a malformed URL may
//! carry part of a password there.

use crate::secrets::Secret;

/// `[user[:password]@]rest` → (user, password, rest), percent-decoded; empty parts are absent.
pub fn split_userinfo(authority: &str) -> Result<(Option<String>, Option<Secret>, &str), String> {
    let Some((info, rest)) = authority.rsplit_once('@') else {
        return Ok((None, None, authority));
    };
    let decode = |s: &str, what: &str| {
        crate::lock::decode_component(s)
            .ok_or_else(|| format!("bad percent-encoding in the URL's {what}"))
    };
    let (user, password) = match info.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (info, None),
    };
    let user = Some(decode(user, "user name")?).filter(|u| !u.is_empty());
    let password = match password {
        Some(p) => Some(Secret::new(decode(p, "password")?)).filter(|p| !p.expose().is_empty()),
        None => None,
    };
    Ok((user, password, rest))
}

/// `host:port`, with brackets around an IPv6 address: the inverse of [`split_host_port`].
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
pub fn split_host_port(text: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed [ in the host")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("expected :port after ]")?),
        };
        (host.to_owned(), port)
    } else {
        match text.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                // Never echo URL text: a malformed URL may carry part of a password there.
                return Err("IPv6 addresses in the URL need brackets, e.g. [::1]:2379".into());
            }
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (text.to_owned(), None),
        }
    };
    if host.is_empty() {
        return Err("the URL names no host".into());
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| "a port in the URL is not a number from 1 to 65535".to_owned())?,
    };
    Ok((host, port))
}

/// Sorted `host:port` list: the same cluster whatever order the endpoints were listed in.
pub fn sorted_endpoints(endpoints: &[(String, u16)]) -> String {
    let mut shown: Vec<String> = endpoints.iter().map(|(h, p)| format!("{h}:{p}")).collect();
    shown.sort();
    shown.join(",")
}

/// What a backend's URL query (`?key=value&…`) takes, for [`parse_query`] and
/// [`unknown_parameter`].
pub struct Params {
    /// The URL as the refusal of an unknown key names it: "a memcached URL".
    pub url: &'static str,
    /// Each accepted key with how that refusal shows it: `("db", "db=N")`.
    pub keys: &'static [(&'static str, &'static str)],
    /// Other spellings of an accepted key, `(alias, key)`: the same key, given once.
    pub aliases: &'static [(&'static str, &'static str)],
    /// Keys match case-insensitively, `_` the same as `-` (as MySQL's connectors read them).
    pub fold: bool,
    /// Said after the list of keys: where what the query does not take goes; may be empty.
    pub note: &'static str,
}

/// The query (what follows `?`) as `(key, value)` pairs in order, both percent-decoded, each
/// key one of `params.keys` (returned as spelled there) and given at most once. Values are
/// never shown, nor a key that could be part of a password.
pub fn parse_query(query: &str, params: &Params) -> Result<Vec<(&'static str, String)>, String> {
    let decode =
        |s: &str| crate::lock::decode_component(s).ok_or("bad percent-encoding in the URL's query");
    let mut pairs: Vec<(&'static str, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            // Not shown: a parameter without `=` may be a stray password.
            .ok_or("a URL parameter has no value (expected key=value)")?;
        let typed = decode(key)?;
        let folded = if params.fold {
            typed.to_ascii_lowercase().replace('_', "-")
        } else {
            typed.clone()
        };
        let name = params
            .aliases
            .iter()
            .find(|(alias, _)| *alias == folded)
            .map_or(folded.as_str(), |&(_, key)| key);
        let Some(&(key, _)) = params.keys.iter().find(|(k, _)| *k == name) else {
            // An `@` after the `?` means the `?` may be in a password (`user:pa?ss@host`):
            // then the key is part of it.
            let shown = if query.contains('@') {
                ""
            } else {
                typed.as_str()
            };
            return Err(unknown_parameter("URL parameter", shown, params));
        };
        if pairs.iter().any(|(k, _)| *k == key) {
            return Err(format!("the URL parameter '{key}' is given twice"));
        }
        pairs.push((key, decode(value)?));
    }
    Ok(pairs)
}

/// The one refusal of a key `params` does not take: "unknown URL parameter 'dbb' (did you
/// mean 'db'?); a redis+unix URL takes db=N; see dlock run --help". `noun` is what the key
/// is ("URL parameter", or "connection parameter" in libpq's key=value form). The key is
/// shown only if it is a plain word (letters, digits, `_`, `-`): anything else may be part of
/// a password.
pub fn unknown_parameter(noun: &str, key: &str, params: &Params) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    let mut text = format!("unknown {noun}");
    if plain {
        text += &format!(" '{key}'");
        let folded = if params.fold {
            key.to_ascii_lowercase().replace('_', "-")
        } else {
            key.to_owned()
        };
        let known: Vec<&str> = params.keys.iter().map(|(k, _)| *k).collect();
        if let Some(meant) = crate::config::closest(&folded, &known) {
            text += &format!(" (did you mean '{meant}'?)");
        }
    }
    let shown: Vec<&str> = params.keys.iter().map(|(_, shown)| *shown).collect();
    if shown.is_empty() {
        text += &format!("; {} takes no parameters", params.url);
    } else {
        text += &format!("; {} takes {}", params.url, shown.join(", "));
    }
    if !params.note.is_empty() {
        text += &format!("; {}", params.note);
    }
    text + "; see dlock run --help"
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: Params = Params {
        url: "a test URL",
        keys: &[("ssl-mode", "ssl-mode=MODE"), ("db", "db=N")],
        aliases: &[("sslmode", "ssl-mode")],
        fold: true,
        note: "passwords go in the config file",
    };

    #[test]
    fn queries_are_split_decoded_and_checked() {
        assert_eq!(
            parse_query("db=1&&SSL_Mode=a%20b", &PARAMS),
            Ok(vec![("db", "1".to_owned()), ("ssl-mode", "a b".to_owned())])
        );
        assert_eq!(parse_query("", &PARAMS), Ok(Vec::new()));
        assert_eq!(
            parse_query("db=1&db=2", &PARAMS).unwrap_err(),
            "the URL parameter 'db' is given twice"
        );
        assert_eq!(
            parse_query("sslmode=a&ssl-mode=b", &PARAMS).unwrap_err(),
            "the URL parameter 'ssl-mode' is given twice"
        );
        assert_eq!(
            parse_query("hunter2", &PARAMS).unwrap_err(),
            "a URL parameter has no value (expected key=value)"
        );
        assert_eq!(
            parse_query("db=%zz", &PARAMS).unwrap_err(),
            "bad percent-encoding in the URL's query"
        );
    }

    #[test]
    fn an_unknown_key_reads_one_way() {
        assert_eq!(
            parse_query("dbb=1", &PARAMS).unwrap_err(),
            "unknown URL parameter 'dbb' (did you mean 'db'?); a test URL takes ssl-mode=MODE, \
             db=N; passwords go in the config file; see dlock run --help"
        );
        assert_eq!(
            parse_query("bogus=1", &PARAMS).unwrap_err(),
            "unknown URL parameter 'bogus'; a test URL takes ssl-mode=MODE, db=N; passwords \
             go in the config file; see dlock run --help"
        );
        // Not a plain word: perhaps part of a password, so neither shown nor matched.
        for query in ["hunt%3Aer2=1", "p@ss=1", "x.y=1", "word=x@host"] {
            let e = parse_query(query, &PARAMS).unwrap_err();
            assert!(
                e.starts_with("unknown URL parameter; a test URL"),
                "{query}: {e}"
            );
        }
        let none = Params {
            url: "an etcd URL",
            keys: &[],
            aliases: &[],
            fold: false,
            note: "",
        };
        assert_eq!(
            parse_query("bogus=hunter2", &none).unwrap_err(),
            "unknown URL parameter 'bogus'; an etcd URL takes no parameters; see dlock run --help"
        );
    }
}
