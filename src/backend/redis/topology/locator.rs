//! Where the master is behind Sentinel, found without a `Conn`: the sentinels of the URL, asked
//! at once for the master they name ([`round`]), and a connection to it once a majority agree.
//! Why a majority, and when the sentinels are asked (every connect, every renewal, a waiter's
//! re-checks), is the theory of `sentinel/`, which drives this from a `Conn`.

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

use self::round::{ask, distinct};
pub(in crate::backend::redis) use self::round::{Answer, Round};

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

/// A `host:port`.
pub(in crate::backend::redis) type Addr = (String, u16);

/// One sentinel of the URL.
#[derive(Clone)]
pub(in crate::backend::redis) struct Sentinel {
    pub(in crate::backend::redis) label: String,
    host: String,
    port: u16,
    pub(in crate::backend::redis) client: Client,
    /// The connection of the last answer, kept for the next question (a waiter asks every
    /// second, a holder at every renewal).
    link: Arc<std::sync::Mutex<Option<MultiplexedConnection>>>,
}

/// Where the master is, for one connection.
pub(in crate::backend::redis) struct Locator {
    pub(in crate::backend::redis) sentinels: Arc<[Sentinel]>,
    /// Which of `sentinels` are distinct servers (resolved once, on first use).
    distinct: Arc<OnceCell<Vec<usize>>>,
    pub(in crate::backend::redis) master: String,
    data: RedisTarget,
    pub(in crate::backend::redis) display: String,
    /// The master this connection is (or was last) connected to.
    pub(in crate::backend::redis) current: Option<Addr>,
    /// Where the next connect goes without asking again (a renewal just asked).
    next: Option<Addr>,
    /// When a majority of the sentinels last named the master of this connection.
    pub(in crate::backend::redis) asked: Option<BootInstant>,
    /// A waiter's `--wait` deadline: its checks of the sentinels end by then.
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
                label: crate::kit::url::join_host_port(host, *port),
                host: host.clone(),
                port: *port,
                client: Setup::client_for(&own, display)?,
                link: Arc::default(),
            });
        }
        let mut data = target.clone();
        data.sentinel = None;
        Ok(Some(Locator {
            sentinels: sentinels.into(),
            distinct: Arc::default(),
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
    /// for). The answers in the URL's order.
    pub(in crate::backend::redis) async fn ask(&self, budget: Duration, early: bool) -> Round {
        let distinct = self
            .distinct
            .get_or_init(|| distinct(&self.sentinels))
            .await;
        let listed = distinct.len();
        let mut asks = tokio::task::JoinSet::new();
        for &i in distinct {
            let (sentinel, master) = (self.sentinels[i].clone(), self.master.clone());
            asks.spawn(async move { (i, ask(&sentinel, &master).await) });
        }
        let until = tokio::time::Instant::now() + budget;
        let mut answers: Vec<(usize, Answer)> = Vec::with_capacity(listed);
        loop {
            let done = match tokio::time::timeout_at(until, asks.join_next()).await {
                Ok(Some(done)) => done,
                Ok(None) => break,
                Err(_) => {
                    answers.push((
                        usize::MAX,
                        Answer::Failed(
                            format!(
                                "{} more sentinel(s): no answer within {}",
                                asks.len(),
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
            if early {
                let round = Round {
                    answers: Vec::new(),
                    listed,
                };
                if round.majority_of(answers.iter().map(|(_, a)| a)).is_some() {
                    break;
                }
            }
        }
        // The sentinels not waited for finish on their own (each within ASK_TIMEOUT) and
        // keep their connection for the next round: a TLS handshake cut off at every round
        // would be made again at every round.
        asks.detach_all();
        answers.sort_by_key(|(i, _)| *i);
        Round {
            answers: answers.into_iter().map(|(_, a)| a).collect(),
            listed,
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
    /// its `--wait` (but [`LAST_CHECK`] at least).
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

/// The last time no majority of a set of sentinels named a master while connecting: the key
/// ([`Locator::key`]), when, and what was said.
static NO_MAJORITY: std::sync::Mutex<Option<(String, BootInstant, String)>> =
    std::sync::Mutex::new(None);

/// A connect within [`ASK_TIMEOUT`] of a round that found no majority (the acquire call's
/// retries, the withdrawal after it) fails the same way at once instead of asking again:
/// the round itself waited up to [`ASK_TIMEOUT`] for the silent sentinels, and asking them
/// again at once would only make the run take that long again, past `--wait`.
fn recent_failure(key: &str) -> Option<Error> {
    let last = NO_MAJORITY.lock().ok()?;
    match last.as_ref() {
        Some((k, at, message))
            if k == key && BootInstant::now().saturating_since(*at) < ASK_TIMEOUT =>
        {
            Some(Error::Unavailable(message.clone()))
        }
        _ => None,
    }
}

/// Remembers a round that did not finish (dropped by its caller's timeout) as one that found
/// no majority: the key and what to say.
struct CutOff(Option<(String, String)>);

impl Drop for CutOff {
    fn drop(&mut self) {
        if let Some((key, message)) = self.0.take() {
            remember_failure(key, &Error::Unavailable(message));
        }
    }
}

fn remember_failure(key: String, error: &Error) {
    if let (Error::Unavailable(message), Ok(mut last)) = (error, NO_MAJORITY.lock()) {
        *last = Some((key, BootInstant::now(), message.clone()));
    }
}
