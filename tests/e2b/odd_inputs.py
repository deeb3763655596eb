"""Odd inputs, sent the way a client sends them: each gets a clear 4xx naming
the problem (never a 200 that ignored it, a 500 or a 502), and the sandbox
keeps working. Also: a client's API key never reaches a sandbox.

Run by `crates/warren/tests/odd_inputs.rs`, one case per invocation:

    python odd_inputs.py CASE

with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set by the Rust test. Each
case asserts what a client sees and prints one `RESULT {json}` line of facts
for the Rust side; it exits non-zero on a failed assertion.
"""

import json
import os
import sys
import time
import urllib.parse
from datetime import datetime, timedelta, timezone
from http.client import HTTPConnection

from e2b import Sandbox, SandboxQuery

from common import http, ok, result, run

API_KEY = os.environ["E2B_API_KEY"]
SANDBOX_URL = os.environ["E2B_SANDBOX_URL"]
# The kernel's largest `NAME=value` (MAX_ARG_STRLEN, 131072, with its NUL).
VAR_LIMIT = 131071
# envd's largest Connect message.
MESSAGE_LIMIT = 8 * 1024 * 1024

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def envd_headers(sbx, port=49983):
    """Headers for a raw request to the sandbox's envd through the gateway."""
    status, _, raw = http("GET", f"/sandboxes/{sbx.sandbox_id}", {"X-API-Key": API_KEY})
    assert status == 200, (status, raw)
    return {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "E2b-Sandbox-Port": str(port),
        "X-Access-Token": json.loads(raw)["envdAccessToken"],
    }


def chunked(path, headers, chunks):
    """A POST whose body is streamed chunked (no Content-Length)."""
    url = urllib.parse.urlsplit(SANDBOX_URL)
    conn = HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", path, body=iter(chunks), headers=headers, encode_chunked=True)
    resp = conn.getresponse()
    status, body = resp.status, resp.read()
    conn.close()
    return status, body


def raises(fn, *fragments):
    """Runs `fn`, which must raise; returns the message, which must contain
    every fragment and must not be a server error."""
    try:
        fn()
    except Exception as e:  # the SDK's exception classes vary by status
        message = f"{type(e).__name__}: {e}"
        for f in fragments:
            assert f in message, (f, message)
        # The SDK words an unmapped HTTP status as "500: ..." and an
        # unmapped Connect code as "Code.INTERNAL: ...".
        assert not str(e).startswith(("500", "502", "503")), message
        assert "Code.INTERNAL" not in message and "Unreachable" not in message, message
        return message
    raise AssertionError(f"expected an error containing {fragments}")


@case
def started_after():
    key = {"X-API-Key": API_KEY}
    refused = {}
    for path in ("/v2/sandboxes", "/sandboxes"):
        for bad in ("yesterday", "", "1700000000", "2024-01-01", "2024-01-01T00:00:00",
                    "2024-02-31T00:00:00Z", "2024-01-01T00:00:99Z"):
            q = urllib.parse.quote(bad)
            status, _, raw = http("GET", f"{path}?startedAfter={q}", key)
            assert status == 400, (path, bad, status, raw)
            assert b"startedAfter" in raw, raw
            refused[f"{path}?startedAfter={bad}"] = status
    before = datetime.now(timezone.utc) - timedelta(minutes=5)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    sbx = Sandbox.create(timeout=120)

    # Through the SDK (Python's isoformat: microseconds and an offset).
    def listed(after):
        return {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(started_after=after)).next_items()}

    assert sbx.sandbox_id in listed(before)
    assert sbx.sandbox_id not in listed(later)
    # v1 applies it as v2 does.
    status, _, raw = http("GET", "/sandboxes?startedAfter=" + urllib.parse.quote(later.isoformat()), key)
    assert status == 200 and json.loads(raw) == [], (status, raw)
    status, _, raw = http("GET", "/sandboxes?startedAfter=" + urllib.parse.quote(before.isoformat()), key)
    assert status == 200 and sbx.sandbox_id in {s["sandboxID"] for s in json.loads(raw)}, raw
    sbx.kill()
    result(refused=refused)


@case
def env_vars():
    at_limit = "x" * (VAR_LIMIT - len("BIG="))
    over = "x" * 131072
    # Create: a raw request and the SDK, both told the limit.
    body = json.dumps({"templateID": "base", "envVars": {"BIG": over}}).encode()
    status, _, raw = http("POST", "/sandboxes", {"X-API-Key": API_KEY, "Content-Type": "application/json"}, body)
    assert status == 400, (status, raw[:300])
    assert b"BIG" in raw and str(VAR_LIMIT).encode() in raw, raw[:300]
    create_error = raises(lambda: Sandbox.create(timeout=60, envs={"BIG": over}), str(VAR_LIMIT))
    # Just at the limit, at create and for a command.
    sbx = Sandbox.create(timeout=120, envs={"BIG": at_limit})
    code, out, _, _ = run(sbx, "echo ${#BIG}")
    assert code == 0 and out.strip() == str(len(at_limit)), (code, out)
    r = sbx.commands.run("echo ${#MINE}", envs={"MINE": "y" * (VAR_LIMIT - len("MINE="))})
    assert r.stdout.strip() == str(VAR_LIMIT - len("MINE=")), r.stdout
    # A command's variable one byte too long: invalid argument, named.
    run_error = raises(lambda: sbx.commands.run("true", envs={"BIG": over}),
                       "InvalidArgument", '"BIG"', str(VAR_LIMIT))
    # Each fits, all together do not (E2BIG): invalid argument too.
    many = {f"V{i}": "z" * 125_000 for i in range(56)}
    together_error = raises(lambda: sbx.commands.run("true", envs=many),
                            "InvalidArgument", "too large together")
    assert ok(sbx)
    sbx.kill()
    result(create=create_error, run=run_error, together=together_error)


@case
def read_only_paths():
    sbx = Sandbox.create(timeout=120)
    # A read-only mount inside the sandbox (the node binds envd's binary so).
    code, out, _, _ = run(sbx, "awk '$4 ~ /(^|,)ro(,|$)/ && $2 != \"/\" {print $2}' /proc/self/mounts")
    mounts = out.split()
    assert code == 0 and mounts, out
    path = mounts[0]
    # Upload through the SDK, then raw: 403 naming it.
    upload_error = raises(lambda: sbx.files.write(path, "overwrite"), "read-only")
    headers = envd_headers(sbx)
    headers["Content-Type"] = "application/octet-stream"
    q = urllib.parse.urlencode({"path": path, "username": "root"})
    status, _, raw = http("POST", f"/files?{q}", headers, b"overwrite", base=SANDBOX_URL)
    assert status == 403, (status, raw)
    message = json.loads(raw)["message"]
    assert "read-only" in message and path in message, message
    # Filesystem RPCs on it: 4xx codes, never internal.
    remove_error = raises(lambda: sbx.files.remove(path, user="root"), "FAILED_PRECONDITION", "busy")
    sbx.files.write("/home/user/other", "x")
    move_error = raises(lambda: sbx.files.rename("/home/user/other", path, user="root"))
    # Nothing changed, and the sandbox works.
    code, _, _, _ = run(sbx, f"test -s {path}")
    assert code == 0, path
    assert ok(sbx)
    sbx.kill()
    result(path=path, upload_status=status, upload=upload_error, remove=remove_error, move=move_error)


@case
def oversized_unary():
    sbx = Sandbox.create(timeout=120)
    headers = envd_headers(sbx)
    headers.update({"Content-Type": "application/proto", "Connect-Protocol-Version": "1"})
    # 9 MiB with a Content-Length: refused before it is read.
    status, _, raw = http("POST", "/process.Process/SendInput", headers, b"\0" * (9 << 20),
                          base=SANDBOX_URL, timeout=60)
    assert status == 429, (status, raw[:300])
    err = json.loads(raw)
    assert err["code"] == "resource_exhausted" and str(MESSAGE_LIMIT) in err["message"], err
    sized = err["message"]
    # 32 MiB chunked: refused by Connect part-way; the answer still arrives.
    status, raw = chunked("/process.Process/SendInput", headers, (b"\0" * (1 << 20) for _ in range(32)))
    assert status == 429, (status, raw[:300])
    err = json.loads(raw)
    assert err["code"] == "resource_exhausted" and "limit" in err["message"], err
    streamed = err["message"]
    # The SDK: 9 MiB of stdin in one call.
    cat = sbx.commands.run("cat", background=True, stdin=True)
    sdk_error = raises(lambda: sbx.commands.send_stdin(cat.pid, "x" * (9 << 20)), str(MESSAGE_LIMIT))
    # Smaller input still flows to the same process.
    sbx.commands.send_stdin(cat.pid, "still listening\n")
    sbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "still listening\n"
    assert ok(sbx)
    sbx.kill()
    result(sized=sized, streamed=streamed, sdk=sdk_error)


@case
def proc_files():
    sbx = Sandbox.create(timeout=120)
    status = sbx.files.read("/proc/self/status")
    assert status.startswith("Name:") and "\nPid:" in status, status[:200]
    cpuinfo = sbx.files.read("/proc/cpuinfo")
    assert "processor" in cpuinfo, cpuinfo[:200]
    meminfo = sbx.files.read("/proc/meminfo")
    assert "MemTotal:" in meminfo, meminfo[:200]
    # A regular file: exactly its bytes, with its length.
    data = os.urandom(100_000)
    sbx.files.write("/home/user/blob.bin", data)
    assert bytes(sbx.files.read("/home/user/blob.bin", format="bytes")) == data
    q = urllib.parse.urlencode({"path": "/home/user/blob.bin", "username": "user"})
    code, hdrs, body = http("GET", f"/files?{q}", envd_headers(sbx), base=SANDBOX_URL)
    assert code == 200 and body == data, code
    assert {k.lower(): v for k, v in hdrs.items()}.get("content-length") == "100000", hdrs
    # A device has no end: refused, named.
    device_error = raises(lambda: sbx.files.read("/dev/zero"), "not a regular file")
    assert ok(sbx)
    sbx.kill()
    result(status_bytes=len(status), cpuinfo_bytes=len(cpuinfo), device=device_error)


ECHO_SERVER = """\
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()
"""


@case
def api_key_stripped():
    sbx = Sandbox.create(timeout=120)
    sbx.files.write("/home/user/echo.py", ECHO_SERVER)
    sbx.commands.run("exec python3 /home/user/echo.py", background=True)
    marker = f"probe-{os.getpid()}-{time.time_ns()}"
    by_header = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}
    host = urllib.parse.urlsplit(SANDBOX_URL)
    by_host = {"Host": f"8000-{sbx.sandbox_id}.localhost:{host.port}"}
    seen = {}
    for name, routing in (("header", by_header), ("host", by_host)):
        headers = dict(routing, **{"X-API-Key": API_KEY, "X-Probe": marker})
        deadline = time.time() + 30
        while True:
            status, _, body = http("GET", "/", headers, base=SANDBOX_URL)
            if status == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert status == 200, (name, status, body)
        echoed = json.loads(body)
        assert echoed.get("x-probe") == marker, (name, echoed)
        assert "x-api-key" not in echoed, (name, echoed)
        assert API_KEY not in body.decode(), (name, echoed)
        seen[name] = echoed
    assert ok(sbx)
    sbx.kill()
    result(seen=seen)


if __name__ == "__main__":
    CASES[sys.argv[1]]()
