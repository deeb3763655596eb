//! System calls the sandbox runtime needs that `nix` does not wrap yet:
//! the new mount API for idmapped mounts (a template's files, owned by ids
//! `0..65536`, seen by each sandbox as its own host id range), and
//! installing a seccomp filter without `no_new_privs` (so `sudo` inside a
//! sandbox still works; allowed to a process with `CAP_SYS_ADMIN` in its
//! user namespace); for envd's PTY processes, making a child the leader of
//! a session whose controlling terminal is its stdin; and, so that nothing
//! a sandbox runs can reach the operator's terminal or a host descriptor,
//! starting a child in a session of its own and closing (or marking
//! close-on-exec) every descriptor past a number.
//!
//! Every function is safe to call: arguments are descriptors and paths Rust
//! owns, results are checked, and the kernel structures are built here.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `open_tree(path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC [| AT_RECURSIVE])`:
/// a detached copy of the mount at `path`, to be changed and attached.
pub fn open_tree_clone(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration;
    // the returned descriptor is new and owned by nobody else.
    let fd =
        check(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The kernel's `struct mount_attr` (size 32, version 0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(mount, "", AT_EMPTY_PATH | AT_RECURSIVE, MOUNT_ATTR_IDMAP)`:
/// every access through the detached mount is mapped through `userns`'s
/// id maps.
pub fn set_idmap(mount: impl AsFd, userns: impl AsFd) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_fd().as_raw_fd() as u64,
    };
    let flags = (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint;
    // SAFETY: `attr` lives across the call and its size is passed; the path
    // is a static empty C string; the descriptors are borrowed and open.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// [`set_idmap`], and the mount made `nosuid` and `nodev` (a volume bound
/// into a sandbox: nothing on it runs set-user-ID or opens a device).
pub fn set_idmap_nosuid_nodev(mount: impl AsFd, userns: impl AsFd) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_fd().as_raw_fd() as u64,
    };
    let flags = (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint;
    // SAFETY: as in `set_idmap`.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// `move_mount(mount, "", AT_FDCWD, to, MOVE_MOUNT_F_EMPTY_PATH)`: attaches
/// a detached mount at `to`.
pub fn move_mount_to(mount: impl AsFd, to: &Path) -> io::Result<()> {
    let c = cpath(to)?;
    // SAFETY: both strings are valid for the call; the descriptor is open.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_fd().as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Installs a classic BPF seccomp program (the kernel's `struct
/// sock_filter` array, 8 bytes per instruction, as `seccompiler` builds)
/// on the calling thread's process tree to come, without setting
/// `no_new_privs`: the caller needs `CAP_SYS_ADMIN` in its user namespace.
/// Call it in a single-threaded process (the filter applies to this thread
/// and what it starts).
pub fn install_seccomp(program: &[u8]) -> io::Result<()> {
    if program.is_empty()
        || !program.len().is_multiple_of(8)
        || program.len() / 8 > u16::MAX as usize
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a seccomp program is a non-empty array of 8-byte instructions",
        ));
    }
    let filters: Vec<libc::sock_filter> = program
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let prog = libc::sock_fprog {
        len: filters.len() as u16,
        filter: filters.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `filters`, both alive across the call; the
    // kernel copies the program.
    check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    })?;
    Ok(())
}

/// Brings the loopback interface of the calling thread's network namespace
/// up (`SIOCGIFFLAGS`/`SIOCSIFFLAGS` on a datagram socket): a fresh network
/// namespace starts with `lo` down.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket call; the descriptor is owned right after.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `ifreq` is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for the duration of both calls.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `ifru_flags` above; both are plain integers.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Registers `fd` (a non-blocking descriptor: a pty master, an inotify
/// instance) with Tokio's reactor, so it can be awaited.
pub fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns `fd` from here on, and an `OwnedFd` names
    // the same open descriptor until it is dropped, which only the
    // `AsyncFd` can do.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// Makes the child `cmd` starts the leader of a new session whose
/// controlling terminal is its standard input (the slave side of a pty the
/// caller put there): `setsid(2)`, then `ioctl(0, TIOCSCTTY, 0)`, between
/// fork and exec. The child must not be made a process-group leader first
/// (`process_group`), or `setsid` fails with `EPERM`; it is one afterwards,
/// so its pid names its group for signals.
pub fn controlling_terminal_from_stdin(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec, so it may
    // only make async-signal-safe calls: `setsid` and `ioctl` are, and
    // `last_os_error` reads errno without allocating. It touches no memory
    // the parent shares and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the child `cmd` starts the leader of a new session, with no
/// controlling terminal (`setsid(2)` between fork and exec). Whatever it
/// starts can neither open the terminal of the process that started it
/// (`/dev/tty` answers `ENXIO`) nor get signals typed there: Ctrl-C in an
/// operator's terminal reaches only its foreground process group, which
/// then stops its children itself. Do not combine with `process_group`
/// (the child would be a group leader, and `setsid` fails then).
pub fn new_session(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec, so it may
    // only make async-signal-safe calls: `setsid` is one, and
    // `last_os_error` reads errno without allocating.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the calling process the leader of a new session with no
/// controlling terminal (`setsid(2)`). Fails with `EPERM` when it already
/// leads a process group.
pub fn leave_terminal() -> io::Result<()> {
    // SAFETY: a plain system call without pointers.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes every descriptor numbered `first` or more (`close_range(2)`).
/// Call it where no other thread may be using one of them: in a
/// single-threaded process, before it starts any thread.
pub fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: no pointers; the descriptors closed are, by the caller's
    // contract, owned by nothing that will use them again.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) })?;
    Ok(())
}

/// Marks every descriptor numbered `first` or more close-on-exec
/// (`close_range(2)` with `CLOSE_RANGE_CLOEXEC`): they stay usable here,
/// and no program this process starts inherits them unless it hands them
/// on by name (a child's descriptor mapping clears the flag on the copy).
pub fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: no pointers; only descriptor flags change.
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn descriptors_past_a_number_are_marked_close_on_exec() {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open("/dev/null").expect("open");
        let fd = f.as_raw_fd();
        // std opens with O_CLOEXEC; clear it to see the call set it again.
        // SAFETY: `fd` is open (owned by `f`) for both calls; only its flags change.
        unsafe {
            assert_eq!(libc::fcntl(fd, libc::F_SETFD, 0), 0);
        }
        super::cloexec_from(fd as u32).expect("close_range");
        // SAFETY: as above.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
    }

    #[test]
    fn malformed_programs_are_refused() {
        assert!(super::install_seccomp(&[]).is_err());
        assert!(super::install_seccomp(&[0; 7]).is_err());
    }
}
