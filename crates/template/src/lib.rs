//! Sandbox templates. A template is an immutable root filesystem plus the
//! defaults a sandbox made from it starts with (user, working directory,
//! environment, start command, CPUs, memory, disk).
//!
//! # Layout
//! - [`spec`]: the declarative build file (`warren template build FILE`).
//! - [`store`]: where templates live, content-addressed: a tarball named by
//!   its SHA-256, its unpacked root filesystem, and a JSON record per name.
//! - [`cache`]: a host's bounded cache of layers fetched from the blob
//!   store: one download per digest, verified, never evicting a leased one.
//! - [`build`]: building a spec with `mmdebstrap` from the Debian archive,
//!   and importing a root filesystem tarball (what `docker export` writes).
//! - [`unused`]: layers whose last record went, noted until whoever can
//!   prove nothing stacks them removes them.
//! - [`gc`]: collecting what no record names (after a grace period, never
//!   what a sandbox of the host stacks), and the records of gone teams.

// Tests may unwrap: a panic there is a test failure with a message.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod build;
pub mod cache;
pub mod gc;
pub mod spec;
pub mod store;
pub mod unused;

pub use spec::Spec;
pub use store::{named_snapshot_key, paused_key, Paused, Snapshot, Store, Template};
pub use unused::Removal;

/// Why a template operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The build file or an argument is wrong; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// No template by that name or digest.
    #[error("template {0:?} does not exist")]
    NotFound(String),
    /// A stored blob does not hash to its name.
    #[error("template blob {name} is corrupt: its SHA-256 is {actual}")]
    Corrupt { name: String, actual: String },
    /// A tool (mmdebstrap, tar) failed; the message has its output.
    #[error("{tool} failed: {message}")]
    Tool { tool: String, message: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TemplateError {
    let what = what.into();
    move |source| TemplateError::Io { what, source }
}

/// Checks a template name: 1..=64 of `[a-z0-9._-]`, starting with a
/// letter or digit (E2B template ids and aliases fit).
pub fn validate_name(name: &str) -> Result<(), TemplateError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(TemplateError::Invalid(format!(
            "template name {name:?} must be 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit"
        )))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        assert!(super::validate_name("base").is_ok());
        assert!(super::validate_name("code-interpreter-v1").is_ok());
        for bad in ["", "../x", "Base", "-x", "a/b", &"x".repeat(65)] {
            assert!(super::validate_name(bad).is_err(), "{bad}");
        }
    }
}
