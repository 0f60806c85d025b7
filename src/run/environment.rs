//! What the command sees (docs/guide.md: "What the command sees"): the lock's variables,
//! and the credentials taken out of the environment and handed on to nested dlocks.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

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
    let mut env: Vec<(OsString, Option<OsString>)> = lock_variables(settings)
        .into_iter()
        .map(|(name, value)| (name.into(), Some(value.into())))
        .collect();
    let mut hidden = Vec::new();
    crate::spawn::for_each_variable(|key, value, _| {
        if is_password_variable(key) {
            let key = OsString::from_vec(key.to_vec());
            env.push((key.clone(), None));
            hidden.push((key, OsString::from_vec(value.to_vec())));
        }
    });
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

/// The variables that say which lock is held and how: `DLOCK_NAME`, `DLOCK_BACKEND`,
/// `DLOCK_MODE`.
pub(super) fn lock_variables(settings: &RunSettings) -> Vec<(String, String)> {
    vec![
        ("DLOCK_NAME".into(), settings.name.as_str().into()),
        ("DLOCK_BACKEND".into(), settings.common.scheme().into()),
        // A description of this hold under a name no run reads as a setting: a nested run
        // of another lock must not become shared because this one is. Every variable dlock
        // sets is such a description (run::tests: no_variable_that_describes_a_hold_is_a_setting);
        // a nested run reads DLOCK_HELD only to re-enter the hold it names (proven alive) and
        // DLOCK_CREDENTIALS_FD only for the credentials taken out of the environment.
        (
            "DLOCK_MODE".into(),
            if settings.mode.is_shared() {
                "shared"
            } else {
                "exclusive"
            }
            .into(),
        ),
    ]
}

/// `DLOCK_…PASSWORD…` in any case (`DLOCK_PASSWORD`, `DLOCK_SENTINEL_PASSWORD`,
/// `dlock_password`): a credential dlock takes out of the command's environment.
fn is_password_variable(key: &[u8]) -> bool {
    key.len() >= 6
        && key[..6].eq_ignore_ascii_case(b"DLOCK_")
        && key
            .windows(8)
            .any(|part| part.eq_ignore_ascii_case(b"PASSWORD"))
}

#[cfg(test)]
mod tests {
    use super::is_password_variable;

    #[test]
    fn a_dlock_password_variable_is_told_in_any_case() {
        for key in [
            "DLOCK_PASSWORD",
            "DLOCK_SENTINEL_PASSWORD",
            "dlock_password",
            "Dlock_Redis_Password_File",
        ] {
            assert!(is_password_variable(key.as_bytes()), "{key}");
        }
        for key in ["PASSWORD", "MY_DLOCK_PASSWORD", "DLOCK_PASS", "DLOCK_", ""] {
            assert!(!is_password_variable(key.as_bytes()), "{key}");
        }
    }
}
