"""`warren dev` in an operator's terminal, attacked from a sandbox.

Run by `crates/warren/tests/security.rs`
(`no_sandbox_reaches_the_operators_terminal`):

    python terminal.py terminal

with WARREN_BIN (the `warren` binary) and WARREN_DATA_DIR (an empty
directory) set. It starts `warren dev` on a pseudo-terminal as a shell
would (the terminal its controlling terminal, its stdin, stdout and
stderr), then, from a sandbox, as `user` and as root, tries to type into
that terminal (`TIOCSTI` on `/dev/tty` and on every descriptor of every
process it can see), to send it Ctrl-C, and to take its foreground. The
terminal must show none of it, and `warren dev` must keep running. Then it
types Ctrl-C into the terminal itself, as the operator would, and checks
that everything stopped. Prints one `RESULT {...}` line.
"""

import json
import os
import pty
import select
import signal
import sys
import threading
import time

MARKER = "INJECTED%016x" % int.from_bytes(os.urandom(8), "big")

# Typed (TIOCSTI) into every terminal descriptor the sandbox can find:
# /dev/tty, then every /proc/*/fd/* that is a terminal. Prints what worked.
INJECT = r"""
import fcntl, json, os, sys, termios
marker = sys.argv[1]
worked, tried = [], []
def inject(path):
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as e:
        tried.append((path, 'open', e.errno))
        return
    try:
        if not os.isatty(fd):
            return
        for ch in (marker + '\n').encode() + b'\x03':
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        worked.append(path)
    except OSError as e:
        tried.append((path, 'TIOCSTI', e.errno))
    finally:
        os.close(fd)
inject('/dev/tty')
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        fds = os.listdir(f'/proc/{pid}/fd')
    except OSError:
        continue
    for n in fds:
        inject(f'/proc/{pid}/fd/{n}')
ttys = {}
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        ttys[pid] = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[4])
    except (OSError, IndexError, ValueError):
        pass
print(json.dumps({'worked': worked, 'tried': tried, 'tty_nr': ttys}))
"""


class Terminal:
    """The master side of the pty: everything `warren dev` printed."""

    def __init__(self, fd):
        self.fd = fd
        self.out = b""
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            try:
                r, _, _ = select.select([self.fd], [], [], 1)
                if r:
                    data = os.read(self.fd, 65536)
                    if not data:
                        return
                    with self.lock:
                        self.out += data
            except OSError:
                return

    def text(self):
        with self.lock:
            return self.out.decode("utf-8", "replace")

    def wait_for(self, needle, within):
        deadline = time.time() + within
        while needle not in self.text():
            if time.time() > deadline:
                raise AssertionError(f"warren dev never printed {needle!r}:\n{self.text()[-4000:]}")
            time.sleep(0.1)


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def terminal():
    warren = os.environ["WARREN_BIN"]
    data = os.environ["WARREN_DATA_DIR"]
    pid, master = pty.fork()
    if pid == 0:
        os.execv(warren, [warren, "dev", "--data-dir", data, "--listen", "127.0.0.1:0",
                          "--nodes", "1", "--runtime", "isolated", "--sandbox-http", "off"])
    term = Terminal(master)
    try:
        term.wait_for("Ctrl-C stops everything.", 240)
        text = term.text()
        env = dict(line.strip().split("export ", 1)[1].split("=", 1)
                   for line in text.splitlines() if line.strip().startswith("export "))
        os.environ.update(env)
        parts = [int(line.split("pid", 1)[1].split()[0]) for line in text.splitlines()
                 if " pid " in line and line.strip().split()[0].startswith(("scheduler", "node-", "gateway-"))]
        assert len(parts) == 3, text
        from e2b import Sandbox

        sbx = Sandbox.create(timeout=300)
        sbx.files.write("/tmp/inject.py", INJECT)
        reports = {}
        for user in ("user", "root"):
            r = sbx.commands.run(f"python3 /tmp/inject.py {MARKER}", user=user, timeout=120)
            reports[user] = json.loads(r.stdout)
        # Let anything typed reach the terminal's echo.
        time.sleep(1)
        for user, rep in reports.items():
            assert not rep["worked"], f"as {user}, TIOCSTI worked on {rep['worked']}"
            # No process of the sandbox has a controlling terminal.
            assert all(v == 0 for v in rep["tty_nr"].values()), (user, rep["tty_nr"])
        assert MARKER not in term.text(), "a sandbox typed into the operator's terminal"
        assert alive(pid), "warren dev stopped (a sandbox sent it Ctrl-C?)"
        assert os.tcgetpgrp(master) == pid, "a sandbox took the terminal's foreground"
        assert sbx.commands.run("echo alive").stdout.strip() == "alive"
        # The operator's Ctrl-C stops everything, cleanly.
        os.write(master, b"\x03")
        deadline = time.time() + 120
        status = None
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"warren dev did not stop on Ctrl-C:\n{term.text()[-4000:]}")
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, term.text()[-4000:])
        assert "warren dev: stopped" in term.text(), term.text()[-4000:]
        left = [p for p in parts if alive(p)]
        assert not left, f"parts still running after Ctrl-C: {left}"
        print("RESULT " + json.dumps({"sandbox": sbx.sandbox_id, "parts": parts,
                                      "tried": {u: len(r["tried"]) for u, r in reports.items()}}),
              flush=True)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    {"terminal": terminal}[sys.argv[1]]()
