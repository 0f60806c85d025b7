//! What `status`, `list`, `release --force` and `check` ask of the Blob service.
//!
//! A lock is held while its blob's lease is (`x-ms-lease-state: leased`); a lease that was
//! released, ran out or was broken leaves the blob, its last record and its token behind, and
//! the lock free whatever the record says. `status` is one read of the blob; `list` one
//! listing per 5000 blobs under the prefix (the lease state is in it) and a read of each held
//! one; `release --force` breaks the lease at once (`x-ms-lease-break-period: 0`); `check`
//! reads the container, compares the service's clock with this host's, and takes and gives
//! back a lease on a probe blob of its own.

use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::kit::round_trip::median_round_trip;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{CheckReport, Holder, HolderStatus, LockName, LockStatus, Record};

use super::account::Credential;
use super::blob::{number, Blobs, Failure, VERSION};
use super::listing::{listed, lock_of, slot_of};
use super::wait::waiters_prefix;
use super::AzureBackend;
use crate::kit::http::Response;

/// The holder a leased blob's answer names (its record; a lease dlock did not take shows
/// only the name).
fn holder_in(name: &str, answer: &Response) -> HolderStatus {
    let holder = serde_json::from_slice::<Record>(&answer.body)
        .map(|record| record.holder)
        .unwrap_or_else(|_| Holder {
            name: name.to_owned(),
            ..Holder::default()
        });
    HolderStatus {
        holder,
        ttl_left_ms: None,
        session: None,
    }
}

fn is_leased(answer: &Response) -> bool {
    answer.header("x-ms-lease-state") == Some("leased")
}

/// A blob, or `None` when it does not exist.
async fn get_blob(blobs: &Blobs, blob: &str) -> Result<Option<Response>, Error> {
    match blobs.get(blob, OP_TIMEOUT).await {
        Ok(answer) => Ok(Some(answer)),
        Err(failure) if failure.code() == Some("BlobNotFound") => Ok(None),
        Err(failure) => Err(failure.into_error(blobs)),
    }
}

/// The leased blobs of the lock whose blob is `base`: its own, and its slots'.
async fn leased_blobs(blobs: &Blobs, base: &str) -> Result<Vec<String>, Error> {
    let all = listed(blobs, base, OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(blobs))?;
    Ok(all
        .into_iter()
        .filter(|b| b.leased && (b.name == base || slot_of(base, &b.name).is_some()))
        .map(|b| b.name)
        .collect())
}

/// The lock's holders (with the blob each one leases) and its last token: one read of its
/// blob, and with `--limit` above 1 a listing of its slots and a read of each held one.
async fn holders_of(
    blobs: &Blobs,
    base: &str,
    name: &str,
) -> Result<(Vec<(String, HolderStatus)>, Option<u64>), Error> {
    let own = get_blob(blobs, base).await?;
    let last_token = own.as_ref().and_then(|a| number(a, "x-ms-meta-dlocktoken"));
    if let Some(answer) = own.as_ref().filter(|a| is_leased(a)) {
        return Ok((vec![(base.to_owned(), holder_in(name, answer))], last_token));
    }
    let limit = own
        .as_ref()
        .and_then(|a| number(a, "x-ms-meta-dlocklimit"))
        .unwrap_or(1);
    let mut holders = Vec::new();
    if limit > 1 {
        for blob in leased_blobs(blobs, base).await? {
            if let Some(answer) = get_blob(blobs, &blob).await?.filter(is_leased) {
                holders.push((blob, holder_in(name, &answer)));
            }
        }
    }
    Ok((holders, last_token))
}

pub(super) async fn status(backend: &AzureBackend, name: &LockName) -> Result<LockStatus, Error> {
    let blobs = Blobs::new(&backend.target)?;
    let base = backend.blob(name);
    let (holders, last_token) = holders_of(&blobs, &base, name.as_str()).await?;
    let registered = listed(&blobs, &waiters_prefix(&base), OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(&blobs))?;
    Ok(LockStatus {
        name: name.to_string(),
        held: !holders.is_empty(),
        holders: holders.into_iter().map(|(_, h)| h).collect(),
        waiters: Some(registered.iter().filter(|b| b.leased).count() as u64),
        queue: Vec::new(),
        last_token,
        waiting_here: Vec::new(),
        location: None,
    })
}

pub(super) async fn list(backend: &AzureBackend) -> Result<Vec<LockStatus>, Error> {
    let blobs = Blobs::new(&backend.target)?;
    let prefix = backend.target.blob_prefix(&backend.prefix);
    let all = listed(&blobs, &prefix, OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(&blobs))?;
    let names: Vec<LockName> = all
        .iter()
        .filter(|b| b.leased)
        .filter_map(|b| lock_of(&prefix, &b.name))
        .filter_map(|encoded| crate::lock::decode_component(&encoded))
        .filter_map(|decoded| LockName::new(&decoded).ok())
        .collect();
    crate::kit::held::list_held(names, async |name| status(backend, name).await).await
}

/// Break every lease of the lock at once (`x-ms-lease-break-period: 0`).
pub(super) async fn force_release(
    backend: &AzureBackend,
    name: &LockName,
) -> Result<Vec<Holder>, Error> {
    let blobs = Blobs::new(&backend.target)?;
    let (holders, _) = holders_of(&blobs, &backend.blob(name), name.as_str()).await?;
    let mut removed = Vec::new();
    for (blob, holder) in holders {
        let headers = vec![("x-ms-lease-break-period".to_owned(), "0".to_owned())];
        match blobs.lease(&blob, "break", headers, OP_TIMEOUT).await {
            Ok(_) => removed.push(holder.holder),
            // Released or lapsed since it was read: nothing to break.
            Err(failure) if failure.code() == Some("LeaseNotPresentWithLeaseOperation") => {}
            Err(failure) => return Err(failure.into_error(&blobs)),
        }
    }
    Ok(removed)
}

pub(super) async fn check(backend: &AzureBackend) -> Result<CheckReport, Error> {
    let blobs = Blobs::new(&backend.target)?;
    let fail = |f: Failure| f.into_error(&blobs);
    let first = blobs.container_properties(OP_TIMEOUT).await.map_err(fail)?;
    let mut warnings = Vec::new();
    let mut details = Vec::new();
    let version = first
        .header("server")
        .map_or_else(|| format!("Blob service {VERSION}"), str::to_owned);
    let median = median_round_trip(5, async || {
        blobs
            .container_properties(OP_TIMEOUT)
            .await
            .map(drop)
            .map_err(|f| f.into_error(&blobs))
    })
    .await?;
    let Some(account) = backend.target.account.as_ref() else {
        return Err(Error::Internal(
            "an Azure target without its account".into(),
        ));
    };
    details.push(("account".into(), account.name.clone()));
    details.push((
        "credential".into(),
        match account.credential {
            Credential::Key(_) => "account key (Shared Key)".into(),
            Credential::Sas(_) => "shared access signature".into(),
        },
    ));
    details.push(("container".into(), backend.target.container.clone()));
    details.push(("api version".into(), VERSION.into()));
    compare_clocks(first.date(), &mut warnings, &mut details);
    probe_lease(backend, &blobs).await?;
    details.push((
        "leases".into(),
        "15 to 60 s, kept on the service's clock; a lease was taken and released".into(),
    ));
    Ok(CheckReport {
        backend: "az".into(),
        location: blobs.display.clone(),
        version,
        round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
        warnings,
        details,
    })
}

/// How far the service's clock (its `Date`) is from this host's. Leases are timed by the
/// service alone, but Shared Key requests dated more than 15 minutes off are refused.
fn compare_clocks(
    theirs: Option<SystemTime>,
    warnings: &mut Vec<String>,
    details: &mut Vec<(String, String)>,
) {
    let Some(theirs) = theirs else {
        return;
    };
    let ours = SystemTime::now();
    let (told, off) = match theirs.duration_since(ours) {
        Ok(ahead) => (format!("{} s ahead of this host", ahead.as_secs()), ahead),
        Err(behind) => {
            let behind = behind.duration();
            (format!("{} s behind this host", behind.as_secs()), behind)
        }
    };
    let told = if off < Duration::from_secs(1) {
        "same second as this host".to_owned()
    } else {
        told
    };
    details.push(("service clock".into(), told));
    if off > Duration::from_secs(300) {
        warnings.push(format!(
            "the service's clock is {} s off this host's: leases are timed by the service \
             alone, but it refuses requests signed more than 15 minutes off its clock; \
             synchronise this host's clock (NTP)",
            off.as_secs()
        ));
    }
}

/// Create a probe blob, lease it, release it and delete it: what a lock needs of the
/// credential and the container.
async fn probe_lease(backend: &AzureBackend, blobs: &Blobs) -> Result<(), Error> {
    let fail = |f: Failure| f.into_error(blobs);
    let probe = format!(
        "{}~check-{}",
        backend.target.blob_prefix(&backend.prefix),
        uuid::Uuid::new_v4().simple()
    );
    blobs
        .put(&probe, Vec::new(), Vec::new(), OP_TIMEOUT)
        .await
        .map_err(fail)?;
    let id = uuid::Uuid::new_v4().hyphenated().to_string();
    let leased = blobs
        .lease(
            &probe,
            "acquire",
            vec![
                ("x-ms-lease-duration".into(), "15".into()),
                ("x-ms-proposed-lease-id".into(), id.clone()),
            ],
            OP_TIMEOUT,
        )
        .await;
    let released = match leased {
        Ok(_) => blobs
            .lease(
                &probe,
                "release",
                vec![("x-ms-lease-id".into(), id)],
                OP_TIMEOUT,
            )
            .await
            .map(drop),
        Err(failure) => Err(failure),
    };
    let deleted = blobs.delete(&probe, Vec::new(), OP_TIMEOUT).await;
    released.map_err(fail)?;
    deleted.map(drop).map_err(fail)
}
