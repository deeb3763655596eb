//! Keeping credentials out of every message: a store's name, its errors and
//! its log lines go through a [`Redactor`] made when it opens.
//!
//! Two rules, both applied to every message:
//! - every secret the store was given (option values and environment
//!   variables whose names say they hold one, passwords in URLs) is
//!   replaced by `<redacted>`;
//! - in every URL the text holds, the user information
//!   (`user:password@`) and the query string (pre-signed signatures, SAS
//!   tokens) are replaced by `<redacted>`.

/// What replaces a secret.
pub(crate) const REDACTED: &str = "<redacted>";

/// Secrets shorter than this are not scrubbed: replacing `true` or `1`
/// everywhere would garble messages, and nothing that short is a credential.
const MIN_SECRET_LEN: usize = 6;

/// The prefixes of the environment variables the backends read
/// credentials from (object_store's `from_env`).
const ENV_PREFIXES: &[&str] = &["AWS_", "AZURE_", "GOOGLE_", "GCS_", "OBJECT_STORE_"];

/// Scrubs one store's secrets from text; see the module doc.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    /// The secret values, longest first (so a secret that contains
    /// another is replaced whole).
    secrets: Vec<String>,
}

/// Whether an option or environment variable named `key` holds a secret:
/// keys, secrets, tokens, passwords, signatures. Key *ids* (an access key's
/// public half) and paths to key files do not.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    if k.ends_with("key_id") || k.ends_with("_file") || k.ends_with("_path") {
        return false;
    }
    ["secret", "token", "password", "sas", "signature", "key"]
        .iter()
        .any(|w| k.contains(w))
        || k.ends_with("credentials")
}

impl Redactor {
    /// A redactor for `options` (the secret ones) and this process's
    /// credential environment variables.
    pub(crate) fn new(options: &[(String, String)]) -> Redactor {
        let mut r = Redactor::default();
        for (k, v) in options {
            if is_secret_key(k) {
                r.add(v);
            }
            r.add_url_password(v);
        }
        for (k, v) in std::env::vars_os() {
            let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
                continue;
            };
            if ENV_PREFIXES.iter().any(|p| k.starts_with(p)) {
                if is_secret_key(k) {
                    r.add(v);
                }
                r.add_url_password(v);
            }
        }
        r
    }

    fn add(&mut self, secret: &str) {
        let secret = secret.trim();
        if secret.len() >= MIN_SECRET_LEN && !self.secrets.iter().any(|s| s == secret) {
            self.secrets.push(secret.to_string());
            self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// The password (and user) of a URL `value`, if it is one with them.
    fn add_url_password(&mut self, value: &str) {
        if let Ok(url) = url::Url::parse(value) {
            if let Some(p) = url.password() {
                self.add(p);
                if let Ok(p) = percent_decode(p) {
                    self.add(&p);
                }
            }
        }
    }

    /// `text` with every secret and every URL's credentials replaced.
    pub(crate) fn redact(&self, text: &str) -> String {
        // URLs first: a secret replaced inside one (`<redacted>`) would end
        // it early, at the `<`, and hide its user and query from the strip.
        let mut out = strip_url_credentials(text);
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }
}

fn percent_decode(s: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
}

/// Where a URL inside free text ends.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '(' | ')' | '[' | ']' | '`')
}

/// `text` with `user:password@` and `?query` removed from every URL in it.
pub(crate) fn strip_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail.find(ends_url).unwrap_or(tail.len());
        let (url, after) = tail.split_at(end);
        // The authority runs to the first '/', '?' or '#'.
        let auth_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let (authority, path) = url.split_at(auth_end);
        match authority.rfind('@') {
            Some(i) => {
                out.push_str(REDACTED);
                out.push_str(&authority[i..]);
            }
            None => out.push_str(authority),
        }
        match path.find('?') {
            Some(q) => {
                out.push_str(&path[..=q]);
                out.push_str(REDACTED);
            }
            None => out.push_str(path),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_are_recognized_and_ids_are_not() {
        for k in [
            "aws_secret_access_key",
            "secret_access_key",
            "AWS_SESSION_TOKEN",
            "token",
            "azure_storage_account_key",
            "azure_storage_sas_key",
            "azure_client_secret",
            "google_service_account_key",
            "sse_customer_key_base64",
        ] {
            assert!(is_secret_key(k), "{k} not secret");
        }
        for k in [
            "aws_access_key_id",
            "endpoint",
            "region",
            "allow_http",
            "aws_web_identity_token_file",
            "google_service_account_path",
            "sse_kms_key_id",
        ] {
            assert!(!is_secret_key(k), "{k} secret");
        }
    }

    #[test]
    fn secrets_and_url_credentials_are_scrubbed() {
        let r = Redactor::new(&[
            ("secret_access_key".into(), "hunter2hunter2".into()),
            ("region".into(), "garage".into()),
            (
                "endpoint".into(),
                "http://bob:p%40ss-word@127.0.0.1:9000".into(),
            ),
        ]);
        let text = "denied hunter2hunter2 at http://bob:p%40ss-word@127.0.0.1:9000/b/k?X-Amz-Signature=abc \
                    (region garage) p@ss-word";
        let out = r.redact(text);
        assert!(!out.contains("hunter2"), "{out}");
        assert!(!out.contains("p%40ss"), "{out}");
        assert!(!out.contains("p@ss-word"), "{out}");
        assert!(!out.contains("bob"), "{out}");
        assert!(!out.contains("abc"), "{out}");
        assert!(out.contains("garage"), "{out}");
        assert!(
            out.contains("<redacted>@127.0.0.1:9000/b/k?<redacted>"),
            "{out}"
        );
    }

    #[test]
    fn text_without_urls_is_unchanged() {
        let r = Redactor::default();
        assert_eq!(r.redact("no such blob"), "no such blob");
        assert_eq!(
            strip_url_credentials("s3://bucket/prefix and file:///var/x"),
            "s3://bucket/prefix and file:///var/x"
        );
    }
}
