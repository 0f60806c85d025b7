//! The command's run under the supervisor (`supervise.rs`), and how it ended, for dlock's exit
//! status: the command's own, or 124 for a loss.

use anyhow::Context;

use super::environment::ChildEnv;
use super::events::{Event, Observer};
use crate::cli::OnLost;
use crate::exit::{self, Outcome};
use crate::lock::Lease;
use crate::secrets::Handoff;
use crate::settings::RunSettings;
use crate::signals::Signals;
use crate::{logging, supervise};

/// How the command's run ended, for dlock's exit status.
pub(super) struct Ran {
    pub(super) status: Outcome,
    /// The command's own status (128+N for a signal), which `status` replaces on a loss.
    pub(super) command: u8,
    /// Why the lock was lost while it ran (and the command was stopped for it).
    pub(super) lost: Option<String>,
    /// dlock was asked to stop by this signal (a terminating one, forwarded): release at once.
    pub(super) stopped_by: Option<i32>,
}

impl Ran {
    /// Tell `observer` how the command's run ended: the loss, the stop, the status.
    pub(super) fn tell(&self, observer: &mut dyn Observer) {
        if let Some(why) = &self.lost {
            observer.saw(Event::Lost(why.clone()));
        }
        if let Some(signal) = self.stopped_by {
            observer.saw(Event::StoppedBy(signal));
        }
        observer.saw(Event::CommandEnded(self.command));
    }
}

/// Start the command and wait for it; map how it ended to dlock's exit status.
pub(super) async fn supervise_command<L: Lease>(
    settings: &RunSettings,
    signals: &mut Signals,
    sigchld: tokio::signal::unix::Signal,
    lease: &mut L,
    env: ChildEnv,
) -> anyhow::Result<Ran> {
    let terminal = supervise::Terminal::foreground();
    let inherit = env.handoff.as_ref().map(Handoff::raw_fd);
    let spawned = supervise::spawn(&settings.command, &env.vars, terminal.as_ref(), inherit);
    // The command has its copy; dlock needs none.
    drop(env.handoff);
    let child = spawned?;
    tracing::debug!(target: logging::HANDOFF, "spawned");
    let policy = supervise::Policy {
        name: settings.name.to_string(),
        on_lost: settings.on_lost,
        kill_after: settings.kill_after,
        lease: settings
            .common
            .target
            .capabilities()
            .lease
            .then(|| (settings.name.clone(), settings.common.ttl)),
    };
    let ending = supervise::supervise(child, lease, signals, policy, terminal.as_ref(), sigchld)
        .await
        .context("lost track of the command")?;
    let command = exit::from_child(ending.status);
    match ending.lost {
        Some(lost) if settings.on_lost != OnLost::Ignore => {
            // A loss seen while the command ran was told then (`supervise`), in one line.
            if ending.lost_after_end {
                say!(
                    "lock '{}' was lost while the command ran ({})",
                    settings.name,
                    lost.reason
                );
            }
            Ok(Ran {
                status: Outcome::Lost,
                command,
                lost: Some(lost.reason),
                stopped_by: ending.stopped_by,
            })
        }
        lost => Ok(Ran {
            status: Outcome::Command(command),
            command,
            lost: lost.map(|lost| lost.reason),
            stopped_by: ending.stopped_by,
        }),
    }
}
