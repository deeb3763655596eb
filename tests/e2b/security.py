"""The sandbox boundary, attacked the way a tenant would: the unmodified `e2b`
Python SDK (and raw HTTP) through a gateway, with nothing but an API key.

Run by `crates/warren/tests/security.rs`, one attack per invocation:

    python security.py ATTACK

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (team a), WARREN_OTHER_API_KEY
(team b) and attack-specific WARREN_* variables set by the Rust test, which
also checks the host side (marker files, a host socket, host uids). Each
attack asserts what the tenant sees and prints one JSON line of facts for
the Rust side (`RESULT {...}`); it exits non-zero on a failed assertion.
"""

import json
import os
import sys
import time

from e2b import Sandbox

from common import http, ok, result, run

API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["WARREN_OTHER_API_KEY"]


def sh(sbx, cmd, user=None, timeout=60):
    """Runs `cmd`; returns (exit code, stdout, stderr, error) without raising."""
    return run(sbx, cmd, user=user, timeout=timeout)


ATTACKS = {}


def attack(fn):
    ATTACKS[fn.__name__] = fn
    return fn


@attack
def env_vars():
    # Loader variables are refused at create, named in the message.
    body = json.dumps({"templateID": "base", "envVars": {"LD_PRELOAD": "/tmp/evil.so"}}).encode()
    status, _, raw = http("POST", "/sandboxes", {"X-API-Key": API_KEY,
                                                "Content-Type": "application/json"}, body)
    assert status == 400, (status, raw)
    assert b"LD_PRELOAD" in raw, raw
    # Other variables reach the sandbox's processes, and only them.
    marker = os.environ["WARREN_ENV_MARKER"]
    sbx = Sandbox.create(timeout=120, envs={"T_MARKER": marker})
    code, out, _, _ = sh(sbx, "echo $T_MARKER")
    assert out.strip() == marker, out
    # A long-running command carries it while the Rust side scans the host.
    sbx.commands.run("exec sleep 60", background=True)
    code, out, _, _ = sh(sbx, "cat /proc/self/uid_map")
    result(sandbox=sbx.sandbox_id, uid_map=out.split())


@attack
def sockets_and_fork():
    host_socket = os.environ["WARREN_HOST_SOCKET"]
    host_secret = os.environ["WARREN_HOST_SECRET"]
    sbx = Sandbox.create(timeout=120)
    # Where would the node's sockets be? Nowhere the sandbox can see.
    code, out, _, _ = sh(sbx, "ls -la /run /run/warren 2>&1; cat /proc/self/mountinfo", user="root")
    assert "envd.sock" not in out and "relay.sock" not in out, out
    # Plant symlinks to a root-only host socket everywhere a socket might be
    # looked up, as root of the sandbox.
    plant = ("mkdir -p /run/warren && for n in envd.sock relay.sock; do "
             f"ln -sf {host_socket} /run/warren/$n; ln -sf {host_socket} /tmp/$n; "
             f"ln -sf {host_socket} /home/user/$n; done; echo planted")
    code, out, _, _ = sh(sbx, plant, user="root")
    assert out.strip() == "planted", out
    # Traffic keeps flowing to the sandbox's own envd.
    for _ in range(5):
        assert ok(sbx)
    sbx.files.write("/home/user/f.txt", "mine")
    assert sbx.files.read("/home/user/f.txt") == "mine"
    # Fork while the parent swaps files for symlinks to a root-only host file,
    # with a sparse file that must stay sparse.
    sh(sbx, "dd if=/dev/zero of=/home/user/sparse bs=1 count=1 seek=200M 2>/dev/null; "
            f"ln -s {host_secret} /home/user/leak; echo plain > /home/user/swap")
    sbx.commands.run(
        f"while true; do ln -sfn {host_secret} /home/user/swap.tmp && mv -f /home/user/swap.tmp /home/user/swap; "
        "echo plain > /home/user/swap.tmp && mv -f /home/user/swap.tmp /home/user/swap; done",
        background=True)
    time.sleep(0.3)
    forks = sbx.fork()
    child = forks[0] if isinstance(forks, list) else forks
    code, out, err, _ = sh(child, "cat /home/user/leak /home/user/swap 2>&1; "
                                  "du -k /home/user/sparse | cut -f1; stat -c %s /home/user/sparse")
    lines = out.split("\n")
    assert "SECRET" not in out, out
    du_kib, size = int(lines[-3]), int(lines[-2])
    assert size == 200 * 1024 * 1024 + 1, size
    assert du_kib < 1024, f"holes filled in: {du_kib} KiB used"
    assert ok(sbx) and ok(child)
    result(parent=sbx.sandbox_id, child=child.sandbox_id)


@attack
def identities():
    a = Sandbox.create(timeout=120)
    b = Sandbox.create(timeout=120, api_key=OTHER_KEY)
    maps = []
    for s in (a, b):
        code, out, _, _ = sh(s, "cat /proc/self/uid_map /proc/self/gid_map")
        maps.append(out.split())
    # Each sandbox maps its ids to a range of its own.
    assert maps[0][1] != maps[1][1], maps
    # User code is `user`, not envd's identity: it can neither read envd's
    # environment nor signal it.
    code, out, err, _ = sh(a, "id -un; pid=$(pgrep -f '^/opt/warren/bin/warren envd'); "
                              "cat /proc/$pid/environ >/dev/null 2>&1 && echo READ; "
                              "ls /proc/$pid/fd >/dev/null 2>&1 && echo FDS; "
                              "kill -9 $pid 2>&1 || echo KILL_REFUSED")
    assert out.split("\n")[0] == "user", out
    assert "READ" not in out and "FDS" not in out, out
    assert "KILL_REFUSED" in out, out
    assert ok(a)
    # Kernel per-uid state is not shared: A exhausts its inotify instances,
    # B can still make one.
    exhaust = ("python3 -c \"import ctypes\nlibc=ctypes.CDLL(None, use_errno=True)\nn=0\n"
               "while n < 100000 and libc.inotify_init() >= 0: n += 1\nprint(n, ctypes.get_errno())\"")
    code, out, _, _ = sh(a, exhaust)
    n, errno = out.split()
    assert int(errno) == 24, out  # EMFILE: the per-user limit (or the fd limit) was reached
    code, out, _, _ = sh(b, "python3 -c \"import ctypes\nprint(ctypes.CDLL(None).inotify_init() >= 0)\"")
    assert out.strip() == "True", f"B cannot make an inotify instance after A exhausted its own: {out}"
    result(a=a.sandbox_id, b=b.sandbox_id, maps=maps)


@attack
def limits():
    a = Sandbox.create(timeout=120)
    b = Sandbox.create(timeout=120, api_key=OTHER_KEY)
    # Fork bomb: ends at the pids limit, inside A.
    bomb = ("python3 -c \"import os, signal, sys, time\nn = 0\ntry:\n"
            "    while n < 20000:\n        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
            "        n += 1\nexcept OSError as e:\n    print(n, e.errno, flush=True)\n"
            "os.killpg(0, signal.SIGKILL)\n\"")
    code, out, err, _ = sh(a, bomb, timeout=90)
    forked, errno = out.split()
    assert int(errno) == 11 and int(forked) < 256, (out, err)  # EAGAIN at the pids limit
    assert ok(b), "the neighbour stopped answering during A's fork bomb"
    # Memory: two processes that each fit, together do not (the limit is per sandbox).
    mb = int(os.environ["WARREN_MEMORY_MB"])
    each = mb * 7 // 10
    fill = f"b=bytearray({each}<<20); b[::4096]=b'x'*len(b[::4096])"
    # The first holds its memory until the second is done; whichever the
    # out-of-memory killer picks ends with 137.
    hog = (f"python3 -c \"import time; {fill}; print('held', flush=True); time.sleep(120)\" > /tmp/held & P=$!; "
           "until grep -q held /tmp/held; do sleep 0.1; done; "
           f"python3 -c \"{fill}\"; S=$?; "
           "if kill -0 $P 2>/dev/null; then kill -9 $P; wait $P; F=alive; else wait $P; F=$?; fi; "
           "echo first=$F second=$S")
    code, out, err, error = sh(a, hog, timeout=90)
    statuses = dict(kv.split("=") for kv in out.split() if "=" in kv)
    assert "137" in statuses.values(), f"two processes of {each} MiB each fit in {mb} MiB: {out} {err}"
    assert ok(b), "the neighbour stopped answering during A's memory hog"
    # A process killed by the out-of-memory killer says so.
    code, out, err, error = sh(a, f"python3 -c \"b=bytearray({mb * 2}<<20); b[::4096]=b'x'*len(b[::4096])\"", timeout=90)
    assert code != 0, (code, out)
    assert error and "memory limit" in error, (code, error, err)
    assert ok(a)
    # Disk: fills up at the sandbox's quota with ENOSPC, inside A.
    disk_mb = int(os.environ["WARREN_DISK_MB"])
    code, out, err, _ = sh(a, f"dd if=/dev/zero of=/home/user/fill bs=1M count={disk_mb * 2} 2>&1; df -m / | tail -1", timeout=90)
    assert "No space left on device" in out + err, (out, err)
    # An upload past the quota fails with a clear error, not a crash.
    try:
        a.files.write("/home/user/more.bin", b"x" * (4 << 20))
        raise AssertionError("an upload to a full disk succeeded")
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - the SDK's error type varies by status
        assert "space" in str(e).lower() or "507" in str(e) or "exhausted" in str(e).lower(), str(e)
    assert ok(b), "the neighbour stopped answering during A's disk fill"
    sh(a, "rm -f /home/user/fill")
    assert ok(a)
    result(a=a.sandbox_id, b=b.sandbox_id)


# Each call kernel_surface tries, as `user` and as root: `name ret errno`.
# x86_64 numbers: keyctl 250, add_key 248, bpf 321, perf_event_open 298,
# unshare 272, mount 165, io_uring_setup 425, socket 41, setsockopt 54,
# pidfd_open 434, pidfd_getfd 438, ioctl 16.
KERNEL_PROBE = r"""
import ctypes, os, pty, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *a)
    return r, ctypes.get_errno()
def show(name, r):
    print(name, r[0] if r[0] < 0 else 0, r[1])
show('keyctl', call(250, 0, 0, 0, 0))
show('add_key', call(248, b'user', b'k', b'v', 1, ctypes.c_long(-4)))
show('bpf', call(321, 0, 0, 0))
show('perf', call(298, 0, 0, -1, -1, 0))
show('mount', call(165, b'none', b'/mnt', b'tmpfs', 0, 0))
for name, flag in [('user', 0x10000000), ('mnt', 0x20000), ('net', 0x40000000),
                   ('uts', 0x4000000), ('ipc', 0x8000000), ('pid', 0x20000000),
                   ('cgroup', 0x2000000), ('time', 0x80)]:
    show('unshare_' + name, call(272, flag))
params = ctypes.create_string_buffer(120)
show('io_uring_setup', call(425, 4, params))
# AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER: how nft reaches nf_tables.
show('netlink_netfilter', call(41, 16, 3, 12))
one = ctypes.c_int(1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
show('ipt_set_replace', call(54, u.fileno(), 0, 64, ctypes.byref(one), 4))
pidfd = libc.syscall(434, os.getpid(), 0)
show('pidfd_getfd', call(438, pidfd, 1, 0))
# TIOCSTI into a terminal that is the caller's controlling one (a new
# session's first terminal): what typed into the node's terminal.
master, slave = pty.openpty()
name = os.ttyname(slave)
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.setsid()
    fd = os.open(name, os.O_RDWR)
    c = ctypes.c_char(b'x')
    got = call(16, fd, 0x5412, ctypes.byref(c))
    os.write(w, ('%d %d' % (got[0] if got[0] < 0 else 0, got[1])).encode())
    os._exit(0)
os.waitpid(child, 0)
got = os.read(r, 64).decode().split()
print('tiocsti', got[0], got[1])
"""


@attack
def kernel_surface():
    sbx = Sandbox.create(timeout=120)
    sbx.files.write("/tmp/kernel_probe.py", KERNEL_PROBE)
    seen = {}
    for user in ("user", "root"):
        code, out, err, _ = sh(sbx, "python3 /tmp/kernel_probe.py", user=user)
        assert code == 0, (user, out, err)
        facts = {line.split()[0]: (int(line.split()[1]), int(line.split()[2]))
                 for line in out.strip().split("\n")}
        seen[user] = facts
        for name, (ret, errno) in facts.items():
            assert ret == -1 and errno == 1, f"{name} as {user}: {ret} errno {errno} (want EPERM)"
    # The tools, as root: each fails.
    tools = {}
    for cmd in ["unshare -U true", "unshare -n true", "unshare -m true", "unshare -T true",
                "unshare -C true", "unshare -i true", "unshare -u true", "unshare -p -f true",
                "nft add table inet x"]:
        code, out, err, _ = sh(sbx, f"{cmd} 2>&1; echo rc=$?", user="root")
        tools[cmd] = out.strip()
        assert "rc=0" not in out, (cmd, out)
    # What the SDK suites rely on keeps working: sudo, pip, threads and
    # processes (Python's multiprocessing), node.
    code, out, err, _ = sh(sbx, "sudo -n id -u")
    assert code == 0 and out.strip() == "0", (code, out, err)
    code, out, err, _ = sh(sbx, "pip --version")
    assert code == 0 and "pip" in out, (code, out, err)
    threads = ("python3 -c \"import threading, multiprocessing as mp\n"
               "t = [threading.Thread(target=sum, args=([1],)) for _ in range(8)]\n"
               "[x.start() for x in t]; [x.join() for x in t]\n"
               "with mp.Pool(2) as p: print(sum(p.map(abs, range(-5, 5))))\"")
    code, out, err, _ = sh(sbx, threads)
    assert code == 0 and out.strip() == "25", (code, out, err)
    code, out, err, _ = sh(sbx, "node -e 'require(\"fs\").readFileSync(\"/etc/hostname\"); console.log(\"node ok\")'")
    assert code == 0 and out.strip() == "node ok", (code, out, err)
    assert ok(sbx)
    result(sandbox=sbx.sandbox_id, seen=seen, tools=tools)


@attack
def host_information():
    host_paths = json.loads(os.environ["WARREN_HOST_PATHS"])
    host_accounts = json.loads(os.environ["WARREN_HOST_ACCOUNTS"])
    sbx = Sandbox.create(timeout=120)
    code, out, _, _ = sh(sbx, "hostname; cat /etc/hostname")
    assert out.split() == [sbx.sandbox_id, sbx.sandbox_id], out
    code, passwd, _, _ = sh(sbx, "cat /etc/passwd /etc/group")
    assert "user:x:1000:1000" in passwd, passwd
    for account in host_accounts:
        assert f"\n{account}:" not in "\n" + passwd, f"host account {account} visible"
    code, out, _, _ = sh(sbx, "cat /proc/self/mountinfo; tr '\\0' ' ' < /proc/1/cmdline; "
                              "tr '\\0' ' ' < /proc/self/cmdline", user="root")
    for p in host_paths:
        assert p not in out, f"host path {p} visible inside:\n{out}"
    code, out, _, _ = sh(sbx, "test -f /etc/resolv.conf && echo yes")
    assert out.strip() == "yes"
    result(sandbox=sbx.sandbox_id)


@attack
def forged_marker():
    sbx = Sandbox.create(timeout=120)
    server = ("import http.server\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        body = b'app says not here'\n"
              "        self.send_response(404)\n"
              "        self.send_header('X-Warren-Route', 'not-found')\n"
              "        self.send_header('X-Warren-Generation', '999')\n"
              "        self.send_header('Content-Length', str(len(body)))\n"
              "        self.end_headers()\n"
              "        self.wfile.write(body)\n"
              "    def log_message(self, *a): pass\n"
              "http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()\n")
    sbx.files.write("/home/user/srv.py", server)
    sbx.commands.run("exec python3 /home/user/srv.py", background=True)
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}
    deadline = time.time() + 20
    while True:
        status, hdrs, body = http("GET", "/", headers, base=os.environ["E2B_SANDBOX_URL"])
        if body == b"app says not here" or time.time() > deadline:
            break
        time.sleep(0.2)
    assert status == 404 and body == b"app says not here", (status, body)
    assert not any(k.lower().startswith("x-warren-") for k in hdrs), hdrs
    for _ in range(20):
        status, hdrs, body = http("GET", "/", headers, base=os.environ["E2B_SANDBOX_URL"])
        assert status == 404 and body == b"app says not here", (status, body)
    assert ok(sbx)
    result(sandbox=sbx.sandbox_id)


# Every descriptor of every process of the sandbox, as its root sees them,
# and whether any of them reads back the host's secret marker.
DESCRIPTOR_PROBE = r"""
import json, os, sys
marker = sys.argv[1].encode()
foreign, found, ttys = [], [], []
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    d = f'/proc/{pid}/fd'
    try:
        fds = os.listdir(d)
    except OSError:
        continue
    for fd in fds:
        p = f'{d}/{fd}'
        try:
            target = os.readlink(p)
        except OSError:
            continue
        if target.split(':')[0] in ('pipe', 'socket', 'anon_inode') or target.startswith('/memfd:'):
            continue
        if target.startswith('/dev/pts/') or target == '/dev/ptmx':
            continue  # envd's own PTYs (reading them would steal a command's output)
        # A descriptor of a file outside the sandbox names a path that, in
        # here, is missing or another file.
        try:
            same = os.stat(p).st_ino == os.stat(target).st_ino and os.stat(p).st_dev == os.stat(target).st_dev
        except OSError:
            same = False
        if not same and not target.endswith(' (deleted)'):
            foreign.append((p, target))
        if target.startswith('/dev/tty') or target == '/dev/console':
            ttys.append((p, target))
        try:
            f = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            data = os.read(f, 1 << 22)
        except OSError:
            data = b''
        finally:
            os.close(f)
        if marker in data:
            found.append((p, target))
pid1 = {fd: os.readlink(f'/proc/1/fd/{fd}') for fd in os.listdir('/proc/1/fd')}
print(json.dumps({'foreign': foreign, 'found': found, 'ttys': ttys, 'pid1': pid1,
                  'exe': os.readlink('/proc/1/exe')}))
"""


@attack
def descriptors():
    marker = os.environ["WARREN_SECRET_MARKER"]
    sbx = Sandbox.create(timeout=120)
    sbx.files.write("/tmp/fds.py", DESCRIPTOR_PROBE)
    code, out, err, _ = sh(sbx, f"python3 /tmp/fds.py {marker}", user="root")
    assert code == 0, (out, err)
    facts = json.loads(out)
    # No descriptor of any process here leads to a host file (the node's
    # log, a stray descriptor of the operator's shell) or terminal...
    assert not facts["foreign"], facts["foreign"]
    assert not facts["ttys"], facts["ttys"]
    # ...nor reads back the secret the host put in one.
    assert not facts["found"], facts["found"]
    # Pid 1 keeps nothing but /dev/null, and runs the sandbox's own copy.
    assert facts["pid1"] == {"0": "/dev/null", "1": "/dev/null", "2": "/dev/null"}, facts["pid1"]
    assert facts["exe"] == "/opt/warren/bin/warren", facts["exe"]
    # No terminal: /dev/tty is nobody's here, for user code as for root.
    for user in ("user", "root"):
        code, out, err, _ = sh(sbx, "python3 -c \"import os\ntry:\n    os.open('/dev/tty', os.O_RDWR)\n"
                                    "    print('opened')\nexcept OSError as e:\n    print(e.errno)\"", user=user)
        assert out.strip() == "6", f"/dev/tty as {user}: {out} {err}"  # ENXIO: no controlling terminal
    # envd's stdout and stderr are the node's pipes: the sandbox's root
    # cannot open them (they belong to the host's root).
    code, out, err, _ = sh(sbx, "for n in 1 2; do echo x 2>/dev/null > /proc/$PPID/fd/$n && echo OPENED $n; done; "
                                "ls -l /proc/$PPID/exe", user="root")
    assert "OPENED" not in out, out
    assert "/opt/warren/bin/warren" in out, out  # $PPID is envd
    assert ok(sbx)
    result(sandbox=sbx.sandbox_id)


@attack
def host_files():
    # What another host account would look for: this sandbox's envd token
    # and an API key in its envVars (in the scheduler's database), and a
    # set-user-ID root shell in a snapshot's layer (in the template store).
    marker = os.environ["WARREN_SECRET_MARKER"]
    sbx = Sandbox.create(timeout=120, envs={"OPENAI_API_KEY": marker})
    code, out, err, _ = sh(sbx, "cp /bin/bash /home/user/suid-bash && chmod 4755 /home/user/suid-bash "
                                "&& stat -c %a /home/user/suid-bash", user="root")
    assert out.strip() == "4755", (out, err)
    snap = sbx.create_snapshot()
    result(sandbox=sbx.sandbox_id, token=sbx._envd_access_token, snapshot=snap.snapshot_id)


@attack
def host_files_cleanup():
    assert Sandbox.delete_snapshot(os.environ["WARREN_SNAPSHOT"]) is True
    result(deleted=True)


@attack
def console_flood():
    # Run on the `process` runtime, where a command may open envd's stderr
    # (the same console pipe an isolated sandbox's envd writes to): what is
    # written there reaches the node's log as this sandbox's output,
    # escaped and bounded, a forged line and then 16 MiB.
    forged = os.environ["WARREN_FORGED_MARKER"]
    sbx = Sandbox.create(timeout=120)
    flood = (f"printf '{forged} warren_node: forged \\033[31mred\\n' > /proc/$PPID/fd/2 && "
             "head -c 16777216 /dev/zero | tr '\\0' 'x' | fold -w 1000 > /proc/$PPID/fd/2 && echo flooded")
    code, out, err, _ = sh(sbx, flood, timeout=120)
    assert out.strip() == "flooded", (out, err)
    assert ok(sbx)
    result(sandbox=sbx.sandbox_id)


if __name__ == "__main__":
    ATTACKS[sys.argv[1]]()

