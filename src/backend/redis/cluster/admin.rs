//! What `list` and `check` need to know about a cluster: its masters (a listing scans each),
//! its state and its slot coverage (a cluster with slots nobody serves cannot keep locks
//! there: 69).

use std::time::Duration;

use crate::error::Error;

use crate::backend::redis::conn::{Conn, Failure};
use crate::backend::redis::topology::SLOTS;

/// The nodes a listing must scan: the masters of a cluster (indices into the connection's
/// pool), or `None` for a standalone server. Reads the slot table unless known.
pub(in crate::backend::redis) async fn masters(
    conn: &mut Conn,
    budget: Duration,
) -> Result<Option<Vec<usize>>, Failure> {
    let known = conn
        .cluster
        .as_ref()
        .is_some_and(|map| !map.masters().is_empty());
    if !known {
        match tokio::time::timeout(budget, conn.discover(None)).await {
            Err(_) => return Err(Failure::Timeout(budget)),
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Ok(None),
            Ok(Err(failure)) => return Err(failure),
        }
    }
    let masters = conn
        .cluster
        .as_ref()
        .map(|map| map.masters())
        .unwrap_or_default();
    let mut indices = Vec::with_capacity(masters.len());
    for master in &masters {
        indices.push(conn.index_of(master).map_err(Failure::Refused)?);
    }
    Ok(Some(indices))
}

/// For `check`: the cluster's state, masters and slot coverage as details; an error (69)
/// when the cluster is not `ok` or some slots have no master. `false`: a standalone server.
pub(in crate::backend::redis) async fn check_details(
    conn: &mut Conn,
    display: &str,
    budget: Duration,
    details: &mut Vec<(String, String)>,
) -> Result<bool, Error> {
    if masters(conn, budget)
        .await
        .map_err(|f| f.into_error(display))?
        .is_none()
    {
        return Ok(false);
    }
    let home = conn.home;
    let info: String = conn
        .query_on(home, redis::cmd("CLUSTER").arg("INFO"), budget)
        .await
        .map_err(|f| f.into_error(display))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let state = field("cluster_state");
    let Some(map) = conn.cluster.as_ref() else {
        return Ok(false);
    };
    let covered = map.covered();
    let masters: Vec<String> = map
        .masters()
        .iter()
        .map(|(host, port)| {
            let ranges: Vec<String> = map
                .ranges()
                .iter()
                .filter(|r| r.master == (host.clone(), *port))
                .map(|r| {
                    let replicas = match r.replicas {
                        0 => String::new(),
                        1 => " with 1 replica".to_owned(),
                        n => format!(" with {n} replicas"),
                    };
                    format!("{}-{}{replicas}", r.first, r.last)
                })
                .collect();
            format!("{host}:{port} (slots {})", ranges.join(", "))
        })
        .collect();
    details.push((
        "cluster".to_owned(),
        format!(
            "state {state}, {} masters, {covered} of {SLOTS} slots covered",
            masters.len()
        ),
    ));
    details.push(("masters".to_owned(), masters.join("; ")));
    if state != "ok" || covered < usize::from(SLOTS) {
        return Err(Error::Unavailable(format!(
            "{display}: the Redis Cluster is not ready to keep locks: cluster_state:{state}, \
             {} of {SLOTS} slots have no master (assign them, e.g. redis-cli --cluster fix)",
            usize::from(SLOTS) - covered
        )));
    }
    Ok(true)
}
