#!/usr/bin/env python3
"""warren's code interpreter: the HTTP server on sandbox port 49999 that the
`e2b-code-interpreter` (PyPI) and `@e2b/code-interpreter` (npm) SDKs talk to,
over Jupyter kernels driven with `jupyter_client`.

It is started by the `code-interpreter-v1` template's `start_cmd` (as the
template's user) and is ready when `GET /health` answers: the default Python
context is running by then. See docs/code-interpreter.md.

The protocol (what the SDKs send and read):

- `POST /execute` `{"code", "context_id", "language", "env_vars"}` answers a
  stream of JSON lines, one per event, while the code runs:
  `{"type": "stdout"|"stderr", "text", "timestamp"}` (nanoseconds),
  `{"type": "result", "text", "html", "png", ..., "is_main_result"}` (a
  Jupyter display or the cell's value), `{"type": "error", "name", "value",
  "traceback"}`, `{"type": "number_of_executions", "execution_count"}`.
  With neither `context_id` nor `language` the default Python context runs
  it; with a `language`, that language's default context (started on first
  use). A client that goes away (the SDK's `timeout`, or any disconnect)
  interrupts the execution.
- `POST /contexts` `{"language", "cwd"}` → `{"id", "language", "cwd"}`;
  `GET /contexts`; `DELETE /contexts/{id}`; `POST /contexts/{id}/restart`.
- `GET /health`.

Every route but `GET /health` (the template's ready command) needs the
sandbox's access token in `X-Access-Token`, as envd's do and as E2B's own
server does: without it (or with another) the answer is `401`
`{"code": 401, "message": "missing or invalid access token
(X-Access-Token)"}` and nothing is done. envd gives the start command the
token's SHA-256 (`WARREN_ACCESS_TOKEN_SHA256`), never the token; a sandbox
with no token checks nothing, like its envd. The SDKs send the token on
`/execute`; e2b-code-interpreter 2.11.5 and @e2b/code-interpreter 2.8.0
send none on the context calls, which are then refused
(docs/code-interpreter.md). A tenant who wants those calls from such an
SDK creates the sandbox with the env var
`CODE_INTERPRETER_CONTEXTS_WITHOUT_TOKEN=1`: the four context routes then
take requests without the token (anyone who knows the sandbox's id may
then list, add, restart and remove its contexts; `/execute` still needs
it).

Each context is its own kernel process; contexts share nothing but the
sandbox. One execution runs in a context at a time; others wait their turn.

Layout: `Kernel` (one context's kernel: start, execute, interrupt, restart),
`Contexts` (the table and the default context per language), the tornado
handlers, `main`.
"""

import argparse
import asyncio
import hashlib
import hmac
import json
import logging
import os
import shlex
import sys
import time
import uuid

import tornado.httpserver
import tornado.iostream
import tornado.web
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.paths import jupyter_runtime_dir

log = logging.getLogger("code-interpreter")

# Where envd puts the hex SHA-256 of the sandbox's access token.
TOKEN_DIGEST_ENV = "WARREN_ACCESS_TOKEN_SHA256"
# A sandbox's own opt-out (its create's env vars): "1" lets the context
# routes take requests without the token, for SDKs that send none there.
OPEN_CONTEXTS_ENV = "CODE_INTERPRETER_CONTEXTS_WITHOUT_TOKEN"

# Language names a client may use → (the name contexts report, the kernel).
LANGUAGES = {
    "python": ("python", "python3"),
    "python3": ("python", "python3"),
    "javascript": ("javascript", "deno"),
    "js": ("javascript", "deno"),
    "typescript": ("typescript", "deno"),
    "ts": ("typescript", "deno"),
    "deno": ("javascript", "deno"),
    "bash": ("bash", "bash"),
    "sh": ("bash", "bash"),
}

# Kernels talk to the server over Unix sockets in the user's Jupyter runtime
# directory (nothing listens on TCP), except Deno's, which knows only TCP
# (on 127.0.0.1, its messages signed with the connection file's key).
TRANSPORTS = {"deno": "tcp"}

# Kernels that send an execution's output on their own schedule, possibly
# after they said the execution is over (Deno publishes stdout and results
# from other tasks, under whatever request came last). After such an
# execution a barrier request runs (see `Run`); its markers come back only
# after everything the execution still had to send.
BARRIER_KERNELS = {"deno"}

# How long a barrier may take before the execution ends without it.
BARRIER_WAIT = 30.0

# Kernels an interrupt would kill (Deno's ignores interrupt requests and
# dies of SIGINT): a client that goes away restarts them instead.
UNINTERRUPTIBLE = {"deno"}

# Jupyter MIME types → the result fields the SDKs read; anything else goes
# into `extra` under its MIME type.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

# Run silently in every new Python kernel: DataFrames also display as
# `data` (columns → values) and matplotlib figures as `chart` (the data the
# SDK's Chart classes read, from the `e2b-charts` package). Neither pandas
# nor matplotlib is imported until the user does; a figure that cannot be
# described still displays as its PNG.
PYTHON_SETUP = r"""
def __warren_setup():
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    def _is(obj, module, name):
        return any(c.__module__ == module and c.__name__ == name for c in type(obj).__mro__)

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            # pandas 3 names its classes' module `pandas`, pandas 2
            # `pandas.core.frame`.
            if _is(obj, "pandas", "DataFrame") or _is(obj, "pandas.core.frame", "DataFrame"):
                return obj.to_dict(orient="list")
            return super().__call__(obj)

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        # Checked here rather than registered by type: matplotlib's inline
        # backend removes every formatter's Figure entry when it starts.
        def __call__(self, obj):
            if _is(obj, "matplotlib.figure", "Figure"):
                try:
                    from e2b_charts import chart_figure_to_dict
                    return chart_figure_to_dict(obj)
                except Exception:
                    return None
            return super().__call__(obj)

    display = get_ipython().display_formatter
    for formatter in (DataFormatter, ChartFormatter):
        kind = formatter.format_type.default_value
        display.formatters[kind] = formatter(parent=display)
        # Only the formatters listed as active run on a display.
        if kind not in display.active_types:
            display.active_types = display.active_types + [kind]

__warren_setup()
del __warren_setup
"""


class ClientError(Exception):
    """A bad request: answered with `status` and the message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def env_snippets(kernel, env):
    """Code that sets `env` in a kernel before an execution, and code that
    puts the environment back afterwards (per-execution `env_vars`)."""
    names = list(env)
    if kernel == "python3":
        before = (
            "import os as __warren_os\n"
            f"__warren_env = {{k: __warren_os.environ.get(k) for k in {names!r}}}\n"
            f"__warren_os.environ.update({env!r})\n"
        )
        after = (
            "for __k, __v in __warren_env.items():\n"
            "    if __v is None: __warren_os.environ.pop(__k, None)\n"
            "    else: __warren_os.environ[__k] = __v\n"
            "del __warren_env, __warren_os, __k, __v\n"
        )
        return before, after
    if kernel == "bash":
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        before = f'__warren_env="$(export -p)"; export {assigns}'
        after = f'unset {" ".join(names)}; eval "$__warren_env"; unset __warren_env'
        return before, after
    if kernel == "deno":
        before = (
            f"globalThis.__warrenEnv = Object.fromEntries({json.dumps(names)}"
            ".map((k) => [k, Deno.env.get(k)]));\n"
            f"for (const [k, v] of Object.entries({json.dumps(env)})) Deno.env.set(k, v);"
        )
        after = (
            "for (const [k, v] of Object.entries(globalThis.__warrenEnv)) "
            "{ if (v === undefined) Deno.env.delete(k); else Deno.env.set(k, v); }\n"
            "delete globalThis.__warrenEnv;"
        )
        return before, after
    raise ClientError(400, f"env_vars are not supported in {kernel} contexts")


def now_ns():
    return time.time_ns()


class Kernel:
    """One context: a kernel process, the readers that route its messages to
    the execution waiting for them, and a lock so one execution runs at a
    time."""

    def __init__(self, context_id, language, kernel_name, cwd, settings):
        self.id = context_id
        self.language = language
        self.kernel_name = kernel_name
        self.cwd = cwd
        self.settings = settings
        self.km = None
        self.kc = None
        # msg_id → queue of (channel, message) for the request waiting on it.
        self.waiters = {}
        self.readers = []
        self.lock = asyncio.Lock()

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def start(self):
        os.makedirs(self.cwd, exist_ok=True)
        transport = TRANSPORTS.get(self.kernel_name, "ipc")
        self.km = AsyncKernelManager(kernel_name=self.kernel_name, transport=transport)
        if transport == "ipc":
            # An absolute path: the kernel runs in the context's cwd.
            runtime = jupyter_runtime_dir()
            os.makedirs(runtime, exist_ok=True)
            self.km.ip = os.path.join(runtime, f"kernel-{self.id}")
        await self.km.start_kernel(cwd=self.cwd)
        await self._connect()

    async def _connect(self):
        self.kc = self.km.client()
        self.kc.start_channels()
        self.readers = [
            asyncio.create_task(self._read("iopub", self.kc.get_iopub_msg)),
            asyncio.create_task(self._read("shell", self.kc.get_shell_msg)),
        ]
        await self._wait_ready()
        if self.kernel_name == "python3":
            await self.run_silent(PYTHON_SETUP)

    async def _wait_ready(self):
        """Until the kernel answers a kernel_info request on the shell
        channel and its status for it arrives on iopub (so both channels are
        connected; iopub drops what it sends before). jupyter_client's
        wait_for_ready does this too, but then waits 0.2 s for nothing."""
        deadline = time.monotonic() + self.settings.kernel_start_timeout
        while True:
            msg_id = self.kc.kernel_info()
            queue = asyncio.Queue()
            self.waiters[msg_id] = queue
            replied = published = False
            try:
                attempt = min(deadline, time.monotonic() + 0.5)
                while not (replied and published):
                    left = attempt - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        channel, _ = await asyncio.wait_for(queue.get(), left)
                    except asyncio.TimeoutError:
                        break
                    replied = replied or channel == "shell"
                    published = published or channel == "iopub"
            finally:
                del self.waiters[msg_id]
            if replied and published:
                return
            if not await self.km.is_alive():
                raise RuntimeError(f"the {self.kernel_name} kernel exited while starting")
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"the {self.kernel_name} kernel did not answer within "
                    f"{self.settings.kernel_start_timeout}s"
                )

    async def _read(self, channel, get):
        while True:
            try:
                msg = await get()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the channel closed under us
                log.debug("context %s: %s channel ended: %s", self.id, channel, e)
                return
            parent = (msg.get("parent_header") or {}).get("msg_id")
            log.debug(
                "context %s: %s %s (parent %s)", self.id, channel, msg.get("msg_type"), parent
            )
            queue = self.waiters.get(parent)
            if queue is not None:
                queue.put_nowait((channel, msg))

    async def _disconnect(self):
        for task in self.readers:
            task.cancel()
        for task in self.readers:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self.readers = []
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None

    async def restart(self):
        """A fresh kernel in the same context (its state is gone)."""
        await self._disconnect()
        await self.km.restart_kernel(now=True)
        await self._connect()

    async def shutdown(self):
        await self._disconnect()
        if self.km is not None:
            try:
                await self.km.shutdown_kernel(now=True)
            except Exception as e:
                log.warning("context %s: shutdown: %s", self.id, e)

    async def run_silent(self, code):
        """Runs `code` without output or history; waits for its reply."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, stop_on_error=False)
        queue = asyncio.Queue()
        self.waiters[msg_id] = queue
        try:
            while True:
                channel, msg = await asyncio.wait_for(
                    queue.get(), self.settings.kernel_start_timeout
                )
                if channel == "shell" and msg["msg_type"] == "execute_reply":
                    if msg["content"].get("status") != "ok":
                        log.warning(
                            "context %s: setup code failed: %s",
                            self.id,
                            msg["content"].get("evalue"),
                        )
                    return
        finally:
            del self.waiters[msg_id]

    async def execute(self, code, env, emit, gone):
        """Runs `code`, passing each event to `emit` as it happens. `gone`
        is set when the client went away: the kernel is interrupted, and if
        it is still busy `interrupt_grace` seconds later, restarted."""
        if not await self._acquire(gone):
            return
        try:
            if env:
                before, after = env_snippets(self.kernel_name, env)
                await self.run_silent(before)
            try:
                await self._execute(code, emit, gone)
            finally:
                if env and self.kc is not None:
                    await self.run_silent(after)
        finally:
            self.lock.release()

    async def _acquire(self, gone):
        """Takes the lock, unless the client goes away first."""
        acquire = asyncio.ensure_future(self.lock.acquire())
        waiting = asyncio.ensure_future(gone.wait())
        await asyncio.wait({acquire, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if acquire.done() and not acquire.cancelled():
            if gone.is_set():
                self.lock.release()
                return False
            return True
        acquire.cancel()
        try:
            await acquire
        except asyncio.CancelledError:
            return False
        # It was acquired in the same instant it was cancelled.
        self.lock.release()
        return False

    async def _execute(self, code, emit, gone):
        msg_id = self.kc.execute(code, silent=False, store_history=True, allow_stdin=False)
        queue = asyncio.Queue()
        self.waiters[msg_id] = queue
        run = Run(msg_id, self.kernel_name)
        interrupted_at = None
        try:
            while not run.finished():
                if run.needs_barrier():
                    # See BARRIER_KERNELS.
                    run.barrier_id = self.kc.execute(
                        barrier_code(run.marker),
                        silent=False,
                        store_history=False,
                        allow_stdin=False,
                    )
                    run.barrier_sent = time.monotonic()
                    self.waiters[run.barrier_id] = queue
                if run.barrier_overdue():
                    log.warning("context %s: no barrier answer; ending the execution", self.id)
                    return
                if gone.is_set() and interrupted_at is None:
                    interrupted_at = time.monotonic()
                    if self.kernel_name in UNINTERRUPTIBLE:
                        log.info("context %s: the client went away; restarting", self.id)
                        await self.restart()
                        return
                    log.info("context %s: the client went away; interrupting", self.id)
                    await self.km.interrupt_kernel()
                if (
                    interrupted_at is not None
                    and time.monotonic() - interrupted_at > self.settings.interrupt_grace
                ):
                    log.warning(
                        "context %s: still busy %ss after the interrupt; restarting it",
                        self.id,
                        self.settings.interrupt_grace,
                    )
                    await self.restart()
                    return
                try:
                    channel, msg = await self._next(queue, gone, interrupted_at is None)
                except asyncio.TimeoutError:
                    if not await self.km.is_alive():
                        await emit(
                            {
                                "type": "error",
                                "name": "KernelDied",
                                "value": "the kernel exited while running this code; "
                                "it was restarted and its state is gone",
                                "traceback": "",
                            }
                        )
                        await self.restart()
                        return
                    continue
                for event in run.take(channel, msg):
                    await emit(event)
        finally:
            self.waiters.pop(msg_id, None)
            if run.barrier_id is not None:
                self.waiters.pop(run.barrier_id, None)

    async def _next(self, queue, gone, watch_gone):
        """The next message for this execution; wakes early (as a timeout)
        when the client goes away, and every second to check the kernel."""
        get = asyncio.ensure_future(queue.get())
        waits = {get}
        if watch_gone:
            waits.add(asyncio.ensure_future(gone.wait()))
        done, pending = await asyncio.wait(waits, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if get in done:
            return get.result()
        raise asyncio.TimeoutError()


class Run:
    """One execution's messages turned into events, and when it is over.

    It is over when the kernel has answered the request and gone idle for
    it — and, in a kernel of BARRIER_KERNELS, once the barrier's two
    markers came back: output that kernel sends late is attributed to
    whichever request came last, so until then the barrier's output is
    this execution's."""

    def __init__(self, msg_id, kernel):
        self.msg_id = msg_id
        self.wants_barrier = kernel in BARRIER_KERNELS
        self.idle = self.replied = self.counted = self.errored = False
        self.barrier_id = None
        self.barrier_sent = None
        self.marker = f"__warren_barrier_{uuid.uuid4().hex}__"
        self.barrier_idle = self.barrier_replied = False
        self.barrier_stream = self.barrier_result = False

    def needs_barrier(self):
        return (
            self.wants_barrier
            and self.barrier_id is None
            and self.idle
            and self.replied
        )

    def barrier_overdue(self):
        return self.barrier_sent is not None and time.monotonic() - self.barrier_sent > BARRIER_WAIT

    def finished(self):
        if not (self.idle and self.replied):
            return False
        if not self.wants_barrier:
            return True
        return (
            self.barrier_id is not None
            and self.barrier_idle
            and self.barrier_replied
            and self.barrier_stream
            and self.barrier_result
        )

    def take(self, channel, msg):
        """The events one kernel message makes."""
        kind, content = msg["msg_type"], msg["content"]
        parent = (msg.get("parent_header") or {}).get("msg_id")
        if parent == self.barrier_id:
            # The barrier's own messages; anything else is this execution's.
            if channel == "shell":
                self.barrier_replied = self.barrier_replied or kind == "execute_reply"
                return []
            if kind == "status":
                self.barrier_idle = content.get("execution_state") == "idle"
                return []
            if kind == "execute_input":
                return []
            if kind == "stream" and self.marker in content.get("text", ""):
                self.barrier_stream = True
                rest = content["text"].replace(self.marker + "\n", "").replace(self.marker, "")
                if not rest:
                    return []
                content = dict(content, text=rest)
            elif kind in ("execute_result", "display_data") and self.marker in json.dumps(
                content.get("data", {})
            ):
                self.barrier_result = True
                return []
            return self._output(kind, content)
        if channel == "shell":
            if kind != "execute_reply":
                return []
            self.replied = True
            events = self._count(content)
            if content.get("status") == "error" and not self.errored:
                self.errored = True
                events.append(error_event(content))
            return events
        if kind == "status":
            self.idle = content.get("execution_state") == "idle"
            return []
        if kind == "execute_input":
            return self._count(content)
        return self._output(kind, content)

    def _count(self, content):
        if self.counted or content.get("execution_count") is None:
            return []
        self.counted = True
        return [{"type": "number_of_executions", "execution_count": content["execution_count"]}]

    def _output(self, kind, content):
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            return [{"type": name, "text": content.get("text", ""), "timestamp": now_ns()}]
        if kind in ("execute_result", "display_data"):
            return [result_event(content.get("data", {}), kind == "execute_result")]
        if kind == "error" and not self.errored:
            self.errored = True
            return [error_event(content)]
        return []


def barrier_code(marker):
    """A barrier request: one line on stdout, one result, both the marker."""
    quoted = json.dumps(marker)
    return f"console.log({quoted});\n{quoted}"


def error_event(content):
    traceback = content.get("traceback") or []
    return {
        "type": "error",
        "name": content.get("ename", ""),
        "value": content.get("evalue", ""),
        "traceback": "\n".join(traceback) if isinstance(traceback, list) else str(traceback),
    }


def result_event(data, main):
    event = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        elif value is not None:
            event[field] = value
    if extra:
        event["extra"] = extra
    return event


class Contexts:
    """Every context, and the default one per language."""

    def __init__(self, settings):
        self.settings = settings
        self.by_id = {}
        self.defaults = {}
        # One start at a time per language default, so two first uses of a
        # language make one context.
        self.default_locks = {}
        self.specs = KernelSpecManager()

    def resolve_language(self, language):
        key = (language or "python").strip().lower()
        found = LANGUAGES.get(key)
        if found is None:
            raise ClientError(
                400,
                f"no kernel for language {language!r} "
                f"(this sandbox has: {', '.join(self.available())})",
            )
        name, kernel = found
        try:
            self.specs.get_kernel_spec(kernel)
        except NoSuchKernel:
            raise ClientError(
                400,
                f"the {name} kernel is not installed in this sandbox "
                f"(this sandbox has: {', '.join(self.available())})",
            )
        return name, kernel

    def available(self):
        kernels = set(self.specs.find_kernel_specs())
        return sorted({name for name, k in LANGUAGES.values() if k in kernels})

    async def create(self, language, cwd):
        name, kernel = self.resolve_language(language)
        cwd = cwd or self.settings.cwd
        if not os.path.isabs(cwd):
            raise ClientError(400, f"cwd {cwd!r} must be an absolute path")
        ctx = Kernel(str(uuid.uuid4()), name, kernel, cwd, self.settings)
        try:
            await ctx.start()
        except Exception as e:
            await ctx.shutdown()
            raise RuntimeError(f"cannot start a {name} context: {e}") from e
        self.by_id[ctx.id] = ctx
        log.info("context %s (%s, %s) started", ctx.id, name, cwd)
        return ctx

    async def default(self, language):
        name, _ = self.resolve_language(language)
        lock = self.default_locks.setdefault(name, asyncio.Lock())
        async with lock:
            ctx = self.defaults.get(name)
            if ctx is None or ctx.id not in self.by_id:
                ctx = await self.create(name, None)
                self.defaults[name] = ctx
            return ctx

    def get(self, context_id):
        ctx = self.by_id.get(context_id)
        if ctx is None:
            raise ClientError(404, f"context {context_id} not found")
        return ctx

    async def remove(self, context_id):
        ctx = self.get(context_id)
        del self.by_id[context_id]
        for name, d in list(self.defaults.items()):
            if d is ctx:
                del self.defaults[name]
        await ctx.shutdown()

    async def shutdown(self):
        for ctx in list(self.by_id.values()):
            await ctx.shutdown()
        self.by_id.clear()


def token_ok(request, digest):
    """Whether `request` carries the access token whose SHA-256 is
    `digest` (always, when the sandbox has none)."""
    if digest is None:
        return True
    sent = request.headers.get("X-Access-Token", "")
    got = hashlib.sha256(sent.encode()).hexdigest()
    return bool(sent) and hmac.compare_digest(got, digest)


class Handler(tornado.web.RequestHandler):
    def initialize(self, contexts, token_digest=None):
        self.contexts = contexts
        self.token_digest = token_digest

    def prepare(self):
        # Every route needs the sandbox's access token (envd gave us its
        # digest, not the token), before anything is read or done: knowing
        # a sandbox's id is not enough to list, change or use its contexts.
        if not token_ok(self.request, self.token_digest):
            raise ClientError(401, "missing or invalid access token (X-Access-Token)")

    def json_body(self):
        if not self.request.body:
            return {}
        try:
            body = json.loads(self.request.body)
        except ValueError as e:
            raise ClientError(400, f"the body is not JSON: {e}")
        if not isinstance(body, dict):
            raise ClientError(400, "the body must be a JSON object")
        return body

    def reply(self, status, doc):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(doc))

    def write_error(self, status_code, **kwargs):
        message = self._reason
        exc = kwargs.get("exc_info")
        if exc is not None and exc[1] is not None and not isinstance(exc[1], tornado.web.HTTPError):
            message = str(exc[1])
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"code": status_code, "message": message}))

    def log_exception(self, typ, value, tb):
        if isinstance(value, ClientError):
            return
        super().log_exception(typ, value, tb)

    def _handle_request_exception(self, e):
        if isinstance(e, ClientError):
            if not self._finished:
                self.reply(e.status, {"code": e.status, "message": str(e)})
            return
        super()._handle_request_exception(e)


def optional_str(body, key):
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ClientError(400, f"{key} must be a string")
    return value or None


class Health(Handler):
    def prepare(self):
        # The one route without the token: the ready command's probe
        # (`GET /health`), which says nothing about any context.
        if self.request.method not in ("GET", "HEAD"):
            super().prepare()

    def get(self):
        self.reply(200, {"status": "ok"})


class NotFound(Handler):
    """Any other path: 401 without the token (like envd), else 404."""

    def prepare(self):
        super().prepare()
        raise ClientError(404, f"no such endpoint: {self.request.method} {self.request.path}")


class Execute(Handler):
    def initialize(self, contexts, token_digest=None):
        super().initialize(contexts, token_digest)
        self.gone = asyncio.Event()

    def on_connection_close(self):
        self.gone.set()

    async def post(self):
        body = self.json_body()
        code = body.get("code")
        if not isinstance(code, str):
            raise ClientError(400, "code must be a string")
        context_id = optional_str(body, "context_id")
        language = optional_str(body, "language")
        if context_id and language:
            raise ClientError(400, "give context_id or language, not both")
        env = body.get("env_vars") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and k and "=" not in k and isinstance(v, str)
            for k, v in env.items()
        ):
            raise ClientError(400, "env_vars must map variable names to strings")
        if context_id:
            ctx = self.contexts.get(context_id)
        else:
            ctx = await self.contexts.default(language)
        if env:
            env_snippets(ctx.kernel_name, env)  # refuses kernels without env support
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-store")
        await self.send(None)
        await ctx.execute(code, env, self.send, self.gone)
        if not self.gone.is_set():
            self.finish()

    async def send(self, event):
        """Writes one event line (or just the headers) and flushes it."""
        if self.gone.is_set():
            return
        if event is not None:
            self.write(json.dumps(event) + "\n")
        try:
            await self.flush()
        except tornado.iostream.StreamClosedError:
            self.gone.set()


class ContextList(Handler):
    def get(self):
        self.reply(200, [c.describe() for c in self.contexts.by_id.values()])

    async def post(self):
        body = self.json_body()
        ctx = await self.contexts.create(optional_str(body, "language"), optional_str(body, "cwd"))
        self.reply(200, ctx.describe())


class ContextOne(Handler):
    async def delete(self, context_id):
        await self.contexts.remove(context_id)
        self.set_status(204)
        self.finish()


class ContextRestart(Handler):
    async def post(self, context_id):
        ctx = self.contexts.get(context_id)
        async with ctx.lock:
            await ctx.restart()
        self.set_status(204)
        self.finish()


def app(contexts, token_digest=None, open_contexts=False):
    args = {"contexts": contexts, "token_digest": token_digest}
    ctx_args = {"contexts": contexts, "token_digest": None if open_contexts else token_digest}
    return tornado.web.Application(
        [
            (r"/health", Health, args),
            (r"/execute", Execute, args),
            (r"/contexts", ContextList, ctx_args),
            (r"/contexts/([^/]+)", ContextOne, ctx_args),
            (r"/contexts/([^/]+)/restart", ContextRestart, ctx_args),
        ],
        default_handler_class=NotFound,
        default_handler_args=args,
    )


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # envd's relay reaches sandbox ports on 127.0.0.1; nothing else needs to.
    p.add_argument("--host", default=os.environ.get("WARREN_CI_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("WARREN_CI_PORT", "49999")))
    p.add_argument(
        "--cwd",
        default=os.environ.get("WARREN_CI_CWD", os.path.expanduser("~")),
        help="the working directory of contexts that name none",
    )
    p.add_argument(
        "--kernel-start-timeout",
        type=float,
        default=float(os.environ.get("WARREN_CI_KERNEL_START_TIMEOUT", "60")),
        help="seconds a kernel may take to answer after it was started",
    )
    p.add_argument(
        "--interrupt-grace",
        type=float,
        default=float(os.environ.get("WARREN_CI_INTERRUPT_GRACE", "10")),
        help="seconds an interrupted execution may take to stop before its kernel is restarted",
    )
    return p.parse_args(argv)


async def serve(settings):
    # The access token's SHA-256, from envd: checked on every route but
    # /health, and not passed on to the kernels.
    token_digest = os.environ.pop(TOKEN_DIGEST_ENV, None) or None
    open_contexts = os.environ.get(OPEN_CONTEXTS_ENV) == "1"
    if open_contexts and token_digest is not None:
        log.warning("%s=1: the context routes take requests without the access token",
                    OPEN_CONTEXTS_ENV)
    contexts = Contexts(settings)
    # The default Python context first: the server is ready (it listens)
    # only once code can run.
    await contexts.default("python")
    server = tornado.httpserver.HTTPServer(
        app(contexts, token_digest, open_contexts), idle_connection_timeout=3600
    )
    server.listen(settings.port, settings.host)
    log.info("code interpreter listening on %s:%s", settings.host, settings.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()
    await contexts.shutdown()


def main(argv=None):
    settings = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=os.environ.get("WARREN_CI_LOG", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
