//! Loop devices without `losetup` or `mount -o loop` (a process each, per
//! sandbox disk): a free device from `/dev/loop-control`, bound to an
//! image file with `LOOP_CONFIGURE` and marked auto-clearing, so it is
//! released by the kernel once the filesystem on it is unmounted and
//! nothing holds it open.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

// <linux/loop.h>
const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// The kernel's `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// The kernel's `struct loop_config` (Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// How often a free device is asked for again when another process took
/// the one the kernel named first (`EBUSY` from `LOOP_CONFIGURE`).
const ATTEMPTS: usize = 64;

/// Binds `image` (opened read-write) to a free loop device, auto-clearing:
/// returns the device's path and an open descriptor of it. Mount the
/// device, then drop the descriptor: the binding lasts while the mount
/// does.
pub fn attach(image: &File) -> io::Result<(PathBuf, OwnedFd)> {
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    for _ in 0..ATTEMPTS {
        // SAFETY: no pointers; the answer is a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(d) => d,
            // Removed again by another process between the two calls.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let config = LoopConfig {
            fd: image.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: LO_FLAGS_AUTOCLEAR,
                lo_file_name: [0; 64],
                lo_crypt_name: [0; 64],
                lo_encrypt_key: [0; 32],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: `config` is a complete `struct loop_config` that lives
        // across the call; the kernel only reads it. Both descriptors are
        // open.
        let r = unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                LOOP_CONFIGURE,
                &config as *const LoopConfig,
            )
        };
        if r == 0 {
            return Ok((path, dev.into()));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(io::Error::new(
                err.kind(),
                format!("LOOP_CONFIGURE {}: {err}", path.display()),
            ));
        }
    }
    Err(io::Error::other(format!(
        "no free loop device after {ATTEMPTS} attempts (others kept taking them)"
    )))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_structures_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<super::LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<super::LoopConfig>(), 304);
    }
}
