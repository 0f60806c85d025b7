//! What the command sees (docs/guide.md: "What the command sees"): the lock's variables,
//! and the credentials taken out of the environment and handed on to nested dlocks.

use std::ffi::OsString;

use crate::secrets::{Handoff, CREDENTIALS_FD};
use crate::settings::RunSettings;

/// What dlock changes in the command's environment.
pub(super) struct ChildEnv {
    /// Variables set, or removed (`None`).
    pub(super) vars: Vec<(OsString, Option<OsString>)>,
    /// The credentials taken out of the environment, for nested dlocks ([`Handoff`]).
    pub(super) handoff: Option<Handoff>,
}

/// The environment changes for the command (docs/guide.md: "What the command sees"): the lock's
/// variables in, consumed credentials out, and handed on to nested dlocks through an
/// inherited descriptor instead.
pub(super) fn child_environment(settings: &RunSettings) -> ChildEnv {
    let mut env: Vec<(OsString, Option<OsString>)> = vec![
        ("DLOCK_NAME".into(), Some(settings.name.as_str().into())),
        (
            "DLOCK_BACKEND".into(),
            Some(settings.common.scheme().into()),
        ),
        // Also the setting of a nested dlock, which so takes the same mode by default: a
        // nested run of the same name re-enters.
        (
            "DLOCK_SHARED".into(),
            Some(if settings.mode.is_shared() { "1" } else { "0" }.into()),
        ),
    ];
    let mut hidden = Vec::new();
    for (key, value) in std::env::vars_os() {
        let upper = key.to_string_lossy().to_ascii_uppercase();
        if upper.starts_with("DLOCK_") && upper.contains("PASSWORD") {
            env.push((key.clone(), None));
            hidden.push((key, value));
        }
    }
    if let Some(url) = std::env::var_os("DLOCK_URL") {
        let redacted = crate::secrets::redact_url(&url.to_string_lossy());
        if redacted != url.to_string_lossy() {
            env.push(("DLOCK_URL".into(), Some(redacted.into())));
            hidden.push(("DLOCK_URL".into(), url));
        }
    }
    let handoff = Handoff::new(&hidden).unwrap_or_else(|err| {
        tracing::info!("cannot hand the credentials on to nested dlocks: {err}");
        None
    });
    if let Some(handoff) = &handoff {
        env.push((
            CREDENTIALS_FD.into(),
            Some(handoff.raw_fd().to_string().into()),
        ));
    }
    ChildEnv { vars: env, handoff }
}
