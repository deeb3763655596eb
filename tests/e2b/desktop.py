"""What a user of the unmodified `e2b-desktop` Python SDK (pinned in
scripts/setup-test-env) notices against warren: `Sandbox.create()` gives a
`desktop` sandbox with Xfce up on E2B's display, resolution and DPI (or
those asked for); screenshots are PNGs of the real screen; the mouse and
keyboard calls reach the window under them (a probe window the test draws,
tests/e2b/desktop_probe.tcl, logs what the X server delivered and changes
colour on a click); `launch` and `open` start a terminal, a text editor
and a browser; the stream serves noVNC through the sandbox's host route,
with and without a password, of the whole screen or one window.

Run by `crates/warren/tests/desktop.rs`, one case per invocation:

    python desktop.py CASE

with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set. Each case asserts
what the user sees and prints one JSON line of facts (`RESULT {...}`); it
exits non-zero on a failed assertion.
"""

import io
import json
import pathlib
import re
import shlex
import sys
import time

from e2b.sandbox.commands.command_handle import CommandExitException
from e2b_desktop import Sandbox
from PIL import Image

from common import http, result, run

PROBE = pathlib.Path(__file__).with_name("desktop_probe.tcl").read_text()
MAGENTA, CYAN = (255, 0, 255), (0, 255, 255)

# Read inside the sandbox: what a VNC viewer learns first (rfb_hello.py).
RFB_HELLO = pathlib.Path(__file__).with_name("rfb_hello.py").read_text()


def wait_for(what, probe, within=60, every=0.5):
    """`probe()`'s first truthy answer, or AssertionError after `within` s."""
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(every)


def create(**kw):
    start = time.monotonic()
    sbx = Sandbox.create(timeout=600, **kw)
    return sbx, time.monotonic() - start


def image(png):
    img = Image.open(io.BytesIO(bytes(png)))
    assert img.format == "PNG", img.format
    return img.convert("RGB")


def near(pixel, colour, slack=8):
    return all(abs(a - b) <= slack for a, b in zip(pixel, colour))


class Probe:
    """The probe window (desktop_probe.tcl) in the sandbox."""

    def __init__(self, sbx, geometry, colours, log="/tmp/probe.log"):
        self.sbx, self.log = sbx, log
        sbx.files.write("/tmp/desktop_probe.tcl", PROBE)
        args = " ".join(shlex.quote(a) for a in [log, geometry, *colours])
        sbx.commands.run(f"wish /tmp/desktop_probe.tcl -name probe {args}",
                         background=True, timeout=0)
        ready = wait_for("the probe window", lambda: [
            l for l in self.lines() if l.startswith("ready ")], within=30)
        w, h, x, y = map(int, re.fullmatch(r"ready (\d+)x(\d+)\+(\d+)\+(\d+)", ready[0]).groups())
        self.width, self.height, self.x, self.y = w, h, x, y

    def lines(self):
        code, out, _, _ = run(self.sbx, f"cat {self.log} 2>/dev/null")
        return out.splitlines() if code == 0 else []

    def events(self, kind):
        return [l.split()[1:] for l in self.lines() if l.split()[0] == kind]

    def typed(self):
        """The characters the key events carried, in order."""
        return "".join(chr(int(code)) for _, _, code in self.events("key") if code != "-")

    def at(self, dx, dy):
        return self.x + dx, self.y + dy


def case_input():
    """Screenshots, the mouse, the keyboard, `wait`, on the default desktop."""
    sbx, create_secs = create()
    try:
        assert sbx.get_screen_size() == (1024, 768), sbx.get_screen_size()
        first = image(sbx.screenshot())
        assert first.size == (1024, 768), first.size
        # The real screen: Xfce's wallpaper and panel, not a blank frame.
        assert len(first.getcolors(1 << 20) or []) > 50, "a blank screenshot"

        probe = Probe(sbx, "400x300+200+150", ["#ff00ff", "#00ffff"])
        centre = probe.at(probe.width // 2, probe.height // 2)
        shot = image(sbx.screenshot())
        assert near(shot.getpixel(centre), MAGENTA), shot.getpixel(centre)

        # A left click on the window changes what the next screenshot shows.
        click = probe.at(20, 20)
        sbx.left_click(*click)
        wait_for("the click's colour in a screenshot", lambda: near(
            image(sbx.screenshot()).getpixel(centre), CYAN), within=20)
        assert sbx.get_cursor_position() == click, sbx.get_cursor_position()

        sbx.move_mouse(*probe.at(50, 60))
        assert sbx.get_cursor_position() == probe.at(50, 60)
        sbx.right_click(*probe.at(30, 40))
        sbx.middle_click(*probe.at(31, 41))
        sbx.double_click(*probe.at(32, 42))
        sbx.scroll("up", 3)
        sbx.scroll("down", 2)
        sbx.drag(probe.at(10, 10), probe.at(100, 80))
        sbx.mouse_press("right")
        sbx.mouse_release("right")
        want = [
            (1, *probe.at(20, 20)),
            (3, *probe.at(30, 40)),
            (2, *probe.at(31, 41)),
            (1, *probe.at(32, 42)), (1, *probe.at(32, 42)),
            (4, *probe.at(32, 42)), (4, *probe.at(32, 42)), (4, *probe.at(32, 42)),
            (5, *probe.at(32, 42)), (5, *probe.at(32, 42)),
            (1, *probe.at(10, 10)),
            (3, *probe.at(100, 80)),
        ]
        # The probe logs what the X server delivered, as it gets to it.
        presses = wait_for("the presses", lambda: (lambda p: len(p) >= len(want) and p)(
            [tuple(map(int, e)) for e in probe.events("press")]), within=20)
        assert presses == want, presses
        releases = [tuple(map(int, e)) for e in probe.events("release")]
        assert (1, *probe.at(100, 80)) in releases, releases
        motions = [tuple(map(int, e)) for e in probe.events("motion")]
        assert motions and motions[-1] == probe.at(100, 80), motions

        # `write` types in chunks (25 characters, 75 ms apart by default; or
        # as asked); `press` sends keys and chords by their SDK names.
        text = "The quick brown fox jumps over the lazy dog: 0123456789 (~!@#$%^&*_+=?)"
        sbx.write(text)
        sbx.write(" 'quoted' \"twice\"", chunk_size=4, delay_in_ms=5)
        sbx.press("enter")
        sbx.press(["ctrl", "a"])
        sbx.press("F5")
        keys = wait_for("the keys", lambda: (lambda k: any(n == "F5" for n, _, _ in k) and k)(
            probe.events("key")), within=30)
        typed = probe.typed()
        assert typed.split("\r")[0] == text + " 'quoted' \"twice\"", typed
        names = [k for k, _, _ in keys]
        assert "Return" in names and "F5" in names, names
        ctrl_a = [int(state) for k, state, _ in keys if k == "a"]
        assert ctrl_a and ctrl_a[-1] & 4, keys  # ControlMask

        start = time.monotonic()
        sbx.wait(700)
        waited = time.monotonic() - start
        assert waited >= 0.7, waited
        result(template=sbx.get_info().template_id, create_secs=round(create_secs, 2),
               presses=len(presses), typed=len(typed))
    finally:
        sbx.kill()


def window_titles(sbx, pattern):
    """Titles of the visible windows whose title matches `pattern`."""
    code, out, _, _ = run(sbx, f"xdotool search --onlyvisible --name {shlex.quote(pattern)}")
    titles = []
    for window in out.split() if code == 0 else []:
        try:
            titles.append(sbx.get_window_title(window))
        except CommandExitException:
            pass  # gone meanwhile
    return titles


def case_apps():
    """`launch` and `open`: a terminal, a text editor and a browser."""
    sbx, _ = create()
    try:
        # A terminal, and what is typed into it runs.
        sbx.launch("xfce4-terminal")

        def terminal():
            try:
                return [w for w in sbx.get_application_windows("xfce4-terminal") if w]
            except CommandExitException:
                return []
        term = wait_for("the terminal's window", terminal, within=60)[0]
        sbx.commands.run(f"xdotool windowactivate --sync {term}")
        sbx.write("echo typed-$((6 * 7)) > /tmp/typed.txt")
        sbx.press("enter")
        wait_for("the command typed into the terminal", lambda: run(
            sbx, "cat /tmp/typed.txt")[1].strip() == "typed-42", within=30)
        focused = sbx.get_window_title(sbx.get_current_window_id())
        assert "Terminal" in focused, focused

        # A text file opens in the text editor.
        sbx.files.write("/home/user/warren-notes.txt", "notes for the editor\n")
        sbx.open("/home/user/warren-notes.txt")
        editor = wait_for("the editor's window", lambda: window_titles(sbx, "warren-notes"), within=60)

        # A URL opens in the browser, which fetches and renders it.
        site = "/tmp/site"
        sbx.files.write(f"{site}/page.html", "<title>warren-page-title</title><h1>hello</h1>")
        sbx.commands.run(f"python3 -m http.server 8123 --bind 127.0.0.1 --directory {site}",
                         background=True, timeout=0)
        wait_for("the page server", lambda: run(sbx, "curl -fsS -o /dev/null http://127.0.0.1:8123/page.html")[0] == 0)
        sbx.open("http://127.0.0.1:8123/page.html")
        browser = wait_for("the browser's window", lambda: window_titles(sbx, "warren-page-title"), within=120)
        assert any("Firefox" in t for t in browser), browser
        result(editor=editor, browser=browser)
    finally:
        sbx.kill()


def rfb_hello(sbx, port=5900):
    sbx.files.write("/tmp/rfb_hello.py", RFB_HELLO)
    return json.loads(sbx.commands.run(f"python3 /tmp/rfb_hello.py {port}").stdout)


def stop_stream(sbx):
    """`stream.stop()`, then waits until x11vnc and noVNC are gone: stop
    returns once it has signalled them (`pkill`), and a `start()` that
    still finds x11vnc says "Stream is already running"."""
    sbx.stream.stop()
    wait_for("the stream to stop", lambda: run(
        sbx, "pgrep -x x11vnc || netstat -tln | grep -q ':6080 '")[0] != 0, within=30)


def through_gateway(sbx, path):
    """GET `path` on the sandbox's port 6080 by its host route."""
    return http("GET", path, headers={"Host": sbx.get_host(6080)})


def case_stream():
    """The stream: noVNC at the host route, with and without a password,
    of the whole screen or one window; and a desktop of another size."""
    sbx, _ = create(resolution=(800, 600), dpi=120)
    try:
        assert sbx.get_screen_size() == (800, 600), sbx.get_screen_size()
        assert image(sbx.screenshot()).size == (800, 600)
        dpi = sbx.commands.run("xdpyinfo | grep resolution:").stdout
        assert "120x120 dots per inch" in dpi, dpi
        try:
            sbx.stream.get_auth_key()
            raise AssertionError("an auth key without require_auth")
        except RuntimeError:
            pass

        sbx.stream.start()
        url = sbx.stream.get_url()
        assert url == f"https://{sbx.get_host(6080)}/vnc.html?autoconnect=true&resize=scale", url
        status, _, body = through_gateway(sbx, "/vnc.html")
        assert status == 200 and b"noVNC" in body, (status, body[:200])
        hello = rfb_hello(sbx)
        assert hello["security"] == [1] and (hello["width"], hello["height"]) == (800, 600), hello
        try:
            sbx.stream.start()
            raise AssertionError("a second stream started")
        except RuntimeError as e:
            assert "already running" in str(e), e
        stop_stream(sbx)
        status, _, body = wait_for("noVNC to stop", lambda: (
            lambda a: a if a[0] == 502 else None)(through_gateway(sbx, "/vnc.html")), within=20)
        assert b"is not open" in body, body

        # One window: the stream's screen is that window.
        probe = Probe(sbx, "320x200+100+100", ["#ff00ff"])
        window = [w for w in sbx.get_application_windows("probe") if w]
        assert len(window) == 1, window
        sbx.stream.start(window_id=window[0])
        hello = rfb_hello(sbx)
        assert (hello["width"], hello["height"]) == (probe.width, probe.height), (hello, probe.width)
        stop_stream(sbx)

        # With a password: x11vnc asks for VNC authentication. (The SDK
        # keeps asking for one in every later start of this sandbox's
        # stream, as on E2B.)
        sbx.stream.start(require_auth=True)
        key = sbx.stream.get_auth_key()
        assert re.fullmatch(r"[A-Za-z0-9]{16}", key), key
        assert sbx.stream.get_url(auth_key=key).endswith(f"&password={key}")
        assert rfb_hello(sbx)["security"] == [2]
        stop_stream(sbx)
        result(url=url, window=[hello["width"], hello["height"]])
    finally:
        sbx.kill()


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
