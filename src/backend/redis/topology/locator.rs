//! Where the master is behind Sentinel, found without a `Conn`: the sentinels of the URL (and,
//! when it lists fewer than a majority of the group, the others they know), asked at once for
//! the master they name ([`round`]), and a connection to it once a majority agree.
//! Why a majority, and when the sentinels are asked (every connect, every renewal, a waiter's
//! re-checks), is the theory of `sentinel/`, which drives this from a `Conn`.

mod no_majority;
mod round;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::sync::OnceCell;

use crate::clock::BootInstant;
use crate::error::Error;

use crate::backend::redis::failure::classify;
use crate::backend::redis::setup::Setup;
use crate::backend::redis::{RedisAddr, RedisTarget};

use self::no_majority::{recent_failure, remember_failure, CutOff};
use self::round::{ask, distinct, Listed, Peer};
pub(in crate::backend::redis) use self::round::{Answer, Found, Round};

/// Bound for asking one sentinel (connecting, authenticating, the answer). A sentinel answers
/// from memory in well under a millisecond on a LAN, but a new TLS connection with a client
/// certificate took up to about 1 s on a loaded 2-core machine (debug build): this leaves it
/// room. It delays nothing while a majority answers (the asking stops when one agrees), and
/// every caller bounds the whole round by its own budget as well (the keeper's attempt
/// timeout for a renewal, `--wait` for a waiter).
pub(in crate::backend::redis) const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// The least time a waiter's check of the sentinels gets at the `--wait` deadline (an answer
/// on a LAN takes milliseconds), so that a grant right at the deadline can still count, and
/// the run still ends within `--wait` + 0.5 s.
const LAST_CHECK: Duration = Duration::from_millis(250);
/// Bound for connecting to the master the sentinels name.
const MASTER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most sentinels dlock asks beyond the URL's, found through them: a group has a handful
/// (Redis documents three or five).
const MAX_FOUND: usize = 16;

/// A `host:port`.
pub(in crate::backend::redis) type Addr = (String, u16);

/// One sentinel: of the URL, or found through one of the URL's.
#[derive(Clone)]
pub(in crate::backend::redis) struct Sentinel {
    pub(in crate::backend::redis) label: String,
    host: String,
    port: u16,
    /// For a sentinel the URL does not list, the one it was found through.
    through: Option<String>,
    pub(in crate::backend::redis) client: Client,
    /// The connection of the last answer, kept for the next question (a waiter asks every
    /// second, a holder at every renewal).
    link: Arc<std::sync::Mutex<Option<MultiplexedConnection>>>,
}

impl Sentinel {
    /// Its address, and for one found through another, which.
    fn shown(&self) -> String {
        match &self.through {
            Some(through) => format!("{} (found through {through})", self.label),
            None => self.label.clone(),
        }
    }
}

/// Where the master is, for one connection.
pub(in crate::backend::redis) struct Locator {
    pub(in crate::backend::redis) sentinels: Arc<[Sentinel]>,
    /// Which of `sentinels` are distinct servers (resolved once, on first use).
    distinct: Arc<OnceCell<Listed>>,
    /// The sentinels found through the URL's when it lists fewer than a majority of the group,
    /// as the last round that heard of them left them (asked from the start of each round).
    pub(in crate::backend::redis) found: Arc<std::sync::Mutex<Vec<Sentinel>>>,
    /// The sentinels' settings (credentials, TLS) for one found through the URL's.
    own: RedisTarget,
    pub(in crate::backend::redis) master: String,
    data: RedisTarget,
    pub(in crate::backend::redis) display: String,
    /// The master this connection is (or was last) connected to.
    pub(in crate::backend::redis) current: Option<Addr>,
    /// Where the next connect goes without asking again (a renewal just asked).
    next: Option<Addr>,
    /// When a majority of the sentinels last named the master of this connection.
    pub(in crate::backend::redis) asked: Option<BootInstant>,
    /// A waiter's time to answer (`--wait`, but at least `MIN_ANSWER`): its checks of the
    /// sentinels end by then.
    pub(in crate::backend::redis) deadline: Option<BootInstant>,
    /// `?replicas=N` and how long to wait for them.
    pub(in crate::backend::redis) replicas: u32,
    pub(in crate::backend::redis) replicas_timeout: Duration,
}

impl Locator {
    /// `None` unless `target` is behind Sentinel.
    pub(in crate::backend::redis) fn new(
        target: &RedisTarget,
        display: &str,
    ) -> Result<Option<Locator>, Error> {
        let Some(sentinel) = &target.sentinel else {
            return Ok(None);
        };
        let own = RedisTarget {
            addr: target.addr.clone(),
            db: 0,
            user: sentinel.user.clone(),
            password: sentinel.password.clone(),
            tls: target.tls.clone(),
            more_hosts: Vec::new(),
            sentinel: None,
        };
        let mut sentinels = Vec::new();
        for (host, port) in &sentinel.sentinels {
            sentinels.push(Self::sentinel_at(&own, host, *port, None, display)?);
        }
        let mut data = target.clone();
        data.sentinel = None;
        Ok(Some(Locator {
            sentinels: sentinels.into(),
            distinct: Arc::default(),
            found: Arc::default(),
            own,
            master: sentinel.master.clone(),
            data,
            display: display.to_owned(),
            current: None,
            next: None,
            asked: None,
            deadline: None,
            replicas: sentinel.replicas,
            replicas_timeout: sentinel.replicas_timeout,
        }))
    }

    /// A sentinel at `host:port` with the settings of `own` (found `through` another, or of
    /// the URL).
    fn sentinel_at(
        own: &RedisTarget,
        host: &str,
        port: u16,
        through: Option<String>,
        display: &str,
    ) -> Result<Sentinel, Error> {
        let mut own = own.clone();
        own.addr = match own.addr {
            RedisAddr::Tls { .. } => RedisAddr::Tls {
                host: host.to_owned(),
                port,
            },
            _ => RedisAddr::Tcp {
                host: host.to_owned(),
                port,
            },
        };
        Ok(Sentinel {
            label: crate::kit::url::join_host_port(host, port),
            host: host.to_owned(),
            port,
            through,
            client: Setup::client_for(&own, display)?,
            link: Arc::default(),
        })
    }

    /// Ask the sentinels where the master is, connect there and check that it is one.
    pub(in crate::backend::redis) async fn locate(
        &mut self,
    ) -> Result<(Client, MultiplexedConnection), Error> {
        let addr = match self.next.take() {
            Some(addr) => addr,
            None => {
                let key = self.key();
                if let Some(error) = recent_failure(&key) {
                    return Err(error);
                }
                // A waiter's round cut off by its call's budget counts as one that found no
                // majority (what follows, such as leaving the queue, must not ask again).
                let mut cut_off = CutOff(self.deadline.map(|_| {
                    let message = format!(
                        "cannot reach {}: no majority of the sentinels of '{}' named its \
                         master in time",
                        self.display, self.master
                    );
                    (key.clone(), message)
                }));
                let round = self.ask(self.budget(), true).await;
                cut_off.0 = None;
                let (addr, _) = round
                    .agreed(&self.master, &self.display)
                    .inspect_err(|e| remember_failure(key, e))?;
                self.asked = Some(BootInstant::now());
                addr
            }
        };
        let (client, connection) = self.connect_to(&addr).await?;
        self.current = Some(addr);
        Ok((client, connection))
    }

    /// Which sentinels and master this is, for [`recent_failure`].
    fn key(&self) -> String {
        let labels: Vec<&str> = self.sentinels.iter().map(|s| s.label.as_str()).collect();
        format!("{}#{}", labels.join(","), self.master)
    }

    /// A copy for another task (asking and connecting only; no connection state).
    pub(in crate::backend::redis) fn detached(&self) -> Locator {
        Locator {
            sentinels: self.sentinels.clone(),
            distinct: self.distinct.clone(),
            found: self.found.clone(),
            own: self.own.clone(),
            master: self.master.clone(),
            data: self.data.clone(),
            display: self.display.clone(),
            current: None,
            next: None,
            asked: None,
            deadline: None,
            replicas: self.replicas,
            replicas_timeout: self.replicas_timeout,
        }
    }

    /// Ask the distinct sentinels at once, within `budget` (each within [`ASK_TIMEOUT`]);
    /// with `early`, stop as soon as a majority names one master (the others are not waited
    /// for). When the URL lists fewer than a majority of the group (as the answers tell it),
    /// the other sentinels the answers name are asked too, as soon as they are named (and from
    /// the start in the rounds after). The answers in the URL's order, then the others'.
    pub(in crate::backend::redis) async fn ask(&self, budget: Duration, early: bool) -> Round {
        let listed = self
            .distinct
            .get_or_init(|| distinct(&self.sentinels))
            .await;
        let mut asked: Vec<Sentinel> = listed
            .kept
            .iter()
            .map(|&i| self.sentinels[i].clone())
            .collect();
        let known = self.found.lock().map(|f| f.clone()).unwrap_or_default();
        let first_found = asked.len();
        asked.extend(known);
        let mut asks = tokio::task::JoinSet::new();
        for (i, sentinel) in asked.iter().enumerate() {
            let (sentinel, master) = (sentinel.clone(), self.master.clone());
            asks.spawn(async move { (i, ask(&sentinel, &master).await) });
        }
        let until = tokio::time::Instant::now() + budget;
        let mut answers: Vec<(usize, Answer)> = Vec::with_capacity(asked.len());
        // The other sentinels the answers name, and whether any answer told the URL lists
        // fewer than a majority of the group.
        let mut named: Vec<Peer> = Vec::new();
        let mut short = false;
        loop {
            let done = match tokio::time::timeout_at(until, asks.join_next()).await {
                Ok(Some(done)) => done,
                Ok(None) => break,
                Err(_) => {
                    let silent: Vec<String> = asked
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !answers.iter().any(|(a, _)| a == i))
                        .map(|(_, s)| s.shown())
                        .collect();
                    answers.push((
                        usize::MAX,
                        Answer::Failed(
                            format!(
                                "{}: no answer within {}",
                                silent.join(", "),
                                humantime::format_duration(budget)
                            ),
                            None,
                        ),
                    ));
                    break;
                }
            };
            match done {
                Ok(answer) => answers.push(answer),
                Err(e) => answers.push((usize::MAX, Answer::Failed(e.to_string(), None))),
            }
            let round = Round {
                answers: Vec::new(),
                listed: listed_count(listed.kept.len(), first_found, &answers),
                found: Vec::new(),
            };
            if early && round.majority_of(answers.iter().map(|(_, a)| a)).is_some() {
                break;
            }
            let (group, _, _) = round.tally(answers.iter().map(|(_, a)| a));
            if round.listed > group / 2 {
                continue;
            }
            short = true;
            // Ask each sentinel named that is not asked yet: not one of the URL's, nor one
            // asked under this address, nor one that answered under another (its run id).
            let mut ids: Vec<&str> = Vec::new();
            for (_, answer) in &answers {
                if let Answer::Master { id, peers, .. } = answer {
                    ids.extend(id.as_deref());
                    for peer in peers {
                        if !named.contains(peer) {
                            named.push(peer.clone());
                        }
                    }
                }
            }
            let mut new = Vec::new();
            for peer in &named {
                let (host, port) = &peer.addr;
                let already = listed.has(&self.sentinels, &peer.addr)
                    || asked.iter().any(|s| &s.host == host && s.port == *port)
                    || peer.id.as_deref().is_some_and(|id| ids.contains(&id));
                if already || asked.len() >= first_found + MAX_FOUND {
                    continue;
                }
                let through = answers.iter().find_map(|(i, a)| match a {
                    Answer::Master { peers, .. } if peers.contains(peer) => {
                        asked.get(*i).map(|s| s.label.clone())
                    }
                    _ => None,
                });
                match Self::sentinel_at(&self.own, host, *port, through, &self.display) {
                    Ok(sentinel) => {
                        new.push(asked.len());
                        asked.push(sentinel);
                    }
                    Err(e) => tracing::debug!("a sentinel named at {host}:{port}: {e}"),
                }
            }
            for i in new {
                let (sentinel, master) = (asked[i].clone(), self.master.clone());
                asks.spawn(async move { (i, ask(&sentinel, &master).await) });
            }
        }
        // The sentinels not waited for finish on their own (each within ASK_TIMEOUT) and
        // keep their connection for the next round: a TLS handshake cut off at every round
        // would be made again at every round.
        asks.detach_all();
        self.keep_found(&asked[first_found..], &answers, &named, short);
        answers.sort_by_key(|(i, _)| *i);
        let found = asked[first_found..]
            .iter()
            .enumerate()
            .map(|(j, s)| Found {
                label: s.label.clone(),
                through: s.through.clone().unwrap_or_default(),
                answered: answers
                    .iter()
                    .any(|(i, a)| *i == first_found + j && matches!(a, Answer::Master { .. })),
            })
            .collect();
        Round {
            listed: listed_count(listed.kept.len(), first_found, &answers),
            answers: answers.into_iter().map(|(_, a)| a).collect(),
            found,
        }
    }

    /// What the next round asks beyond the URL's sentinels: when this one found the URL lists
    /// fewer than a majority, those of `asked` that a sentinel named in it (`named`: a
    /// sentinel that left the group is dropped with it); none when it lists a majority; as
    /// they were when no sentinel answered.
    fn keep_found(
        &self,
        asked: &[Sentinel],
        answers: &[(usize, Answer)],
        named: &[Peer],
        short: bool,
    ) {
        if !answers
            .iter()
            .any(|(_, a)| matches!(a, Answer::Master { .. }))
        {
            return;
        }
        let kept: Vec<Sentinel> = if short {
            asked
                .iter()
                .filter(|s| {
                    named
                        .iter()
                        .any(|p| p.addr.0 == s.host && p.addr.1 == s.port)
                })
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        if let Ok(mut found) = self.found.lock() {
            *found = kept;
        }
    }

    /// Connect to `addr` with the data nodes' settings; it must be a master.
    pub(in crate::backend::redis) async fn connect_to(
        &self,
        addr: &Addr,
    ) -> Result<(Client, MultiplexedConnection), Error> {
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
            crate::kit::url::join_host_port(&addr.0, addr.1)
        );
        let client = Setup::client_for(&data, &self.display)?;
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

    /// How long a round of asking may take: [`ASK_TIMEOUT`], and for a waiter no longer than
    /// its time to answer (but [`LAST_CHECK`] at least).
    fn budget(&self) -> Duration {
        match self.deadline {
            Some(deadline) => ASK_TIMEOUT.min(deadline.remaining().max(LAST_CHECK)),
            None => ASK_TIMEOUT,
        }
    }

    /// Before a renewal or a grant counts: does a majority of the sentinels still name the
    /// master this connection is on? `Ok(false)` when it does, `Ok(true)` when it names
    /// another one (the next connect goes there), an error when no majority names one.
    pub(in crate::backend::redis) async fn confirm(&mut self) -> Result<bool, String> {
        let budget = self.budget();
        let round = self.ask(budget, true).await;
        let (addr, _) = round
            .agreed(&self.master, &self.display)
            .map_err(|e| e.to_string())?;
        self.asked = Some(BootInstant::now());
        if self.current.as_ref() != Some(&addr) {
            tracing::warn!(
                "the sentinels name a new master for '{}': {}; moving there",
                self.master,
                crate::kit::url::join_host_port(&addr.0, addr.1)
            );
            self.next = Some(addr);
            return Ok(true);
        }
        Ok(false)
    }
}

/// How many distinct sentinels the URL lists, as far as `answers` tell: `distinct` entries
/// (those before `first_found` in the round's order), less those that answered with the run
/// id of another entry that did (one sentinel reached at two addresses, `127.0.0.1` and
/// `::1`).
fn listed_count(distinct: usize, first_found: usize, answers: &[(usize, Answer)]) -> usize {
    let mut ids: Vec<&str> = Vec::new();
    let mut twice = 0;
    for (i, answer) in answers {
        if let (true, Answer::Master { id: Some(id), .. }) = (*i < first_found, answer) {
            if ids.contains(&id.as_str()) {
                twice += 1;
            } else {
                ids.push(id);
            }
        }
    }
    distinct.saturating_sub(twice)
}
