//! The settings the AWS tools read, read the same way: credentials from
//! `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, else from the profile
//! (`AWS_PROFILE`, else `default`) in the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`) and then the config file
//! (`AWS_CONFIG_FILE`, else `~/.aws/config`, `[profile NAME]` sections); the region from
//! the URL, `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`, else `us-east-1`; the
//! endpoint from the URL, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, else
//! `https://s3.REGION.amazonaws.com`. Not read: the config file's `endpoint_url` and
//! `services` sections, SSO, `credential_process`, instance and container credentials.

use std::path::PathBuf;

use crate::error::Error;
use crate::kit::http::Origin;
use crate::secrets::Secret;

use super::sign::Credentials;

/// Bound for reading a shared file.
const MAX_FILE: u64 = 1 << 20;

/// What a completed target is opened with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub credentials: Credentials,
    /// Where the credentials came from, for `check` (never the secret).
    pub credentials_from: String,
    pub region: String,
    /// The endpoint URL as given or made from the region.
    pub endpoint: String,
    /// Path-style addressing asked for by the URL.
    pub path_style: bool,
}

/// Resolve the settings; `env` reads a variable (empty counts as unset).
pub fn resolve(
    env: &dyn Fn(&str) -> Option<String>,
    region: Option<&str>,
    endpoint: Option<&str>,
    path_style: Option<bool>,
) -> Result<Settings, Error> {
    let profile_name = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let named = env("AWS_PROFILE").is_some();
    let home = env("HOME").map(PathBuf::from);
    let in_home = |leaf: &str| home.as_ref().map(|h| h.join(".aws").join(leaf));
    let credentials_file = env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| in_home("credentials"));
    let config_file = env("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| in_home("config"));
    let from_credentials = read_profile(credentials_file.as_ref(), &profile_name, false)?;
    let from_config = read_profile(config_file.as_ref(), &profile_name, true)?;
    let key = |k: &str| {
        from_credentials
            .as_ref()
            .and_then(|p| p.get(k))
            .or_else(|| from_config.as_ref().and_then(|p| p.get(k)))
    };
    let (credentials, credentials_from) =
        match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => (
                Credentials {
                    access_key_id: id,
                    secret_access_key: Secret::new(secret),
                    session_token: env("AWS_SESSION_TOKEN").map(Secret::new),
                },
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".to_owned(),
            ),
            (Some(_), None) | (None, Some(_)) => return Err(Error::Config(
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together; one of them \
                 is empty or unset"
                    .into(),
            )),
            (None, None) => match (key("aws_access_key_id"), key("aws_secret_access_key")) {
                (Some(id), Some(secret)) => (
                    Credentials {
                        access_key_id: id.clone(),
                        secret_access_key: Secret::new(secret.clone()),
                        session_token: key("aws_session_token").cloned().map(Secret::new),
                    },
                    format!("profile {profile_name}"),
                ),
                _ => {
                    let profile_said =
                        if named && from_credentials.is_none() && from_config.is_none() {
                            format!(
                        "; AWS_PROFILE names '{profile_name}', which neither shared file has"
                    )
                        } else {
                            String::new()
                        };
                    return Err(Error::Config(format!(
                    "no AWS credentials for s3://: set AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or \
                     AWS_PROFILE with a profile in ~/.aws/credentials \
                     (AWS_SHARED_CREDENTIALS_FILE) or ~/.aws/config (AWS_CONFIG_FILE){profile_said}"
                )));
                }
            },
        };
    let region = region
        .map(str::to_owned)
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or_else(|| key("region").cloned())
        .unwrap_or_else(|| "us-east-1".into());
    let (endpoint, whose) = match endpoint {
        Some(e) => (e.to_owned(), "the URL's endpoint"),
        None => match env("AWS_ENDPOINT_URL_S3") {
            Some(e) => (e, "AWS_ENDPOINT_URL_S3"),
            None => match env("AWS_ENDPOINT_URL") {
                Some(e) => (e, "AWS_ENDPOINT_URL"),
                None => (format!("https://s3.{region}.amazonaws.com"), "the region"),
            },
        },
    };
    Origin::parse(&endpoint).map_err(|e| Error::Config(format!("{whose}: {e}")))?;
    Ok(Settings {
        credentials,
        credentials_from,
        region,
        endpoint,
        path_style: path_style.unwrap_or(false),
    })
}

/// The keys of `profile` in the INI file at `path` (`None`: no file, or no such section). In
/// the config file a profile other than `default` is `[profile NAME]`.
fn read_profile(
    path: Option<&PathBuf>,
    profile: &str,
    config: bool,
) -> Result<Option<std::collections::HashMap<String, String>>, Error> {
    let Some(path) = path else {
        return Ok(None);
    };
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::files::read_small_file(path, MAX_FILE)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let wanted = if config && profile != "default" {
        format!("profile {profile}")
    } else {
        profile.to_owned()
    };
    Ok(section(&text, &wanted))
}

/// The `key = value` pairs of `[wanted]` in INI `text`; indented lines (sub-sections) and
/// comments are skipped.
fn section(text: &str, wanted: &str) -> Option<std::collections::HashMap<String, String>> {
    let mut found = None;
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.split_whitespace().collect::<Vec<_>>().join(" ") == wanted;
            if inside && found.is_none() {
                found = Some(std::collections::HashMap::new());
            }
            continue;
        }
        if let (true, Some(map), Some((key, value))) =
            (inside, found.as_mut(), line.split_once('='))
        {
            map.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        }
    }

    #[test]
    fn the_environment_comes_first_then_the_defaults() {
        let env = with(&[
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("HOME", "/nonexistent"),
        ]);
        let s = resolve(&env, None, None, None).unwrap();
        assert_eq!(s.credentials.access_key_id, "AKID");
        assert_eq!(s.region, "eu-west-1");
        assert_eq!(s.endpoint, "https://s3.eu-west-1.amazonaws.com");
        let s = resolve(&env, Some("us-west-2"), Some("http://127.0.0.1:9"), None).unwrap();
        assert_eq!(
            (s.region.as_str(), s.endpoint.as_str()),
            ("us-west-2", "http://127.0.0.1:9")
        );
    }

    #[test]
    fn profiles_are_read_from_the_shared_files() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id = D\naws_secret_access_key = d\n\n[ci]\n\
             aws_access_key_id=C\naws_secret_access_key=c\naws_session_token = t\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[profile ci]\nregion = ap-south-1\ns3 =\n  endpoint_url = http://x\n",
        )
        .unwrap();
        let env = with(&[
            ("AWS_PROFILE", "ci"),
            ("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().unwrap()),
            ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ]);
        let s = resolve(&env, None, None, None).unwrap();
        assert_eq!(s.credentials.access_key_id, "C");
        assert_eq!(s.credentials.session_token.unwrap().expose(), "t");
        assert_eq!(s.region, "ap-south-1");
        let env = with(&[
            ("AWS_PROFILE", "nope"),
            ("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().unwrap()),
            ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ]);
        let e = resolve(&env, None, None, None).unwrap_err();
        assert_eq!(e.code().value(), 78);
        assert!(e.to_string().contains("AWS_PROFILE names 'nope'"), "{e}");
    }

    #[test]
    fn no_credentials_is_78_naming_the_variables() {
        let env = with(&[("HOME", "/nonexistent")]);
        let e = resolve(&env, None, None, None).unwrap_err();
        assert_eq!(e.code().value(), 78);
        assert!(e.to_string().contains("AWS_ACCESS_KEY_ID"), "{e}");
    }
}
