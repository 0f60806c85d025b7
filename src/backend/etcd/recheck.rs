//! The linearizable re-check of a waiter: in one read, that our key is still there (else our
//! lease died while we waited: the command must never start) and which keys before ours keep
//! us waiting, for an exclusive run, one of `--limit N`, or a reader.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::conn::Conn;
use super::key::older_keys;
use super::lease::place_lost;
use super::readers::{self, Scan};
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;

/// Which keys before ours keep a waiter waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waits {
    /// Every key: an exclusive run (`--limit 1`) waits until none is before its own, one of
    /// `--limit N` until fewer than N are.
    Any(usize),
    /// Writers' keys only: a shared run waits until no writer's key is before its own
    /// (`readers`).
    Writers,
}

/// Linearizable re-check: our key must still be there (else our lease died while waiting:
/// never start the command); returns the keys before ours that keep us waiting (newest
/// first: at most limit+1; a reader's nearest older writer and a key before it) and the
/// revision read at.
pub(super) async fn recheck(
    conn: &mut Conn,
    key: &str,
    pfx: &str,
    my_rev: i64,
    waits: Waits,
) -> Result<(Vec<Vec<u8>>, i64), Error> {
    let limit = match waits {
        Waits::Any(limit) => limit,
        Waits::Writers => return recheck_reader(conn, key, pfx, my_rev).await,
    };
    let check = while_ours(
        key,
        my_rev,
        vec![TxnOp::get(
            pfx.to_owned(),
            Some(older_keys(Some(my_rev), limit + 1)),
        )],
    );
    let response = read(conn, &check).await?;
    let older = match response.op_responses().first() {
        Some(TxnOpResponse::Get(range)) => range.kvs().iter().map(|kv| kv.key().to_vec()).collect(),
        _ => Vec::new(),
    };
    Ok((older, response.header().map_or(0, |h| h.revision())))
}

/// [`recheck`] for a reader: a page of the keys before ours with their values, and the
/// lock's oldest key, in one read that also checks our key; more pages if needed, at the
/// same revision (read once more from the start if etcd compacted it meanwhile).
async fn recheck_reader(
    conn: &mut Conn,
    key: &str,
    pfx: &str,
    my_rev: i64,
) -> Result<(Vec<Vec<u8>>, i64), Error> {
    let check = while_ours(
        key,
        my_rev,
        vec![
            TxnOp::get(
                pfx.to_owned(),
                Some(readers::older_with_values(Some(my_rev), 0)),
            ),
            TxnOp::get(pfx.to_owned(), Some(readers::oldest_key_only())),
        ],
    );
    let mut compactions = 0;
    loop {
        let response = read(conn, &check).await?;
        let at = response.header().map_or(0, |h| h.revision());
        let (first, oldest) = reader_page(&response, 0, my_rev)?;
        match readers::nearest_writer(conn, pfx, at, first, oldest.as_deref()).await {
            Ok(older) => return Ok((older, at)),
            Err(e) if readers::compacted(&e) && compactions < 3 => compactions += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The first page of a reader's keys before ours (created before `before`) and the lock's
/// oldest key, from the transaction operations `first` and `first + 1` of `response`.
pub(super) fn reader_page(
    response: &TxnResponse,
    first: usize,
    before: i64,
) -> Result<(Scan, Option<Vec<u8>>), Error> {
    let answers = response.op_responses();
    let (Some(TxnOpResponse::Get(page)), Some(TxnOpResponse::Get(oldest))) =
        (answers.get(first), answers.get(first + 1))
    else {
        return Err(Error::Internal(
            "etcd's answer lacks the keys before ours".into(),
        ));
    };
    let oldest = oldest.kvs().first().map(|kv| kv.key().to_vec());
    let scan = readers::scan(
        &readers::listed(page.kvs(), before),
        page.more(),
        oldest.as_deref(),
    );
    Ok((scan, oldest))
}

/// `reads`, done only while our key (created at `my_rev`) is still there; otherwise the
/// transaction reads our key alone, and [`read`] says the place was lost.
fn while_ours(key: &str, my_rev: i64, reads: Vec<TxnOp>) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            key.to_owned(),
            CompareOp::Equal,
            my_rev,
        )])
        .and_then(reads)
        .or_else([TxnOp::get(
            key.to_owned(),
            Some(GetOptions::new().with_keys_only()),
        )])
}

/// Run a [`while_ours`] read: its answer, or the error of a place that was lost.
async fn read(conn: &mut Conn, check: &Txn) -> Result<TxnResponse, Error> {
    let response = conn
        .call(OP_TIMEOUT, |mut c| {
            let t = check.clone();
            async move { c.txn(t).await }
        })
        .await?;
    if !response.succeeded() {
        return Err(place_lost());
    }
    Ok(response)
}
