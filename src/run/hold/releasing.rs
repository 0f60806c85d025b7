//! `dlock release NAME` without `--force`: end a hold of yours (`dlock hold`), found by the
//! handle `DLOCK_HELD` names for NAME in this environment, or `--handle`'s. Another's hold or
//! run is refused: breaking it is `release --force`.

use super::handle::{ask_release, Answer, Handle};
use crate::cli::ReleaseArgs;
use crate::config::FileConfig;
use crate::error::Error;
use crate::exit::Outcome;
use crate::lock::Backend;
use crate::run::reentry;
use crate::settings;

pub(crate) async fn release(args: &ReleaseArgs, config: &FileConfig) -> anyhow::Result<Outcome> {
    let name = settings::lock_name(&args.name)?;
    let common = settings::common(&args.backend, None, config)?;
    let lock = reentry::lock_key(&common.identity(), &name);
    let handle = match &args.handle {
        Some(text) => Some(Handle::parse(text).ok_or_else(|| {
            Error::Usage(format!(
                "--handle {}: not the handle of a hold (DLOCK_HOLD's value, PID.START)",
                crate::logging::printable(text)
            ))
        })?),
        None => {
            let held = std::env::var("DLOCK_HELD").unwrap_or_default();
            match reentry::hold_entry(&held, &lock) {
                Some(entry) if entry.reentered => {
                    tracing::info!(
                        "this hold of '{name}' re-entered an enclosing one (pid {}'s), which \
                         keeps the lock; nothing to release",
                        entry.pid
                    );
                    return Ok(Outcome::Done);
                }
                entry => entry.and_then(|entry| entry.keeper),
            }
        }
    };
    let Some(handle) = handle else {
        return not_yours(&common, &name).await;
    };
    match ask_release(handle, &lock).await? {
        Some(Answer::Released) => {
            tracing::info!("released '{name}'");
            Ok(Outcome::Done)
        }
        Some(Answer::Kept(until)) => {
            tracing::info!("'{name}' is kept until {until} (--min-hold), then released");
            Ok(Outcome::Done)
        }
        Some(Answer::Lost(why)) => {
            say!("your hold of '{name}' had been lost before this release ({why})");
            Ok(Outcome::Lost)
        }
        Some(Answer::Other) => Err(Error::Usage(format!(
            "the hold {handle} is not a hold of '{name}' on this backend"
        ))
        .into()),
        None => {
            say!(
                "your hold of '{name}' had already ended (its keeper, pid {}, is gone): nothing to release",
                handle.pid
            );
            Ok(Outcome::Nothing)
        }
    }
}

/// No hold of NAME in this environment: refused when someone holds it (77), nothing to do
/// when nobody does (1).
async fn not_yours(
    common: &settings::Common,
    name: &crate::lock::LockName,
) -> anyhow::Result<Outcome> {
    let status = common.target.open(common).status(name).await?;
    match status.holders.first() {
        Some(holder) => Err(Error::Permission(format!(
            "'{name}' is held by {}, not by a hold of yours (DLOCK_HELD names none); \
             dlock release --force {name} breaks it",
            crate::wording::holder(&holder.holder)
        ))
        .into()),
        None => {
            say!("'{name}' is not held, and DLOCK_HELD names no hold of it: nothing to release");
            Ok(Outcome::Nothing)
        }
    }
}
