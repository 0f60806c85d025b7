//! What the command sees (docs/guide.md: "What the command sees"): the lock's variables,
//! and the credentials taken out of the environment and handed on to nested dlocks.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use super::reentry;
use crate::lock::LockName;
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

/// The variables that describe a hold of `tokens` (each held name with its fencing token:
/// NAME first, then the `--also` names in the order given) by this process, on the backend
/// `identity`: the tokens ([`token_variables`]), and `DLOCK_HELD`, `inherited_held` with an
/// entry for every name, so that a nested run of any of them re-enters (`reentry`). Without
/// this process's own /proc entry no nested run could prove the hold is ours, and
/// `DLOCK_HELD` is left as it was: a nested run acquires normally.
pub(crate) fn hold_variables(
    tokens: &[(LockName, u64)],
    inherited_held: &str,
    identity: &str,
) -> Vec<(OsString, OsString)> {
    let mut vars = token_variables(tokens);
    let mut held = inherited_held.to_owned();
    for (name, token) in tokens {
        let Some(entry) = reentry::Entry::for_this_process(identity, name, *token) else {
            return vars;
        };
        held = reentry::with_entry(&held, &entry);
    }
    vars.push(("DLOCK_HELD".into(), held.into()));
    vars
}

/// `DLOCK_FENCING_TOKEN`, the token of the first of `tokens` (NAME), and
/// `DLOCK_FENCING_TOKENS`, a line `TOKEN NAME` for each (a name has no control characters,
/// so no line break), for `while read -r token name`.
pub(super) fn token_variables(tokens: &[(LockName, u64)]) -> Vec<(OsString, OsString)> {
    let mut vars = Vec::with_capacity(3);
    if let Some((_, token)) = tokens.first() {
        vars.push(("DLOCK_FENCING_TOKEN".into(), token.to_string().into()));
    }
    let lines: Vec<String> = tokens
        .iter()
        .map(|(name, token)| format!("{token} {name}"))
        .collect();
    vars.push(("DLOCK_FENCING_TOKENS".into(), lines.join("\n").into()));
    vars
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
