//! The backend a command names: `--url` (`DLOCK_URL`, the config file) or the default lock
//! file, as a [`Target`] completed from the config file and the URL as it may be shown; one URL
//! only, and never a password that a parent dlock hid.

use super::{bad, origin, pick};
use crate::backend::Target;
use crate::cli;
use crate::config::{FileConfig, OneOrMany};
use crate::error::Error;
use crate::secrets::redact_url;

/// Whether `url` carries the `***` that a holder's command sees in place of a password.
fn url_password_is_masked(url: &str) -> bool {
    url.contains(":***@") || url.contains("password=***")
}

/// The backend `--url` names (`DLOCK_URL`, the config file; the file backend in its default
/// directory when none does), completed from the config file, and the URL as shown.
pub(super) fn target_setting(
    backend: &cli::BackendArgs,
    file: &FileConfig,
) -> Result<(Target, String), Error> {
    let env = &backend.from_env;
    let file_urls = match &file.values.url {
        None => None,
        Some(OneOrMany::One(u)) => Some(vec![u.clone()]),
        Some(OneOrMany::Many(us)) => Some(us.clone()),
    };
    let urls = pick(
        (!backend.url.is_empty()).then(|| backend.url.clone()),
        file_urls,
    );
    Ok(match urls {
        None => (Target::default_file(), "file://".to_owned()),
        Some(s) => {
            if s.value.len() > 1 {
                return Err(bad(s.from_file, &origin("--url", env), several_urls()));
            }
            let url = &s.value[0];
            let display = redact_url(url);
            if !s.from_file
                && env.iter().any(|id| id == "url")
                && display == *url
                && url_password_is_masked(url)
            {
                return Err(Error::Config(format!(
                    "DLOCK_URL (environment): its password is *** as the dlock running this command \
                     hid it; that dlock hands it to nested dlocks through {} (an inherited \
                     descriptor), which did not reach this one; give the password with \
                     password_file in the config file (docs/guide.md: \"What the command sees\")",
                    crate::secrets::CREDENTIALS_FD
                )));
            }
            let mut target =
                Target::parse(url).map_err(|m| bad(s.from_file, &origin("--url", env), m))?;
            target.complete(file)?;
            (target, display)
        }
    })
}

/// The refusal of several URLs, which would mean one lock across independent servers: the
/// registry's kinds whose one URL reaches several servers are the way.
fn several_urls() -> String {
    format!(
        "several URLs would mean a lock across independent servers (Redlock), which dlock does \
         not offer (docs/faq.md: Why no Redlock?); give one URL: {}",
        crate::backend::one_url_of_several()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal of several URLs names, in each kind's own words, every kind whose one URL
    /// reaches several servers, by what a lock on it outlives, and no other kind.
    #[test]
    fn several_urls_are_refused_naming_the_kinds_that_outlive_a_server() {
        use crate::kind::Servers;
        let said = several_urls();
        let (failover, quorum) = said
            .split_once(" for a lock that survives a failed server, or ")
            .unwrap_or_else(|| panic!("{said}"));
        assert!(
            quorum.ends_with(" for a lock that needs no timing assumptions"),
            "{said}"
        );
        for kind in crate::backend::KINDS {
            let one_url = kind.words.one_url;
            match kind.capabilities.servers {
                Servers::One => assert!(one_url.is_empty(), "{}", kind.name),
                Servers::Failover => assert!(
                    !one_url.is_empty() && failover.contains(one_url),
                    "{}: {said}",
                    kind.name
                ),
                Servers::Quorum => assert!(
                    !one_url.is_empty() && quorum.contains(one_url),
                    "{}: {said}",
                    kind.name
                ),
            }
        }
        for scheme in crate::backend::schemes() {
            let named =
                said.contains(&format!(" {scheme}://")) || said.contains(&format!("({scheme}://"));
            let kind = crate::backend::kind_of_scheme(scheme);
            assert_eq!(
                named,
                kind.is_some_and(|k| k.words.one_url.contains(&format!("{scheme}://"))),
                "{scheme}: {said}"
            );
        }
    }
}
