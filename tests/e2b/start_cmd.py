"""A template's start command as a user of the unmodified `e2b` Python SDK
notices it: a sandbox's create returns once the start command is ready (its
server answers at once, through the gateway's port relay), the command runs
as the template's user and is listed; a start command that fails makes the
create fail with its reason and leaves no sandbox behind.

Run by `crates/warren/tests/start_cmd.rs`, one case per invocation:

    python start_cmd.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, WARREN_TEMPLATE (a template
whose start command serves /srv/www on port 8000 and fails on purpose when
the sandbox has BROKEN=1) and WARREN_MARKER (the content of /srv/www/hello.txt).
Prints one JSON line of facts (`RESULT {...}`); exits non-zero on a failed
assertion.
"""

import os
import sys

from e2b import Sandbox

from common import http, result, run

SANDBOX_URL = os.environ["E2B_SANDBOX_URL"]
TEMPLATE = os.environ["WARREN_TEMPLATE"]
MARKER = os.environ["WARREN_MARKER"]


def case_ready():
    sbx = Sandbox.create(template=TEMPLATE, timeout=120)
    try:
        # The first request after create: the server is up already.
        status, _, body = http("GET", "/hello.txt", base=SANDBOX_URL, headers={
            "E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"})
        assert status == 200, (status, body)
        assert body.decode().strip() == MARKER, body
        procs = [p for p in sbx.commands.list() if p.tag == "start_cmd"]
        assert len(procs) == 1, sbx.commands.list()
        code, out, err, _ = run(sbx, f"ps -o user= -p {procs[0].pid}")
        assert code == 0 and out.strip() == "user", (code, out, err)
        result(status=status, pid=procs[0].pid)
    finally:
        sbx.kill()


def case_broken():
    try:
        sbx = Sandbox.create(template=TEMPLATE, timeout=120, envs={"BROKEN": "1"})
        sbx.kill()
        raise AssertionError("a sandbox whose start command fails was created")
    except AssertionError:
        raise
    except Exception as e:
        message = str(e)
    assert "start command" in message, message
    assert "exit status 3" in message, message
    assert "broken on purpose" in message, message
    left = Sandbox.list().next_items()
    assert left == [], left
    result(message=message)


if __name__ == "__main__":
    globals()["case_" + sys.argv[1]]()
