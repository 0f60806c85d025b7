//! A nested run of a lock its ancestor holds ([`super::reentry`]): re-enter when the backend
//! shows the ancestor holding it in a mode this run may share, never upgrade a shared hold.

use std::time::Duration;

use super::events::{Event, Observer};
use super::reentry;
use crate::error::Error;
use crate::lock::{Backend, Lease, LockName, Lost, Mode};
use crate::settings::RunSettings;

/// Whether an ancestor's hold of the lock is this run's to re-enter.
pub(super) enum Reentry {
    /// Ancestors provably hold every name of this run in a mode it may share: run at once.
    /// The tokens of their holds, NAME's first, then each `--also` name's.
    Held(Vec<(LockName, u64)>),
    /// Acquire as usual.
    Acquire,
}

/// Ancestors named in `DLOCK_HELD` that the backend shows holding every name of this run
/// (NAME and the `--also` names) let the command run at once, unless this run is exclusive
/// and a hold is shared (refused: never an upgrade). None of them held means acquiring; some
/// but not all is refused, as acquiring the rest while an ancestor holds the others would
/// take names out of their one order.
pub(super) async fn reenter<B: Backend>(
    backend: &B,
    settings: &RunSettings,
    inherited_held: &str,
    identity: &str,
    observer: &mut dyn Observer,
) -> Result<Reentry, Error> {
    let mut held = Vec::new();
    let mut not_held = None;
    for name in settings.names() {
        match held_by_ancestor(backend, settings, name, inherited_held, identity, observer).await? {
            Some(token) => held.push((name.clone(), token)),
            None => {
                not_held.get_or_insert(name);
            }
        }
    }
    match (held.first(), not_held) {
        (None, _) => Ok(Reentry::Acquire),
        (Some(_), None) => Ok(Reentry::Held(held)),
        (Some((name, _)), Some(missing)) => {
            observer.saw(Event::GaveUp);
            Err(Error::Usage(format!(
                "'{name}' is held by an ancestor and '{missing}' is not; a nested run re-enters \
                 all its names or none: hold '{missing}' in the outer run too (--also), or take \
                 it in a nested run of its own"
            )))
        }
    }
}

/// The token of an ancestor's hold of `name`, named in `DLOCK_HELD` and shown by the backend,
/// when it is this run's to re-enter (`None`: acquire it); an exclusive run inside a shared
/// hold is refused.
async fn held_by_ancestor<B: Backend>(
    backend: &B,
    settings: &RunSettings,
    name: &LockName,
    inherited_held: &str,
    identity: &str,
    observer: &mut dyn Observer,
) -> Result<Option<u64>, Error> {
    let lock_key = reentry::lock_key(identity, name);
    let Some(entry) = reentry::ancestor_entry(inherited_held, &lock_key) else {
        return Ok(None);
    };
    match ancestor_holds(backend, name, &entry).await {
        Some(Mode::Shared) if settings.mode == Mode::Exclusive => {
            // Re-entering would run an exclusive command beside the other shared holders.
            observer.saw(Event::GaveUp);
            Err(Error::Usage(format!(
                "'{name}' is held shared by dlock pid {}, an ancestor; a nested exclusive run \
                 would have to upgrade that hold, which dlock does not do: run the outer dlock \
                 without --shared, or this one with --shared",
                entry.pid
            )))
        }
        Some(_) => {
            tracing::info!(
                "'{name}' is held by dlock pid {}, an ancestor; running the command at once",
                entry.pid
            );
            Ok(Some(entry.token))
        }
        None => {
            tracing::info!(
                "DLOCK_HELD names pid {} as the holder of '{name}', but the backend does not show it holding; acquiring",
                entry.pid
            );
            Ok(None)
        }
    }
}

/// How the backend shows `entry`'s process (an ancestor of ours) holding `name` with the
/// entry's token, on this host (see [`reentry`]); `None` when it does not. Any doubt means
/// `None`.
async fn ancestor_holds<B: Backend>(
    backend: &B,
    name: &LockName,
    entry: &reentry::Entry,
) -> Option<Mode> {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    match tokio::time::timeout(Duration::from_secs(10), backend.status(name)).await {
        Ok(Ok(status)) => status
            .holders
            .iter()
            .find(|h| {
                h.holder.pid == entry.holder_pid()
                    && h.holder.token == entry.token
                    && h.holder.host == host
            })
            .map(|h| h.holder.mode),
        Ok(Err(err)) => {
            tracing::info!("cannot confirm the ancestor's hold of '{name}': {err}");
            None
        }
        Err(_) => None,
    }
}

/// The lease of a reentrant run: the ancestor holds the lock, so there is nothing to lose here.
pub(super) struct Reentrant;

impl Lease for Reentrant {
    fn token(&self) -> u64 {
        0
    }

    async fn lost(&mut self) -> Lost {
        std::future::pending().await
    }

    async fn release(self) -> Result<(), Error> {
        Ok(())
    }
}
