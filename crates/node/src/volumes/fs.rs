//! Every host-side operation on a volume's content, confined to the
//! volume: each starts from a descriptor of the volume's root directory
//! and resolves the client's path with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, so neither `..` nor a
//! symlink (one already there, or one a sandbox plants while the call is
//! in flight) leads out of it: the kernel refuses such a resolution
//! (`EXDEV`), which is answered 400. The last component is then used only
//! through its parent's descriptor with calls that never follow it
//! (`statat(AT_SYMLINK_NOFOLLOW)`, `mkdirat`, `unlinkat`, `renameat`,
//! `O_NOFOLLOW | O_EXCL` creates), or opened through `openat2` beneath
//! again. Files are opened `O_NONBLOCK` (a FIFO a sandbox made cannot
//! hold a thread) and checked with `fstat` before use; ownership and
//! modes change by descriptor.
//!
//! Why rustix rather than cap-std: the operations need `fchown`,
//! `AT_SYMLINK_NOFOLLOW` ownership changes and `O_EXCL` temporary files
//! next to the target, which cap-std does not expose; `openat2` gives the
//! same confinement cap-std uses on Linux.
//!
//! Ids are the ones stored on disk, which are the ids a sandbox sees
//! (every mount is idmapped through the sandbox's user namespace): `1000`
//! is `user` in every sandbox, whatever host range it runs under.
//!
//! All of it is blocking: run it in `spawn_blocking`.

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use std::os::fd::{AsFd, OwnedFd};

/// How every client path is resolved (see the module doc).
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// The owner of what the API makes when the call names none: E2B's `user`.
pub const DEFAULT_ID: u32 = 1000;
/// Largest uid or gid the API sets: the ids a sandbox's namespace maps.
pub const MAX_ID: u32 = 65535;
/// Most entries one listing answers.
pub const MAX_LIST: usize = 10_000;
/// Deepest listing.
pub const MAX_DEPTH: u32 = 64;
/// Longest path accepted.
const MAX_PATH: usize = 4096;

/// Why an operation failed, as the content API answers it.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    /// The volume is full (`ENOSPC`, `EDQUOT`).
    #[error("{0}")]
    NoSpace(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Internal(String),
}

impl FsError {
    /// `errno` from an operation on `path`, as the client should read it.
    pub fn from_errno(e: Errno, what: &str, path: &VPath) -> FsError {
        let p = path.display();
        match e {
            Errno::NOENT => FsError::NotFound(format!("path {p} not found")),
            Errno::XDEV | Errno::LOOP => FsError::BadRequest(format!(
                "path {p} leads out of the volume (through a symlink or a mount); \
                 paths and the symlinks in them must stay inside the volume"
            )),
            Errno::NOTDIR => {
                FsError::BadRequest(format!("a component of path {p} is not a directory"))
            }
            Errno::EXIST => FsError::Conflict(format!("path {p} already exists")),
            Errno::ISDIR => FsError::Conflict(format!("path {p} is a directory")),
            Errno::NOTEMPTY => FsError::Conflict(format!("directory {p} is not empty")),
            Errno::NAMETOOLONG => FsError::BadRequest(format!("path {p} is too long")),
            Errno::NOSPC | Errno::DQUOT => FsError::NoSpace(format!("{what} {p}")),
            Errno::ACCESS | Errno::PERM => {
                FsError::Forbidden(format!("cannot {what} {p}: not permitted"))
            }
            e => FsError::Internal(format!("cannot {what} {p}: {e}")),
        }
    }
}

type Result<T> = std::result::Result<T, FsError>;

/// A path inside a volume, from the client: `/`-separated components,
/// never `..`, never a NUL; empty and `.` components dropped. `/` (or an
/// empty path) is the volume's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VPath {
    parts: Vec<String>,
}

impl VPath {
    pub fn parse(s: &str) -> Result<VPath> {
        if s.len() > MAX_PATH {
            return Err(FsError::BadRequest(format!(
                "path is longer than {MAX_PATH} bytes"
            )));
        }
        if s.contains('\0') {
            return Err(FsError::BadRequest("path contains a NUL byte".into()));
        }
        let mut parts = Vec::new();
        for c in s.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    return Err(FsError::BadRequest(format!(
                        "path {s:?} contains '..': paths stay inside the volume"
                    )))
                }
                c => parts.push(c.to_string()),
            }
        }
        Ok(VPath { parts })
    }

    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// `/a/b`, as answers name it.
    pub fn display(&self) -> String {
        format!("/{}", self.parts.join("/"))
    }

    /// The last component ('' for the root).
    pub fn name(&self) -> &str {
        self.parts.last().map_or("", String::as_str)
    }

    /// Relative to the root (`.` for the root itself).
    fn relative(&self) -> String {
        if self.parts.is_empty() {
            ".".into()
        } else {
            self.parts.join("/")
        }
    }

    fn parent(&self) -> VPath {
        VPath {
            parts: self.parts[..self.parts.len().saturating_sub(1)].to_vec(),
        }
    }

    fn child(&self, name: &str) -> VPath {
        let mut parts = self.parts.clone();
        parts.push(name.to_string());
        VPath { parts }
    }
}

/// E2B's `VolumeEntryStat`.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub path: String,
    pub size: u64,
    /// Permission bits (`0o7777`), not the file type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: String,
    pub mtime: String,
    pub ctime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

fn kind_of(st: &Stat) -> &'static str {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => "directory",
        FileType::RegularFile => "file",
        FileType::Symlink => "symlink",
        _ => "unknown",
    }
}

fn time(secs: i64, nanos: i64) -> String {
    warren_core::time::rfc3339_ms(
        secs.saturating_mul(1000)
            .saturating_add(nanos.div_euclid(1_000_000)),
    )
}

fn entry(st: &Stat, path: &VPath, target: Option<String>) -> Entry {
    Entry {
        name: path.name().to_string(),
        kind: kind_of(st),
        path: path.display(),
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: time(st.st_atime, st.st_atime_nsec as i64),
        mtime: time(st.st_mtime, st.st_mtime_nsec as i64),
        ctime: time(st.st_ctime, st.st_ctime_nsec as i64),
        target,
    }
}

/// Opens `path` beneath `root` with `flags`, symlinks followed only
/// while they stay beneath (and the last one not at all with `O_NOFOLLOW`).
fn open_beneath(root: impl AsFd, path: &VPath, flags: OFlags, what: &str) -> Result<OwnedFd> {
    rustix::fs::openat2(
        root,
        path.relative(),
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
    .map_err(|e| FsError::from_errno(e, what, path))
}

/// `path`'s parent directory, opened beneath `root`.
fn parent_dir(root: impl AsFd, path: &VPath, what: &str) -> Result<OwnedFd> {
    open_beneath(
        root,
        &path.parent(),
        OFlags::RDONLY | OFlags::DIRECTORY,
        what,
    )
    .map_err(|e| match e {
        FsError::NotFound(_) => FsError::NotFound(format!(
            "the directory of {} does not exist",
            path.display()
        )),
        e => e,
    })
}

/// What `name` in `dir` is, never following it; with a symlink's target.
fn stat_in(dir: &OwnedFd, name: &str, path: &VPath) -> Result<Entry> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| FsError::from_errno(e, "read", path))?;
    let target = (FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
        .then(|| rustix::fs::readlinkat(dir, name, Vec::new()).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned());
    Ok(entry(&st, path, target))
}

/// `GET /path`: what `path` is (a symlink as itself).
pub fn stat(root: &OwnedFd, path: &VPath) -> Result<Entry> {
    if path.is_root() {
        let st = rustix::fs::fstat(root).map_err(|e| FsError::from_errno(e, "read", path))?;
        return Ok(entry(&st, path, None));
    }
    let dir = parent_dir(root, path, "read")?;
    stat_in(&dir, path.name(), path)
}

/// `GET /dir`: the entries under `path`, `depth` levels down (1: its
/// children). Symlinks are listed, never followed; at most [`MAX_LIST`].
pub fn list(root: &OwnedFd, path: &VPath, depth: u32) -> Result<Vec<Entry>> {
    if depth == 0 || depth > MAX_DEPTH {
        return Err(FsError::BadRequest(format!(
            "depth must be between 1 and {MAX_DEPTH}"
        )));
    }
    let dir = open_beneath(root, path, OFlags::RDONLY | OFlags::DIRECTORY, "list")?;
    let mut out = Vec::new();
    list_into(&dir, path, depth, &mut out)?;
    Ok(out)
}

fn list_into(dir: &OwnedFd, path: &VPath, depth: u32, out: &mut Vec<Entry>) -> Result<()> {
    let names = names(dir, path)?;
    for name in names {
        let child = path.child(&name);
        let e = match stat_in(dir, &name, &child) {
            Ok(e) => e,
            // Removed meanwhile (by a sandbox): not listed.
            Err(FsError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        let is_dir = e.kind == "directory";
        if out.len() >= MAX_LIST {
            return Err(FsError::BadRequest(format!(
                "{} holds more than {MAX_LIST} entries at this depth; list a deeper path or \
                 fewer levels",
                path.display()
            )));
        }
        out.push(e);
        if is_dir && depth > 1 {
            let sub = rustix::fs::openat2(
                dir,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                BENEATH | ResolveFlags::NO_SYMLINKS,
            );
            match sub {
                Ok(sub) => list_into(&sub, &child, depth - 1, out)?,
                // Replaced or removed meanwhile: listed as it was.
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {}
                Err(e) => return Err(FsError::from_errno(e, "list", &child)),
            }
        }
    }
    Ok(())
}

/// The names in `dir`, sorted, without `.` and `..`.
fn names(dir: &OwnedFd, path: &VPath) -> Result<Vec<String>> {
    let d = rustix::fs::Dir::read_from(dir).map_err(|e| FsError::from_errno(e, "list", path))?;
    let mut names = Vec::new();
    for ent in d {
        let ent = ent.map_err(|e| FsError::from_errno(e, "list", path))?;
        let n = ent.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        match std::str::from_utf8(n) {
            Ok(s) => names.push(s.to_string()),
            // A name the API cannot carry (JSON strings are UTF-8).
            Err(_) => continue,
        }
    }
    names.sort();
    Ok(names)
}

/// Who owns what the API makes, and its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

impl Owner {
    /// From the call's `uid`, `gid`, `mode` (each optional), checked.
    pub fn new(
        uid: Option<u32>,
        gid: Option<u32>,
        mode: Option<u32>,
        default_mode: u32,
    ) -> Result<Owner> {
        for (what, v) in [("uid", uid), ("gid", gid)] {
            if v.is_some_and(|v| v > MAX_ID) {
                return Err(FsError::BadRequest(format!(
                    "{what} must be at most {MAX_ID} (the ids a sandbox has)"
                )));
            }
        }
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(FsError::BadRequest(
                "mode is permission bits, at most 0o7777 (4095)".into(),
            ));
        }
        Ok(Owner {
            uid: uid.unwrap_or(DEFAULT_ID),
            gid: gid.unwrap_or(DEFAULT_ID),
            mode: mode.unwrap_or(default_mode),
        })
    }
}

fn own(fd: &OwnedFd, owner: Owner, path: &VPath) -> Result<()> {
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(owner.uid)),
        Some(rustix::fs::Gid::from_raw(owner.gid)),
    )
    .map_err(|e| FsError::from_errno(e, "change the owner of", path))?;
    // After the owner: chown clears set-user-ID bits.
    rustix::fs::fchmod(fd, Mode::from_raw_mode(owner.mode))
        .map_err(|e| FsError::from_errno(e, "change the mode of", path))
}

/// `POST /dir`: makes directory `path` (with `force`, its missing parents
/// too, and an existing directory is no error).
pub fn make_dir(root: &OwnedFd, path: &VPath, owner: Owner, force: bool) -> Result<Entry> {
    if path.is_root() {
        return if force {
            stat(root, path)
        } else {
            Err(FsError::Conflict("the volume's root already exists".into()))
        };
    }
    if !force {
        let dir = parent_dir(root, path, "make")?;
        mkdir_in(&dir, path.name(), path, owner, false)?;
        return stat_in(&dir, path.name(), path);
    }
    // One component at a time, each opened beneath the one before.
    let mut dir = rustix::fs::openat(
        root,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::from_errno(e, "open", path))?;
    let mut at = VPath { parts: Vec::new() };
    for c in &path.parts {
        at = at.child(c);
        mkdir_in(&dir, c, &at, owner, true)?;
        dir = rustix::fs::openat2(
            &dir,
            c.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )
        .map_err(|e| FsError::from_errno(e, "open", &at))?;
    }
    let dir = parent_dir(root, path, "read")?;
    stat_in(&dir, path.name(), path)
}

/// Makes `name` in `dir`, owned by `owner`; an existing directory is fine
/// when `exist_ok`.
fn mkdir_in(dir: &OwnedFd, name: &str, path: &VPath, owner: Owner, exist_ok: bool) -> Result<()> {
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
        Ok(()) => {}
        // Whether it is a directory (or a symlink to one inside the
        // volume), the caller's open beneath decides.
        Err(Errno::EXIST) if exist_ok => return Ok(()),
        Err(e) => return Err(FsError::from_errno(e, "make", path)),
    }
    let fd = rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|e| FsError::from_errno(e, "open", path))?;
    own(&fd, owner, path)
}

/// A file being written (`PUT /file`): a new temporary file beside the
/// target, renamed over it once complete, so a failed or cut upload never
/// leaves half a file where the old one was.
pub struct Upload {
    dir: OwnedFd,
    temp: String,
    pub file: std::fs::File,
    path: VPath,
    owner: Owner,
    done: bool,
}

/// Starts writing `path` (its directory must exist).
pub fn start_upload(root: &OwnedFd, path: &VPath, owner: Owner) -> Result<Upload> {
    if path.is_root() {
        return Err(FsError::Conflict("the volume's root is a directory".into()));
    }
    let dir = parent_dir(root, path, "write")?;
    // A directory already there is refused before any byte is taken.
    if let Ok(st) = rustix::fs::statat(&dir, path.name(), AtFlags::SYMLINK_NOFOLLOW) {
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            return Err(FsError::Conflict(format!(
                "{} is a directory",
                path.display()
            )));
        }
    }
    let temp = format!(
        ".{}.warren-{}.part",
        path.name().chars().take(100).collect::<String>(),
        warren_core::id::random_token(12)
    );
    let fd = rustix::fs::openat(
        &dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| FsError::from_errno(e, "write", path))?;
    Ok(Upload {
        dir,
        temp,
        file: std::fs::File::from(fd),
        path: path.clone(),
        owner,
        done: false,
    })
}

impl Upload {
    /// Appends `data`.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        use std::io::Write;
        self.file
            .write_all(data)
            .map_err(|e| match e.raw_os_error() {
                Some(n) => FsError::from_errno(Errno::from_raw_os_error(n), "write", &self.path),
                None => FsError::Internal(format!("cannot write {}: {e}", self.path.display())),
            })
    }

    /// Sets its owner and mode and puts it in place.
    pub fn finish(mut self) -> Result<Entry> {
        let fd = OwnedFd::from(self.file.try_clone().map_err(|e| {
            FsError::Internal(format!("cannot finish {}: {e}", self.path.display()))
        })?);
        own(&fd, self.owner, &self.path)?;
        rustix::fs::renameat(&self.dir, self.temp.as_str(), &self.dir, self.path.name())
            .map_err(|e| FsError::from_errno(e, "write", &self.path))?;
        self.done = true;
        stat_in(&self.dir, self.path.name(), &self.path)
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.done {
            let _ = rustix::fs::unlinkat(&self.dir, self.temp.as_str(), AtFlags::empty());
        }
    }
}

/// `GET /file`: `path` opened for reading (a regular file only), and its size.
pub fn open_file(root: &OwnedFd, path: &VPath) -> Result<(std::fs::File, u64)> {
    let fd = open_beneath(
        root,
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        "read",
    )?;
    let st = rustix::fs::fstat(&fd).map_err(|e| FsError::from_errno(e, "read", path))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => {
            return Err(FsError::BadRequest(format!(
                "{} is a directory; list it instead",
                path.display()
            )))
        }
        _ => {
            return Err(FsError::BadRequest(format!(
                "{} is not a regular file",
                path.display()
            )))
        }
    }
    // Reads of a regular file never block; the flag only mattered for a FIFO.
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| FsError::from_errno(e, "read", path))?;
    rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)
        .map_err(|e| FsError::from_errno(e, "read", path))?;
    Ok((
        std::fs::File::from(fd),
        u64::try_from(st.st_size).unwrap_or(0),
    ))
}

/// `PATCH /path`: sets `path`'s owner and mode (each only when given). A
/// symlink's owner changes; it has no mode of its own.
pub fn update(
    root: &OwnedFd,
    path: &VPath,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> Result<Entry> {
    Owner::new(uid, gid, mode, 0)?;
    if path.is_root() {
        set(root, path, uid, gid, mode)?;
        return stat(root, path);
    }
    let dir = parent_dir(root, path, "change")?;
    let name = path.name();
    let opened = rustix::fs::openat2(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH | ResolveFlags::NO_SYMLINKS,
    );
    match opened {
        Ok(fd) => set(&fd, path, uid, gid, mode)?,
        Err(Errno::LOOP) => {
            if mode.is_some() {
                return Err(FsError::BadRequest(format!(
                    "{} is a symlink, which has no mode of its own",
                    path.display()
                )));
            }
            rustix::fs::chownat(
                &dir,
                name,
                uid.map(rustix::fs::Uid::from_raw),
                gid.map(rustix::fs::Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| FsError::from_errno(e, "change the owner of", path))?;
        }
        Err(e) => return Err(FsError::from_errno(e, "change", path)),
    }
    stat_in(&dir, name, path)
}

fn set(
    fd: &OwnedFd,
    path: &VPath,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> Result<()> {
    if uid.is_some() || gid.is_some() {
        rustix::fs::fchown(
            fd,
            uid.map(rustix::fs::Uid::from_raw),
            gid.map(rustix::fs::Gid::from_raw),
        )
        .map_err(|e| FsError::from_errno(e, "change the owner of", path))?;
    }
    if let Some(m) = mode {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(m))
            .map_err(|e| FsError::from_errno(e, "change the mode of", path))?;
    }
    Ok(())
}

/// `DELETE /path`: removes `path` (a directory with everything in it; a
/// symlink itself, never what it names).
pub fn remove(root: &OwnedFd, path: &VPath) -> Result<()> {
    if path.is_root() {
        return Err(FsError::BadRequest(
            "the volume's root cannot be removed; delete the volume instead".into(),
        ));
    }
    let dir = parent_dir(root, path, "remove")?;
    remove_in(&dir, path.name(), path, 0)
}

/// Deepest tree [`remove`] walks.
const MAX_REMOVE_DEPTH: usize = 512;

fn remove_in(dir: &OwnedFd, name: &str, path: &VPath, depth: usize) -> Result<()> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| FsError::from_errno(e, "remove", path))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty())
            .map_err(|e| FsError::from_errno(e, "remove", path));
    }
    if depth > MAX_REMOVE_DEPTH {
        return Err(FsError::BadRequest(format!(
            "{} nests deeper than {MAX_REMOVE_DEPTH} directories",
            path.display()
        )));
    }
    empty_dir(dir, name, path, depth)?;
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
        .map_err(|e| FsError::from_errno(e, "remove", path))
}

/// Removes everything in directory `name` of `dir` (opened without
/// following anything), then leaves it empty.
fn empty_dir(dir: &OwnedFd, name: &str, path: &VPath, depth: usize) -> Result<()> {
    let sub = rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|e| FsError::from_errno(e, "remove", path))?;
    for n in names(&sub, path)? {
        match remove_in(&sub, &n, &path.child(&n), depth + 1) {
            Ok(()) | Err(FsError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes the tree at `name` in `dir` (a whole volume's directory), by
/// descriptors, never following a symlink.
pub fn remove_tree(dir: &OwnedFd, name: &str) -> Result<()> {
    let path = VPath {
        parts: vec![name.to_string()],
    };
    match remove_in(dir, name, &path, 0) {
        Err(FsError::NotFound(_)) => Ok(()),
        r => r,
    }
}

/// Bytes in use and in all on the filesystem holding `fd` (a local
/// volume's own image).
pub fn usage(fd: &OwnedFd) -> Option<(u64, u64)> {
    let s = rustix::fs::fstatvfs(fd).ok()?;
    let total = s.f_blocks.saturating_mul(s.f_frsize);
    let free = s.f_bfree.saturating_mul(s.f_frsize);
    Some((total.saturating_sub(free), total))
}

#[cfg(test)]
#[path = "fs_tests.rs"]
mod tests;
