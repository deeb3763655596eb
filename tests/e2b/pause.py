"""Pause and resume as a user of the unmodified `e2b` Python SDK sees them
through a gateway, on the `isolated` runtime: a paused sandbox's processes
stop (a counter a background process writes stops advancing, read from the
host side), listings say `paused`, it outlives its timeout while paused,
and `Sandbox.connect` (or any data-plane request) resumes it with its memory
intact (the same process goes on counting from where it stopped).

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


@case
def freeze_and_resume():
    sbx = Sandbox.create(timeout=300)
    sbx.commands.run(COUNTER, background=True)
    eventually(lambda: run(sbx, "test -s /tmp/count")[0] == 0, "the counter starts")
    pid, _ = in_sandbox(sbx)
    eventually(lambda: in_sandbox(sbx)[1] >= 10, "the counter counts")

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


if __name__ == "__main__":
    try:
        CASES[sys.argv[1]]()
    finally:
        # A failed case must not leave a frozen sandbox behind: frozen
        # processes outlive a killed node (they cannot act on its death).
        _, left = api("GET", "/v2/sandboxes?state=running,paused")
        for s in left or []:
            api("DELETE", f"/sandboxes/{s['sandboxID']}")
