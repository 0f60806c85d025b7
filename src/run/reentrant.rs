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
    /// An ancestor provably holds it in a mode this run may share: run at once.
    Held,
    /// Acquire as usual.
    Acquire,
}

/// An ancestor named in `DLOCK_HELD` that the backend shows holding the lock lets the
/// command run at once, unless this run is exclusive and the ancestor's hold is shared
/// (refused: never an upgrade). Anything unproven means acquiring.
pub(super) async fn reenter<B: Backend>(
    backend: &B,
    settings: &RunSettings,
    inherited_held: &str,
    identity: &str,
    observer: &mut dyn Observer,
) -> Result<Reentry, Error> {
    let lock_key = reentry::lock_key(identity, &settings.name);
    let Some(entry) = reentry::ancestor_entry(inherited_held, &lock_key) else {
        return Ok(Reentry::Acquire);
    };
    match ancestor_holds(backend, &settings.name, &entry).await {
        Some(Mode::Shared) if settings.mode == Mode::Exclusive => {
            // Re-entering would run an exclusive command beside the other shared holders.
            observer.saw(Event::GaveUp);
            Err(Error::Usage(format!(
                "'{}' is held shared by dlock pid {}, an ancestor; a nested exclusive run \
                 would have to upgrade that hold, which dlock does not do: run the outer dlock \
                 without --shared, or this one with --shared",
                settings.name, entry.pid
            )))
        }
        Some(_) => {
            tracing::info!(
                "'{}' is held by dlock pid {}, an ancestor; running the command at once",
                settings.name,
                entry.pid
            );
            Ok(Reentry::Held)
        }
        None => {
            tracing::info!(
                "DLOCK_HELD names pid {} as the holder of '{}', but the backend does not show it holding; acquiring",
                entry.pid,
                settings.name
            );
            Ok(Reentry::Acquire)
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
