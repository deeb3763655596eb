"""What a user of the unmodified `e2b-code-interpreter` Python SDK (pinned in
scripts/setup-test-env) notices against warren: `Sandbox.create()` gives a
`code-interpreter-v1` sandbox whose `run_code` keeps state, streams output
while the code runs, reports exceptions, returns matplotlib figures as PNG,
runs in isolated contexts, stops at its `timeout` without losing the
context, and runs JavaScript and bash.

Run by `crates/warren/tests/code_interpreter.rs`, one case per invocation:

    python code_interpreter.py CASE

with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set. Each case asserts
what the user sees and prints one JSON line of facts (`RESULT {...}`); it
exits non-zero on a failed assertion.
"""

import base64
import json
import os
import sys

from e2b import TimeoutException
from e2b_code_interpreter import Context, Sandbox

from common import http, result

SANDBOX_URL = os.environ["E2B_SANDBOX_URL"]


# A sandbox's opt-out of the access token on the context routes, which
# the pinned SDK's context calls need: they send no token there.
OPEN_CONTEXTS = {"CODE_INTERPRETER_CONTEXTS_WITHOUT_TOKEN": "1"}


def create(envs=None):
    return Sandbox.create(timeout=300, envs=envs)


def case_state():
    """Variables, imports and functions live on between `run_code` calls."""
    sbx = create()
    try:
        first = sbx.run_code("x = 41\nimport math\ndef double(v):\n    return 2 * v")
        assert first.error is None, first.error
        second = sbx.run_code("x += 1\nx")
        assert second.text == "42", second
        third = sbx.run_code("double(x) + math.floor(0.5)")
        assert third.text == "84", third
        assert third.execution_count > second.execution_count > first.execution_count, (
            first.execution_count, second.execution_count, third.execution_count)
        result(template=sbx.get_info().template_id, text=third.text,
               counts=[first.execution_count, second.execution_count, third.execution_count])
    finally:
        sbx.kill()


def case_streaming():
    """`print` reaches `on_stdout` while the code still runs: the code waits
    for a file that only the `on_stdout` callback writes."""
    sbx = create()
    try:
        seen = []

        def on_stdout(msg):
            seen.append(msg.line)
            if msg.line.startswith("waiting"):
                sbx.files.write("/tmp/go", "go")

        code = (
            "import os, time\n"
            "print('waiting for the client', flush=True)\n"
            "deadline = time.monotonic() + 120\n"
            "while not os.path.exists('/tmp/go') and time.monotonic() < deadline:\n"
            "    time.sleep(0.05)\n"
            "print('released' if os.path.exists('/tmp/go') else 'never released')\n"
        )
        execution = sbx.run_code(code, on_stdout=on_stdout, timeout=180)
        out = "".join(execution.logs.stdout)
        assert "released" in out and "never released" not in out, out
        assert seen and seen[0].startswith("waiting"), seen
        assert any("released" in line for line in seen), seen
        result(stdout=execution.logs.stdout)
    finally:
        sbx.kill()


def case_error():
    """An exception comes back as `execution.error` with its name; stderr
    and the results before it are kept, and the context goes on."""
    sbx = create()
    try:
        errors = []
        execution = sbx.run_code(
            "import sys\nprint('to stderr', file=sys.stderr)\nraise ValueError('bad value')",
            on_error=errors.append,
        )
        err = execution.error
        assert err is not None, execution
        assert err.name == "ValueError", err
        assert err.value == "bad value", err
        assert "ValueError" in err.traceback, err.traceback
        assert errors and errors[0].name == "ValueError", errors
        assert "to stderr\n" in execution.logs.stderr, execution.logs
        again = sbx.run_code("1 + 1")
        assert again.error is None and again.text == "2", again
        result(name=err.name, value=err.value)
    finally:
        sbx.kill()


def case_matplotlib():
    """A matplotlib figure comes back as a PNG result (and its chart data)."""
    sbx = create()
    try:
        execution = sbx.run_code(
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [1, 4, 9])\n"
            "plt.title('squares')\n"
            "plt.show()\n"
        )
        assert execution.error is None, execution.error
        pngs = [r for r in execution.results if r.png]
        assert len(pngs) == 1, execution.results
        data = base64.b64decode(pngs[0].png)
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), data[:16]
        chart = pngs[0].chart
        assert chart is not None and chart.title == "squares", chart
        frame = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
        main = [r for r in frame.results if r.is_main_result][0]
        assert main.html and "<table" in main.html, main
        assert main.data == {"a": [1, 2], "b": [3, 4]}, main.data
        result(png_bytes=len(data), chart=chart.type.value, formats=list(pngs[0].formats()))
    finally:
        sbx.kill()


def case_contexts():
    """Two contexts do not share variables; contexts are listed, restarted
    (state gone) and removed. The SDK sends no access token on its context
    calls, so by default they are refused (401); a sandbox made with
    CODE_INTERPRETER_CONTEXTS_WITHOUT_TOKEN=1 takes them."""
    locked = create()
    try:
        try:
            locked.create_code_context()
            raise AssertionError("a context call without the token was taken")
        except AssertionError:
            raise
        except Exception as e:
            refused = str(e)
        assert refused.startswith("401"), refused
    finally:
        locked.kill()
    sbx = create(OPEN_CONTEXTS)
    try:
        a = sbx.create_code_context()
        b = sbx.create_code_context(cwd="/tmp", language="python")
        assert a.id != b.id and a.language == "python" and b.cwd == "/tmp", (a, b)
        sbx.run_code("secret = 'in a'", context=a)
        in_b = sbx.run_code("secret", context=b)
        assert in_b.error is not None and in_b.error.name == "NameError", in_b
        in_a = sbx.run_code("secret", context=a)
        assert in_a.text == "'in a'", in_a
        default = sbx.run_code("'secret' in globals()")
        assert default.text == "False", default
        cwd = sbx.run_code("import os\nos.getcwd()", context=b)
        assert cwd.text == "'/tmp'", cwd
        ids = [c.id for c in sbx.list_code_contexts()]
        assert a.id in ids and b.id in ids, ids
        sbx.restart_code_context(a)
        after = sbx.run_code("secret", context=a)
        assert after.error is not None and after.error.name == "NameError", after
        sbx.remove_code_context(b)
        ids = [c.id for c in sbx.list_code_contexts()]
        assert b.id not in ids, ids
        try:
            sbx.run_code("1", context=b)
            raise AssertionError("a removed context ran code")
        except AssertionError:
            raise
        except Exception as e:
            gone = type(e).__name__
        result(contexts=len(ids), removed_context_error=gone, refused=refused)
    finally:
        sbx.kill()


def case_timeout():
    """A loop stopped by a short `timeout` raises TimeoutException; the
    kernel was interrupted (the loop no longer runs) and the context keeps
    its state."""
    sbx = create()
    try:
        sbx.run_code("n = 0")
        try:
            sbx.run_code("import time\nwhile True:\n    n += 1\n    time.sleep(0.001)", timeout=3)
            raise AssertionError("an endless loop finished")
        except TimeoutException as e:
            message = str(e)
        first = sbx.run_code("n", timeout=120)
        second = sbx.run_code("n", timeout=120)
        assert first.error is None, first.error
        assert int(first.text) > 0, first
        assert first.text == second.text, ("the loop still runs", first.text, second.text)
        result(timeout=message, n=int(first.text))
    finally:
        sbx.kill()


def case_languages():
    """JavaScript (Deno) and bash contexts run, each keeping its state;
    an unknown language is refused with a message."""
    sbx = create(OPEN_CONTEXTS)
    try:
        js = sbx.run_code("const answer = 6 * 7;\nconsole.log('from js');\nanswer", language="javascript")
        assert js.error is None, js.error
        assert js.logs.stdout == ["from js\n"], js.logs
        assert js.text == "42", js
        js_again = sbx.run_code("answer + 1", language="js")
        assert js_again.text == "43", js_again
        js_err = sbx.run_code("null.x", language="javascript")
        assert js_err.error is not None and js_err.error.name == "TypeError", js_err
        sh = sbx.run_code("export GREETING=hello\necho $((6 * 7))", language="bash")
        assert sh.error is None, sh.error
        assert "".join(sh.logs.stdout) == "42\n", sh.logs
        sh_again = sbx.run_code("echo $GREETING $(whoami)", language="bash")
        assert "".join(sh_again.logs.stdout) == "hello user\n", sh_again.logs
        ctx = sbx.create_code_context(language="bash")
        assert ctx.language == "bash", ctx
        try:
            sbx.run_code("1", language="cobol")
            raise AssertionError("cobol ran")
        except AssertionError:
            raise
        except Exception as e:
            refused = str(e)
        assert "cobol" in refused, refused
        languages = sorted({c.language for c in sbx.list_code_contexts()})
        result(languages=languages, refused=refused)
    finally:
        sbx.kill()


def case_env_vars():
    """`envs` apply to one execution only; the sandbox's own env vars reach
    the code too."""
    sbx = Sandbox.create(timeout=300, envs={"FROM_CREATE": "c"})
    try:
        one = sbx.run_code("import os\nos.environ['ONLY_NOW'] + os.environ['FROM_CREATE']",
                           envs={"ONLY_NOW": "n"})
        assert one.text == "'nc'", one
        after = sbx.run_code("os.environ.get('ONLY_NOW')")
        assert after.text is None and after.error is None, after
        sh = sbx.run_code("echo ${ONLY_NOW:-unset}", language="bash", envs={"ONLY_NOW": "b"})
        assert "".join(sh.logs.stdout) == "b\n", sh.logs
        result(ok=True)
    finally:
        sbx.kill()


def case_auth():
    """Code runs only for a client with the sandbox's access token: without
    it, or with another, `/execute` answers 401 and runs nothing."""
    sbx = create()
    try:
        def execute(token):
            headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999",
                       "Content-Type": "application/json"}
            if token is not None:
                headers["X-Access-Token"] = token
            body = json.dumps({"code": "open('/tmp/ran', 'a').write('x')\n'ran'"}).encode()
            return http("POST", "/execute", headers=headers, body=body, base=SANDBOX_URL)

        token = sbx._envd_access_token
        assert token, "the sandbox has an access token"
        missing, _, _ = execute(None)
        wrong, _, _ = execute(token[:-1] + ("x" if token[-1] != "x" else "y"))
        assert (missing, wrong) == (401, 401), (missing, wrong)
        assert not sbx.files.exists("/tmp/ran"), "code ran without the token"
        ok_status, _, body = execute(token)
        assert ok_status == 200 and b"'ran'" in body, (ok_status, body)
        assert sbx.files.read("/tmp/ran") == "x"
        result(missing=missing, wrong=wrong, ok=ok_status)
    finally:
        sbx.kill()


def case_routes_need_the_token():
    """The attack: a client that knows a sandbox's id but not its access
    token lists, creates, restarts and deletes its contexts and runs code
    in them. Every route but the ready probe answers 401 and changes
    nothing; the victim's context keeps its state. With the token each
    works."""
    sbx = create()
    try:
        token = sbx._envd_access_token
        assert token, "the sandbox has an access token"

        def call(method, path, token=None, body=None):
            headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999",
                       "Content-Type": "application/json"}
            if token is not None:
                headers["X-Access-Token"] = token
            data = json.dumps(body).encode() if body is not None else None
            status, _, raw = http(method, path, headers=headers, body=data, base=SANDBOX_URL)
            return status, (json.loads(raw) if raw else None)

        # The victim's own context, made with the token, holding state.
        status, victim = call("POST", "/contexts", token, {"language": "python"})
        assert status == 200, (status, victim)
        ctx = victim["id"]
        status, _ = call("POST", "/execute", token, {"code": "kept = 41", "context_id": ctx})
        assert status == 200, status
        status, listed = call("GET", "/contexts", token)
        assert status == 200, (status, listed)
        before = sorted(c["id"] for c in listed)

        wrong = token[:-1] + ("x" if token[-1] != "x" else "y")
        attempts = {}
        for label, method, path, body in [
            ("list", "GET", "/contexts", None),
            ("create", "POST", "/contexts", {"language": "python"}),
            ("restart", "POST", f"/contexts/{ctx}/restart", None),
            ("delete", "DELETE", f"/contexts/{ctx}", None),
            ("execute", "POST", "/execute", {"code": "kept = 0", "context_id": ctx}),
            ("unknown", "GET", "/no-such-route", None),
        ]:
            for who, tok in (("none", None), ("wrong", wrong)):
                for _ in range(3 if label == "create" else 1):
                    status, body = call(method, path, tok, body)
                    attempts[f"{label}/{who}"] = status
                    assert status == 401, (label, who, status, body)
                    assert "access token" in body["message"], body
        # Nothing changed: the same contexts (no kernel was started), and
        # the victim's state is there.
        status, listed = call("GET", "/contexts", token)
        after = sorted(c["id"] for c in listed)
        assert after == before, (before, after)
        kept = sbx.run_code("kept + 1", context=Context(ctx, "python", "/home/user"))
        assert kept.text == "42", kept
        # The ready probe needs none.
        health, _ = call("GET", "/health")
        assert health == 200, health
        # With the token every route works.
        status, _ = call("POST", f"/contexts/{ctx}/restart", token)
        assert status == 204, status
        status, _ = call("DELETE", f"/contexts/{ctx}", token)
        assert status == 204, status
        result(attempts=attempts, contexts=len(before), health=health)
    finally:
        sbx.kill()


if __name__ == "__main__":
    globals()["case_" + sys.argv[1]]()
