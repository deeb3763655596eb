"""What every SDK script under tests/e2b/ run by a Rust test shares: raw
HTTP to the gateway, running a command without raising, and the one
`RESULT {json}` line the Rust side reads."""

import json
import os
import urllib.error
import urllib.request

from e2b.sandbox.commands.command_handle import CommandExitException

API_URL = os.environ["E2B_API_URL"]


def http(method, path, headers=None, body=None, base=None, timeout=20):
    """A raw request; returns (status, headers, body bytes)."""
    req = urllib.request.Request((base or API_URL) + path, method=method, data=body,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def run(sbx, cmd, user=None, timeout=60):
    """Runs `cmd`; returns (exit code, stdout, stderr, error) without raising."""
    kw = {"timeout": timeout}
    if user:
        kw["user"] = user
    try:
        r = sbx.commands.run(cmd, **kw)
        return r.exit_code, r.stdout, r.stderr, r.error
    except CommandExitException as e:
        return e.exit_code, e.stdout, e.stderr, e.error


def ok(sbx):
    """The sandbox still answers a command."""
    code, out, _, _ = run(sbx, "echo alive")
    return code == 0 and out.strip() == "alive"


def result(**facts):
    print("RESULT " + json.dumps(facts), flush=True)
