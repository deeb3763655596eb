"""End-to-end test: the unmodified `e2b` Python SDK against a running warren.

Run by `crates/warren/tests/e2b_sdk.rs`, which starts `warren dev` and sets
E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (team "dev") and WARREN_OTHER_API_KEY
(a key of another team). Every check is a plain function; the script prints one
line per check and a closing "N passed, N failed" line, and exits non-zero on
any failure.
"""

import json
import os
import sys
import time
import traceback
import urllib.error
import urllib.request

from e2b import Sandbox
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException
from e2b.sandbox.commands.command_handle import CommandExitException

API_URL = os.environ["E2B_API_URL"]
API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["WARREN_OTHER_API_KEY"]

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def http(method, path, headers=None, body=None):
    """A raw request to the gateway; returns (status, parsed JSON or text)."""
    req = urllib.request.Request(API_URL + path, method=method, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


STATE = {}


@check
def create_sandbox():
    sbx = Sandbox.create(timeout=120, metadata={"suite": "e2b-sdk"})
    assert sbx.sandbox_id, "no sandbox id"
    STATE["sbx"] = sbx


@check
def run_command_streams_stdout_stderr_and_exit_code():
    sbx = STATE["sbx"]
    ok = sbx.commands.run("echo hello from warren")
    assert ok.exit_code == 0, ok
    assert ok.stdout == "hello from warren\n", repr(ok.stdout)
    try:
        sbx.commands.run("echo out; echo err >&2; exit 3")
    except CommandExitException as e:
        assert e.exit_code == 3, e.exit_code
        assert e.stdout == "out\n", repr(e.stdout)
        assert e.stderr == "err\n", repr(e.stderr)
    else:
        raise AssertionError("a command exiting 3 did not raise CommandExitException")
    seen = []
    sbx.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=seen.append)
    assert "".join(seen) == "line1\nline2\nline3\n", seen


@check
def background_command_reattached_with_connect():
    sbx = STATE["sbx"]
    handle = sbx.commands.run(
        "sleep 1; for i in 1 2 3 4 5; do echo tick$i; sleep 0.2; done", background=True
    )
    assert handle.pid > 0
    listed = [p.pid for p in sbx.commands.list()]
    assert handle.pid in listed, (handle.pid, listed)
    handle.disconnect()
    again = sbx.commands.connect(handle.pid)
    result = again.wait()
    assert result.exit_code == 0, result
    # Connect streams live output (as E2B's envd does): we reattached before the
    # first tick, so every tick arrives.
    assert "tick5" in result.stdout, repr(result.stdout)


@check
def files_round_trip_binary_and_list():
    sbx = STATE["sbx"]
    data = bytes(range(256)) * 64 + os.urandom(4096)
    sbx.files.write("/home/user/blob.bin", data)
    back = sbx.files.read("/home/user/blob.bin", format="bytes")
    assert bytes(back) == data, f"read {len(back)} bytes, wrote {len(data)}"
    names = [e.name for e in sbx.files.list("/home/user")]
    assert "blob.bin" in names, names
    text = "héllo wörld\n"
    sbx.files.write("/home/user/dir/note.txt", text)
    assert sbx.files.read("/home/user/dir/note.txt") == text
    out = sbx.commands.run("cat /home/user/dir/note.txt")
    assert out.stdout == text, repr(out.stdout)


@check
def set_timeout_moves_end_at():
    sbx = STATE["sbx"]
    before = sbx.get_info().end_at
    sbx.set_timeout(600)
    after = sbx.get_info().end_at
    assert after > before, (before, after)


@check
def list_shows_the_sandbox():
    sbx = STATE["sbx"]
    paginator = Sandbox.list()
    ids = []
    while True:
        ids += [s.sandbox_id for s in paginator.next_items()]
        if not paginator.has_next:
            break
    assert sbx.sandbox_id in ids, (sbx.sandbox_id, ids)


@check
def another_team_cannot_see_or_kill_it():
    sbx = STATE["sbx"]
    try:
        Sandbox.get_info(sbx.sandbox_id, api_key=OTHER_KEY)
    except NotFoundException:
        pass
    else:
        raise AssertionError("another team could read the sandbox")
    assert Sandbox.kill(sbx.sandbox_id, api_key=OTHER_KEY) is False
    assert sbx.is_running(), "the sandbox died when another team tried to kill it"
    other_ids = [s.sandbox_id for s in Sandbox.list(api_key=OTHER_KEY).next_items()]
    assert sbx.sandbox_id not in other_ids


@check
def bad_api_key_is_401():
    try:
        Sandbox.create(api_key="warren_not_a_key")
    except AuthenticationException:
        pass
    else:
        raise AssertionError("a bad API key created a sandbox")
    status, _ = http("GET", "/sandboxes", {"X-API-Key": "nope"})
    assert status == 401, status


@check
def malformed_sandbox_id_is_400_on_both_planes():
    status, body = http("GET", "/sandboxes/NOT..VALID", {"X-API-Key": API_KEY})
    assert status == 400, (status, body)
    status, body = http(
        "GET", "/health", {"E2b-Sandbox-Id": "Bad_Id!", "E2b-Sandbox-Port": "49983"}
    )
    assert status == 400, (status, body)


@check
def signed_upload_as_root_lands_in_roots_home():
    # What E2B's docs show: a signed upload URL for `root`, a relative path,
    # and a plain multipart POST to it. The URL's query is sent host-routed
    # (`49983-<id>.<domain>`), as it is when no E2B_SANDBOX_URL is set.
    sbx = STATE["sbx"]
    url = sbx.upload_url("hello.txt", user="root", use_signature_expiration=60)
    query = url[url.index("/files?"):]
    boundary = "warren-check-boundary"
    body = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="hello.txt"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
        "hello from root's upload\r\n"
        f"--{boundary}--\r\n"
    ).encode()
    status, answer = http(
        "POST",
        query,
        {
            "Host": f"49983-{sbx.sandbox_id}.{sbx.sandbox_domain}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
        body,
    )
    assert status == 200, (status, answer)
    assert answer == [{"name": "hello.txt", "path": "/root/hello.txt", "type": "file"}], answer
    got = sbx.files.read("/root/hello.txt", user="root")
    assert got == "hello from root's upload", got
    # The same relative path for `user` is in user's home.
    sbx.files.write("hello.txt", "user's", user="user")
    assert sbx.files.read("/home/user/hello.txt") == "user's"


@check
def kill_then_gone_on_both_planes():
    sbx = STATE["sbx"]
    assert sbx.kill() is True
    try:
        Sandbox.get_info(sbx.sandbox_id)
    except NotFoundException:
        pass
    else:
        raise AssertionError("control plane still knows the killed sandbox")
    status, body = http(
        "GET", "/health", {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    )
    # E2B's answer for a gone sandbox on the data plane, which the SDK reads
    # as "not running".
    assert status == 502, (status, body)
    assert body == {
        "message": "The sandbox was not found",
        "sandboxId": sbx.sandbox_id,
        "code": 502,
    }, body
    assert sbx.is_running() is False
    try:
        sbx.commands.run("echo still here")
    except SandboxException:
        pass
    else:
        raise AssertionError("a command ran in a killed sandbox")


def main():
    passed = failed = 0
    for fn in CHECKS:
        start = time.monotonic()
        try:
            fn()
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAIL {fn.__name__} ({time.monotonic() - start:.2f}s)")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {fn.__name__} ({time.monotonic() - start:.2f}s)")
        sys.stdout.flush()
    print(f"e2b-sdk: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
