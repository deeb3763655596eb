#!/usr/bin/env python3
"""Runs the systemd units' start lines as systemd would run them (the
unit's user, environment file and capabilities; /etc/warren as a host has
it), without systemd: for CI, with --check-config, and for docs/deploy.md's
run, started for real.

    units.py check --warren BIN deploy/systemd
    units.py start --warren BIN --unit deploy/systemd/warren-node.service \
        --etc DIR [--mount SRC:DST]... [--check]

`check`, for each `*.service`: a host's /etc/warren is made from deploy/systemd/etc
(the unit's TOML file and environment file, as shipped) and the files the
TOML names (the cluster CA and this part's certificate for the name and
address it gives, the store key, the API-key file, the upload-link key,
the wildcard certificate), owned by the unit's user, 0600, with that user
in /etc/passwd; then the unit's ExecStartPre line (its own --check-config)
and its ExecStart line with --check-config run in a private mount
namespace with that /etc/warren, the binary at /usr/local/bin/warren, the
unit's environment file, user and capabilities. Each must exit 0. Then
`systemd-analyze verify` checks the units' syntax and `systemd-analyze
security --offline=true` prints each one's exposure (when systemd-analyze
is installed).

`start` execs the unit's ExecStart line (ExecStartPre's with --check)
with DIR as /etc/warren and the other mounts given (a host's data
directories), in the process's network namespace (`nsenter` puts it on a
host first); with --in-place, in a host's mount namespace that `host`
made (`nsenter --mount=FILE`), where those are mounted already.

Not checked here: that systemd applies the hardening as written (no
systemd runs in CI or in the run).
"""

import argparse
import configparser
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import private_root  # noqa: E402

BINARY = "/usr/local/bin/warren"
SERVICE_UID = 64999


class Failure(Exception):
    pass


def unit(path):
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str
    # Repeated keys (SystemCallFilter=) are fine for us: the last wins.
    with open(path) as f:
        cp.read_string(f.read())
    return cp["Service"]


def sh(argv, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise Failure(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout


def private(path, data, uid, gid):
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(data)
    os.chown(path, uid, gid)


def make_etc(warren, shipped, toml_name, etc, uid, gid):
    """/etc/warren of one host for the part whose TOML is `toml_name`."""
    shutil.copy(os.path.join(shipped, toml_name), etc)
    env_name = toml_name[: -len(".toml")] + ".env"
    if os.path.exists(os.path.join(shipped, env_name)):
        shutil.copy(os.path.join(shipped, env_name), etc)
    with open(os.path.join(etc, toml_name), "rb") as f:
        cfg = tomllib.load(f)
    certs = os.path.join(etc, "certs")
    os.makedirs(certs, exist_ok=True)
    made = []
    if not os.path.exists(os.path.join(certs, "ca.pem")):
        sh([warren, "certs", "init", "--dir", certs, "--days", "2"])

    def in_etc(p):
        if not p.startswith("/etc/warren/"):
            raise Failure(f"{toml_name}: {p} is outside /etc/warren")
        return os.path.join(etc, p[len("/etc/warren/"):])

    if "tls-cert" in cfg:
        base = os.path.basename(cfg["tls-cert"])[: -len(".pem")]
        role, name = base.split("-", 1)
        host = cfg["listen"].rsplit(":", 1)[0].strip("[]")
        hosts = [] if role == "gateway" else ["--host", host]
        sh([warren, "certs", "issue", "--dir", certs, "--role", role, "--name", name, "--days", "2"] + hosts)
        for key in ("tls-cert", "tls-key"):
            os.chown(in_etc(cfg[key]), uid, gid)
        made.append(f"{role} certificate for {name}")
    if "store-key-file" in cfg:
        private(in_etc(cfg["store-key-file"]), os.urandom(32).hex().encode() + b"\n", uid, gid)
        made.append("store key")
    if "api-keys-file" in cfg:
        private(in_etc(cfg["api-keys-file"]), b"e2b_" + b"0" * 39 + b"1 ops\n", uid, gid)
        made.append("API keys")
    if "build-upload-key-file" in cfg:
        private(in_etc(cfg["build-upload-key-file"]), os.urandom(32).hex().encode(), uid, gid)
        made.append("upload-link key")
    if "public-tls-cert" in cfg:
        cert, key = in_etc(cfg["public-tls-cert"]), in_etc(cfg["public-tls-key"])
        os.makedirs(os.path.dirname(cert), exist_ok=True)
        domain = cfg["domain"]
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={domain}",
            "-addext", f"subjectAltName=DNS:*.{domain},DNS:{domain}"])
        for p in (cert, key):
            os.chown(p, uid, gid)
            os.chmod(p, 0o600)
        made.append("wildcard certificate")
    return made


def env_file(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return env


def unit_command(path, etc, warren, scratch, line, extra_args=(), extra_mounts=(), extra_env=None,
                 in_place=False):
    """The command that runs the unit's `line` (ExecStart, ExecStartPre) as
    systemd would, with `etc` as /etc/warren; and the user it runs as."""
    svc = unit(path)
    user = svc.get("User", "root")
    uid, gid = (0, 0) if user == "root" else (SERVICE_UID, SERVICE_UID)
    argv = shlex.split(svc[line]) + list(extra_args)
    env = {}
    for f in svc.get("EnvironmentFile", "").split():
        optional = f.startswith("-")
        f = f.lstrip("-")
        if not f.startswith("/etc/warren/"):
            raise Failure(f"{path}: EnvironmentFile {f} is outside /etc/warren")
        p = os.path.join(etc, f[len("/etc/warren/"):])
        if os.path.exists(p) or not optional:
            env.update(env_file(p))
    env.update(extra_env or {})
    mounts = [(etc, "/etc/warren"), (os.path.abspath(warren), BINARY)] + list(extra_mounts)
    if user != "root":
        work = os.path.dirname(scratch)
        name = os.path.basename(path)
        passwd = os.path.join(work, f"passwd-{name}")
        group = os.path.join(work, f"group-{name}")
        with open("/etc/passwd") as f, open(passwd, "w") as out:
            out.write(f.read() + f"{user}:x:{uid}:{gid}::/var/lib/warren:/usr/sbin/nologin\n")
        with open("/etc/group") as f, open(group, "w") as out:
            out.write(f.read() + f"{user}:x:{gid}:\n")
        mounts += [(passwd, "/etc/passwd"), (group, "/etc/group")]
    caps = "all" if uid == 0 else [c[len("CAP_"):] for c in svc.get("AmbientCapabilities", "").split()]
    if in_place:
        # Already in the host's namespace (`units.py host`): no mounts.
        cmd = private_root.exec_argv(argv, env, uid, gid, (), caps)
    else:
        cmd = private_root.command(argv, env, mounts, scratch, uid, gid, (), caps)
    return cmd, user, caps, argv


def host_mounts(etc, warren, work, extra_mounts=()):
    """What a host's mount namespace shows: its /etc/warren, the binary,
    the `warren` account, and its data directories."""
    passwd = os.path.join(work, "passwd")
    group = os.path.join(work, "group")
    with open("/etc/passwd") as f, open(passwd, "w") as out:
        out.write(f.read() + f"warren:x:{SERVICE_UID}:{SERVICE_UID}::/var/lib/warren:/usr/sbin/nologin\n")
    with open("/etc/group") as f, open(group, "w") as out:
        out.write(f.read() + f"warren:x:{SERVICE_UID}:\n")
    return [(etc, "/etc/warren"), (os.path.abspath(warren), BINARY), (passwd, "/etc/passwd"),
            (group, "/etc/group")] + list(extra_mounts)


def check_unit(warren, shipped, path, work):
    svc = unit(path)
    name = os.path.basename(path)
    user = svc.get("User", "root")
    uid, gid = (0, 0) if user == "root" else (SERVICE_UID, SERVICE_UID)
    etc = tempfile.mkdtemp(dir=work, prefix="etc-warren-")
    os.chmod(etc, 0o755)
    start = shlex.split(svc["ExecStart"])
    config = start[start.index("--config") + 1]
    made = make_etc(warren, shipped, os.path.basename(config), etc, uid, gid)
    runs = [("ExecStart", ["--check-config"])]
    if "ExecStartPre" in svc:
        runs.insert(0, ("ExecStartPre", []))
    for i, (line, extra) in enumerate(runs):
        scratch = os.path.join(work, f"scratch-{name}-{i}")
        cmd, user, caps, argv = unit_command(path, etc, warren, scratch, line, extra)
        if i == 0:
            print(f"{name}: /etc/warren with {', '.join(made)}; as {user}"
                  + ("" if caps == "all" else f" with capabilities {caps or 'none'}"))
        if "--check-config" not in argv:
            raise Failure(f"{name}: {line} is not a check: {argv}")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise Failure(f"{name}: {line}: exit {p.returncode}: {' '.join(argv)}\n{p.stderr.strip()}")
        print(f"  {line}{' + --check-config' if extra else ''}: {' '.join(argv)}")
        for out in p.stdout.strip().splitlines():
            print(f"    | {out}")


def check(a):
    units = sorted(os.path.join(a.units_dir, f) for f in os.listdir(a.units_dir) if f.endswith(".service"))
    shipped = os.path.join(a.units_dir, "etc")
    work = tempfile.mkdtemp(prefix="warren-units-")
    try:
        if not units:
            raise Failure(f"no units in {a.units_dir}")
        for u in units:
            check_unit(a.warren, shipped, u, work)
        analyze = shutil.which("systemd-analyze")
        if analyze:
            # In a private root with the binary in place (verify checks it).
            scratch = os.path.join(work, "scratch-analyze")
            argv = [analyze, "verify", "--man=no"] + [os.path.abspath(u) for u in units]
            rc, out, err = private_root.run(argv, {}, [(os.path.abspath(a.warren), BINARY)], scratch)
            problems = [l for l in (out + err).splitlines() if l.strip()]
            if rc != 0 or problems:
                raise Failure("systemd-analyze verify:\n" + "\n".join(problems))
            print(f"systemd-analyze verify: {len(units)} units ok")
            for u in units:
                p = subprocess.run([analyze, "security", "--offline=true", "--no-pager", os.path.abspath(u)],
                                   capture_output=True, text=True)
                last = [l for l in p.stdout.splitlines() if "Overall exposure level" in l]
                shown = last[0].split(":", 1)[1].strip() if last else p.stderr.strip()
                print(f"systemd-analyze security {os.path.basename(u)}: {shown}")
        else:
            print("units.py: systemd-analyze is not installed: the units' syntax is not verified")
        print(f"units.py: {len(units)} unit(s) passed --check-config")
    except Failure as e:
        print(f"units.py: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def start(a):
    scratch = tempfile.mkdtemp(prefix="warren-unit-", dir=a.work)
    mounts = [tuple(m.split(":", 1)) for m in a.mount]
    line = "ExecStartPre" if a.check else "ExecStart"
    # The harness's exit-with-its-parent marker (warren_harness), which the
    # unit's clean environment would drop, passes through.
    passthrough = {k: os.environ[k] for k in ("WARREN_EXIT_WITH_PARENT",) if k in os.environ}
    cmd, _, _, _ = unit_command(a.unit, a.etc_in, a.warren, os.path.join(scratch, "root"),
                                line, (), mounts, passthrough, in_place=a.in_place)
    os.execvp(cmd[0], cmd)


def host(a):
    """A host's persistent mount namespace (see private_root.persistent)."""
    work = os.path.abspath(a.work)
    mounts = host_mounts(os.path.abspath(a.etc), a.warren, work, [tuple(m.split(":", 1)) for m in a.mount])
    private_root.persistent(a.ns, mounts, os.path.join(work, "root"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--warren", required=True)
    c.add_argument("units_dir")
    s = sub.add_parser("start")
    s.add_argument("--warren", required=True)
    s.add_argument("--unit", required=True)
    s.add_argument("--etc", required=True)
    s.add_argument("--mount", action="append", default=[])
    s.add_argument("--check", action="store_true")
    s.add_argument("--work", help="where the run's scratch files go (default: the temporary directory)")
    s.add_argument("--in-place", action="store_true",
                   help="in a host's namespace already (units.py host): /etc/warren and the binary are there")
    h = sub.add_parser("host")
    h.add_argument("--warren", required=True)
    h.add_argument("--etc", required=True)
    h.add_argument("--ns", required=True, help="the file that holds the namespace")
    h.add_argument("--work", required=True)
    h.add_argument("--mount", action="append", default=[])
    a = ap.parse_args()
    if a.cmd == "start":
        # In place, /etc/warren is read where it is mounted.
        a.etc_in = "/etc/warren" if a.in_place else os.path.abspath(a.etc)
    return {"check": check, "start": start, "host": host}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
