//! One round of asking the sentinels where the master is, and what their answers add up
//! to: each distinct sentinel asked at once ([`ask`], [`distinct`]), with who it is (its run
//! id) and the others it knows (`SENTINEL SENTINELS`), and a master that counts only when a
//! majority of the group names it, each sentinel once ([`Round::agreed`]).

use std::net::SocketAddr;

use redis::{AsyncConnectionConfig, RedisError, Value};

use crate::error::Error;

use super::*;

/// Where the sentinels' own password is given, for the messages about it.
const SENTINEL_PASSWORD_PLACES: &str = "DLOCK_SENTINEL_PASSWORD or the [redis-sentinel] table's \
     password_file (the URL's password is the data nodes')";

/// What one sentinel said about the master.
pub(in crate::backend::redis) enum Answer {
    /// Its current view: the master's address and the configuration epoch it dates from,
    /// and how many other sentinels it knows, with the rest of the `SENTINEL MASTER` fields
    /// (for `check`); its run id (`SENTINEL MYID`, when it tells) and the other sentinels it
    /// knows (`SENTINEL SENTINELS`, when it tells).
    Master {
        addr: Addr,
        epoch: u64,
        others: usize,
        fields: Vec<(String, String)>,
        id: Option<String>,
        peers: Vec<Peer>,
    },
    /// It monitors no master of that name.
    Unknown,
    Failed(String, Option<Error>),
}

/// Another sentinel of the group, as one sentinel knows it: the address it announces, and
/// its run id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::backend::redis) struct Peer {
    pub(in crate::backend::redis) addr: Addr,
    pub(in crate::backend::redis) id: Option<String>,
}

/// A sentinel that the URL does not list, found through the ones it does and asked in a
/// round: where, through which, and whether it named a master.
pub(in crate::backend::redis) struct Found {
    pub(in crate::backend::redis) label: String,
    pub(in crate::backend::redis) through: String,
    pub(in crate::backend::redis) answered: bool,
}

/// The answers of one round of asking (the URL's sentinels' and those found through them),
/// how many distinct sentinels the URL lists, and those found through them that were asked.
pub(in crate::backend::redis) struct Round {
    pub(in crate::backend::redis) answers: Vec<Answer>,
    pub(in crate::backend::redis) listed: usize,
    pub(in crate::backend::redis) found: Vec<Found>,
}

impl Round {
    /// The group's size as the sentinels know it (the largest `num-other-sentinels` + 1 any
    /// of them reports; never fewer than the distinct sentinels that answered, or than the
    /// URL lists), the sentinels that answered (each once: answers that give a run id
    /// already counted are the same sentinel reached at another address), and the votes for
    /// each master (address, newest epoch, how many).
    pub(in crate::backend::redis) fn tally<'a>(
        &self,
        answers: impl Iterator<Item = &'a Answer>,
    ) -> (usize, usize, Vec<(Addr, u64, usize)>) {
        let mut group = self.listed;
        let mut answered = 0;
        let mut votes: Vec<(Addr, u64, usize)> = Vec::new();
        let mut ids: Vec<&str> = Vec::new();
        for answer in answers {
            let Answer::Master {
                addr,
                epoch,
                others,
                id,
                ..
            } = answer
            else {
                continue;
            };
            if let Some(id) = id {
                if ids.contains(&id.as_str()) {
                    continue;
                }
                ids.push(id);
            }
            answered += 1;
            group = group.max(others.saturating_add(1)).max(answered);
            match votes.iter_mut().find(|(a, ..)| a == addr) {
                Some((_, newest, count)) => {
                    *newest = (*newest).max(*epoch);
                    *count += 1;
                }
                None => votes.push((addr.clone(), *epoch, 1)),
            }
        }
        (group, answered, votes)
    }

    /// The master a majority of the group names among `answers`, with its newest epoch.
    pub(in crate::backend::redis) fn majority_of<'a>(
        &self,
        answers: impl Iterator<Item = &'a Answer>,
    ) -> Option<(Addr, u64)> {
        let (group, _, votes) = self.tally(answers);
        votes
            .into_iter()
            .find(|(_, _, count)| *count > group / 2)
            .map(|(addr, epoch, _)| (addr, epoch))
    }

    /// The master a majority of the sentinel group names, or why there is none: no sentinel
    /// knows the name (78), none answered (69; 77 or 78 when they all refused us for the same
    /// reason), fewer than a majority answered, or they do not agree (69).
    pub(in crate::backend::redis) fn agreed(
        &self,
        master: &str,
        display: &str,
    ) -> Result<(Addr, u64), Error> {
        if let Some(found) = self.majority_of(self.answers.iter()) {
            return Ok(found);
        }
        let (group, answered, votes) = self.tally(self.answers.iter());
        if answered == 0 {
            return Err(none_answered(&self.answers, master, display));
        }
        let majority = group / 2 + 1;
        let reasons: Vec<&str> = self
            .answers
            .iter()
            .filter_map(|a| match a {
                Answer::Failed(reason, _) => Some(reason.as_str()),
                _ => None,
            })
            .collect();
        let why = if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join("; "))
        };
        if answered < majority {
            let listed = if self.found.iter().any(|f| !f.answered) {
                format!(
                    "; the URL lists {} of them and dlock found the others through it, at the \
                     addresses they announce: if those cannot be reached from here (NAT, \
                     containers), set 'sentinel announce-ip' and 'sentinel announce-port' on \
                     the sentinels, or list {majority} of them in the URL",
                    self.listed
                )
            } else if self.listed < majority {
                format!(
                    "; the URL lists only {} of them, and they named no other that dlock could \
                     ask: list at least {majority}",
                    self.listed
                )
            } else {
                String::new()
            };
            return Err(Error::Unavailable(format!(
                "cannot reach {display}: only {answered} of the {group} sentinels of '{master}' \
                 answered, and a majority ({majority}) must name its master before dlock uses \
                 it{why}{listed}"
            )));
        }
        let named: Vec<String> = votes
            .iter()
            .map(|(addr, epoch, count)| {
                format!(
                    "{count} name {} (epoch {epoch})",
                    crate::kit::url::join_host_port(&addr.0, addr.1)
                )
            })
            .collect();
        Err(Error::Unavailable(format!(
            "{display}: no majority ({majority} of {group}) of the sentinels names the same \
             master for '{master}' ({}): a failover in progress?",
            named.join(", ")
        )))
    }
}

/// The URL's sentinels as asked: which entries are distinct servers, and every address
/// their names resolve to (to tell a sentinel found through them from one they list).
pub(in crate::backend::redis) struct Listed {
    pub(in crate::backend::redis) kept: Vec<usize>,
    addrs: Vec<SocketAddr>,
}

impl Listed {
    /// Is `addr` (as a sentinel announces it) one of the URL's sentinels?
    pub(in crate::backend::redis) fn has(&self, sentinels: &[Sentinel], addr: &Addr) -> bool {
        let by_name = sentinels
            .iter()
            .any(|s| s.host == addr.0 && s.port == addr.1);
        let by_ip = addr.0.parse::<std::net::IpAddr>().is_ok_and(|ip| {
            self.addrs
                .contains(&SocketAddr::new(ip.to_canonical(), addr.1))
        });
        by_name || by_ip
    }
}

/// Which of `sentinels` to ask: one per server, where entries whose names resolve to a
/// common address (IPv4-mapped IPv6 as IPv4) are one server. A name that does not resolve
/// stays an entry of its own (asking it reports why). Resolved once per run, each name within
/// [`ASK_TIMEOUT`].
pub(in crate::backend::redis) async fn distinct(sentinels: &[Sentinel]) -> Listed {
    let lookups = sentinels.iter().map(|s| async {
        let found = tokio::time::timeout(
            ASK_TIMEOUT,
            tokio::net::lookup_host((s.host.as_str(), s.port)),
        )
        .await;
        match found {
            Ok(Ok(addrs)) => addrs
                .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
                .collect(),
            _ => Vec::new(),
        }
    });
    let resolved: Vec<Vec<SocketAddr>> = futures_util::future::join_all(lookups).await;
    let mut kept: Vec<usize> = Vec::new();
    for (i, addrs) in resolved.iter().enumerate() {
        let same = kept.iter().any(|&k| {
            let other = &resolved[k];
            if addrs.is_empty() || other.is_empty() {
                sentinels[k].host == sentinels[i].host && sentinels[k].port == sentinels[i].port
            } else {
                addrs.iter().any(|a| other.contains(a))
            }
        });
        if !same {
            kept.push(i);
        }
    }
    Listed {
        kept,
        addrs: resolved.into_iter().flatten().collect(),
    }
}

/// `SENTINEL MASTER <name>` on one sentinel, with `SENTINEL MYID` and `SENTINEL SENTINELS
/// <name>` beside it on the same connection (who it is, and the others it knows; a sentinel
/// that does not tell, such as one whose ACL does not allow them, still answers).
pub(in crate::backend::redis) async fn ask(sentinel: &Sentinel, master: &str) -> Answer {
    let link = |update: &dyn Fn(&mut Option<MultiplexedConnection>)| {
        if let Ok(mut link) = sentinel.link.lock() {
            update(&mut link);
        }
    };
    let asked = tokio::time::timeout(ASK_TIMEOUT, async {
        let kept = sentinel.link.lock().ok().and_then(|l| l.clone());
        if let Some(connection) = kept {
            match questions(connection, master).await {
                Ok(replies) => return Ok(replies),
                // A kept connection may have died since: one more try on a fresh one.
                Err(e) if e.is_io_error() || e.is_connection_dropped() => link(&|l| *l = None),
                Err(e) => return Err(e),
            }
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(ASK_TIMEOUT))
            .set_response_timeout(Some(ASK_TIMEOUT));
        let connection = sentinel
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let replies = questions(connection.clone(), master).await?;
        link(&|l| *l = Some(connection.clone()));
        Ok(replies)
    })
    .await;
    if !matches!(asked, Ok(Ok(_))) {
        link(&|l| *l = None);
    }
    let label = sentinel.shown();
    let (reply, id, peers) = match asked {
        Ok(Ok(replies)) => replies,
        Ok(Err(e)) => return failed(&label, &e),
        Err(_) => {
            return Answer::Failed(
                format!(
                    "{label}: no answer within {}",
                    humantime::format_duration(ASK_TIMEOUT)
                ),
                None,
            )
        }
    };
    let fields = fields_of(&reply);
    let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
    match (get("ip"), get("port").and_then(|p| p.parse::<u16>().ok())) {
        (Some(ip), Some(port)) => Answer::Master {
            addr: (ip.to_owned(), port),
            epoch: get("config-epoch")
                .and_then(|e| e.parse().ok())
                .unwrap_or(0),
            others: get("num-other-sentinels")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            fields: fields.clone(),
            id,
            peers,
        },
        _ => Answer::Failed(
            format!("{label}: an answer dlock cannot read: {reply:?}"),
            None,
        ),
    }
}

/// The three questions to one sentinel, sent together on `connection`: `SENTINEL MASTER`
/// (its error is the answer's), and its run id and the other sentinels it knows, `None` and
/// none when it does not tell.
async fn questions(
    mut connection: MultiplexedConnection,
    master: &str,
) -> Result<(Value, Option<String>, Vec<Peer>), RedisError> {
    let (mut for_id, mut for_peers) = (connection.clone(), connection.clone());
    let mut about = redis::cmd("SENTINEL");
    about.arg("MASTER").arg(master);
    let mut myid = redis::cmd("SENTINEL");
    myid.arg("MYID");
    let mut others = redis::cmd("SENTINEL");
    others.arg("SENTINELS").arg(master);
    let (reply, id, peers) = tokio::join!(
        about.query_async::<Value>(&mut connection),
        myid.query_async::<String>(&mut for_id),
        others.query_async::<Value>(&mut for_peers),
    );
    let peers = peers.map(|p| peers_of(&p)).unwrap_or_default();
    Ok((reply?, id.ok().filter(|id| !id.is_empty()), peers))
}

/// The sentinels of a `SENTINEL SENTINELS` reply, as many as [`MAX_FOUND`] (each entry a
/// flat array in RESP2, a map in RESP3).
fn peers_of(reply: &Value) -> Vec<Peer> {
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let fields = fields_of(entry);
            let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
            let port = get("port")?.parse::<u16>().ok().filter(|p| *p != 0)?;
            Some(Peer {
                addr: (get("ip").filter(|ip| !ip.is_empty())?, port),
                id: get("runid").filter(|id| !id.is_empty()),
            })
        })
        .take(MAX_FOUND)
        .collect()
}

/// Why one sentinel could not answer; authentication and "not a sentinel" are kept as
/// errors of their own kind, so that they are reported when no sentinel answers.
fn failed(label: &str, e: &RedisError) -> Answer {
    let text = e.to_string();
    if text.contains("No such master") {
        return Answer::Unknown;
    }
    // A sentinel whose certificate the CA does not vouch for (or that refuses ours) is a
    // set-up error, not an outage: reported as such even though no sentinel answered.
    let kind = if crate::error::caused_by_tls(e) {
        Some(Error::Config(format!(
            "TLS with sentinel {label} failed: {text} (rediss-sentinel:// uses the [redis] \
             table's ca_file, cert_file and key_file for the sentinels and the data nodes)"
        )))
    } else if matches!(e.code(), Some("NOAUTH")) || text.contains("unauthenticated") {
        Some(Error::Permission(format!(
            "sentinel {label} wants a password for user 'default', and none was given: give \
             the sentinels' password in {SENTINEL_PASSWORD_PLACES}"
        )))
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS"))
    {
        Some(Error::Permission(format!(
            "sentinel {label} refused user 'default' with the password given: check the \
             sentinels' password in {SENTINEL_PASSWORD_PLACES}"
        )))
    } else if text.contains("unknown command") {
        Some(Error::Config(format!(
            "{label} is not a Redis Sentinel (it does not know the SENTINEL command); \
             use redis:// for a lone server"
        )))
    } else if matches!(e.code(), Some("NOPERM")) {
        Some(Error::Permission(format!(
            "sentinel {label}: the ACL does not allow SENTINEL MASTER: {text}"
        )))
    } else {
        None
    };
    Answer::Failed(format!("{label}: {text}"), kind)
}

/// The fields of a `SENTINEL MASTER` reply (a flat array in RESP2, a map in RESP3).
fn fields_of(reply: &Value) -> Vec<(String, String)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    };
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|c| Some((text(c.first()?), text(c.get(1)?))))
            .collect(),
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (text(k), text(v))).collect(),
        _ => Vec::new(),
    }
}

/// Why no sentinel named a master: none knows the name (78), or none answered (69; 77 or 78
/// when they all refused us for the same reason).
pub(in crate::backend::redis) fn none_answered(
    answers: &[Answer],
    master: &str,
    display: &str,
) -> Error {
    if answers.iter().any(|a| matches!(a, Answer::Unknown)) {
        return Error::Config(format!(
            "{display}: the sentinels monitor no master named '{master}' (the name after '#' \
             must be the one in 'sentinel monitor <name> …')"
        ));
    }
    if let Some(kind) = answers.iter().find_map(|a| match a {
        Answer::Failed(_, Some(Error::Permission(m))) => Some(Error::Permission(m.clone())),
        Answer::Failed(_, Some(Error::Config(m))) => Some(Error::Config(m.clone())),
        _ => None,
    }) {
        return kind;
    }
    let reasons: Vec<&str> = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Failed(reason, _) => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    if !reasons.is_empty()
        && reasons.len() == answers.len()
        && reasons.iter().all(|r| r.contains("Connection refused"))
    {
        return super::super::super::failure::refused(display);
    }
    // A sentinel that speaks TLS only resets a plain-text connection at its first bytes.
    let hint = if display.starts_with("redis-sentinel:")
        && reasons.iter().any(|r| r.contains("reset by peer"))
    {
        "; if the sentinels speak TLS only, use rediss-sentinel:// (with the [redis] table's \
         ca_file, cert_file, key_file)"
    } else {
        ""
    };
    Error::Unavailable(format!(
        "cannot reach {display}: no sentinel answered ({}){hint}",
        reasons.join("; ")
    ))
}
