//! Host files only their owner may read: the scheduler's database and
//! store key, private keys, API-key files, the template store's blobs.
//! Files warren makes are made that way from the start (never created
//! wider and narrowed after); files an operator names are checked at
//! start, and a wider one is refused with the file and the fix named.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Why a file that must be private is not usable.
#[derive(Debug, thiserror::Error)]
pub enum PrivateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path} is readable by other accounts (mode {mode:03o}); it must be its owner's \
         only: chmod 600 {path}"
    )]
    Mode { path: String, mode: u32 },
}

/// Checks that `path` gives no access to its group or to other accounts.
pub fn check(path: &Path) -> Result<(), PrivateError> {
    let md = std::fs::metadata(path).map_err(|source| PrivateError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mode = md.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(PrivateError::Mode {
            path: path.display().to_string(),
            mode,
        });
    }
    Ok(())
}

/// Writes `bytes` to `path` (replacing it), created readable and writable
/// by its owner only, and flushed to disk.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file that existed keeps its old mode through open: narrow it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Creates `dir` (and its parents) if missing, and makes it its owner's
/// only (0700). The parents keep whatever mode they get.
pub fn dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_files_are_made_private_and_wide_ones_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        std::fs::write(&p, "x").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = check(&p).unwrap_err().to_string();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        write(&p, b"y").unwrap();
        assert!(check(&p).is_ok());
        assert_eq!(std::fs::read(&p).unwrap(), b"y");
        let sub = d.path().join("a/b");
        dir(&sub).unwrap();
        let mode = std::fs::metadata(&sub).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(check(&d.path().join("missing")).is_err());
    }
}
