"""A sandbox's life as the unmodified `e2b` Python SDK sees it through a
gateway: a killed sandbox is gone on the data plane the way E2B says it (a
502 "The sandbox was not found", so `is_running()` is False and a command
cut by the kill says the sandbox "was killed or reached its end of life");
listings come newest first unless asked otherwise, page by page; a
shortened timeout ends the sandbox when it runs out.

Run by `crates/warren/tests/lifecycle.rs`, one case per invocation:

    python lifecycle.py CASE

Each case asserts what the user sees and prints one `RESULT {...}` line.
"""

import json
import sys
import time

from e2b import Sandbox, SandboxQuery
from e2b.exceptions import SandboxException

from common import http, result

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def health(sandbox_id):
    return http("GET", "/health", {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"})


@case
def killed_is_gone():
    sbx = Sandbox.create()
    assert sbx.is_running() is True
    cmd = sbx.commands.run("sleep 60", background=True)
    assert sbx.kill() is True

    # The command's stream was cut by the kill: the SDK asks the sandbox's
    # health, is told it is gone, and says so.
    try:
        cmd.wait()
        raise AssertionError("waiting on a command of a killed sandbox returned")
    except SandboxException as e:
        cut = str(e)
    assert "sandbox was killed or reached its end of life" in cut, cut
    # Over HTTP/1.1 the gateway resets the connection of a response cut
    # off upstream, as HTTP/2 resets the stream: a broken connection, not a
    # message that merely stops (which older SDKs do not recognise).
    assert "reset" in cut.lower(), cut

    assert sbx.is_running() is False
    status, headers, body = health(sbx.sandbox_id)
    assert status == 502, (status, body)
    answer = json.loads(body)
    # Exactly E2B's proxy's answer: clients compare the message.
    gone = {"message": "The sandbox was not found", "sandboxId": sbx.sandbox_id, "code": 502}
    assert answer == gone, answer
    assert headers.get("Should-Retry", headers.get("should-retry")) == "false", headers
    # Host-routed, as a browser or `get_host()` reaches it: the same answer.
    status, _, body = http("GET", "/health",
                           {"Host": f"49983-{sbx.sandbox_id}.{sbx.sandbox_domain}"})
    assert status == 502 and json.loads(body) == gone, (status, body)

    # A sandbox that never existed reads the same on the data plane; the
    # control plane still says 404.
    status, _, body = health("neverexisted0000000000")
    assert status == 502 and b"was not found" in body, (status, body)
    status, _, _ = http("GET", f"/sandboxes/{sbx.sandbox_id}",
                        {"X-API-Key": __import__("os").environ["E2B_API_KEY"]})
    assert status == 404, status
    result(cut=cut, message=answer["message"])


@case
def list_order():
    tag = f"order-{time.time_ns()}"
    made = []
    for _ in range(3):
        made.append(Sandbox.create(metadata={"tag": tag}).sandbox_id)
        # Start times are kept to the millisecond; make them differ.
        time.sleep(0.01)
    try:
        query = SandboxQuery(metadata={"tag": tag})
        newest_first = [s.sandbox_id for s in Sandbox.list(query=query).next_items()]
        assert newest_first == made[::-1], (newest_first, made)
        oldest_first = [s.sandbox_id for s in Sandbox.list(query=query, order="asc").next_items()]
        assert oldest_first == made, (oldest_first, made)

        # Page by page, newest first: every sandbox once, in order.
        pages = Sandbox.list(query=query, limit=1)
        paged = []
        while pages.has_next:
            paged.extend(s.sandbox_id for s in pages.next_items())
        assert paged == made[::-1], (paged, made)

        key = __import__("os").environ["E2B_API_KEY"]
        status, _, body = http("GET", "/v2/sandboxes?order=sideways", {"X-API-Key": key})
        assert status == 400 and b"asc or desc" in body, (status, body)
    finally:
        for sandbox_id in made:
            Sandbox.kill(sandbox_id)
    result(made=made)


@case
def timeout_ends_it():
    sbx = Sandbox.create()
    sbx.set_timeout(3)
    end = sbx.get_info().end_at.timestamp()
    # Waits for the end, then for the sandbox to be gone. The cluster's
    # nodes heartbeat only every 60 s, and a node kills an expired sandbox
    # when its heartbeat says so: gone well within that (the bound below
    # leaves room for a loaded machine) means the end was enforced when it
    # came, not a heartbeat later.
    while time.time() < end:
        time.sleep(0.2)
    deadline = end + 40
    while sbx.is_running():
        assert time.time() < deadline, "the sandbox outlived its timeout by 40 s"
        time.sleep(0.2)
    status, _, body = health(sbx.sandbox_id)
    assert status == 502 and b"was not found" in body, (status, body)
    result(gone_after_end_s=round(time.time() - end, 1))


if __name__ == "__main__":
    CASES[sys.argv[1]]()
