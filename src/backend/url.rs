//! The URL grammar the network backends share: user info, `host:port` lists with bracketed
//! IPv6 hosts, and percent-decoding. Messages never quote URL text: a malformed URL may carry
//! part of a password there.

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

/// The refusal of an `http://` or `https://` URL, which is how etcd's own tools write an
/// endpoint: dlock names the backend by its scheme, so say how to write it.
pub fn http_hint(scheme: &str) -> String {
    let etcd = if scheme == "https" { "etcds" } else { "etcd" };
    format!(
        "unknown URL scheme '{scheme}'; for an etcd endpoint write {etcd}://host:port (etcd's \
         {scheme}://host:port), for the other backends see --url in 'dlock run --help'"
    )
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
