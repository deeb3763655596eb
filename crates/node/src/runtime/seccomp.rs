//! The seccomp filter every isolated sandbox runs under, compiled with
//! `seccompiler` (no hand-written BPF) as two programs that the sandbox's
//! pid 1 installs on itself before it starts envd (without `no_new_privs`,
//! so `sudo` works), and so on everything in the sandbox.
//!
//! It is a deny list, not Docker's allowlist, and it refuses more than
//! Docker's default profile does in one respect that matters: the
//! sandbox's root holds every capability inside its own user namespace
//! (`CAP_SYS_ADMIN`, `CAP_NET_ADMIN` over its network namespace), where
//! Docker's default container has neither, so what Docker leaves to a
//! missing capability warren must refuse here. docs/security.md compares
//! the two line by line.
//!
//! 1. `EPERM` for system calls a sandbox never needs and that widen the
//!    kernel surface: keyrings (`keyctl`, `add_key`, `request_key`), `bpf`,
//!    `perf_event_open`, `userfaultfd`, io_uring (`io_uring_setup`,
//!    `_enter`, `_register`: its operations bypass seccomp, and it is where
//!    many recent kernel escalations came from), module loading,
//!    `kexec_*`, `reboot`, swap, clock setting, `acct`, `quotactl`,
//!    `quotactl_fd`, handle-based opens (`open_by_handle_at`, the classic
//!    container escape), every mount API (`mount`, `umount2`, `pivot_root`,
//!    `fsopen`, `fsmount`, `move_mount`, `open_tree`, `fsconfig`, `fspick`,
//!    `mount_setattr`), `setns`, `pidfd_getfd` (taking another process's
//!    descriptor), `fanotify_init`, `ioperm`/`iopl`, `syslog`, `personality`
//!    changes, `lookup_dcookie`, `vhangup`, `nfsservctl`, `uselib`;
//! 2. and, by argument, with `EPERM`:
//!    - every new namespace: `unshare` with any `CLONE_NEW*` flag
//!      (`NEWNS`, `NEWUTS`, `NEWIPC`, `NEWUSER`, `NEWPID`, `NEWNET`,
//!      `NEWCGROUP`, `NEWTIME`) and `clone` with any of them (but
//!      `NEWTIME`, which `clone` cannot take: its low byte is the exit
//!      signal). A new network namespace would hand the sandbox's root a
//!      fresh netfilter, xfrm and routing stack to program; a new mount
//!      namespace buys nothing while mounting is refused; none of the
//!      others is needed by anything a sandbox runs;
//!    - nf_tables and the rest of netfilter's control plane:
//!      `socket(AF_NETLINK, _, NETLINK_NETFILTER)`, and the legacy
//!      `setsockopt` tables (`SOL_IP`: `IPT_SO_SET_REPLACE`/`_ADD_COUNTERS`
//!      64/65, arptables 96/97, ebtables 128/129, IPVS 1152–1167;
//!      `SOL_IPV6`: ip6tables 64/65), all reachable with `CAP_NET_ADMIN`
//!      over the sandbox's own network namespace;
//!    - `socket(AF_VSOCK, ...)`: vsock is not namespaced (as Docker refuses
//!      it);
//!    - `ioctl` `TIOCSTI` (typing into a terminal) and `TIOCLINUX`,
//!      compared on the command's low 32 bits, as the kernel reads it.
//! 3. `ENOSYS` for `clone3`: its flags sit behind a pointer seccomp cannot
//!    read, and `ENOSYS` makes glibc fall back to `clone`, which program 1
//!    checks.
//!
//! Calls of another architecture (i386) kill the process (seccompiler's
//! architecture check); the x32 numbers of refused calls are refused as
//! the x86_64 ones are.

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
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
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
    libc::SYS_quotactl_fd,
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
    libc::SYS_pidfd_getfd,
    libc::SYS_fanotify_init,
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_syslog,
    libc::SYS_lookup_dcookie,
    libc::SYS_vhangup,
    libc::SYS_nfsservctl,
    libc::SYS_uselib,
];

/// Every namespace flag `unshare(2)` takes.
const NEW_NAMESPACES: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWTIME,
];

/// `personality(2)` values a program may still set (query, Linux, and the
/// address-space flag debuggers and some runtimes use), as Docker allows.
const PERSONALITY_OK: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// `NETLINK_NETFILTER`: nf_tables, conntrack, ipset, nfqueue, nflog.
const NETLINK_NETFILTER: u64 = 12;

/// `(level, first optname, last optname)` of the legacy netfilter tables'
/// `setsockopt` calls: ip_tables (`IPT_SO_SET_REPLACE`,
/// `IPT_SO_SET_ADD_COUNTERS`), arp_tables, ebtables, IPVS
/// (`IP_VS_SO_SET_*`), ip6_tables.
const NETFILTER_SOCKOPTS: &[(u64, u64, u64)] = &[
    (libc::SOL_IP as u64, 64, 65),
    (libc::SOL_IP as u64, 96, 97),
    (libc::SOL_IP as u64, 128, 129),
    (libc::SOL_IP as u64, 1152, 1167),
    (libc::SOL_IPV6 as u64, 64, 65),
];

/// Terminal ioctls refused: `TIOCSTI` (push a byte into a terminal's input)
/// and `TIOCLINUX` (the virtual console's selection and more).
const TTY_IOCTLS: &[u64] = &[0x5412, 0x541C];

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp support for {}: {e:?}", std::env::consts::ARCH))
}

fn err(e: impl std::fmt::Debug) -> String {
    format!("cannot build the seccomp filter: {e:?}")
}

/// A condition on the low 32 bits of argument `arg` (flags, families,
/// levels and ioctl commands are `int`s to the kernel).
fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(err)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(err)
}

/// Rules matching a call whose argument `arg` has any of `flags` set.
fn any_flag(arg: u8, flags: &[libc::c_int]) -> Result<Vec<SeccompRule>, String> {
    flags
        .iter()
        .map(|f| {
            let f = u64::from(*f as u32);
            rule(vec![cond(arg, SeccompCmpOp::MaskedEq(f), f)?])
        })
        .collect()
}

/// The x32 ABI's number for an x86_64 system call (`__X32_SYSCALL_BIT`).
/// An x32 call passes the filter's architecture check (it is
/// `AUDIT_ARCH_X86_64`), so each refusal is made for both numbers: on a
/// kernel built with `CONFIG_X86_X32_ABI` the x32 number of a refused call
/// is refused too (without it, the kernel answers `ENOSYS` anyway).
#[cfg(target_arch = "x86_64")]
fn with_x32(rules: BTreeMap<i64, Vec<SeccompRule>>) -> BTreeMap<i64, Vec<SeccompRule>> {
    let x32: Vec<(i64, Vec<SeccompRule>)> = rules
        .iter()
        .map(|(nr, r)| (nr | 0x4000_0000, r.clone()))
        .collect();
    rules.into_iter().chain(x32).collect()
}

#[cfg(not(target_arch = "x86_64"))]
fn with_x32(rules: BTreeMap<i64, Vec<SeccompRule>>) -> BTreeMap<i64, Vec<SeccompRule>> {
    rules
}

/// The first program: `EPERM` for [`DENIED`] and the argument rules of
/// the module doc.
fn first() -> Result<SeccompFilter, String> {
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|s| (*s, Vec::new())).collect();
    deny.insert(libc::SYS_unshare, any_flag(0, NEW_NAMESPACES)?);
    // clone(2)'s low byte is the exit signal, not CLONE_NEWTIME.
    let clone_flags: Vec<libc::c_int> = NEW_NAMESPACES
        .iter()
        .copied()
        .filter(|f| *f != libc::CLONE_NEWTIME)
        .collect();
    deny.insert(libc::SYS_clone, any_flag(0, &clone_flags)?);
    deny.insert(
        libc::SYS_socket,
        vec![
            rule(vec![
                cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?,
                cond(2, SeccompCmpOp::Eq, NETLINK_NETFILTER)?,
            ])?,
            rule(vec![cond(0, SeccompCmpOp::Eq, libc::AF_VSOCK as u64)?])?,
        ],
    );
    let mut sockopts = Vec::new();
    for (level, low, high) in NETFILTER_SOCKOPTS {
        sockopts.push(rule(vec![
            cond(1, SeccompCmpOp::Eq, *level)?,
            cond(2, SeccompCmpOp::Ge, *low)?,
            cond(2, SeccompCmpOp::Le, *high)?,
        ])?);
    }
    deny.insert(libc::SYS_setsockopt, sockopts);
    let mut ioctls = Vec::new();
    for cmd in TTY_IOCTLS {
        ioctls.push(rule(vec![cond(1, SeccompCmpOp::Eq, *cmd)?])?);
    }
    deny.insert(libc::SYS_ioctl, ioctls);
    // personality: anything but the allowed values is refused.
    let mut conds = Vec::new();
    for v in PERSONALITY_OK {
        conds.push(cond(0, SeccompCmpOp::Ne, *v)?);
    }
    deny.insert(libc::SYS_personality, vec![rule(conds)?]);
    SeccompFilter::new(
        with_x32(deny),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(err)
}

/// The second program: `ENOSYS` for `clone3`.
fn second() -> Result<SeccompFilter, String> {
    SeccompFilter::new(
        with_x32([(libc::SYS_clone3, Vec::new())].into_iter().collect()),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(err)
}

/// The two BPF programs (see the module doc), serialized as the kernel's
/// `struct sock_filter` array bubblewrap reads from a file descriptor.
pub fn programs() -> Result<[Vec<u8>; 2], String> {
    Ok([serialize(first()?)?, serialize(second()?)?])
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

    /// Each call and what it must give under the filter (`errno`, or 0 for
    /// "not refused by seccomp": the call's own answer is then anything but
    /// `EPERM`), as a Python program prints it: `name errno`.
    const PROBE: &str = r#"
import ctypes, os, socket, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *a)
    return 0 if r >= 0 else ctypes.get_errno()
L = ctypes.c_long
params = ctypes.create_string_buffer(120)
one = ctypes.c_int(1)
c = ctypes.c_char(b"x")
# x86_64 numbers: io_uring_setup 425, _enter 426, _register 427,
# socket 41, setsockopt 54, ioctl 16, unshare 272, pidfd_open 434,
# pidfd_getfd 438, fanotify_init 300.
print("io_uring_setup", call(425, 1, params))
print("io_uring_enter", call(426, -1, 0, 0, 0, 0, 0))
print("io_uring_register", call(427, -1, 0, 0, 0))
print("netlink_netfilter", call(41, 16, 3, 12))
print("vsock", call(41, 40, 1, 0))
for name, flag in [("ns", 0x20000), ("uts", 0x4000000), ("ipc", 0x8000000),
                   ("user", 0x10000000), ("pid", 0x20000000), ("net", 0x40000000),
                   ("cgroup", 0x2000000), ("time", 0x80)]:
    print("unshare_" + name, call(272, flag))
for name, level, opt in [("ipt_replace", 0, 64), ("ipt_counters", 0, 65), ("arpt", 0, 96),
                         ("ebt", 0, 128), ("ipvs", 0, 1160), ("ip6t_replace", 41, 64)]:
    print("setsockopt_" + name, call(54, -1, level, opt, ctypes.byref(one), 4))
print("tiocsti", call(16, -1, 0x5412, ctypes.byref(c)))
print("tiocsti_high_bits", call(16, -1, L(0x100005412), ctypes.byref(c)))
print("tioclinux", call(16, -1, 0x541C, ctypes.byref(c)))
print("fanotify_init", call(300, 0, 0))
# x32's number for keyctl (ENOSYS unfiltered on a kernel without x32).
print("x32_keyctl", call(0x40000000 | 250, 0, 0, 0, 0))
pidfd = libc.syscall(434, os.getpid(), 0)
print("pidfd_getfd", call(438, pidfd, 1, 0))
# What a sandbox's programs do keeps working (not EPERM):
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); s.close()
print("netlink_route", 0)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 16); u.close()
print("setsockopt_tos", 0)
print("ioctl_fionread_ebadf", call(16, -1, 0x541B, ctypes.byref(one)))
t = threading.Thread(target=lambda: None); t.start(); t.join()
print("thread", 0)
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", 0 if os.waitpid(pid, 0)[1] >> 8 == 7 else 1)
"#;

    /// The filter refuses what the module doc says, for a process it was
    /// installed in (a Python child of a thread that installed it: seccomp
    /// filters are per thread and inherited by children), and lets what a
    /// sandbox's programs do through. Needs root (installing without
    /// `no_new_privs`) and python3.
    #[test]
    fn the_filter_refuses_what_it_says_and_nothing_a_program_needs() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: installing the filter without no_new_privs needs root");
            return;
        }
        let programs = super::programs().expect("filters");
        let out = std::thread::spawn(move || {
            for p in &programs {
                warren_sys::install_seccomp(p).expect("install");
            }
            std::process::Command::new("python3")
                .args(["-c", PROBE])
                .output()
                .expect("python3 runs")
        })
        .join()
        .expect("probe thread");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: std::collections::HashMap<&str, i32> = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k, v.parse().ok()?))
            })
            .collect();
        let eperm = libc::EPERM;
        for name in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "netlink_netfilter",
            "vsock",
            "unshare_ns",
            "unshare_uts",
            "unshare_ipc",
            "unshare_user",
            "unshare_pid",
            "unshare_net",
            "unshare_cgroup",
            "unshare_time",
            "setsockopt_ipt_replace",
            "setsockopt_ipt_counters",
            "setsockopt_arpt",
            "setsockopt_ebt",
            "setsockopt_ipvs",
            "setsockopt_ip6t_replace",
            "tiocsti",
            "tiocsti_high_bits",
            "tioclinux",
            "fanotify_init",
            "pidfd_getfd",
            "x32_keyctl",
        ] {
            assert_eq!(got.get(name), Some(&eperm), "{name}: {text}");
        }
        for name in ["netlink_route", "setsockopt_tos", "thread", "fork"] {
            assert_eq!(got.get(name), Some(&0), "{name}: {text}");
        }
        assert_eq!(
            got.get("ioctl_fionread_ebadf"),
            Some(&libc::EBADF),
            "{text}"
        );
    }
}
