"""Snapshots as a user of the unmodified `e2b` Python SDK sees them through
a gateway: `create_snapshot`, `list_snapshots`, `delete_snapshot`, and
`Sandbox.create(snapshot_id)`.

Run by `crates/warren/tests/snapshots.rs`, one case per invocation:

    python snapshots.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (team A) and
E2B_API_KEY_B (another team). Prints one JSON line of facts
(`RESULT {...}`); exits non-zero on a failed assertion.
"""

import json
import os
import sys
from e2b import Sandbox, Template

from common import http, result, run

KEY_B = os.environ.get("E2B_API_KEY_B", "")
NOTE = "/home/user/note.txt"

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def api(method, path, body=None, key=None):
    headers = {"X-API-Key": key or os.environ["E2B_API_KEY"]}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    status, hdrs, raw = http(method, path, headers, data)
    try:
        return status, hdrs, json.loads(raw) if raw else None
    except ValueError:
        return status, hdrs, raw


def node_of(sbx_id):
    status, _, got = api("GET", f"/sandboxes/{sbx_id}")
    assert status == 200, (status, got)
    return got["clientID"]


def every_snapshot(**kw):
    """Every page of `Sandbox.list_snapshots(**kw)`, in order."""
    pager = Sandbox.list_snapshots(**kw)
    out = []
    while pager.has_next:
        out.extend(s.snapshot_id for s in pager.next_items())
    return out


def refused(fn, status):
    """`fn()` raises, and the error says `status`; returns its message."""
    try:
        fn()
    except Exception as e:  # the SDK's classes differ by status
        got = getattr(e, "status_code", None)
        assert got in (None, status), (got, status, e)
        return str(e)
    raise AssertionError(f"expected a {status} refusal")


@case
def files_listing_and_teams():
    sbx = Sandbox.create("base", timeout=300)
    sbx.files.write(NOTE, "from the original")
    # A file of the template removed in the sandbox stays removed in its
    # snapshot (an overlay whiteout carried in the layer).
    code, out, err, _ = run(sbx, "sudo rm /etc/debian_version && sudo mkdir -p /opt/app && echo hi | sudo tee /opt/app/x")
    assert code == 0, (code, out, err)

    snap = sbx.create_snapshot()
    sid = snap.snapshot_id
    assert sid and sid in snap.names, snap

    # Two sandboxes from one snapshot: both have the files, each its own copy.
    s1 = Sandbox.create(sid, timeout=300)
    s2 = Sandbox.create(sid, timeout=300)
    for s in (s1, s2):
        assert s.files.read(NOTE) == "from the original"
        assert not s.files.exists("/etc/debian_version")
        assert s.files.read("/opt/app/x") == "hi\n"
        code, out, _, _ = run(s, "whoami && stat -c %U /home/user/note.txt")
        assert code == 0 and out.split() == ["user", "user"], out
    s1.files.write(NOTE, "changed in s1")
    sbx.files.write(NOTE, "changed in the original")
    assert s2.files.read(NOTE) == "from the original"
    assert s1.files.read(NOTE) == "changed in s1"
    assert sbx.files.read(NOTE) == "changed in the original"

    # Listed for its team, also by source sandbox.
    assert sid in every_snapshot(), every_snapshot()
    assert sid in every_snapshot(sandbox_id=sbx.sandbox_id)
    assert sid not in every_snapshot(sandbox_id=s1.sandbox_id)

    # A named snapshot of a sandbox made from a snapshot (two layers), used
    # by its name.
    named = s1.create_snapshot(name="my-snap")
    assert named.snapshot_id == "my-snap" and any("my-snap" in n for n in named.names), named
    assert every_snapshot(name="my-snap") == ["my-snap"]
    assert every_snapshot(name="my-snap-does-not-exist") == []
    s3 = Sandbox.create("my-snap", timeout=300)
    assert s3.files.read(NOTE) == "changed in s1"
    assert not s3.files.exists("/etc/debian_version")

    # Pages: one at a time, nothing twice, nothing missed.
    extra = sbx.create_snapshot()
    paged = every_snapshot(limit=1)
    assert sorted(paged) == sorted({sid, "my-snap", extra.snapshot_id}), paged

    # Another team: not listed, not usable, not deletable — 404 like an
    # unknown one.
    assert every_snapshot(api_key=KEY_B) == []
    for ref in (sid, "my-snap"):
        refused(lambda: Sandbox.create(ref, api_key=KEY_B), 404)
        assert Sandbox.delete_snapshot(ref, api_key=KEY_B) is False
    status, _, body = api("DELETE", f"/templates/{sid}", key=KEY_B)
    assert status == 404, (status, body)
    # Names as `Template.exists` sees them (GET /templates/aliases/{name}):
    # the operator's templates for every team, a named snapshot for its own.
    assert Template.exists("base") is True
    assert Template.exists("base", api_key=KEY_B) is True
    assert Template.exists("my-snap") is True
    assert Template.exists("my-snap", api_key=KEY_B) is False
    assert Template.exists("no-such-template-anywhere") is False
    status, _, body = api("GET", "/templates/aliases/a%2F..%2Fb%20c")
    assert status == 400 and "not a template name" in body["message"], (status, body)
    # The other team's own snapshot called "my-snap" is its own.
    other = Sandbox.create("base", timeout=120, api_key=KEY_B)
    theirs = other.create_snapshot(name="my-snap")
    assert theirs.snapshot_id == "my-snap"
    s4 = Sandbox.create("my-snap", timeout=120, api_key=KEY_B)
    assert not s4.files.exists(NOTE)
    assert Sandbox.create("my-snap", timeout=120).files.read(NOTE) == "changed in s1"

    nodes = {
        "original": node_of(sbx.sandbox_id),
        "from_snapshot": [node_of(s.sandbox_id) for s in (s1, s2, s3)],
    }

    # Deleting a snapshot leaves the sandboxes made from it running.
    assert Sandbox.delete_snapshot(sid) is True
    assert Sandbox.delete_snapshot(sid) is False
    assert s2.files.read(NOTE) == "from the original"
    s2.files.write("/home/user/after", "still writable")
    code, out, _, _ = run(s2, "cat /home/user/after /opt/app/x")
    assert code == 0 and out == "still writablehi\n", out
    # ...and forks of them still get the snapshot's files.
    status, _, forks = api("POST", f"/sandboxes/{s2.sandbox_id}/fork", {"timeout": 60, "count": 1})
    assert status == 201 and forks[0].get("sandbox"), (status, forks)
    fork = Sandbox.connect(forks[0]["sandbox"]["sandboxID"])
    assert fork.files.read(NOTE) == "from the original"
    # A create from it now fails clearly.
    msg = refused(lambda: Sandbox.create(sid), 404)
    assert "not found" in msg, msg

    # A paused sandbox is snapshotted as it is, and stays paused.
    assert s2.pause() is not False
    frozen = Sandbox.create_snapshot(s2.sandbox_id)
    status, _, got = api("GET", f"/sandboxes/{s2.sandbox_id}")
    assert status == 200 and got["state"] == "paused", (status, got)
    s5 = Sandbox.create(frozen.snapshot_id, timeout=60)
    assert s5.files.read("/home/user/after") == "still writable"
    assert Sandbox.delete_snapshot(frozen.snapshot_id) is True

    # Operators' templates are not the API's to delete.
    status, _, body = api("DELETE", "/templates/base")
    assert status == 403, (status, body)

    for s in (named.snapshot_id, extra.snapshot_id):
        assert Sandbox.delete_snapshot(s) is True
    assert Sandbox.delete_snapshot("my-snap", api_key=KEY_B) is True
    assert every_snapshot() == [] and every_snapshot(api_key=KEY_B) == []
    assert Template.exists("my-snap") is False
    result(snapshot=sid, **nodes)


@case
def process_runtime_refuses():
    sbx = Sandbox.create("base", timeout=60)
    status, _, body = api("POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", {})
    assert status == 400, (status, body)
    assert "process runtime cannot snapshot" in body["message"], body
    msg = refused(lambda: sbx.create_snapshot(), 400)
    assert "process runtime" in msg, msg
    assert every_snapshot() == []
    sbx.kill()
    result(message=body["message"])


@case
def bounds():
    """Run with --snapshot-team-count 2 and --snapshot-team-bytes 40 MiB:
    a snapshot past the bytes is refused and not kept, a third one is
    refused, another team's is not; a deleted one makes room."""
    slow = {"request_timeout": 600}
    sbx = Sandbox.create("base", timeout=300)
    first = sbx.create_snapshot(**slow)
    code, out, err, _ = run(sbx, "head -c 60M /dev/urandom > /home/user/big", timeout=300)
    assert code == 0, (code, out, err)
    too_big = refused(lambda: sbx.create_snapshot(**slow), 429)
    assert "--snapshot-team-bytes" in too_big, too_big
    assert every_snapshot() == [first.snapshot_id], "the refused one is not kept"
    code, _, _, _ = run(sbx, "rm /home/user/big")
    assert code == 0
    second = sbx.create_snapshot(**slow)
    too_many = refused(lambda: sbx.create_snapshot(**slow), 429)
    assert "--snapshot-team-count" in too_many, too_many
    # Another team's bounds are its own.
    other = Sandbox.create("base", timeout=120, api_key=KEY_B)
    assert other.create_snapshot(**slow).snapshot_id
    # A deleted snapshot makes room.
    assert Sandbox.delete_snapshot(first.snapshot_id) is True
    third = sbx.create_snapshot(**slow)
    assert sorted(every_snapshot()) == sorted([second.snapshot_id, third.snapshot_id])
    result(bytes=too_big, count=too_many)


if __name__ == "__main__":
    try:
        CASES[sys.argv[1]]()
    finally:
        for key in filter(None, (os.environ["E2B_API_KEY"], KEY_B)):
            status, _, left = api("GET", "/v2/sandboxes?state=running,paused", key=key)
            for s in left if status == 200 else []:
                api("DELETE", f"/sandboxes/{s['sandboxID']}", key=key)
            status, _, snaps = api("GET", "/snapshots", key=key)
            for s in snaps if status == 200 else []:
                api("DELETE", f"/templates/{s['snapshotID']}", key=key)
