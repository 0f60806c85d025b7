//! Redis behind Sentinel: where the master is, asked of the sentinels at every connect and at
//! every renewal, so that a hold is only ever renewed on the master the sentinels name now.
//!
//! Why not only at connect (the client guideline) and `ROLE`: after `SENTINEL FAILOVER` the old
//! master keeps answering `ROLE` with `master` and keeps accepting writes for seconds (about
//! 10 s measured with Redis 7.0.15 on loopback) until the sentinels reconfigure it. A holder
//! that kept renewing there would see its renewals succeed while its hold runs out on the new
//! master, where the waiters now are: two holders. So:
//!
//! - every sentinel of the URL is asked at once (`SENTINEL MASTER <name>`, each bounded by
//!   [`ASK_TIMEOUT`]), and the answer with the highest `config-epoch` wins: a failover always
//!   raises the epoch, so a sentinel that has not heard of it yet cannot send us back to the
//!   old master;
//! - a connection goes to that master, which must answer `ROLE` with `master`;
//! - a renewal ([`Locator::confirm`], run by the lease's renewer before `renew.lua`) counts
//!   only when a majority of the listed sentinels answered and the newest of their answers
//!   names the master this connection is on. When it names another one, the connection moves
//!   there and the renewal runs on the new master: a hold that the failover carried over (it
//!   was replicated in time; `?replicas=N` makes sure) is kept, one that it lost is gone and
//!   the command is stopped (124), as on any loss;
//! - while a lock is held, a `+switch-master` subscription ([`watch`]) looks at the new
//!   master at once instead of at the next renewal;
//! - a waiter asks again at least every [`WAITER_RECHECK`], and before a grant counts: a place
//!   in line or a grant on a master the sentinels no longer name is taken again on the new
//!   one (a hold that the failover lost is then granted there once, not twice).
//!
//! The sentinels are never used for locks, nor are replicas: only master-side commands go to
//! the master.

pub(super) mod check;
mod connect;
pub(super) mod replicas;
pub mod target;
pub(super) mod watch;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Value};

use crate::clock::BootInstant;
use crate::error::Error;

use super::conn::{classify, Conn};
use super::{RedisAddr, RedisTarget};

/// Bound for asking one sentinel (connecting, authenticating, the answer).
pub(super) const ASK_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a waiter asks the sentinels whether the master moved.
pub(super) const WAITER_RECHECK: Duration = Duration::from_secs(1);
/// A grant counts without asking again when the sentinels were asked this recently.
pub(super) const FRESH: Duration = Duration::from_millis(100);
/// Bound for connecting to the master the sentinels name.
const MASTER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A `host:port`.
pub(super) type Addr = (String, u16);

/// One sentinel of the URL.
#[derive(Clone)]
pub(super) struct Sentinel {
    pub(super) label: String,
    pub(super) client: Client,
    /// The connection of the last answer, kept for the next question (a waiter asks every
    /// second, a holder at every renewal).
    link: Arc<std::sync::Mutex<Option<MultiplexedConnection>>>,
}

/// What one sentinel said about the master.
pub(super) enum Answer {
    /// Its current view: the master's address and the configuration epoch it dates from,
    /// with the rest of the `SENTINEL MASTER` fields (for `check`).
    Master {
        addr: Addr,
        epoch: u64,
        fields: Vec<(String, String)>,
    },
    /// It monitors no master of that name.
    Unknown,
    Failed(String, Option<Error>),
}

/// Where the master is, for one connection.
pub(crate) struct Locator {
    pub(super) sentinels: Arc<[Sentinel]>,
    pub(super) master: String,
    data: RedisTarget,
    pub(super) display: String,
    /// The master this connection is (or was last) connected to.
    pub(super) current: Option<Addr>,
    /// Where the next connect goes without asking again (a renewal just asked).
    next: Option<Addr>,
    /// When the sentinels were last asked for this connection.
    asked: Option<BootInstant>,
    /// `?replicas=N` and how long to wait for them.
    pub(super) replicas: u32,
    pub(super) replicas_timeout: Duration,
}

impl Locator {
    /// `None` unless `target` is behind Sentinel.
    pub(crate) fn new(target: &RedisTarget, display: &str) -> Result<Option<Locator>, Error> {
        let Some(sentinel) = &target.sentinel else {
            return Ok(None);
        };
        let mut sentinels = Vec::new();
        for (host, port) in &sentinel.sentinels {
            let addr = if sentinel.tls {
                RedisAddr::Tls {
                    host: host.clone(),
                    port: *port,
                }
            } else {
                RedisAddr::Tcp {
                    host: host.clone(),
                    port: *port,
                }
            };
            let own = RedisTarget {
                addr,
                db: 0,
                user: sentinel.user.clone(),
                password: sentinel.password.clone(),
                tls: target.tls.clone(),
                more_hosts: Vec::new(),
                sentinel: None,
            };
            sentinels.push(Sentinel {
                label: crate::backend::url::join_host_port(host, *port),
                client: Conn::client_for(&own, display)?,
                link: Arc::default(),
            });
        }
        let mut data = target.clone();
        data.sentinel = None;
        Ok(Some(Locator {
            sentinels: sentinels.into(),
            master: sentinel.master.clone(),
            data,
            display: display.to_owned(),
            current: None,
            next: None,
            asked: None,
            replicas: sentinel.replicas,
            replicas_timeout: sentinel.replicas_timeout,
        }))
    }

    /// Ask the sentinels where the master is, connect there and check that it is one.
    pub(super) async fn locate(&mut self) -> Result<(Client, MultiplexedConnection), Error> {
        let addr = match self.next.take() {
            Some(addr) => addr,
            None => {
                self.asked = Some(BootInstant::now());
                let answers = ask_all(&self.sentinels, &self.master).await;
                newest(&answers, &self.master, &self.display)?.0
            }
        };
        let (client, connection) = self.connect_to(&addr).await?;
        self.current = Some(addr);
        Ok((client, connection))
    }

    /// A copy for another task (asking and connecting only; no connection state).
    fn detached(&self) -> Locator {
        Locator {
            sentinels: self.sentinels.clone(),
            master: self.master.clone(),
            data: self.data.clone(),
            display: self.display.clone(),
            current: None,
            next: None,
            asked: None,
            replicas: self.replicas,
            replicas_timeout: self.replicas_timeout,
        }
    }

    /// Connect to `addr` with the data nodes' settings; it must be a master.
    async fn connect_to(&self, addr: &Addr) -> Result<(Client, MultiplexedConnection), Error> {
        let mut data = self.data.clone();
        data.addr = match data.addr {
            RedisAddr::Tls { .. } => RedisAddr::Tls {
                host: addr.0.clone(),
                port: addr.1,
            },
            _ => RedisAddr::Tcp {
                host: addr.0.clone(),
                port: addr.1,
            },
        };
        let shown = format!(
            "{} (master '{}' at {})",
            self.display,
            self.master,
            crate::backend::url::join_host_port(&addr.0, addr.1)
        );
        let client = Conn::client_for(&data, &self.display)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(MASTER_CONNECT_TIMEOUT))
            .set_response_timeout(None);
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| classify(&e, &shown))?;
        let role: Vec<Value> = redis::cmd("ROLE")
            .query_async(&mut connection)
            .await
            .map_err(|e| classify(&e, &shown))?;
        match role.first() {
            Some(Value::BulkString(role)) if role == b"master" => Ok((client, connection)),
            _ => Err(Error::Unavailable(format!(
                "{shown} is not a master yet (a failover in progress?); try again"
            ))),
        }
    }

    /// Before a renewal: do the sentinels still name the master this connection is on?
    /// `Ok(false)` when they do, `Ok(true)` when they name another one (the next connect goes
    /// there), an error when too few sentinels answered to tell.
    async fn confirm(&mut self) -> Result<bool, String> {
        self.asked = Some(BootInstant::now());
        let answers = ask_all(&self.sentinels, &self.master).await;
        let answered = answers
            .iter()
            .filter(|a| !matches!(a, Answer::Failed(..)))
            .count();
        let majority = self.sentinels.len() / 2 + 1;
        if answered < majority {
            return Err(format!(
                "only {answered} of {} sentinels answered, fewer than a majority: cannot tell \
                 whether '{}' is still the master",
                self.sentinels.len(),
                self.master
            ));
        }
        let (addr, _) = newest(&answers, &self.master, &self.display).map_err(|e| e.to_string())?;
        if self.current.as_ref() != Some(&addr) {
            tracing::warn!(
                "the sentinels name a new master for '{}': {}; moving there",
                self.master,
                crate::backend::url::join_host_port(&addr.0, addr.1)
            );
            self.next = Some(addr);
            return Ok(true);
        }
        Ok(false)
    }
}

/// Before a renewal on `conn`: confirm that the sentinels name its master now, or move it to
/// the one they name (the renewal then finds there whether the hold survived the failover).
/// Nothing to do when `conn` is not behind Sentinel.
pub(super) async fn confirm(conn: &mut Conn) -> Result<(), String> {
    moved(conn, Duration::ZERO).await.map(drop)
}

/// For a waiter, after each acquire step (`granted`: the step granted the lock): has the
/// master moved? A grant is checked unless the sentinels were asked within [`FRESH`], a
/// place in line every [`WAITER_RECHECK`].
pub(super) async fn follow(conn: &mut Conn, granted: bool) -> Result<bool, Error> {
    let max_age = if granted { FRESH } else { WAITER_RECHECK };
    moved(conn, max_age).await.map_err(Error::Unavailable)
}

/// Has the master moved since the sentinels were last asked for `conn`? They are asked again
/// unless that was less than `max_age` ago; when it moved, `conn` reconnects to the new one.
/// `Ok(false)` when `conn` is not behind Sentinel.
pub(super) async fn moved(conn: &mut Conn, max_age: Duration) -> Result<bool, String> {
    let Some(locator) = conn.sentinel.as_mut() else {
        return Ok(false);
    };
    if !max_age.is_zero()
        && locator
            .asked
            .is_some_and(|at| BootInstant::now().saturating_since(at) < max_age)
    {
        return Ok(false);
    }
    let moved = locator.confirm().await?;
    if moved {
        conn.reconnect();
    }
    Ok(moved)
}

/// Ask every sentinel at once; each answer within [`ASK_TIMEOUT`].
pub(super) async fn ask_all(sentinels: &Arc<[Sentinel]>, master: &str) -> Vec<Answer> {
    let mut asks = tokio::task::JoinSet::new();
    for (i, sentinel) in sentinels.iter().enumerate() {
        let (sentinel, master) = (sentinel.clone(), master.to_owned());
        asks.spawn(async move { (i, ask(&sentinel, &master).await) });
    }
    let mut answers: Vec<(usize, Answer)> = Vec::with_capacity(sentinels.len());
    while let Some(done) = asks.join_next().await {
        match done {
            Ok(answer) => answers.push(answer),
            Err(e) => answers.push((usize::MAX, Answer::Failed(e.to_string(), None))),
        }
    }
    answers.sort_by_key(|(i, _)| *i);
    answers.into_iter().map(|(_, a)| a).collect()
}

/// `SENTINEL MASTER <name>` on one sentinel.
async fn ask(sentinel: &Sentinel, master: &str) -> Answer {
    let link = |update: &dyn Fn(&mut Option<MultiplexedConnection>)| {
        if let Ok(mut link) = sentinel.link.lock() {
            update(&mut link);
        }
    };
    let asked = tokio::time::timeout(ASK_TIMEOUT, async {
        let kept = sentinel.link.lock().ok().and_then(|l| l.clone());
        let mut command = redis::cmd("SENTINEL");
        command.arg("MASTER").arg(master);
        if let Some(mut connection) = kept {
            match command.query_async::<Value>(&mut connection).await {
                Ok(reply) => return Ok(reply),
                // A kept connection may have died since: one more try on a fresh one.
                Err(e) if e.is_io_error() || e.is_connection_dropped() => link(&|l| *l = None),
                Err(e) => return Err(e),
            }
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(ASK_TIMEOUT))
            .set_response_timeout(Some(ASK_TIMEOUT));
        let mut connection = sentinel
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let reply = command.query_async::<Value>(&mut connection).await?;
        link(&|l| *l = Some(connection.clone()));
        Ok(reply)
    })
    .await;
    if !matches!(asked, Ok(Ok(_))) {
        link(&|l| *l = None);
    }
    let label = &sentinel.label;
    let reply = match asked {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => return failed(label, &e),
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
            fields: fields.clone(),
        },
        _ => Answer::Failed(
            format!("{label}: an answer dlock cannot read: {reply:?}"),
            None,
        ),
    }
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
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || text.contains("unauthenticated")
    {
        Some(Error::Permission(format!(
            "sentinel {label} refused authentication: give the sentinels' password in \
             DLOCK_SENTINEL_PASSWORD or the [redis-sentinel] table's password_file (the \
             URL's password is the data nodes')"
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

/// The master named by the newest configuration among the answers (highest epoch), or why
/// there is none: no sentinel knows the name (78), or none answered (69; 77 or 78 when they
/// all refused us for the same reason).
pub(super) fn newest(
    answers: &[Answer],
    master: &str,
    display: &str,
) -> Result<(Addr, u64), Error> {
    let best = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Master { addr, epoch, .. } => Some((addr.clone(), *epoch)),
            _ => None,
        })
        .max_by_key(|(_, epoch)| *epoch);
    if let Some(best) = best {
        return Ok(best);
    }
    if answers.iter().any(|a| matches!(a, Answer::Unknown)) {
        return Err(Error::Config(format!(
            "{display}: the sentinels monitor no master named '{master}' (the name after '#' \
             must be the one in 'sentinel monitor <name> …')"
        )));
    }
    if let Some(kind) = answers.iter().find_map(|a| match a {
        Answer::Failed(_, Some(Error::Permission(m))) => Some(Error::Permission(m.clone())),
        Answer::Failed(_, Some(Error::Config(m))) => Some(Error::Config(m.clone())),
        _ => None,
    }) {
        return Err(kind);
    }
    let reasons: Vec<&str> = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Failed(reason, _) => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    // A sentinel that speaks TLS only resets a plain-text connection at its first bytes.
    let hint = if display.starts_with("redis-sentinel:")
        && reasons.iter().any(|r| r.contains("reset by peer"))
    {
        "; if the sentinels speak TLS only, use rediss-sentinel:// (with the [redis] table's \
         ca_file, cert_file, key_file)"
    } else {
        ""
    };
    Err(Error::Unavailable(format!(
        "cannot reach {display}: no sentinel answered ({}){hint}",
        reasons.join("; ")
    )))
}
