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

/// Makes an empty ext4 image of `bytes` (sparse) whose root directory
/// belongs to host uid/gid `owner`.
pub fn make(image: &Path, bytes: u64, owner: u32) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(image)?;
    file.set_len(bytes)?;
    drop(file);
    let ext = format!("lazy_itable_init=1,lazy_journal_init=1,root_owner={owner}:{owner}");
    run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-E".as_ref(),
            ext.as_ref(),
            image.as_os_str(),
        ],
    )
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

/// Loop-mounts `image` at `at` without set-uid programs or device files.
pub fn mount(image: &Path, at: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(at)?;
    run(
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            "loop,nosuid,nodev".as_ref(),
            image.as_os_str(),
            at.as_os_str(),
        ],
    )
}

/// Mounts a sandbox's root at `<dir>/fs`: an overlay of `<dir>/lower`
/// (and, above it, a snapshot's `layers` layers at `<dir>/layers/<i>`,
/// bottom first) under the writable layer `<dir>/disk/upper` (work dir
/// `<dir>/disk/work`). The layers are named relative to `dir`: the
/// overlay's options are what the sandbox's `/proc/self/mountinfo` shows
/// for `/`, and they must name no host path.
pub fn mount_overlay(dir: &Path, layers: usize) -> std::io::Result<()> {
    let opts = overlay_options(layers);
    run_in(
        Some(dir),
        "mount",
        &[
            "-t".as_ref(),
            "overlay".as_ref(),
            "overlay".as_ref(),
            "-o".as_ref(),
            opts.as_ref(),
            "fs".as_ref(),
        ],
    )
}

/// The overlay's options: overlayfs takes lower layers top first.
fn overlay_options(layers: usize) -> String {
    let mut lower: Vec<String> = (0..layers).rev().map(|i| format!("layers/{i}")).collect();
    lower.push("lower".into());
    format!(
        "nodev,lowerdir={},upperdir=disk/upper,workdir=disk/work",
        lower.join(":")
    )
}

/// True when something is mounted at `at`.
pub fn is_mounted(at: &Path) -> bool {
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

/// Unmounts `at` (lazily if it is busy), if mounted.
pub fn unmount(at: &Path) -> std::io::Result<()> {
    if !is_mounted(at) {
        return Ok(());
    }
    use nix::mount::{umount2, MntFlags};
    umount2(at, MntFlags::empty())
        .or_else(|_| umount2(at, MntFlags::MNT_DETACH))
        .map_err(|e| std::io::Error::other(format!("cannot unmount {}: {e}", at.display())))
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

    #[test]
    fn overlay_layers_top_first() {
        assert_eq!(
            super::overlay_options(0),
            "nodev,lowerdir=lower,upperdir=disk/upper,workdir=disk/work"
        );
        assert_eq!(
            super::overlay_options(2),
            "nodev,lowerdir=layers/1:layers/0:lower,upperdir=disk/upper,workdir=disk/work"
        );
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
