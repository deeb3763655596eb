"""Running one command as a container or a unit would see the machine:
in a private mount namespace where chosen directories are mounted at the
paths it expects (over a copy-on-write view of the machine's own
directories, so nothing of the machine changes), as the user and with the
capabilities it would have. Needs root, `unshare`, `mount` and `setpriv`
(util-linux).

Used by kubelet.py (the chart's pods) and units.py (the systemd units).
"""

import os
import shlex
import shutil
import subprocess

# What an image's environment holds before the container's own (Debian's).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Top-level directories that may be overlaid (copy-on-write) so that a
# mount point can be made under them without touching the machine.
OVERLAYABLE = {"etc", "run", "var", "usr", "opt", "srv", "home", "root"}


def setup_script(mounts, scratch):
    """Shell lines that mount each (source, target) in `mounts` at target,
    overlaying the target's top-level directory first when the target is
    not there; `scratch` is a directory for the overlays' upper layers."""
    lines = [
        "set -eu",
        f"mount -t tmpfs -o mode=0700 warren-check {shlex.quote(scratch)}",
    ]
    overlaid = set()
    for source, target in mounts:
        parts = [p for p in target.split("/") if p]
        top = parts[0] if parts else ""
        if not os.path.exists(target):
            if top not in OVERLAYABLE:
                raise ValueError(f"cannot make mount point {target} (only under /{', /'.join(sorted(OVERLAYABLE))})")
            if top not in overlaid:
                upper = f"{scratch}/{top}.upper"
                work = f"{scratch}/{top}.work"
                lines += [
                    f"mkdir -p {upper} {work}",
                    f"mount -t overlay overlay -o lowerdir=/{top},upperdir={upper},workdir={work} /{top}",
                ]
                overlaid.add(top)
            if os.path.isdir(source):
                lines.append(f"mkdir -p {shlex.quote(target)}")
            else:
                lines.append(f"mkdir -p {shlex.quote(os.path.dirname(target))}")
                lines.append(f": > {shlex.quote(target)}")
        lines.append(f"mount --bind {shlex.quote(source)} {shlex.quote(target)}")
    return lines


def exec_argv(argv, env, uid=0, gid=0, groups=(), caps="all"):
    """`argv` with exactly `env` (plus PATH, as an image sets it), as
    uid:gid with supplementary `groups`; `caps` is "all" (root's, or a
    privileged container's) or a list of capability names it keeps
    (empty: none). `env` then `setpriv` then `argv`, each exec'ing the
    next."""
    setpriv = [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={gid}"]
    setpriv.append("--groups=" + ",".join(str(g) for g in groups) if groups else "--clear-groups")
    if caps != "all":
        keep = ",".join("+" + c.lower() for c in caps)
        bounding = "-all" + ("," + keep if keep else "")
        setpriv += [f"--inh-caps={bounding}", f"--bounding-set={bounding}"]
        if keep and uid != 0:
            setpriv.append(f"--ambient-caps={keep}")
    full_env = {"PATH": IMAGE_PATH, **env}
    envs = [shutil.which("env") or "env", "-i"] + [f"{k}={v}" for k, v in full_env.items()]
    return envs + setpriv + ["--"] + list(argv)


def command(argv, env, mounts, scratch, uid=0, gid=0, groups=(), caps="all", workdir=None):
    """The command line that runs [`exec_argv`] after `mounts`, in a mount
    namespace of its own. Every step execs the next: the process is
    `argv`'s, signals reach it."""
    lines = setup_script(mounts, scratch)
    cd = f"cd {shlex.quote(workdir)} && " if workdir else ""
    inner = exec_argv(argv, env, uid, gid, groups, caps)
    lines.append(cd + "exec " + " ".join(shlex.quote(a) for a in inner))
    os.makedirs(scratch, exist_ok=True)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)]


def persistent(ns_file, mounts, scratch):
    """Makes a mount namespace with `mounts` that outlives its first
    process, held by a bind mount of it on `ns_file` (whose directory must
    be on a private mount): a host's own view of the machine, which
    processes join with `nsenter --mount=ns_file`. A process that makes a
    namespace of its own from there (the node) keeps paths to what it
    started from, which a namespace of one process would lose with it."""
    os.makedirs(scratch, exist_ok=True)
    if not os.path.exists(ns_file):
        open(ns_file, "w").close()
    lines = setup_script(mounts, scratch) + ["true"]
    subprocess.run(["unshare", f"--mount={ns_file}", "--propagation", "private", "sh", "-c",
                    "\n".join(lines)], check=True)


def run(argv, env, mounts, scratch, uid=0, gid=0, groups=(), caps="all", workdir=None, timeout=60):
    """Runs [`command`]; returns (exit code, stdout, stderr)."""
    proc = subprocess.run(
        command(argv, env, mounts, scratch, uid, gid, groups, caps, workdir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr
