"""Pause and resume as a user of the unmodified `e2b` Python SDK sees them
through a gateway, on the `isolated` runtime: a paused sandbox's processes
stop (a counter a background process writes stops advancing, read from the
host side), listings say `paused`, it outlives its timeout while paused,
and `Sandbox.connect` resumes it with its memory intact (the same process
goes on counting from where it stopped). A data-plane request resumes it
only when it was created with `lifecycle={"auto_resume": True}`; otherwise
`is_running()` is False and requests fail without resuming it. With
`lifecycle={"on_timeout": "pause"}` the timeout pauses it instead of
killing it. A filesystem-only pause (`pause(keep_memory=False)`, or
`on_timeout={"action": "pause", "keep_memory": False}`) ends its processes
(gone from the host) and keeps its files; `connect()` cold-boots it: files
kept, a new boot id, the old processes gone; a kill removes its files.

Run by `crates/warren/tests/pause.rs`, one case per invocation:

    python pause.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and WARREN_NODE_DATA (the
node's data dir, to read the sandbox's files from the host while it is
frozen). Prints one JSON line of facts (`RESULT {...}`); exits non-zero on a
failed assertion.
"""

import json
import os
import sys
import threading
import time
from e2b import Sandbox

from common import http, result, run

API_KEY = os.environ["E2B_API_KEY"]
NODE_DATA = os.environ["WARREN_NODE_DATA"]

# Counts in memory and writes "pid count" to /tmp/count every 20 ms: after a
# resume the same pid goes on from its own count (memory kept).
COUNTER = ("python3 -c 'import os, time\n"
           "n = 0\n"
           "while True:\n"
           "    n += 1\n"
           "    open(\"/tmp/count.new\", \"w\").write(f\"{os.getpid()} {n}\")\n"
           "    os.replace(\"/tmp/count.new\", \"/tmp/count\")\n"
           "    time.sleep(0.02)\n'")


def eventually(fn, what, tries=100, pause=0.1):
    last = None
    for _ in range(tries):
        last = fn()
        if last:
            return last
        time.sleep(pause)
    raise AssertionError(f"{what}: never happened (last: {last!r})")


def in_sandbox(sbx):
    """(pid, count) read through the SDK (resumes a paused sandbox)."""
    code, out, err, _ = run(sbx, "cat /tmp/count")
    assert code == 0, (code, out, err)
    pid, n = out.split()
    return int(pid), int(n)


def node_pid():
    """The `warren node` process serving NODE_DATA."""
    for p in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"node" in argv and NODE_DATA.encode() in argv:
            return int(p)
    raise AssertionError(f"no warren node process for {NODE_DATA}")


def from_host(sbx):
    """(pid, count) read from the host, without touching the sandbox."""
    # The sandbox's root is mounted in the node's own mount namespace.
    path = os.path.join(f"/proc/{node_pid()}/root", NODE_DATA.lstrip("/"), "sandboxes",
                        sbx.sandbox_id, "fs", "tmp", "count")
    pid, n = open(path).read().split()
    return int(pid), int(n)


def api(method, path, body=None):
    headers = {"X-API-Key": API_KEY}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    status, _, raw = http(method, path, headers, data)
    return status, (json.loads(raw) if raw else None)


def state_of(sbx_id):
    status, got = api("GET", f"/sandboxes/{sbx_id}")
    assert status == 200, (status, got)
    return got["state"]


def start_counter(sbx):
    sbx.commands.run(COUNTER, background=True)
    eventually(lambda: run(sbx, "test -s /tmp/count")[0] == 0, "the counter starts")
    pid, _ = in_sandbox(sbx)
    eventually(lambda: in_sandbox(sbx)[1] >= 10, "the counter counts")
    return pid


def stands_still(sbx):
    """The counter, read from the host, does not move for 1.5 s (75 writes'
    worth while running)."""
    frozen = from_host(sbx)
    time.sleep(1.5)
    assert from_host(sbx) == frozen, (from_host(sbx), frozen)
    return frozen


def refused_while_paused(sbx):
    """A data-plane request fails with the SDK's error for E2B's 502
    "paused"; the message names the pause and the way out."""
    try:
        sbx.files.read("/tmp/count")
    except Exception as e:  # noqa: BLE001 - the SDK's error type varies by call
        msg = str(e)
        assert "paused" in msg and "resume" in msg, msg
        return msg
    raise AssertionError("a data-plane request to a paused sandbox succeeded")


def wait_paused(sbx_id):
    """Waits for the timeout to pause the sandbox (no timed assertion: the
    heartbeat and the node's freeze take what they take)."""
    return eventually(lambda: state_of(sbx_id) == "paused", "paused at its timeout",
                      tries=600, pause=0.1)


def listed_state(sbx_id):
    """The sandbox's state in each listing: v1 (running ones only), v2
    ?state=paused, v2 ?state=running."""
    _, v1 = api("GET", "/sandboxes")
    _, paused = api("GET", "/v2/sandboxes?state=paused")
    _, running = api("GET", "/v2/sandboxes?state=running")
    return ([s["state"] for s in v1 if s["sandboxID"] == sbx_id],
            [s["state"] for s in paused if s["sandboxID"] == sbx_id],
            [s["state"] for s in running if s["sandboxID"] == sbx_id])


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


# Auto-resume is off by default (E2B's default); the SDK allows it only with
# on_timeout=pause.
AUTO_RESUME = {"on_timeout": "pause", "auto_resume": True}


@case
def freeze_and_resume():
    sbx = Sandbox.create(timeout=300, lifecycle=AUTO_RESUME)
    pid = start_counter(sbx)

    assert sbx.pause() is True
    # v1 lists running sandboxes only (as E2B's does).
    assert listed_state(sbx.sandbox_id) == ([], ["paused"], []), \
        listed_state(sbx.sandbox_id)
    status, got = api("GET", f"/sandboxes/{sbx.sandbox_id}")
    assert status == 200 and got["state"] == "paused", (status, got)
    # Pausing again: 409, which the SDK reports as False.
    assert sbx.pause() is False
    # Frozen: the host sees the counter stand still.
    frozen = from_host(sbx)
    assert frozen[0] == pid, (frozen, pid)
    time.sleep(1.5)  # 75 writes' worth while running
    assert from_host(sbx) == frozen, (from_host(sbx), frozen)

    # connect() resumes it; the same process goes on from its own count.
    t0 = time.monotonic()
    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    resume_ms = (time.monotonic() - t0) * 1000
    assert listed_state(sbx.sandbox_id) == (["running"], [], ["running"]), \
        listed_state(sbx.sandbox_id)
    after = eventually(lambda: (lambda v: v if v[1] > frozen[1] else None)(in_sandbox(again)),
                       "the counter continues")
    assert after[0] == pid, (after, pid)
    assert after[1] < frozen[1] + 200, ("counted on while paused?", after, frozen)

    # resume on a running sandbox: 409.
    status, body = api("POST", f"/sandboxes/{sbx.sandbox_id}/resume", {})
    assert status == 409, (status, body)

    # Paused again, a data-plane request resumes it (many at once: one resume).
    assert sbx.pause() is True
    frozen2 = from_host(sbx)
    outs, errs = [], []

    def read():
        try:
            outs.append(in_sandbox(sbx))
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(repr(e))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errs, errs
    assert len(outs) == 8 and all(p == pid and n >= frozen2[1] for p, n in outs), outs
    assert listed_state(sbx.sandbox_id) == (["running"], [], ["running"]), \
        listed_state(sbx.sandbox_id)
    eventually(lambda: from_host(sbx)[1] > frozen2[1], "the counter continues after auto-resume")
    sbx.kill()
    result(sandbox=sbx.sandbox_id, pid=pid, frozen=frozen[1], after=after[1],
           resume_ms=round(resume_ms, 1))


@case
def no_auto_resume_by_default():
    """Without auto_resume: is_running() is False while paused, a data-plane
    request does not resume it, connect() does (E2B's conformance test)."""
    sbx = Sandbox.create(timeout=300)
    info = sbx.get_info()
    assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}, info.lifecycle
    pid = start_counter(sbx)
    assert sbx.is_running() is True
    assert sbx.pause() is True
    assert sbx.is_running() is False
    message = refused_while_paused(sbx)
    assert state_of(sbx.sandbox_id) == "paused"
    frozen = stands_still(sbx)
    # Many at once: none resumes it.
    errs = []
    threads = [threading.Thread(target=lambda: errs.append(refused_while_paused(sbx)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errs) == 4, errs
    assert state_of(sbx.sandbox_id) == "paused"
    assert from_host(sbx) == frozen, (from_host(sbx), frozen)

    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert again.is_running() is True
    assert state_of(sbx.sandbox_id) == "running"
    after = eventually(lambda: (lambda v: v if v[1] > frozen[1] else None)(in_sandbox(again)),
                       "the counter continues")
    assert after[0] == pid, (after, pid)
    sbx.kill()
    result(sandbox=sbx.sandbox_id, message=message)


@case
def paused_at_timeout_then_auto_resumed():
    """on_timeout=pause + auto_resume: the timeout pauses it (frozen, not
    killed); its files and a background process survive; a data-plane
    request resumes it."""
    sbx = Sandbox.create(timeout=300, lifecycle=AUTO_RESUME)
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
    sbx.files.write("/home/user/kept.txt", "still here")
    pid = start_counter(sbx)
    # Set up first, then a short timeout: nothing above races its end.
    sbx.set_timeout(2)
    wait_paused(sbx.sandbox_id)
    frozen = stands_still(sbx)
    assert frozen[0] == pid, (frozen, pid)
    assert listed_state(sbx.sandbox_id)[1] == ["paused"], listed_state(sbx.sandbox_id)

    # A data-plane request resumes it, memory and files intact.
    assert sbx.files.read("/home/user/kept.txt") == "still here"
    assert state_of(sbx.sandbox_id) == "running"
    after = eventually(lambda: (lambda v: v if v[1] > frozen[1] else None)(in_sandbox(sbx)),
                       "the counter continues")
    assert after[0] == pid, (after, pid)
    sbx.kill()
    result(sandbox=sbx.sandbox_id, pid=pid, frozen=frozen[1], after=after[1])


@case
def paused_at_timeout_stays_paused():
    """on_timeout=pause without auto_resume: paused at its end, and
    data-plane requests leave it paused; connect() resumes it."""
    sbx = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause"})
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
    sbx.files.write("/home/user/kept.txt", "still here")
    pid = start_counter(sbx)
    # Set up first, then a short timeout: nothing above races its end.
    sbx.set_timeout(2)
    wait_paused(sbx.sandbox_id)
    frozen = stands_still(sbx)
    assert sbx.is_running() is False
    refused_while_paused(sbx)
    assert state_of(sbx.sandbox_id) == "paused"
    assert from_host(sbx) == frozen, (from_host(sbx), frozen)

    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert again.files.read("/home/user/kept.txt") == "still here"
    after = eventually(lambda: (lambda v: v if v[1] > frozen[1] else None)(in_sandbox(again)),
                       "the counter continues")
    assert after[0] == pid, (after, pid)
    sbx.kill()
    result(sandbox=sbx.sandbox_id)


@case
def paused_outlives_its_timeout():
    sbx = Sandbox.create(timeout=3)
    assert sbx.pause() is True
    time.sleep(6)  # twice its timeout
    status, got = api("GET", f"/sandboxes/{sbx.sandbox_id}")
    assert status == 200 and got["state"] == "paused", (status, got)
    status, body = api("POST", f"/sandboxes/{sbx.sandbox_id}/resume", {"timeout": 60})
    assert status == 201, (status, body)
    assert body["sandboxID"] == sbx.sandbox_id, body
    code, out, _, _ = run(sbx, "echo alive")
    assert code == 0 and out.strip() == "alive", (code, out)
    sbx.kill()
    result(sandbox=sbx.sandbox_id)


# Filesystem-only pauses (keep_memory=False): processes stop and are gone,
# files stay, a resume cold-boots the sandbox.

def boot_id(sbx):
    got = sbx.files.read("/proc/sys/kernel/random/boot_id").strip()
    assert len(got) == 36, got
    return got


def host_procs(sbx_id):
    """Host pids of the sandbox's processes: those in its cgroups."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            groups = open(f"/proc/{p}/cgroup").read()
        except OSError:
            continue
        if sbx_id in groups:
            found.append(int(p))
    return found


def counters(sbx):
    """The counter's processes inside the sandbox (by their command line)."""
    code, out, err, _ = run(sbx, "grep -l 'count[.]new' /proc/[0-9]*/cmdline || true")
    assert code == 0, (code, out, err)
    return out.split()


def kept_dir(sbx_id):
    """The sandbox's directory on the node (its kept disk image in it)."""
    return os.path.join(f"/proc/{node_pid()}/root", NODE_DATA.lstrip("/"), "sandboxes", sbx_id)


def cold_booted(sbx, again, before):
    """After a filesystem-only pause and connect(): same sandbox, same
    token, its files kept, a new boot id, its old processes gone and new
    commands run."""
    assert again.sandbox_id == sbx.sandbox_id
    assert again.is_running() is True
    assert state_of(sbx.sandbox_id) == "running"
    # The old handle works too: the same envd access token.
    assert sbx.files.read("/home/user/kept.txt") == "still here"
    assert again.files.read("/tmp/count") != ""
    after = boot_id(again)
    assert after != before, (after, before)
    assert counters(again) == [], counters(again)
    code, out, _, _ = run(again, "echo alive")
    assert code == 0 and out.strip() == "alive", (code, out)
    assert eventually(lambda: host_procs(sbx.sandbox_id), "the rebooted sandbox's processes")
    return after


@case
def filesystem_only_pause_and_reboot():
    host_boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    sbx = Sandbox.create(timeout=300)
    before = boot_id(sbx)
    assert before != host_boot, "the sandbox shows the host's boot id"
    assert boot_id(sbx) == before, "the boot id changed within one boot"
    sbx.files.write("/home/user/kept.txt", "still here")
    start_counter(sbx)
    assert counters(sbx), "the counter runs"
    assert eventually(lambda: host_procs(sbx.sandbox_id), "the sandbox's processes on the host")

    assert sbx.pause(keep_memory=False) is True
    assert sbx.is_running() is False
    assert state_of(sbx.sandbox_id) == "paused"
    assert listed_state(sbx.sandbox_id) == ([], ["paused"], []), listed_state(sbx.sandbox_id)
    # Its processes are gone from the host; its disk is kept.
    eventually(lambda: host_procs(sbx.sandbox_id) == [], "the sandbox's processes end")
    assert os.path.isfile(os.path.join(kept_dir(sbx.sandbox_id), "disk.img"))
    message = refused_while_paused(sbx)
    # Pausing again: 409 (False), either way.
    assert sbx.pause(keep_memory=False) is False
    assert sbx.pause() is False

    t0 = time.monotonic()
    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    resume_ms = (time.monotonic() - t0) * 1000
    after = cold_booted(sbx, again, before)

    # Twice over: each boot its own boot id; then paused with its memory.
    assert again.pause(keep_memory=False) is True
    eventually(lambda: host_procs(sbx.sandbox_id) == [], "the sandbox's processes end")
    status, body = api("POST", f"/sandboxes/{sbx.sandbox_id}/resume", {"timeout": 60})
    assert status == 201, (status, body)
    third = boot_id(sbx)
    assert third not in (before, after), (third, before, after)
    assert sbx.files.read("/home/user/kept.txt") == "still here"
    assert sbx.pause() is True
    assert Sandbox.connect(sbx.sandbox_id, timeout=300).is_running()
    assert boot_id(sbx) == third, "a memory-kept pause does not reboot"
    sbx.kill()
    result(sandbox=sbx.sandbox_id, message=message, resume_ms=round(resume_ms, 1))


@case
def filesystem_paused_is_not_auto_resumed():
    """Created with auto_resume, then paused filesystem-only: requests do
    not cold-boot it (E2B's rule), they fail and it stays paused; connect()
    does."""
    sbx = Sandbox.create(timeout=300, lifecycle=AUTO_RESUME)
    before = boot_id(sbx)
    sbx.files.write("/home/user/kept.txt", "still here")
    assert sbx.pause(keep_memory=False) is True
    message = refused_while_paused(sbx)
    assert "filesystem-only" in message, message
    errs = []
    threads = [threading.Thread(target=lambda: errs.append(refused_while_paused(sbx)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errs) == 4, errs
    assert state_of(sbx.sandbox_id) == "paused"
    assert host_procs(sbx.sandbox_id) == []
    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert again.files.read("/home/user/kept.txt") == "still here"
    assert boot_id(again) != before
    sbx.kill()
    result(sandbox=sbx.sandbox_id, message=message)


@case
def kill_a_filesystem_paused_sandbox():
    sbx = Sandbox.create(timeout=300)
    sbx.files.write("/home/user/kept.txt", "still here")
    assert sbx.pause(keep_memory=False) is True
    kept = kept_dir(sbx.sandbox_id)
    assert os.path.isfile(os.path.join(kept, "disk.img"))
    sbx.kill()
    status, _ = api("GET", f"/sandboxes/{sbx.sandbox_id}")
    assert status == 404, status
    assert not os.path.exists(kept), os.listdir(kept)
    _, paused = api("GET", "/v2/sandboxes?state=paused")
    assert [s for s in paused if s["sandboxID"] == sbx.sandbox_id] == [], paused
    result(sandbox=sbx.sandbox_id)


@case
def auto_pause_filesystem_only_at_timeout():
    """on_timeout=pause with keep_memory=False: the timeout pauses it
    filesystem-only; connect() cold-boots it."""
    sbx = Sandbox.create(timeout=300,
                         lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}})
    assert sbx.get_info().lifecycle["on_timeout"] == "pause", sbx.get_info().lifecycle
    before = boot_id(sbx)
    sbx.files.write("/home/user/kept.txt", "still here")
    start_counter(sbx)
    assert eventually(lambda: host_procs(sbx.sandbox_id), "the sandbox's processes on the host")
    # Set up first, then a short timeout: nothing above races its end.
    sbx.set_timeout(2)
    wait_paused(sbx.sandbox_id)
    eventually(lambda: host_procs(sbx.sandbox_id) == [], "the sandbox's processes end")
    assert sbx.is_running() is False
    refused_while_paused(sbx)
    assert state_of(sbx.sandbox_id) == "paused"

    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    cold_booted(sbx, again, before)
    sbx.kill()
    result(sandbox=sbx.sandbox_id)


if __name__ == "__main__":
    try:
        CASES[sys.argv[1]]()
    finally:
        # A failed case must not leave a frozen sandbox behind: frozen
        # processes outlive a killed node (they cannot act on its death).
        _, left = api("GET", "/v2/sandboxes?state=running,paused")
        for s in left or []:
            api("DELETE", f"/sandboxes/{s['sandboxID']}")
