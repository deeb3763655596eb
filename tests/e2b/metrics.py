"""Sandbox metrics as a user of the unmodified `e2b` Python SDK sees them
through a gateway, on the `isolated` runtime (real cgroups): a sandbox
burning CPU shows a higher `cpu_used_pct` than an idle one, memory it
allocates shows in `mem_used`, a file it writes in `disk_used`; `start`/
`end` filter; another team's sandbox is not found; the multi-sandbox form
answers only the ids asked for (and only the team's); a paused sandbox
keeps its samples and gets no new ones until it is resumed. On the
`process` runtime, what it can report without cgroups.

Run by `crates/warren/tests/metrics.rs` (nodes sample every second), one
case per invocation:

    python metrics.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and OTHER_API_KEY (a key of
another team). Prints one JSON line of facts (`RESULT {...}`); exits
non-zero on a failed assertion.
"""

import datetime
import json
import os
import sys
import time

from e2b import Sandbox, SandboxNotFoundException

from common import http, result, run

API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["OTHER_API_KEY"]
MIB = 1 << 20


def eventually(fn, what, tries=600, pause=0.1):
    last = None
    for _ in range(tries):
        last = fn()
        if last:
            return last
        time.sleep(pause)
    raise AssertionError(f"{what}: never happened (last: {last!r})")


def api(path, key=API_KEY):
    status, _, raw = http("GET", path, {"X-API-Key": key})
    return status, (json.loads(raw) if raw else None)


def since(sbx, t):
    """The samples taken at Unix second `t` or later."""
    return [m for m in sbx.get_metrics() if m.timestamp.timestamp() >= t]


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def usage_shows_in_samples():
    idle = Sandbox.create(timeout=300)
    busy = Sandbox.create(timeout=300)
    first = eventually(busy.get_metrics, "a first sample")[-1]
    assert first.mem_total > 0 and first.disk_total > 0 and first.cpu_count >= 1, first

    # Burn one CPU, hold 100 MiB, write 50 MiB.
    busy.commands.run("yes > /dev/null", background=True)
    busy.commands.run("python3 -c 'import time; b = b\"x\" * (100 << 20); time.sleep(3600)'",
                      background=True)
    code, _, err, _ = run(busy, "head -c 50M /dev/urandom > /home/user/big && sync")
    assert code == 0, err
    # Samples wholly after all that (nodes sample every second): one
    # whose interval began after it.
    t0 = int(time.time()) + 2
    after = eventually(
        lambda: (lambda v: v if len(v) >= 3
                 and max(m.mem_used for m in v) >= first.mem_used + 90 * MIB
                 and max(m.disk_used for m in v) >= first.disk_used + 45 * MIB
                 else None)(since(busy, t0)),
        "busy samples showing the CPU, memory and disk used", tries=1200)
    calm = eventually(lambda: (lambda v: v if len(v) >= 3 else None)(since(idle, t0)),
                      "idle samples over the same time")
    busy_pct = sum(m.cpu_used_pct for m in after) / len(after)
    idle_pct = sum(m.cpu_used_pct for m in calm) / len(calm)
    # One busy CPU of two is 50%; far less when the host is loaded (the
    # sandbox then gets its share of the host's CPUs, no more), but always
    # well above a sandbox doing nothing.
    assert busy_pct >= 2 and busy_pct > 5 * idle_pct + 1, (busy_pct, idle_pct, after, calm)
    last = after[-1]
    assert 0 <= last.cpu_used_pct <= 100, last
    assert last.mem_used <= last.mem_total and last.disk_used <= last.disk_total, last
    idle.kill()
    busy.kill()
    result(busy_pct=round(busy_pct, 2), idle_pct=round(idle_pct, 2),
           cpu_count=last.cpu_count, mem_before=first.mem_used, mem_after=last.mem_used,
           mem_total=last.mem_total, mem_cache=last.mem_cache,
           disk_before=first.disk_used, disk_after=last.disk_used, disk_total=last.disk_total)


@case
def windows_teams_and_many():
    created = datetime.datetime.now(datetime.timezone.utc)
    a = Sandbox.create(timeout=300)
    b = Sandbox.create(timeout=300)
    eventually(lambda: a.get_metrics() and b.get_metrics(), "first samples")

    # start/end: the samples inside; none before the sandbox existed.
    now = datetime.datetime.now(datetime.timezone.utc)
    inside = a.get_metrics(start=created, end=now)
    assert inside, "no sample between the create and now"
    for m in inside:
        assert int(created.timestamp()) <= m.timestamp.timestamp() < int(now.timestamp()) + 1, m
    assert a.get_metrics(start=created - datetime.timedelta(hours=1),
                         end=created - datetime.timedelta(minutes=30)) == []
    later = a.get_metrics(start=now + datetime.timedelta(hours=1))
    assert later == [], later
    # Bad parameters: 400 naming the problem.
    for query, word in [("start=abc", "start"), ("end=-1", "end"), ("start=5&end=4", "after")]:
        status, body = api(f"/sandboxes/{a.sandbox_id}/metrics?{query}")
        assert status == 400 and word in body["message"], (query, status, body)

    # Another team's sandbox is not found, exactly as an unknown one.
    status, body = api(f"/sandboxes/{a.sandbox_id}/metrics", key=OTHER_KEY)
    assert status == 404, (status, body)
    try:
        Sandbox.get_metrics(a.sandbox_id, api_key=OTHER_KEY)
        raise AssertionError("another team read the metrics")
    except SandboxNotFoundException:
        pass
    status, _ = api("/sandboxes/nosuchsandbox0000/metrics")
    assert status == 404, status

    # The multi form: only the ids asked for, only the team's.
    status, many = api(f"/sandboxes/metrics?sandbox_ids={a.sandbox_id},nosuchsandbox0000")
    assert status == 200 and list(many["sandboxes"]) == [a.sandbox_id], (status, many)
    got = many["sandboxes"][a.sandbox_id]
    for field in ["timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed",
                  "memTotal", "memCache", "diskUsed", "diskTotal"]:
        assert field in got, (field, got)
    status, both = api(f"/sandboxes/metrics?sandbox_ids={a.sandbox_id}%2C{b.sandbox_id}")
    assert status == 200 and sorted(both["sandboxes"]) == sorted([a.sandbox_id, b.sandbox_id]), both
    status, theirs = api(f"/sandboxes/metrics?sandbox_ids={a.sandbox_id}", key=OTHER_KEY)
    assert status == 200 and theirs["sandboxes"] == {}, (status, theirs)
    too_many = ",".join(f"s{i}" for i in range(101))
    for query, word in [("", "sandbox_ids"), (f"sandbox_ids={too_many}", "at most 100"),
                        ("sandbox_ids=a,a", "twice"), ("sandbox_ids=..%2Fetc", "invalid")]:
        status, body = api(f"/sandboxes/metrics?{query}")
        assert status == 400 and word in body["message"], (query, status, body)

    # Paused: its samples stay, no new ones while the sampler goes on
    # sampling the running one, new ones once resumed.
    assert a.pause() is True
    status, frozen = api(f"/sandboxes/{a.sandbox_id}/metrics")
    assert status == 200 and frozen, (status, frozen)
    seen = len(b.get_metrics())
    eventually(lambda: len(b.get_metrics()) >= seen + 3, "three more rounds of sampling")
    status, still = api(f"/sandboxes/{a.sandbox_id}/metrics")
    assert status == 200 and still == frozen, ("sampled while paused", frozen, still)
    Sandbox.connect(a.sandbox_id, timeout=300)
    eventually(lambda: len(api(f"/sandboxes/{a.sandbox_id}/metrics")[1]) > len(frozen),
               "samples after the resume")
    a.kill()
    b.kill()
    result(samples=len(frozen))


@case
def process_runtime():
    """No cgroups: CPU and memory from the sandbox's processes, the host's
    totals, no disk of its own."""
    sbx = Sandbox.create(timeout=120)
    m = eventually(sbx.get_metrics, "a first sample")[-1]
    assert m.cpu_count >= 1 and m.mem_total > 0 and 0 < m.mem_used < m.mem_total, m
    assert m.disk_used == 0 and m.disk_total == 0, m
    sbx.kill()
    result(mem_used=m.mem_used, mem_total=m.mem_total, cpu_count=m.cpu_count)


if __name__ == "__main__":
    try:
        CASES[sys.argv[1]]()
    finally:
        # A failed case must not leave a frozen sandbox behind.
        status, _, raw = http("GET", "/v2/sandboxes?state=running,paused",
                              {"X-API-Key": API_KEY})
        for s in (json.loads(raw) if status == 200 and raw else []):
            http("DELETE", f"/sandboxes/{s['sandboxID']}", {"X-API-Key": API_KEY})
