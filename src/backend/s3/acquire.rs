//! One acquisition: read the lock object, and if it has room (its live holders fewer than
//! `--limit`, all agreeing on it) write it back with our entry and the next token, on the
//! ETag read; poll while it has none (`wait.rs`), retry a lost race at once and a server's
//! "later" (503 SlowDown, 500) with backoff, all within `--wait`.
//!
//! Uncontended, `dlock run` costs three requests: this GET and PUT, and the release's PUT.
//! The first acquisition of a name, which creates its object, adds two writes that must fail
//! on a server that honours conditional writes (see the module doc of [`super`]).

use std::time::Duration;

use crate::budget::{WaitBudget, MIN_ANSWER};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::backoff::Backoff;
use crate::kit::held::pause_before_next_poll;
use crate::kit::limit;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{AcquireRequest, Cancel, Holder, Record};

use super::client::{Cond, Failure, Got, Put, S3};
use super::lease::{Held, S3Lease};
use super::record::{nonce, Body, Entry, VERSION};
use super::wait::{self, Registration};
use super::{S3Backend, WAIT_GRACE};

/// An ETag no object has: a write on it must fail.
const NO_SUCH_ETAG: &str = "\"00000000000000000000000000000000\"";
/// The first pause before retrying a server that asked for it or could not be reached.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(2);
/// Writes lost to other writers in a row that are tried again at once; after them, with
/// backoff (a race is lost only to a write that succeeded, so a long run of them is a busy
/// object or a server that answers every write with a conflict).
const RACES_AT_ONCE: u32 = 5;
/// Bound for deleting a waiter's registration on the way out (it goes stale by itself).
const LEAVE_BUDGET: Duration = Duration::from_millis(500);

/// The bound of one request of an acquisition: [`OP_TIMEOUT`], within the server's time to
/// answer (at least [`MIN_ANSWER`] from the start, however short `--wait` is: a first request
/// over TLS to a remote endpoint connects too), and never ending later than `--wait` +
/// [`WAIT_GRACE`] once the server's time to answer is over.
fn request_limit(budget: &WaitBudget) -> Duration {
    budget
        .share(OP_TIMEOUT, WAIT_GRACE)
        .max(budget.call_limit(OP_TIMEOUT))
}

/// What one attempt found.
enum Attempt {
    Won(Box<Held>, u64, BootInstant),
    Held(Vec<Holder>),
    /// Somebody wrote between our read and our write: decide again.
    Raced,
}

/// One acquisition's constants.
struct Ctx<'a> {
    s3: &'a S3,
    request: &'a AcquireRequest,
    key: String,
    id: String,
}

pub(super) async fn acquire(
    backend: &S3Backend,
    request: &AcquireRequest,
    mut cancel: Cancel,
) -> Result<S3Lease, Error> {
    let s3 = backend.s3()?;
    let ctx = Ctx {
        s3,
        request,
        key: backend.keys.lock(&request.name),
        id: nonce(),
    };
    let budget = &request.budget;
    // A server that asks to be tried later is given the server's time to answer, also with
    // `--no-wait` (one look that a throttled first answer must not end).
    let answering = budget.answering_within(MIN_ANSWER);
    let mut polls = wait::polling();
    let mut retries = Backoff::new(RETRY_FIRST, RETRY_CAP);
    let mut registration: Option<Registration> = None;
    let mut waited = false;
    // The server has answered as S3: from then on an unreachable or silent server is waited
    // out (within `--wait`), not a wrong URL to report ([`may_retry`]).
    let mut answered = false;
    // Writes lost in a row (412, 409).
    let mut races = 0u32;
    let outcome = loop {
        let holders = match attempt(&ctx, request_limit(budget)).await {
            Ok(Attempt::Won(held, token, sent)) => {
                if waited {
                    tracing::debug!(target: crate::logging::HANDOFF, "woken");
                }
                break S3Lease::grant(
                    *held,
                    &request.name,
                    token,
                    sent,
                    request.ttl,
                    request.kill_after,
                )
                .await;
            }
            Ok(Attempt::Raced) => {
                answered = true;
                races += 1;
                if races <= RACES_AT_ONCE {
                    continue;
                }
                // Lost again and again: somebody writes the object all the time (or the server
                // answers every write with a conflict). Back off, within the wait.
                if budget.is_final() && answering.answer_is_over() {
                    break Err(Error::Unavailable(format!(
                        "{}: the lock object changed under {races} writes in a row",
                        s3.display
                    )));
                }
                let mut pause = retries.next_delay();
                if let Some(left) = answering.answer_by().map(BootInstant::remaining) {
                    pause = pause.min(left);
                }
                if let Err(e) = sleep_unless_cancelled(&mut cancel, pause).await {
                    break Err(e);
                }
                continue;
            }
            Ok(Attempt::Held(holders)) => {
                answered = true;
                races = 0;
                retries.reset();
                holders
            }
            Err(failure) if may_retry(&failure, answered, budget, &answering) => {
                tracing::debug!("{}: {}; trying again", s3.display, failure.describe());
                let mut pause = retries.next_delay();
                let left = match failure {
                    Failure::Retry(_) => answering.answer_by().map(BootInstant::remaining),
                    _ => budget.left(),
                };
                if let Some(left) = left {
                    pause = pause.min(left);
                }
                if let Err(e) = sleep_unless_cancelled(&mut cancel, pause).await {
                    break Err(e);
                }
                continue;
            }
            Err(failure) => break Err(failure.into_error(&s3.display)),
        };
        let pause = match pause_before_next_poll(request, &holders, &mut polls) {
            Ok(pause) => pause,
            Err(e) => break Err(e),
        };
        match registration.as_mut() {
            Some(r) => r.refresh(s3, request_limit(budget)).await,
            None => {
                let prefix = backend.keys.waiters(&request.name);
                registration =
                    Registration::register(s3, &prefix, &ctx.id, request_limit(budget)).await;
                crate::lock::queued(request);
            }
        }
        if let Err(e) = sleep_unless_cancelled(&mut cancel, pause).await {
            break Err(e);
        }
        waited = true;
    };
    if let Some(registration) = registration {
        let bound = if outcome.is_ok() {
            request_limit(budget)
        } else {
            LEAVE_BUDGET
        };
        let _ = registration.leave(s3, bound).await;
        tracing::debug!(target: crate::logging::HANDOFF, "unregistered");
    }
    outcome
}

/// Whether an attempt that failed with `failure` is tried again: a server's "try later" (503
/// SlowDown, 500) until the server's time to answer ends (`answering`); an unreachable or
/// silent server only once it has answered as S3 before, until `--wait` ends.
fn may_retry(
    failure: &Failure,
    answered: bool,
    budget: &WaitBudget,
    answering: &WaitBudget,
) -> bool {
    match failure {
        Failure::Retry(_) => !answering.answer_is_over(),
        Failure::NotSent(_) | Failure::Unknown(_) => answered && !budget.is_final(),
        Failure::Refused(_) => false,
    }
}

/// Read the object and write our entry if there is room.
async fn attempt(ctx: &Ctx<'_>, limit: Duration) -> Result<Attempt, Failure> {
    let request = ctx.request;
    let (mut body, cond, created) = match ctx.s3.get(&ctx.key, limit).await? {
        Got::Missing { date } => {
            let body = Body {
                v: VERSION,
                // Below every token of an object of this name deleted by hand before.
                token: date.saturating_mul(1_000_000),
                limit: request.limit,
                nonce: String::new(),
                holders: Vec::new(),
            };
            (body, Cond::Absent, true)
        }
        Got::Found(object) => {
            let Some(mut body) = Body::parse(&object.body) else {
                return Err(Failure::Refused(Error::Unavailable(format!(
                    "{}: the object '{}' holds data dlock did not write; remove it or use \
                     another --prefix",
                    ctx.s3.display, ctx.key
                ))));
            };
            let (lm, date) = (object.last_modified, object.date);
            let live: Vec<&Entry> = body.live(lm, date).collect();
            for entry in &live {
                limit::agrees(&request.name, request.limit, entry.record.limit)
                    .map_err(Failure::Refused)?;
            }
            if live.len() >= request.limit as usize {
                let holders = live.iter().map(|e| e.record.holder.clone()).collect();
                return Ok(Attempt::Held(holders));
            }
            body.prepare(lm, date);
            (body, Cond::Matches(object.etag), false)
        }
    };
    let token = body.token.saturating_add(1);
    let mut holder = request.holder.clone();
    holder.token = token;
    holder.granted_now();
    body.token = token;
    body.limit = request.limit;
    body.nonce = nonce();
    body.holders.push(Entry {
        id: ctx.id.clone(),
        renewed: None,
        record: Record {
            holder,
            limit: request.limit,
        },
    });
    let bytes = body.to_bytes();
    let sent = BootInstant::now();
    let put = ctx.s3.put(&ctx.key, bytes.clone(), &cond, limit).await;
    tracing::debug!(target: crate::logging::HANDOFF, "written");
    let held = |etag: String, body: Body| {
        Box::new(Held {
            s3: ctx.s3.clone(),
            key: ctx.key.clone(),
            id: ctx.id.clone(),
            sent_nonce: body.nonce.clone(),
            body,
            etag,
            uncertain: false,
        })
    };
    match put {
        Ok(Put::Done(etag)) => {
            if created {
                refuse_unconditional(ctx, bytes, limit).await?;
            }
            Ok(Attempt::Won(held(etag, body), token, sent))
        }
        Ok(Put::Lost) => Ok(Attempt::Raced),
        Err(Failure::Unknown(why)) => {
            // Our write may have happened: the object says.
            match ctx.s3.get(&ctx.key, limit).await? {
                Got::Found(object) => match Body::parse(&object.body) {
                    Some(mut found)
                        if found.holders.iter().any(|e| {
                            e.id == ctx.id && !e.expired(object.last_modified, object.date)
                        }) =>
                    {
                        found.prepare(object.last_modified, object.date);
                        Ok(Attempt::Won(held(object.etag, found), token, sent))
                    }
                    _ => Ok(Attempt::Raced),
                },
                Got::Missing { .. } => {
                    tracing::debug!("a lost write did not happen: {why}");
                    Ok(Attempt::Raced)
                }
            }
        }
        Err(failure) => Err(failure),
    }
}

/// After creating a lock object: a second create and a write on an ETag nobody has must
/// both fail (412), else the server ignores the conditions dlock's safety rests on (78).
/// Both repeat the body just written, so a server that ignores them changes nothing.
async fn refuse_unconditional(
    ctx: &Ctx<'_>,
    bytes: Vec<u8>,
    limit: Duration,
) -> Result<(), Failure> {
    for (cond, header) in [
        (Cond::Absent, "If-None-Match: *"),
        (Cond::Matches(NO_SUCH_ETAG.to_owned()), "If-Match"),
    ] {
        if let Put::Done(_) = ctx.s3.put(&ctx.key, bytes.clone(), &cond, limit).await? {
            return Err(Failure::Refused(ignores_conditions(
                &ctx.s3.display,
                header,
            )));
        }
    }
    Ok(())
}

/// The refusal of a server that wrote an object despite a condition that had to fail.
pub(super) fn ignores_conditions(display: &str, header: &str) -> Error {
    Error::Config(format!(
        "{display}: the server ignores conditional writes (a PutObject with {header} that \
         had to fail succeeded); dlock's locks rest on them and it never writes without \
         them: use a server that honours If-Match and If-None-Match (AWS S3 since 2024, \
         MinIO, …)"
    ))
}

/// Sleeps for `pause`, or ends with [`Error::Cancelled`] when the run is cancelled first.
async fn sleep_unless_cancelled(cancel: &mut Cancel, pause: Duration) -> Result<(), Error> {
    tokio::select! {
        () = cancel.cancelled() => Err(Error::Cancelled),
        () = tokio::time::sleep(pause) => Ok(()),
    }
}
