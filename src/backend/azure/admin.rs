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
use super::blob::{Blobs, Failure, VERSION};
use super::AzureBackend;

/// The most listing pages `list` reads (5000 blobs each).
const MAX_PAGES: usize = 2000;

/// A blob's lock as its properties and body say.
fn lock_of(name: String, answer: Option<&crate::kit::http::Response>) -> LockStatus {
    let mut status = LockStatus {
        name,
        held: false,
        holders: Vec::new(),
        waiters: None,
        queue: Vec::new(),
        last_token: None,
        waiting_here: Vec::new(),
        location: None,
    };
    let Some(answer) = answer else {
        return status;
    };
    status.last_token = super::blob::number(answer, "x-ms-meta-dlocktoken");
    if answer.header("x-ms-lease-state") == Some("leased") {
        status.held = true;
        let holder = serde_json::from_slice::<Record>(&answer.body)
            .map(|record| record.holder)
            .unwrap_or_else(|_| Holder {
                name: status.name.clone(),
                ..Holder::default()
            });
        status.holders.push(HolderStatus {
            holder,
            ttl_left_ms: None,
            session: None,
        });
    }
    status
}

pub(super) async fn status(backend: &AzureBackend, name: &LockName) -> Result<LockStatus, Error> {
    let blobs = Blobs::new(&backend.target)?;
    let answer = match blobs.get(&backend.blob(name), OP_TIMEOUT).await {
        Ok(answer) => Some(answer),
        Err(failure) if failure.code() == Some("BlobNotFound") => None,
        Err(failure) => return Err(failure.into_error(&blobs)),
    };
    Ok(lock_of(name.to_string(), answer.as_ref()))
}

pub(super) async fn list(backend: &AzureBackend) -> Result<Vec<LockStatus>, Error> {
    let blobs = Blobs::new(&backend.target)?;
    let prefix = backend.target.blob_prefix(&backend.prefix);
    let mut names = Vec::new();
    let mut marker = String::new();
    for _ in 0..MAX_PAGES {
        let page = blobs
            .list_page(&prefix, &marker, OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&blobs))?;
        let text = String::from_utf8_lossy(&page.body);
        for entry in elements(&text, "Blob") {
            let leased = element(entry, "LeaseState") == Some("leased");
            let name = element(entry, "Name").map(unescape).unwrap_or_default();
            // Names of locks never contain `/` or `~` (`check`'s probe blob has one).
            let lock = name
                .strip_prefix(&prefix)
                .filter(|rest| !rest.contains(['/', '~']))
                .and_then(crate::lock::decode_component)
                .and_then(|decoded| LockName::new(&decoded).ok());
            if let (true, Some(lock)) = (leased, lock) {
                names.push(lock);
            }
        }
        marker = element(&text, "NextMarker")
            .map(unescape)
            .unwrap_or_default();
        if marker.is_empty() {
            return crate::kit::held::list_held(names, async |name| status(backend, name).await)
                .await;
        }
    }
    Err(Error::Unavailable(format!(
        "{}: more than {MAX_PAGES} pages of blobs under the prefix; list the locks of a \
         narrower --prefix",
        blobs.display
    )))
}

pub(super) async fn force_release(
    backend: &AzureBackend,
    name: &LockName,
) -> Result<Vec<Holder>, Error> {
    let blobs = Blobs::new(&backend.target)?;
    let blob = backend.blob(name);
    let lock = status(backend, name).await?;
    if !lock.held {
        return Ok(Vec::new());
    }
    let headers = vec![("x-ms-lease-break-period".to_owned(), "0".to_owned())];
    match blobs.lease(&blob, "break", headers, OP_TIMEOUT).await {
        Ok(_) => Ok(lock.holders.into_iter().map(|h| h.holder).collect()),
        // Released or lapsed since it was read: nothing to break.
        Err(failure) if failure.code() == Some("LeaseNotPresentWithLeaseOperation") => {
            Ok(Vec::new())
        }
        Err(failure) => Err(failure.into_error(&blobs)),
    }
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

/// The contents of each `<tag>…</tag>` in `text`, in order.
fn elements<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else {
            break;
        };
        found.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    found
}

/// The contents of the first `<tag>…</tag>` in `text`.
fn element<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    elements(text, tag).into_iter().next()
}

/// XML's five escapes undone.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read_blob_by_blob() {
        let page = "<EnumerationResults><Blobs><Blob><Name>d/a</Name><Properties>\
                    <LeaseState>leased</LeaseState></Properties></Blob><Blob><Name>d/b&amp;c\
                    </Name><Properties><LeaseState>available</LeaseState></Properties></Blob>\
                    </Blobs><NextMarker>m&amp;1</NextMarker></EnumerationResults>";
        let blobs = elements(page, "Blob");
        assert_eq!(blobs.len(), 2);
        assert_eq!(element(blobs[0], "LeaseState"), Some("leased"));
        assert_eq!(
            element(blobs[1], "Name").map(unescape).as_deref(),
            Some("d/b&c")
        );
        assert_eq!(
            element(page, "NextMarker").map(unescape).as_deref(),
            Some("m&1")
        );
        assert_eq!(element("<NextMarker />", "NextMarker"), None);
    }
}
