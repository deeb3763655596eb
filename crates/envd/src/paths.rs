//! Client paths → host paths under the sandbox root.
//!
//! A client names paths as the sandbox sees them (`/home/user/x`, `x`,
//! `~/x`); envd serves them from `--root`. Resolution walks the path one
//! component at a time with `lstat`, following symlinks the way the kernel
//! would, and then checks that the final host path is inside the root:
//!
//! - a `..` that would climb above the sandbox's `/` is refused outright
//!   ([`PathError::Escape`], a client error — 400 / `invalid_argument`);
//! - a symlink whose target lies outside the root is refused
//!   ([`PathError::SymlinkEscape`] — 403 / `permission_denied`), even when it
//!   is dangling and the caller wants to create the file it points at.
//!
//! With `--root /` (inside bwrap) the namespace itself is the boundary and
//! every check passes trivially.
//!
//! This is a check-then-use design: a process inside the sandbox that swaps a
//! directory for a symlink between the check and the open can still race it.
//! Under bwrap that gains nothing (root is `/`); under the `process` runtime
//! there is no isolation to protect in the first place.

use std::collections::VecDeque;
use std::io;
use std::path::{Component, Path, PathBuf};

/// How many symlinks one resolution may follow (Linux's own limit).
const MAX_SYMLINKS: usize = 40;

/// Why a client path could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// `..` above the sandbox's `/`.
    #[error("path {0:?} escapes the sandbox root")]
    Escape(String),
    /// A symlink on the way leads outside the sandbox root.
    #[error("path {0:?} leads outside the sandbox through a symlink")]
    SymlinkEscape(String),
    /// A NUL byte, which no file name can hold.
    #[error("path {0:?} contains a NUL byte")]
    Nul(String),
    /// `ELOOP`.
    #[error("path {0:?}: too many levels of symbolic links")]
    Loop(String),
    /// `lstat`/`readlink` failed for a reason other than "does not exist".
    #[error("path {path:?}: {source}")]
    Io {
        /// The client's path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Whether the last component is followed when it is a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Read and write through links (`/files`, ListDir's directory).
    All,
    /// Act on the link itself (Stat, Remove, Move).
    NotLast,
}

/// A resolved path: where it is on the host, and how the client names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The path on the host, inside the root.
    pub host: PathBuf,
    /// The same path as the sandbox sees it (absolute, `/`-separated).
    pub client: String,
}

/// The sandbox root and home, for resolving client paths.
#[derive(Debug, Clone)]
pub struct Jail {
    root: PathBuf,
    home: String,
    /// Who requests act as (see [`crate::users`]).
    users: crate::users::Users,
}

impl Jail {
    /// `root` must be canonical; `home` absolute and normalized (see
    /// [`crate::Settings`]).
    pub fn new(root: PathBuf, home: String) -> Jail {
        Jail {
            root,
            home,
            users: crate::users::Users::default(),
        }
    }

    /// The same jail, acting as the users requests name.
    pub fn with_users(mut self, users: crate::users::Users) -> Jail {
        self.users = users;
        self
    }

    /// Who requests act as.
    pub fn users(&self) -> &crate::users::Users {
        &self.users
    }

    /// The canonical root on the host.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The home directory as the client sees it.
    pub fn home(&self) -> &str {
        &self.home
    }

    /// The home directory on the host (not checked for existence).
    pub fn home_host(&self) -> PathBuf {
        self.host_of(&self.home)
    }

    /// The host path of a normalized client path, without touching the disk.
    fn host_of(&self, client: &str) -> PathBuf {
        let rel = client.trim_start_matches('/');
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    /// The client's name for a host path inside the root, if it is inside.
    fn client_of(&self, host: &Path) -> Option<String> {
        let rel = host.strip_prefix(&self.root).ok()?;
        let mut out = String::from("/");
        out.push_str(&rel.to_string_lossy());
        Some(out)
    }

    /// The client's path made absolute and normalized: `~` and relative
    /// paths start at `home`, `.` and empty components vanish, `..` climbs.
    fn normalize(&self, path: &str, home: &str) -> Result<String, PathError> {
        if path.contains('\0') {
            return Err(PathError::Nul(path.to_string()));
        }
        let full = if path.is_empty() || path == "~" {
            home.to_string()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{home}/{rest}")
        } else if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{home}/{path}")
        };
        normalize_absolute(&full).map_err(|_| PathError::Escape(path.to_string()))
    }

    /// Resolves a client path to a host path inside the root; relative
    /// paths start at the jail's home (`--home`).
    pub fn resolve(&self, path: &str, follow: Follow) -> Result<Resolved, PathError> {
        self.resolve_for(path, follow, None)
    }

    /// [`Jail::resolve`] for a request acting as `user`: its relative
    /// paths and `~` start at that user's home, as E2B's envd resolves
    /// them (`root`'s `hello.txt` is `/root/hello.txt`); without one (envd
    /// does not switch users), at the jail's home.
    pub fn resolve_for(
        &self,
        path: &str,
        follow: Follow,
        user: Option<&crate::users::Identity>,
    ) -> Result<Resolved, PathError> {
        let home = user.map_or(self.home.as_str(), |u| u.home.as_str());
        let client = self.normalize(path, home)?;
        let mut todo: VecDeque<String> = components(&client).map(str::to_string).collect();
        let mut cur = self.root.clone();
        let mut links = 0;
        let mut missing = false;
        while let Some(name) = todo.pop_front() {
            if name == ".." {
                cur.pop();
                continue;
            }
            let next = cur.join(&name);
            if missing {
                // Below a missing directory nothing exists, so no symlinks either.
                cur = next;
                continue;
            }
            let is_last = todo.is_empty();
            match std::fs::symlink_metadata(&next) {
                Ok(meta)
                    if meta.file_type().is_symlink() && (follow == Follow::All || !is_last) =>
                {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(PathError::Loop(path.to_string()));
                    }
                    let target = std::fs::read_link(&next).map_err(|source| PathError::Io {
                        path: path.to_string(),
                        source,
                    })?;
                    if target.is_absolute() {
                        cur = PathBuf::from("/");
                    }
                    let mut parts: Vec<String> = Vec::new();
                    for c in target.components() {
                        match c {
                            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
                            Component::ParentDir => parts.push("..".to_string()),
                            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                        }
                    }
                    for p in parts.into_iter().rev() {
                        todo.push_front(p);
                    }
                }
                Ok(_) => cur = next,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    missing = true;
                    cur = next;
                }
                // ENOTDIR: a file used as a directory; the operation itself
                // will report it properly, so keep the path as named.
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                    missing = true;
                    cur = next;
                }
                Err(source) => {
                    return Err(PathError::Io {
                        path: path.to_string(),
                        source,
                    })
                }
            }
        }
        match self.client_of(&cur) {
            Some(client) => Ok(Resolved { host: cur, client }),
            None => Err(PathError::SymlinkEscape(path.to_string())),
        }
    }
}

fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".")
}

/// Normalizes an absolute `/`-separated path lexically; `Err` when it is not
/// absolute or a `..` climbs above `/`.
pub fn normalize_absolute(path: &str) -> Result<String, &'static str> {
    if !path.starts_with('/') {
        return Err("not an absolute path");
    }
    let mut stack: Vec<&str> = Vec::new();
    for c in components(path) {
        if c == ".." {
            if stack.pop().is_none() {
                return Err("`..` climbs above /");
            }
        } else {
            stack.push(c);
        }
    }
    Ok(format!("/{}", stack.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jail() -> (tempfile::TempDir, Jail) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        std::fs::create_dir_all(root.join("home/user")).expect("home");
        (dir, Jail::new(root, "/home/user".into()))
    }

    #[test]
    fn relative_and_tilde_paths_start_at_home() {
        let (_d, j) = jail();
        let home = "/home/user";
        assert_eq!(
            j.normalize("a.txt", home).ok().as_deref(),
            Some("/home/user/a.txt")
        );
        assert_eq!(
            j.normalize("~/a/./b", home).ok().as_deref(),
            Some("/home/user/a/b")
        );
        assert_eq!(j.normalize("", home).ok().as_deref(), Some("/home/user"));
        assert_eq!(
            j.normalize("/tmp/../etc//x", home).ok().as_deref(),
            Some("/etc/x")
        );
    }

    /// A request acting as a user resolves relative paths in that user's
    /// home (`root`'s `hello.txt` is `/root/hello.txt`), as E2B's envd.
    #[test]
    fn relative_paths_start_at_the_requesting_users_home() {
        let (_d, j) = jail();
        let root = crate::users::Identity {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        };
        let r = j
            .resolve_for("hello.txt", Follow::All, Some(&root))
            .expect("inside");
        assert_eq!(r.client, "/root/hello.txt");
        assert!(r.host.ends_with("root/hello.txt"));
        let r = j
            .resolve_for("~/x", Follow::All, Some(&root))
            .expect("inside");
        assert_eq!(r.client, "/root/x");
        let r = j.resolve_for("x", Follow::All, None).expect("inside");
        assert_eq!(r.client, "/home/user/x");
    }

    #[test]
    fn dotdot_above_root_is_an_escape() {
        let (_d, j) = jail();
        assert!(matches!(
            j.resolve("/../etc/passwd", Follow::All),
            Err(PathError::Escape(_))
        ));
        assert!(matches!(
            j.resolve("../../../x", Follow::All),
            Err(PathError::Escape(_))
        ));
    }

    #[test]
    fn symlinks_inside_resolve_and_outside_are_refused() {
        let (_d, j) = jail();
        let home = j.home_host();
        std::fs::write(home.join("real"), b"x").expect("write");
        std::os::unix::fs::symlink("real", home.join("rel")).expect("symlink");
        std::os::unix::fs::symlink("/etc", home.join("out")).expect("symlink");
        std::os::unix::fs::symlink("../../..", home.join("up")).expect("symlink");
        std::os::unix::fs::symlink("/nonexistent-warren-target", home.join("dangling"))
            .expect("symlink");

        let r = j.resolve("rel", Follow::All).expect("inside");
        assert_eq!(r.client, "/home/user/real");
        let r = j.resolve("rel", Follow::NotLast).expect("the link itself");
        assert_eq!(r.client, "/home/user/rel");
        assert!(matches!(
            j.resolve("out/passwd", Follow::All),
            Err(PathError::SymlinkEscape(_))
        ));
        assert!(matches!(
            j.resolve("up/x", Follow::All),
            Err(PathError::SymlinkEscape(_))
        ));
        assert!(matches!(
            j.resolve("dangling", Follow::All),
            Err(PathError::SymlinkEscape(_))
        ));
        // Removing the link itself is fine: it lives inside.
        assert!(j.resolve("out", Follow::NotLast).is_ok());
    }

    #[test]
    fn missing_paths_resolve_for_creation() {
        let (_d, j) = jail();
        let r = j
            .resolve("new/dir/file", Follow::All)
            .expect("missing is fine");
        assert_eq!(r.client, "/home/user/new/dir/file");
        assert_eq!(r.host, j.root().join("home/user/new/dir/file"));
    }
}
