//! The seccomp filter every isolated sandbox runs under: a deny list in the
//! spirit of Docker's default profile, compiled with `seccompiler` (no
//! hand-written BPF) as two programs that the sandbox's pid 1 installs on
//! itself before it starts envd (without `no_new_privs`, so `sudo` works),
//! and so on everything in the sandbox:
//!
//! 1. `EPERM` for system calls a sandbox never needs and that widen the
//!    kernel surface: keyrings (`keyctl`, `add_key`, `request_key`), `bpf`,
//!    `perf_event_open`, `userfaultfd`, module loading, `kexec_*`,
//!    `reboot`, swap, clock setting, `acct`, `quotactl`, handle-based opens
//!    (`open_by_handle_at`, the classic container escape), every mount API
//!    (`mount`, `umount2`, `pivot_root`, `fsopen`, `fsmount`, `move_mount`,
//!    `open_tree`, `fsconfig`, `fspick`, `mount_setattr`), `setns`,
//!    `unshare`/`clone` with `CLONE_NEWUSER` (no nested user namespaces),
//!    `ioperm`/`iopl`, `syslog`, `personality` changes, `lookup_dcookie`,
//!    `vhangup`, `nfsservctl`.
//! 2. `ENOSYS` for `clone3`: its flags sit behind a pointer seccomp cannot
//!    read, and `ENOSYS` makes glibc fall back to `clone`, which program 1
//!    checks.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// System calls refused outright with `EPERM`.
const DENIED: &[i64] = &[
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_syslog,
    libc::SYS_lookup_dcookie,
    libc::SYS_vhangup,
    libc::SYS_nfsservctl,
];

/// `personality(2)` values a program may still set (query, Linux, and the
/// address-space flag debuggers and some runtimes use), as Docker allows.
const PERSONALITY_OK: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp support for {}: {e:?}", std::env::consts::ARCH))
}

fn err(e: impl std::fmt::Debug) -> String {
    format!("cannot build the seccomp filter: {e:?}")
}

/// The two BPF programs (see the module doc), serialized as the kernel's
/// `struct sock_filter` array bubblewrap reads from a file descriptor.
pub fn programs() -> Result<[Vec<u8>; 2], String> {
    let arch = arch()?;
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|s| (*s, Vec::new())).collect();
    let newuser = libc::CLONE_NEWUSER as u64;
    let flag_rule = |arg: u8| -> Result<SeccompRule, String> {
        SeccompRule::new(vec![SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(newuser),
            newuser,
        )
        .map_err(err)?])
        .map_err(err)
    };
    deny.insert(libc::SYS_unshare, vec![flag_rule(0)?]);
    deny.insert(libc::SYS_clone, vec![flag_rule(0)?]);
    // personality: anything but the allowed values is refused.
    let mut conds = Vec::new();
    for v in PERSONALITY_OK {
        conds.push(
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *v).map_err(err)?,
        );
    }
    deny.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(conds).map_err(err)?],
    );
    let first = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(err)?;
    let second = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;
    Ok([serialize(first)?, serialize(second)?])
}

fn serialize(filter: SeccompFilter) -> Result<Vec<u8>, String> {
    let program: BpfProgram = filter.try_into().map_err(err)?;
    let mut out = Vec::with_capacity(program.len() * 8);
    for ins in &program {
        out.extend_from_slice(&ins.code.to_ne_bytes());
        out.push(ins.jt);
        out.push(ins.jf);
        out.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn programs_build() {
        let [a, b] = super::programs().expect("filters");
        assert!(!a.is_empty() && a.len().is_multiple_of(8));
        assert!(!b.is_empty() && b.len().is_multiple_of(8));
    }
}
