"""Warm pools as a user sees them: a sandbox a create takes from a node's
pool (`--warm-pool base=N`) is the sandbox a cold create makes. The
unmodified `e2b` Python SDK (and raw HTTP) through a gateway.

Run by `crates/warren/tests/pool.rs`, one case per invocation:

    python pool.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and WARREN_NODE_METRICS (the
node's /metrics) set by the Rust test. Each case asserts what it can alone
and prints one JSON line of facts (`RESULT {...}`); `facts` prints what the
Rust side compares between a cold and a pooled cluster.
"""

import concurrent.futures as futures
import json
import os
import re
import sys
import time
import urllib.request

from e2b import Sandbox

from common import http, result, run

SANDBOX_URL = os.environ["E2B_SANDBOX_URL"]
METRICS = os.environ["WARREN_NODE_METRICS"]


def metric(name, **labels):
    """The node's metric `name` with `labels` (0 when absent)."""
    text = urllib.request.urlopen(METRICS, timeout=10).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if m and m.group(1) == name and set(m.group(2).split(",")) == set(want.split(",")):
            return float(m.group(3))
    return 0.0


def taken():
    return metric("warren_node_warm_pool_takes_total", template="base", outcome="taken")


def ready():
    return metric("warren_node_warm_pool_ready", template="base")


def wait_for(what, check, within=120):
    deadline = time.time() + within
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {within}s: {what}")


def must(sbx, cmd, user=None):
    code, out, err, _ = run(sbx, cmd, user=user)
    assert code == 0, f"{cmd!r} exited {code}:\n{out}\n{err}"
    return out


def create(**kw):
    return Sandbox.create(template="base", timeout=300, **kw)


# What a sandbox shows, as `user` and as its root: environment, identity,
# name, resolver, network interfaces, limits, files, pid 1.
SHOW = [
    ("env", "env | sort", None),
    ("id", "id", None),
    ("root_id", "id", "root"),
    ("hostname", "hostname; cat /etc/hostname /etc/hosts", None),
    ("resolv", "cat /etc/resolv.conf", None),
    ("links", "ip -o link | awk '{print $2}'", None),
    ("ulimits", "ulimit -a", None),
    ("home", "ls -la /home/user | awk '{print $1, $3, $4, $NF}'", None),
    ("tmp", "ls -la /tmp | awk '{print $1, $3, $4, $NF}'", None),
    ("disk", "df -B1 --output=size / | tail -1", None),
    ("pid1", "tr '\\0' ' ' < /proc/1/cmdline", None),
    ("mounts", "awk '{print $5, $9}' /proc/self/mountinfo | sort", None),
    ("cwd", "pwd", None),
]


def show(sbx):
    """The facts of SHOW, the sandbox's id replaced by <id>."""
    facts = {}
    for key, cmd, user in SHOW:
        facts[key] = must(sbx, cmd, user=user).replace(sbx.sandbox_id, "<id>")
    info = sbx.get_info()
    facts["metadata"] = info.metadata
    facts["template"] = info.template_id
    facts["lifetime_s"] = round((info.end_at - info.started_at).total_seconds() / 10) * 10
    # Its token: envd refuses a request without it, answers with it.
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    path = "/files?path=/etc/hostname&username=user"
    without, _, _ = http("GET", path, headers=headers, base=SANDBOX_URL)
    token = next(v for k, v in vars(sbx).items() if k.endswith("envd_access_token"))
    with_token, _, body = http("GET", path, base=SANDBOX_URL,
                               headers={**headers, "X-Access-Token": token})
    facts["token"] = [without, with_token, body.decode().strip() == sbx.sandbox_id]
    return facts


def facts():
    """Two sandboxes, as a user makes them: one with variables, metadata
    and the default network; one without internet access."""
    a = create(envs={"GREETING": "hello", "PATH_EXTRA": "/opt/x"}, metadata={"who": "test"})
    b = create(allow_internet_access=False)
    try:
        out = {"default": show(a), "no_internet": show(b)}
        # The network policy holds: without internet, nothing but lo.
        assert out["no_internet"]["links"].split() == ["lo:"], out["no_internet"]["links"]
        assert out["default"]["links"].split() == ["lo:", "tap0:"], out["default"]["links"]
        assert "GREETING=hello" in out["default"]["env"], out["default"]["env"]
        assert out["default"]["token"] == [401, 200, True], out["default"]["token"]
        result(**out)
    finally:
        a.kill()
        b.kill()


def many_at_once():
    """Eight creates at once on a pool of two: every sandbox is its own
    (its name, a file it writes), none handed to two creates."""
    def one(i):
        sbx = create(envs={"N": str(i)})
        must(sbx, f"echo {i} > /tmp/mine")
        return sbx
    with futures.ThreadPoolExecutor(8) as pool:
        sandboxes = list(pool.map(one, range(8)))
    try:
        ids = [s.sandbox_id for s in sandboxes]
        assert len(set(ids)) == 8, ids
        for i, s in enumerate(sandboxes):
            assert must(s, "hostname").strip() == s.sandbox_id
            assert must(s, "cat /tmp/mine; echo $N").split() == [str(i), str(i)]
        result(ids=ids, taken=taken())
    finally:
        for s in sandboxes:
            s.kill()


def rebuild():
    """The template's record changes (WARREN_RECORD, a record file of the
    node's private store): pooled sandboxes of the old one are never handed
    out, and the pool refills from the new one."""
    record_path = os.environ["WARREN_RECORD"]
    wait_for("the pool to fill", lambda: ready() >= 1)
    sbx = create()
    try:
        assert "BUILD=2" not in must(sbx, "env")
    finally:
        sbx.kill()
    wait_for("the pool to refill", lambda: ready() >= 1)
    record = json.load(open(record_path))
    record["defaults"].setdefault("env", {})["BUILD"] = "2"
    tmp = record_path + ".tmp"
    json.dump(record, open(tmp, "w"))
    os.rename(tmp, record_path)
    # Every create from here sees the new record; at last one taken from
    # the pool does too (the stale one stopped, a new one started).
    pooled_new = False
    tries = 0
    while not pooled_new:
        tries += 1
        assert tries < 60, "no pooled sandbox of the new record"
        before = taken()
        sbx = create()
        try:
            assert "BUILD=2" in must(sbx, "env"), "a sandbox of the old record"
            pooled_new = taken() > before
        finally:
            sbx.kill()
        if not pooled_new:
            wait_for("the pool to refill", lambda: ready() >= 1)
    result(tries=tries)


def capacity():
    """--capacity 2 with a pool of 2: the pool holds the node's spare room;
    two creates take it, a third is refused, a delete makes room again."""
    wait_for("the pool to fill", lambda: ready() == 2)
    a, b = create(), create()
    try:
        assert taken() == 2, taken()
        assert ready() == 0, ready()
        refused = None
        try:
            create().kill()
        except Exception as e:  # the SDK's error for a full cluster
            refused = repr(e)
        assert refused is not None, "a third sandbox was created on a full node"
    finally:
        a.kill()
    wait_for("the pool to take the room back", lambda: ready() == 1)
    b.kill()
    wait_for("the pool to fill again", lambda: ready() == 2)
    result(refused=refused)


CASES = {f.__name__: f for f in (facts, many_at_once, rebuild, capacity)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
