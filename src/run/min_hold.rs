//! `--min-hold` (README: "Cron on several hosts"): after the command has finished, keep the
//! lock until the hold's minimum length is up, so that the same crontab line on hosts whose
//! clocks differ by less than that finds the lock still held and runs once.
//!
//! Meanwhile the lease is kept alive as while the command ran (the lease's own renewer runs
//! until it is released). The time is measured from the acquisition on `CLOCK_BOOTTIME`, so a
//! suspend counts. Then dlock releases and exits with the command's status. A signal in that
//! time releases and exits at once with 128+N (as a signal that kills a holding command
//! would); a lost lock ends the wait with the command's status and a warning (the command
//! already ran with the lock held, there is nothing to stop). A terminating signal forwarded
//! while the command ran means dlock was asked to stop: `run.rs` then skips the hold.

use std::time::{Duration, SystemTime};

use crate::clock::{sleep_until, BootInstant};
use crate::exit::Outcome;
use crate::lock::{Holder, Lease};
use crate::settings::RunSettings;
use crate::signals::{self, Signals};

/// How long the metadata update may take (it only helps `status`).
const RECORD_TIMEOUT: Duration = Duration::from_secs(5);

/// When the lock was acquired, on both clocks: the boot clock to wait on, the wall clock to
/// tell `status` until when.
pub(super) struct Acquired {
    pub(super) at: BootInstant,
    pub(super) wall: SystemTime,
}

impl Acquired {
    pub(super) fn now() -> Acquired {
        Acquired {
            at: BootInstant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// The command ended with `status`; keep the lock until `--min-hold` after `acquired`, then
/// return the status to exit with.
pub(super) async fn keep<L: Lease>(
    lease: &mut L,
    signals: &mut Signals,
    settings: &RunSettings,
    holder: &Holder,
    acquired: &Acquired,
    status: Outcome,
) -> Outcome {
    let Some(min_hold) = settings.min_hold else {
        return status;
    };
    let until = acquired.at + min_hold;
    if BootInstant::now() >= until {
        return status;
    }
    // Settings bound --min-hold far below the clock's end; any doubt shows no time.
    let until_text = acquired
        .wall
        .checked_add(min_hold)
        .map(|wall| humantime::format_rfc3339_seconds(wall).to_string())
        .unwrap_or_default();
    let finished = Holder {
        token: lease.token(),
        // The record keeps the grant as its start, not the run's.
        since: humantime::format_rfc3339_seconds(acquired.wall).to_string(),
        kept_until: until_text.clone(),
        ..holder.clone()
    };
    match tokio::time::timeout(RECORD_TIMEOUT, lease.finished(&finished)).await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => tracing::debug!("cannot record that the command has finished: {err}"),
        Err(_) => tracing::debug!("recording that the command has finished timed out"),
    }
    tracing::info!(
        "the command has finished (status {}); keeping '{}' until {until_text} (--min-hold)",
        status.status(),
        settings.name
    );
    tokio::select! {
        () = sleep_until(until) => status,
        lost = lease.lost() => {
            crate::lock::loss_reported();
            tracing::warn!(
                "lock '{}' was lost while --min-hold kept it after the command finished ({})",
                settings.name,
                lost.reason
            );
            status
        }
        signal = signals.recv() => {
            say!(
                "got {} while --min-hold kept '{}' after the command finished (status {}); released",
                signals::name(signal),
                settings.name,
                status.status()
            );
            Outcome::Signalled(signal)
        }
    }
}
