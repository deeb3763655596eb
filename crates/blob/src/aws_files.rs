//! The AWS shared credentials file (`~/.aws/credentials`, where `aws
//! configure` writes keys), which object_store does not read: its static
//! keys are used for an `s3://` store given no access key in its options
//! or the environment, as the AWS tools do (before web identity, ECS and
//! instance metadata).
//!
//! The file is `AWS_SHARED_CREDENTIALS_FILE` or `$HOME/.aws/credentials`;
//! the profile `AWS_PROFILE` or `default`. Only `aws_access_key_id`,
//! `aws_secret_access_key` and `aws_session_token` are read (no
//! `credential_process`, no roles from `~/.aws/config`). A missing file,
//! or a missing `default` profile, is no error: the other sources follow.
//! A profile named by `AWS_PROFILE` that is not there, or one without both
//! keys, is a [`BlobError::Config`] naming the file, the profile and the
//! key (never a value).

use crate::BlobError;
use object_store::aws::AmazonS3ConfigKey as K;
use std::path::PathBuf;

/// The options the shared credentials file adds to `options` (none when
/// the store has a key already, or signs nothing, or there is no file).
pub(crate) fn shared_credentials(
    options: &[(String, String)],
) -> Result<Vec<(String, String)>, BlobError> {
    let given = |want: K| {
        options
            .iter()
            .any(|(k, v)| k.to_ascii_lowercase().parse::<K>().ok() == Some(want) && !v.is_empty())
    };
    let unsigned = options.iter().any(|(k, v)| {
        k.to_ascii_lowercase().parse::<K>().ok() == Some(K::SkipSignature)
            && v.eq_ignore_ascii_case("true")
    });
    let env_key = std::env::var_os("AWS_ACCESS_KEY_ID").is_some_and(|v| !v.is_empty());
    if given(K::AccessKeyId) || env_key || unsigned {
        return Ok(Vec::new());
    }
    let file = match std::env::var_os("AWS_SHARED_CREDENTIALS_FILE") {
        Some(f) if !f.is_empty() => PathBuf::from(f),
        _ => match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".aws/credentials"),
            None => return Ok(Vec::new()),
        },
    };
    let named = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    let profile = named.as_deref().unwrap_or("default");
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && named.is_none() => {
            return Ok(Vec::new())
        }
        Err(e) => {
            return Err(BlobError::Config(format!(
                "cannot read the AWS shared credentials file {}: {e}",
                file.display()
            )))
        }
    };
    let shown = file.display();
    match profile_keys(&text, profile) {
        None if named.is_none() => Ok(Vec::new()),
        None => Err(BlobError::Config(format!(
            "AWS_PROFILE names profile {profile:?}, which {shown} does not have (warren \
             reads static keys from the shared credentials file only)"
        ))),
        Some(keys) => {
            let get = |k: &str| keys.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let mut out = Vec::new();
            for (file_key, option) in [
                ("aws_access_key_id", "access_key_id"),
                ("aws_secret_access_key", "secret_access_key"),
            ] {
                let v = get(file_key).ok_or_else(|| {
                    BlobError::Config(format!("profile {profile:?} in {shown} has no {file_key}"))
                })?;
                out.push((option.to_string(), v));
            }
            if let Some(t) = get("aws_session_token") {
                out.push(("token".to_string(), t));
            }
            Ok(out)
        }
    }
}

/// The `key = value` lines of `[profile]` in an INI text (keys lowercased),
/// or `None` if it has no such section.
fn profile_keys(text: &str, profile: &str) -> Option<Vec<(String, String)>> {
    let mut inside = false;
    let mut found = None::<Vec<(String, String)>>;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == profile;
            if inside && found.is_none() {
                found = Some(Vec::new());
            }
            continue;
        }
        if !inside {
            continue;
        }
        if let (Some(keys), Some((k, v))) = (found.as_mut(), line.split_once('=')) {
            keys.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# written by aws configure
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret/default+1

[ci]
; a comment
AWS_ACCESS_KEY_ID=AKIDCI
aws_secret_access_key=secret-ci
aws_session_token = tok=en==
";

    #[test]
    fn profiles_are_read_by_name() {
        let d = profile_keys(FILE, "default").expect("default");
        assert_eq!(
            d,
            [
                ("aws_access_key_id".to_string(), "AKIDDEFAULT".to_string()),
                (
                    "aws_secret_access_key".to_string(),
                    "secret/default+1".to_string()
                ),
            ]
        );
        let ci = profile_keys(FILE, "ci").expect("ci");
        assert_eq!(ci[0], ("aws_access_key_id".into(), "AKIDCI".into()));
        assert_eq!(ci[2], ("aws_session_token".into(), "tok=en==".into()));
        assert!(profile_keys(FILE, "nope").is_none());
        assert!(profile_keys("", "default").is_none());
    }
}
