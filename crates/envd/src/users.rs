//! Who a request acts as. In a `bwrap` sandbox envd runs as root *of the
//! sandbox's user namespace* (`--switch-users`) and runs user code, and
//! creates files, as the user the client names (the SDK's Basic
//! `Authorization` user, or `username` on `/files`; default `user`), looked
//! up in the sandbox's own `/etc/passwd`. So user code never shares envd's
//! identity: it cannot read envd's token from `/proc` or signal envd.
//!
//! Without `--switch-users` (the `process` runtime, tests) everything runs
//! as envd itself and the name only sets `USER`/`HOME`-style variables.

use std::io;
use std::path::{Path, PathBuf};

/// The user a request acts as when it names none.
pub const DEFAULT_USER: &str = "user";

/// The user table (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Users {
    /// `Some(<root>/etc/passwd)` when envd switches identities.
    passwd: Option<PathBuf>,
    /// The template's user, when not [`DEFAULT_USER`].
    default_user: Option<String>,
    /// The template's working directory, where the default user's
    /// processes start when a request names none.
    default_workdir: Option<String>,
}

/// A user from the sandbox's `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// The home directory as the sandbox sees it.
    pub home: String,
}

/// Why a user could not be used.
#[derive(Debug, thiserror::Error)]
#[error("user {0:?} does not exist in this sandbox")]
pub struct UnknownUser(pub String);

impl Users {
    /// Identity switching on, with the sandbox root at `root`.
    pub fn switching(root: &Path) -> Users {
        Users {
            passwd: Some(root.join("etc/passwd")),
            ..Users::default()
        }
    }

    /// Who a request naming nobody acts as.
    pub fn default_name(&self) -> &str {
        self.default_user.as_deref().unwrap_or(DEFAULT_USER)
    }

    /// The template's user and working directory (see the fields).
    pub fn with_defaults(mut self, user: Option<String>, workdir: Option<String>) -> Users {
        self.default_user = user;
        self.default_workdir = workdir;
        self
    }

    /// Where a process of the user `name` (`None`: the default) starts
    /// when the request names no directory: the template's working
    /// directory for the template's user, else `None` (their home).
    pub fn default_cwd(&self, name: Option<&str>) -> Option<&str> {
        let default = self.default_user.as_deref().unwrap_or(DEFAULT_USER);
        let named = name.filter(|n| !n.is_empty()).unwrap_or(default);
        (named == default)
            .then_some(self.default_workdir.as_deref())
            .flatten()
    }

    /// Whether requests run as the users they name.
    pub fn switches(&self) -> bool {
        self.passwd.is_some()
    }

    /// The identity for `name` (default `user`); `Ok(None)` when envd does
    /// not switch identities.
    pub fn lookup(&self, name: Option<&str>) -> Result<Option<Identity>, UnknownUser> {
        let Some(passwd) = &self.passwd else {
            return Ok(None);
        };
        let name = name
            .filter(|n| !n.is_empty())
            .or(self.default_user.as_deref())
            .unwrap_or(DEFAULT_USER);
        let text = std::fs::read_to_string(passwd).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() >= 7 && f[0] == name {
                if let (Ok(uid), Ok(gid)) = (f[2].parse(), f[3].parse()) {
                    return Ok(Some(Identity {
                        name: name.to_string(),
                        uid,
                        gid,
                        home: f[5].to_string(),
                    }));
                }
            }
        }
        Err(UnknownUser(name.to_string()))
    }
}

/// Gives `path` (not following a symlink) to `owner`, if any.
pub fn give(path: &Path, owner: Option<&Identity>) -> io::Result<()> {
    match owner {
        Some(id) => std::os::unix::fs::lchown(path, Some(id.uid), Some(id.gid)),
        None => Ok(()),
    }
}

/// `create_dir_all` that gives every directory it creates to `owner`.
pub fn make_dirs(path: &Path, owner: Option<&Identity>) -> io::Result<()> {
    if owner.is_none() {
        return std::fs::create_dir_all(path);
    }
    let mut missing = Vec::new();
    let mut at = path;
    while std::fs::symlink_metadata(at).is_err() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    for dir in missing.iter().rev() {
        match std::fs::create_dir(dir) {
            Ok(()) => give(dir, owner)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    if std::fs::metadata(path)?.is_dir() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "exists and is not a directory",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_reads_the_sandbox_passwd() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("etc")).expect("etc");
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
        )
        .expect("passwd");
        let users = Users::switching(dir.path());
        let user = users.lookup(None).expect("user").expect("switching");
        assert_eq!(
            (user.uid, user.gid, user.home.as_str()),
            (1000, 1000, "/home/user")
        );
        assert_eq!(
            users.lookup(Some("root")).expect("root").map(|r| r.uid),
            Some(0)
        );
        assert!(users.lookup(Some("mallory")).is_err());
        assert_eq!(Users::default().lookup(Some("x")).expect("none"), None);
        assert_eq!(users.default_cwd(None), None, "no template workdir: home");
    }

    #[test]
    fn the_templates_user_and_workdir_are_the_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("etc")).expect("etc");
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\nguest:x:1001:1001::/home/guest:/bin/bash\n",
        )
        .expect("passwd");
        let users = Users::switching(dir.path())
            .with_defaults(Some("guest".into()), Some("/srv/app".into()));
        let who = users.lookup(None).expect("guest").expect("switching");
        assert_eq!((who.name.as_str(), who.uid), ("guest", 1001));
        assert_eq!(users.default_name(), "guest");
        assert_eq!(users.default_cwd(None), Some("/srv/app"));
        assert_eq!(users.default_cwd(Some("guest")), Some("/srv/app"));
        assert_eq!(
            users.default_cwd(Some("root")),
            None,
            "another user: its home"
        );
    }
}
