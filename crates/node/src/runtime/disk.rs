//! A sandbox's disk: an ext4 filesystem of bounded size in a sparse image
//! file (`disk.img`), loop-mounted at `fs/` in the node's private mount
//! namespace (see [`isolate_mounts`]). Everything the sandbox can write
//! (`/home/user`, `/tmp`, `/etc`) lives there, so:
//! - a disk fill ends with `ENOSPC` inside the sandbox, nowhere else;
//! - the node never walks a tree the sandbox can change: cleanup unmounts
//!   and deletes one file; a fork copies the image (holes kept) after
//!   freezing the parent and flushing its filesystem;
//! - bind mounts from it show `/dev/loopN` and paths inside the image, never
//!   a host path, in the sandbox's `/proc/self/mountinfo`.

use std::path::Path;
use std::process::Stdio;

/// Runs a helper program to completion; the error names it and its stderr.
fn run(program: &str, args: &[&std::ffi::OsStr]) -> std::io::Result<()> {
    run_in(None, program, args)
}

/// [`run`] from the directory `cwd`.
fn run_in(cwd: Option<&Path>, program: &str, args: &[&std::ffi::OsStr]) -> std::io::Result<()> {
    let mut cmd = std::process::Command::new(program);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let out = cmd
        .args(args)
        .env_clear()
        .env("PATH", super::SANDBOX_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run {program}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{program} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Where empty images are made once per size and copied from: a fresh
/// `mkfs.ext4` costs a process and an fsync of the image (most of a
/// create's disk step); a copy of an empty one is a megabyte or so moved
/// inside the kernel. Every copy has the same filesystem UUID (as a
/// fork's copy of its parent always had).
#[derive(Debug)]
pub struct Images {
    /// `<data>/images`: `ext4-<bytes>.img`, each made once, never changed.
    dir: std::path::PathBuf,
}

impl Images {
    pub fn new(dir: std::path::PathBuf) -> Images {
        Images { dir }
    }

    /// The empty image of `bytes`, made now if there is none yet.
    fn empty(&self, bytes: u64) -> std::io::Result<std::path::PathBuf> {
        let path = self.dir.join(format!("ext4-{bytes}.img"));
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes) {
            return Ok(path);
        }
        std::fs::create_dir_all(&self.dir)?;
        // Made under a name of its own and renamed into place: two creates
        // making it at once each make one, and the last rename wins.
        let tmp = self
            .dir
            .join(format!(".ext4-{bytes}.{:016x}", rand::random::<u64>()));
        let made = mkfs(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, &path));
        if made.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        made.map(|_| path)
    }

    /// Makes an empty ext4 image of `bytes` (sparse) at `image`: a copy of
    /// the empty one of that size.
    pub fn make(&self, image: &Path, bytes: u64) -> std::io::Result<()> {
        let from = std::fs::File::open(self.empty(bytes)?)?;
        let to = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(image)?;
        copy_sparse(&from, &to, bytes)
    }
}

/// `mkfs.ext4` of `bytes` (sparse) at `image`, root directory owned by
/// host root (a sandbox's disk root is given its owner once mounted).
fn mkfs(image: &Path, bytes: u64) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(image)?;
    file.set_len(bytes)?;
    drop(file);
    run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-E".as_ref(),
            "lazy_itable_init=1,lazy_journal_init=1".as_ref(),
            image.as_os_str(),
        ],
    )
}

/// Copies the `len` bytes of `from` into the empty `to`, holes kept: only
/// the extents holding data are copied, inside the kernel.
fn copy_sparse(from: &std::fs::File, to: &std::fs::File, len: u64) -> std::io::Result<()> {
    use rustix::fs::{copy_file_range, seek, SeekFrom};
    to.set_len(len)?;
    let mut at: u64 = 0;
    while at < len {
        let data = match seek(from, SeekFrom::Data(at)) {
            Ok(d) => d,
            // No data past `at`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = seek(from, SeekFrom::Hole(data))?.min(len);
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            let want = (hole - off_in) as usize;
            let n = copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), want)?;
            if n == 0 {
                return Err(std::io::Error::other("the image is shorter than it says"));
            }
        }
        at = hole;
    }
    Ok(())
}

/// Copies an image, keeping its holes (a fork's disk).
pub fn copy(from: &Path, to: &Path) -> std::io::Result<()> {
    run(
        "cp",
        &[
            "--sparse=always".as_ref(),
            "--reflink=auto".as_ref(),
            "--".as_ref(),
            from.as_os_str(),
            to.as_os_str(),
        ],
    )
}

/// Loop-mounts `image` at `at` without set-uid programs or device files
/// (a loop device bound here, auto-cleared at the unmount: no `mount`
/// process).
pub fn mount(image: &Path, at: &Path) -> std::io::Result<()> {
    use nix::mount::MsFlags;
    std::fs::create_dir_all(at)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)?;
    let (dev, _held) = warren_sys::loopdev::attach(&file)?;
    nix::mount::mount(
        Some(&dev),
        at,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| {
        std::io::Error::other(format!(
            "cannot mount {} ({}) at {}: {e}",
            image.display(),
            dev.display(),
            at.display()
        ))
    })
}

/// Mounts a sandbox's root at `<dir>/fs`: an overlay of `<dir>/lower`
/// (and, above it, a snapshot's `layers` layers at `<dir>/layers/<i>`,
/// bottom first) under the writable layer `<dir>/disk/upper` (work dir
/// `<dir>/disk/work`). The layers are named relative to `dir`: the
/// overlay's options are what the sandbox's `/proc/self/mountinfo` shows
/// for `/`, and they must name no host path. So the mount is made from a
/// thread of its own whose working directory is `dir` (it leaves the
/// process's shared one first: no other thread's relative paths move).
pub fn mount_overlay(dir: &Path, layers: usize) -> std::io::Result<()> {
    use nix::mount::MsFlags;
    let opts = overlay_options(layers);
    let dir = dir.to_path_buf();
    std::thread::Builder::new()
        .name("overlay-mount".into())
        .spawn(move || -> std::io::Result<()> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)?;
            nix::unistd::chdir(&dir)?;
            nix::mount::mount(
                Some("overlay"),
                "fs",
                Some("overlay"),
                MsFlags::MS_NODEV,
                Some(opts.as_str()),
            )
            .map_err(|e| {
                std::io::Error::other(format!(
                    "cannot mount the overlay at {}/fs ({opts}): {e}",
                    dir.display()
                ))
            })
        })?
        .join()
        .map_err(|_| std::io::Error::other("the overlay mount's thread panicked"))?
}

/// The overlay's options: overlayfs takes lower layers top first.
fn overlay_options(layers: usize) -> String {
    let mut lower: Vec<String> = (0..layers).rev().map(|i| format!("layers/{i}")).collect();
    lower.push("lower".into());
    format!(
        "lowerdir={},upperdir=disk/upper,workdir=disk/work",
        lower.join(":")
    )
}

/// True when something is mounted at `at` (not following a symlink
/// there). The kernel says so per path (`statx`'s mount-root attribute);
/// only a kernel that cannot (before 5.8) has the mount table read.
pub fn is_mounted(at: &Path) -> bool {
    use rustix::fs::{statx, AtFlags, StatxAttributes, StatxFlags, CWD};
    match statx(CWD, at, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS) {
        Ok(st) if st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) => {
            st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)
        }
        Ok(_) => in_mount_table(at),
        Err(_) => false,
    }
}

/// Whether the mount table names `at` as a mount point.
fn in_mount_table(at: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(at) else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| {
            m.lines()
                .filter_map(|l| l.split(' ').nth(4))
                .any(|p| Path::new(&unescape(p)) == canon)
        })
        .unwrap_or(false)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("x");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts `at` (lazily if it is busy), if mounted. Asks the kernel
/// rather than reading the mount table: that table holds every
/// sandbox's mounts, so reading it per unmount cost each delete time in
/// proportion to the sandboxes hosted.
pub fn unmount(at: &Path) -> std::io::Result<()> {
    use nix::errno::Errno;
    use nix::mount::{umount2, MntFlags};
    match umount2(at, MntFlags::UMOUNT_NOFOLLOW) {
        Ok(()) => Ok(()),
        // Not a mount point (or not there at all): nothing to do.
        Err(Errno::EINVAL | Errno::ENOENT | Errno::ENOTDIR) => Ok(()),
        Err(_) => umount2(at, MntFlags::UMOUNT_NOFOLLOW | MntFlags::MNT_DETACH)
            .map_err(|e| std::io::Error::other(format!("cannot unmount {}: {e}", at.display()))),
    }
}

/// Flushes a mounted sandbox filesystem to its image.
pub fn sync(at: &Path) -> std::io::Result<()> {
    let dir = std::fs::File::open(at)?;
    nix::unistd::syncfs(&dir).map_err(std::io::Error::from)
}

/// Gives the node process its own mount namespace (as root, before any
/// thread starts): sandbox disks and the envd binary's mount live and die
/// with the node, and the host's mount table never shows them. Host mounts
/// still propagate in (slave). Returns what happened, for the log.
pub fn isolate_mounts() -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    if !nix::unistd::geteuid().is_root() {
        return Err("not root".into());
    }
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make / a slave mount: {e}"))
}

/// Puts a copy of the `warren` binary on a small read-only tmpfs at `dir`,
/// so sandboxes bind it from there: their `mountinfo` then shows `tmpfs`
/// and `/warren`, not where the binary lives on the host. Returns the path
/// of the copy.
pub fn stage_binary(bin: &Path, dir: &Path) -> std::io::Result<std::path::PathBuf> {
    use nix::mount::{mount, MsFlags};
    let size = std::fs::metadata(bin)?.len() + (1 << 20);
    std::fs::create_dir_all(dir)?;
    let _ = unmount(dir);
    let opts = format!("size={size},mode=0755");
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(|e| {
        std::io::Error::other(format!("cannot mount a tmpfs at {}: {e}", dir.display()))
    })?;
    let target = dir.join("warren");
    std::fs::copy(bin, &target)?;
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| std::io::Error::other(format!("cannot make {} read-only: {e}", dir.display())))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::unescape;
    use std::path::Path;

    #[test]
    fn overlay_layers_top_first() {
        assert_eq!(
            super::overlay_options(0),
            "lowerdir=lower,upperdir=disk/upper,workdir=disk/work"
        );
        assert_eq!(
            super::overlay_options(2),
            "lowerdir=layers/1:layers/0:lower,upperdir=disk/upper,workdir=disk/work"
        );
    }

    #[test]
    fn a_plain_directory_is_no_mount_point_and_the_root_is_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!super::is_mounted(dir.path()));
        assert!(!super::is_mounted(&dir.path().join("missing")));
        assert!(super::is_mounted(Path::new("/")));
        assert!(super::in_mount_table(Path::new("/")));
    }

    #[test]
    fn a_sparse_copy_keeps_data_and_holes() {
        use std::io::{Read, Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().expect("tempdir");
        let len = 64 << 20;
        let mut from = std::fs::File::create(dir.path().join("a")).expect("create");
        from.set_len(len).expect("set_len");
        for at in [0, 5 << 20, len - 4096] {
            from.seek(SeekFrom::Start(at)).expect("seek");
            from.write_all(&[7u8; 4096]).expect("write");
        }
        let from = std::fs::File::open(dir.path().join("a")).expect("open");
        let to = std::fs::File::create(dir.path().join("b")).expect("create");
        super::copy_sparse(&from, &to, len).expect("copy");
        let mut back = Vec::new();
        std::fs::File::open(dir.path().join("b"))
            .expect("open")
            .read_to_end(&mut back)
            .expect("read");
        assert_eq!(back.len() as u64, len);
        for at in [0usize, 5 << 20, len as usize - 4096] {
            assert!(back[at..at + 4096].iter().all(|b| *b == 7), "data at {at}");
        }
        assert!(back[4096..5 << 20].iter().all(|b| *b == 0));
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(dir.path().join("b"))
            .expect("stat")
            .blocks();
        assert!(
            blocks * 512 < 1 << 20,
            "the copy is sparse ({blocks} blocks)"
        );
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
