//! `EntryInfo` for a file, as E2B's envd fills it (Go's `os.FileInfo`).
//!
//! A symlink is reported as what it points to (type and mode of the target,
//! `FILE_TYPE_UNSPECIFIED` when that is missing or outside the sandbox),
//! with `symlink_target` naming the target; its size, permissions (`L...`),
//! owner and time are the link's own. `metadata` is the file's `user.e2b.*`
//! attributes ([`crate::metadata`]).

use crate::paths::{Follow, Jail};
use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use warren_envd_proto::filesystem::{EntryInfo, FileType};

/// Owner and group names by id, cached for one request (a ListDir of a big
/// tree would otherwise read `/etc/passwd` once per entry).
#[derive(Debug, Default)]
pub struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn user(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(uid.into())
                    .ok()
                    .flatten()
                    .map_or_else(|| uid.to_string(), |u| u.name)
            })
            .clone()
    }

    fn group(&mut self, gid: u32) -> String {
        self.groups
            .entry(gid)
            .or_insert_with(|| {
                nix::unistd::Group::from_gid(gid.into())
                    .ok()
                    .flatten()
                    .map_or_else(|| gid.to_string(), |g| g.name)
            })
            .clone()
    }
}

/// The entry for `host` (not followed if it is a symlink), named `client`.
pub fn entry_info(
    jail: &Jail,
    host: &Path,
    client: &str,
    names: &mut Names,
) -> std::io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(host)?;
    Ok(from_metadata(jail, host, client, &meta, names))
}

/// The entry for `host`, whose `lstat` is `meta`.
pub fn from_metadata(
    jail: &Jail,
    host: &Path,
    client: &str,
    meta: &Metadata,
    names: &mut Names,
) -> EntryInfo {
    let ft = meta.file_type();
    // What the entry is as a program opening it sees it: a link's target.
    let (kind, mode, symlink_target, data_path) = if ft.is_symlink() {
        match jail.resolve(client, Follow::All) {
            Ok(target) => match std::fs::metadata(&target.host) {
                Ok(t) => (
                    kind_of(&t),
                    t.mode() & 0o777,
                    Some(target.client),
                    Some(target.host),
                ),
                Err(_) => (
                    FileType::FILE_TYPE_UNSPECIFIED,
                    0,
                    Some(target.client),
                    None,
                ),
            },
            // Outside the sandbox or a loop: the link's own text, never a
            // resolved host path.
            Err(_) => (
                FileType::FILE_TYPE_UNSPECIFIED,
                0,
                Some(
                    std::fs::read_link(host)
                        .map(|t| t.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                ),
                None,
            ),
        }
    } else {
        (
            kind_of(meta),
            meta.mode() & 0o777,
            None,
            Some(host.to_path_buf()),
        )
    };
    let metadata = data_path
        .map(|p| crate::metadata::read(&p))
        .unwrap_or_default();
    let name = client
        .rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or("/")
        .to_string();
    EntryInfo {
        name,
        r#type: kind.into(),
        path: client.to_string(),
        size: meta.len() as i64,
        mode,
        permissions: permissions(meta),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        modified_time: meta
            .modified()
            .ok()
            .map(buffa_types::google::protobuf::Timestamp::from)
            .into(),
        symlink_target,
        metadata: metadata.into_iter().collect(),
        ..Default::default()
    }
}

fn kind_of(meta: &Metadata) -> FileType {
    let ft = meta.file_type();
    if ft.is_dir() {
        FileType::FILE_TYPE_DIRECTORY
    } else if ft.is_file() {
        FileType::FILE_TYPE_FILE
    } else {
        FileType::FILE_TYPE_UNSPECIFIED
    }
}

/// Go's `FileMode.String()`: type letters (or `-`), then `rwxrwxrwx`.
pub fn permissions(meta: &Metadata) -> String {
    let ft = meta.file_type();
    let mode = meta.mode();
    let mut s = String::with_capacity(12);
    if ft.is_dir() {
        s.push('d');
    }
    if ft.is_symlink() {
        s.push('L');
    }
    if ft.is_block_device() || ft.is_char_device() {
        s.push('D');
    }
    if ft.is_fifo() {
        s.push('p');
    }
    if ft.is_socket() {
        s.push('S');
    }
    if mode & libc::S_ISUID != 0 {
        s.push('u');
    }
    if mode & libc::S_ISGID != 0 {
        s.push('g');
    }
    if ft.is_char_device() {
        s.push('c');
    }
    if mode & libc::S_ISVTX != 0 {
        s.push('t');
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        let bit = 1 << (8 - i);
        s.push(if mode & bit != 0 { c } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn permissions_read_like_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let meta = std::fs::symlink_metadata(&f).expect("stat");
        assert_eq!(permissions(&meta), "-rw-r--r--");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let meta = std::fs::symlink_metadata(dir.path()).expect("stat");
        assert_eq!(permissions(&meta), "drwxr-xr-x");
        std::os::unix::fs::symlink("f", dir.path().join("l")).expect("symlink");
        let meta = std::fs::symlink_metadata(dir.path().join("l")).expect("stat");
        assert_eq!(permissions(&meta), "Lrwxrwxrwx");
    }
}
