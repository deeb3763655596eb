//! A sandbox's files on the host: the `base` template, fork copies, removal.
//! All blocking; callers run these in `spawn_blocking`.

use crate::runtime::Paths;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The one built-in template.
pub const BASE_TEMPLATE: &str = "base";

/// `base` and empty (meaning `base`) are known; anything else is not.
pub fn template_known(template_id: &str) -> bool {
    template_id.is_empty() || template_id == BASE_TEMPLATE
}

const PROFILE: &str = "\
# ~/.profile of a warren sandbox (template `base`).
export PATH=\"$HOME/.local/bin:$PATH\"
";

const README: &str = "\
This is a warren sandbox (template `base`).
Files under /home/user and /tmp belong to this sandbox only; a fork starts
with a copy of them (running processes are not carried over).
";

/// Creates a fresh sandbox tree for the `process` runtime: from `parent` (a
/// fork: its `fs/` is copied) or from the `base` template. (Isolated
/// sandboxes get a template root and a disk image instead; see
/// `runtime::isolated`.)
pub fn prepare(paths: &Paths, parent: Option<&Paths>) -> io::Result<()> {
    if paths.dir.exists() {
        // Leftovers of a create that died half-way; nothing there is live.
        std::fs::remove_dir_all(&paths.dir)?;
    }
    std::fs::create_dir_all(&paths.dir)?;
    std::fs::set_permissions(&paths.dir, std::fs::Permissions::from_mode(0o700))?;
    match parent {
        Some(parent) => copy_tree(&parent.fs, &paths.fs)?,
        None => {
            std::fs::create_dir_all(&paths.home)?;
            std::fs::write(paths.home.join(".profile"), PROFILE)?;
            std::fs::write(paths.home.join("README"), README)?;
        }
    }
    std::fs::create_dir_all(&paths.home)?;
    std::fs::create_dir_all(&paths.tmp)?;
    std::fs::set_permissions(&paths.tmp, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// Removes everything the sandbox had on disk.
pub fn remove(paths: &Paths) -> io::Result<()> {
    match std::fs::remove_dir_all(&paths.dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Copies a directory tree: regular files, directories and symlinks (as
/// symlinks, never followed), keeping permission bits. Sockets, fifos and
/// devices are skipped: they belong to running processes, which a fork does
/// not carry over.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    let meta = std::fs::symlink_metadata(from)?;
    std::fs::set_permissions(to, meta.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ft = entry.file_type()?;
        if ft.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if ft.is_file() {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_then_fork_copies_files_not_sockets() {
        let tmp = std::env::temp_dir().join(format!("warren-node-files-{}", std::process::id()));
        let a = Paths::new(&tmp, "a");
        let b = Paths::new(&tmp, "b");
        prepare(&a, None).unwrap();
        assert!(a.home.join(".profile").is_file());
        std::fs::write(a.home.join("data.bin"), [0u8, 1, 2, 255]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", a.home.join("link")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(a.tmp.join("s.sock")).unwrap();
        prepare(&b, Some(&a)).unwrap();
        assert_eq!(
            std::fs::read(b.home.join("data.bin")).unwrap(),
            [0u8, 1, 2, 255]
        );
        assert!(std::fs::symlink_metadata(b.home.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!b.tmp.join("s.sock").exists());
        remove(&a).unwrap();
        remove(&b).unwrap();
        assert!(!a.dir.exists());
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn templates() {
        assert!(template_known(""));
        assert!(template_known("base"));
        assert!(!template_known("python"));
    }
}
