//! What `dlock check` adds behind Sentinel: how many sentinels answered (the URL's, and those
//! found through them when it lists fewer than a majority; a warning when fewer than the
//! quorum did: a failover could not be agreed on now), the master they name and the
//! configuration epoch, and the master's replicas with their lag.

use crate::lock::CheckReport;

use super::super::conn::Conn;
use super::super::topology::{Answer, Locator, Round, ASK_TIMEOUT};
use crate::kit::timeouts::OP_TIMEOUT;

/// Add the Sentinel details to `report` (nothing when `conn` is not behind Sentinel).
pub(in crate::backend::redis) async fn report(conn: &mut Conn, report: &mut CheckReport) {
    let Some(locator) = conn.sentinel.as_ref() else {
        return;
    };
    report.backend = "redis-sentinel".into();
    let round = locator.ask(ASK_TIMEOUT, false).await;
    let answered = report_answers(&round, locator, report);
    report_quorum(&round, answered, report);
    report_master(&round, locator, answered, report);
    let wanted = locator.replicas;
    report_wanted_replicas(locator, report);
    report_connected_replicas(conn, wanted, report).await;
}

/// Reports how many sentinels answered (the URL's, then each found through them) and the
/// group they know, warning of each sentinel that did not answer or does not monitor the
/// master; returns how many (each once) named a master.
fn report_answers(round: &Round, locator: &Locator, report: &mut CheckReport) -> usize {
    let answers = &round.answers;
    let listed = round.listed;
    let (group, answered, _) = round.tally(answers.iter());
    let found_answered = round.found.iter().filter(|f| f.answered).count();
    report.details.push((
        "sentinels".into(),
        format!(
            "{} of {listed} answered",
            answered.saturating_sub(found_answered)
        ),
    ));
    if !round.found.is_empty() {
        let found: Vec<String> = round
            .found
            .iter()
            .map(|f| {
                let said = if f.answered {
                    "answered"
                } else {
                    "did not answer"
                };
                format!("{} {said} (through {})", f.label, f.through)
            })
            .collect();
        report.details.push((
            "found through them".into(),
            format!(
                "{} (the URL lists fewer than a majority of the group)",
                found.join("; ")
            ),
        ));
    }
    report.details.push((
        "sentinel group".into(),
        format!(
            "{group} (as the sentinels know it); a majority ({}) must name the master for a \
             run to take the lock or renew it",
            group / 2 + 1
        ),
    ));
    for answer in answers {
        match answer {
            Answer::Failed(reason, _) => report
                .warnings
                .push(format!("a sentinel did not answer: {reason}")),
            Answer::Unknown => report
                .warnings
                .push(format!("a sentinel does not monitor '{}'", locator.master)),
            Answer::Master { .. } => {}
        }
    }
    answered
}

/// Reports the quorum the first answering sentinel gives, warning when fewer sentinels than
/// that answered.
fn report_quorum(round: &Round, answered: usize, report: &mut CheckReport) {
    let asked = round.listed + round.found.len();
    let field = |name: &str| {
        round.answers.iter().find_map(|a| match a {
            Answer::Master { fields, .. } => fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone()),
            _ => None,
        })
    };
    if let Some(quorum) = field("quorum").and_then(|q| q.parse::<usize>().ok()) {
        report.details.push(("quorum".into(), quorum.to_string()));
        if answered < quorum {
            report.warnings.push(format!(
                "only {answered} of {asked} sentinels answered, fewer than the quorum of \
                 {quorum}: a failover cannot be agreed on now, and runs and renewals need a \
                 majority of the group"
            ));
        }
    }
}

/// Reports the master a majority of the sentinels names, with its config epoch; warns when
/// sentinels answered but no majority names one.
fn report_master(round: &Round, locator: &Locator, answered: usize, report: &mut CheckReport) {
    match round.agreed(&locator.master, &locator.display) {
        Ok(((host, port), epoch)) => report.details.push((
            "master".into(),
            format!(
                "'{}' at {} (config epoch {epoch})",
                locator.master,
                crate::kit::url::join_host_port(&host, port)
            ),
        )),
        Err(e) if answered > 0 => report.warnings.push(format!(
            "runs are refused (69) and holders stopped (124) until a majority of the sentinels \
             names the master: {e}"
        )),
        Err(_) => {}
    }
}

/// Reports how many replicas must acknowledge each hold (`?replicas=N`), when any must.
fn report_wanted_replicas(locator: &Locator, report: &mut CheckReport) {
    let wanted = locator.replicas;
    if wanted > 0 {
        report.details.push((
            "replicas".into(),
            format!(
                "{wanted} must acknowledge each hold within {} (at most the lease's safety \
                 margin, max(500ms, --ttl/10); an older grant is confirmed by a renewal before \
                 the command starts)",
                humantime::format_duration(locator.replicas_timeout)
            ),
        ));
    }
}

/// Reports the master's connected replicas, warning when there are none, when they cannot
/// be read, or when fewer are connected than the `wanted` acknowledgements.
async fn report_connected_replicas(conn: &mut Conn, wanted: u32, report: &mut CheckReport) {
    let replicas = replicas_of(conn).await;
    match &replicas {
        Some(replicas) if replicas.is_empty() => report
            .warnings
            .push("the master has no replica connected: a failover has nothing to promote".into()),
        Some(replicas) => {
            for (i, replica) in replicas.iter().enumerate() {
                report
                    .details
                    .push((format!("replica {i}"), replica.clone()));
            }
        }
        None => report
            .warnings
            .push("cannot read the master's replication state (INFO replication)".into()),
    }
    let connected = replicas.as_ref().map_or(0, Vec::len);
    if wanted as usize > connected {
        report.warnings.push(format!(
            "replicas={wanted}, but {connected} replica(s) are connected: every run will be \
             refused (exit 69) until enough replicas are"
        ));
    }
}

/// The master's replicas as `INFO replication` shows them: "ip:port state, lag N s, offset
/// behind B bytes".
async fn replicas_of(conn: &mut Conn) -> Option<Vec<String>> {
    let info: String = conn
        .query(redis::cmd("INFO").arg("replication"), OP_TIMEOUT)
        .await
        .ok()?;
    let master_offset = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|o| o.trim().parse::<i64>().ok())
        .unwrap_or(0);
    let mut replicas = Vec::new();
    for line in info.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if !key.starts_with("slave") || !key[5..].chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let get = |name: &str| {
            value
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .unwrap_or("?")
                .trim()
                .to_owned()
        };
        let behind = get("offset")
            .parse::<i64>()
            .map_or("?".to_owned(), |o| (master_offset - o).max(0).to_string());
        replicas.push(format!(
            "{}:{} {}, lag {} s, {behind} bytes behind",
            get("ip"),
            get("port"),
            get("state"),
            get("lag")
        ));
    }
    Some(replicas)
}
