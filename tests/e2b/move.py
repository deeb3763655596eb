"""A filesystem-paused sandbox resumed on another node, as a user of the
unmodified `e2b` Python SDK sees it through a gateway. The steps are cases
of their own, one per invocation, because the Rust side
(`crates/warren/tests/pause.rs`) kills the sandbox's node between them and
runs some through a second gateway:

    python move.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, and SANDBOX (the sandbox's
id) for every case but `create` (and BOOT, CA: its boot id and egress CA's
digest, from `create`). Prints one JSON line of facts
(`RESULT {...}`); exits non-zero on a failed assertion. Sandboxes are left
running: the test kills them (and the cluster's end does).
"""

import json
import os
import sys
from e2b import Sandbox

from common import http, result, run

API_KEY = os.environ["E2B_API_KEY"]
FILE = "/home/user/moved.txt"
# Egress rules (inert without a network, kept all the same).
RULES = {"api.example.com": [{"transform": {"headers": {
    "Authorization": "Bearer ${e2b.secrets.move-token}"}}}]}


def api(method, path, body=None):
    headers = {"X-API-Key": API_KEY}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    status, _, raw = http(method, path, headers, data)
    return status, (json.loads(raw) if raw else None)


def described(sbx_id):
    status, got = api("GET", f"/sandboxes/{sbx_id}")
    assert status == 200, (status, got)
    return got


def boot_id(sbx):
    got = sbx.files.read("/proc/sys/kernel/random/boot_id").strip()
    assert len(got) == 36, got
    return got


def works(sbx):
    """Its file, its environment and a command, through this gateway."""
    assert sbx.files.read(FILE) == "came along", sbx.files.read(FILE)
    code, out, err, _ = run(sbx, "echo $MOVE_VAR; cat /home/user/moved.txt")
    assert code == 0, (code, out, err)
    assert out.split() == ["kept", "came", "along"], out


def offline(sbx):
    """Created without internet access: no network device but loopback
    (an open policy would give it tap0)."""
    code, out, err, _ = run(sbx, "tail -n +3 /proc/net/dev | cut -d: -f1")
    assert code == 0, (code, out, err)
    assert out.split() == ["lo"], out


def egress_ca(sbx):
    """Its egress CA as its trust store holds it: the certificate's
    digest and how many are marked in the bundle (one: its own)."""
    code, out, err, _ = run(
        sbx, "sha256sum /usr/local/share/ca-certificates/warren-egress-ca.crt | cut -c1-64; "
             "grep -c 'warren sandbox egress CA: begin' /etc/ssl/certs/ca-certificates.crt")
    assert code == 0, (code, out, err)
    digest, marked = out.split()
    assert marked == "1", out
    return digest


def create():
    sbx = Sandbox.create(timeout=300, envs={"MOVE_VAR": "kept"},
                         metadata={"purpose": "move"}, allow_internet_access=False,
                         network={"rules": RULES})
    sbx.files.write(FILE, "came along")
    works(sbx)
    offline(sbx)
    result(sandbox=sbx.sandbox_id, boot=boot_id(sbx), ca=egress_ca(sbx))


def use():
    sbx = Sandbox.connect(os.environ["SANDBOX"])
    works(sbx)
    assert described(sbx.sandbox_id)["state"] == "running"
    result(boot=boot_id(sbx))


def pause():
    sbx = Sandbox.connect(os.environ["SANDBOX"])
    assert sbx.pause(keep_memory=False) is True
    assert described(sbx.sandbox_id)["state"] == "paused"
    # The layer its pause packed is no team's template or snapshot, not
    # even its own team's.
    record = f"paused-{sbx.sandbox_id}"
    status, got = api("POST", "/sandboxes", {"templateID": record})
    assert status == 404, (status, got)
    status, got = api("GET", "/snapshots")
    assert status == 200 and record not in json.dumps(got), (status, got)
    status, got = api("GET", "/templates")
    assert status == 200 and record not in json.dumps(got), (status, got)
    result()


def resume():
    sbx_id = os.environ["SANDBOX"]
    before = os.environ["BOOT"]
    again = Sandbox.connect(sbx_id, timeout=300)
    assert again.sandbox_id == sbx_id
    assert again.is_running() is True
    got = described(sbx_id)
    assert got["state"] == "running", got
    assert got["metadata"] == {"purpose": "move"}, got
    works(again)
    # Its egress policy came along, its rules and its CA (the same one).
    offline(again)
    assert got["network"]["rules"] == RULES, got
    assert egress_ca(again) == os.environ["CA"]
    after = boot_id(again)
    assert after != before, (after, before)
    result(boot=after)


CASES = {"create": create, "use": use, "pause": pause, "resume": resume}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
