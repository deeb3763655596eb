"""Frames per second and bandwidth of a desktop sandbox's stream
(docs/desktop.md), through warren against a direct connection. Run by
bench/desktop-stream.sh, which starts `warren dev`; see there.

A desktop sandbox (the unmodified e2b-desktop SDK) shows a full-screen
window that flips between two images of random pixels every 20 ms, so
every frame changes every pixel and no encoding shrinks it (the worst
case for a stream). The stream is started as the SDK starts it (x11vnc on
5900, noVNC's websockify on 6080). A minimal RFB client (the `client`
mode of this file, stdlib only) then asks for frames as a VNC viewer
does — one incremental FramebufferUpdateRequest after each update — for
SECS seconds, in one encoding (Raw, or ZRLE: zlib, which noVNC also
offers), and counts whole updates (frames) and bytes, over each path:

  sandbox 5900  x11vnc itself, the client inside the sandbox (no WebSocket)
  sandbox 6080  websockify, the client inside the sandbox (WebSocket)
  gateway ws    the gateway's HTTP listener, host-routed (6080-{id}.{domain})
  gateway wss   the gateway's TLS listener, the same (what a browser uses)

The client inside the sandbox shares the sandbox's CPUs with x11vnc and
Xvfb; the one on the host shares the host's with warren. Prints a
Markdown table, after the time `Sandbox.create()` takes (CREATES times:
the SDK's create returns once Xfce is up).
"""

import argparse
import base64
import json
import os
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import time

RAW, ZRLE = 0, 16


class WebSocket:
    """A WebSocket client on `sock` (binary messages; enough for websockify)."""

    def __init__(self, sock, host, path="/websockify"):
        self.sock = sock
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: binary\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            more = sock.recv(4096)
            if not more:
                raise SystemExit(f"websocket handshake: closed after {head!r}")
            head += more
        head, rest = head.split(b"\r\n\r\n", 1)
        self.pending = bytearray(rest)
        if not head.startswith(b"HTTP/1.1 101"):
            raise SystemExit(f"websocket handshake: {head.decode(errors='replace')}")
        self.bytes = len(self.pending)

    def _exact(self, n):
        while len(self.pending) < n:
            more = self.sock.recv(1 << 20)
            if not more:
                raise EOFError
            self.bytes += len(more)
            self.pending += more
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    def recv(self):
        """The next data frame's payload."""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 127
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            if b0 & 15 in (0, 1, 2):
                return payload
            if b0 & 15 == 8:
                raise EOFError

    def sendall(self, data):
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x82]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(head + mask + body)


class Tcp:
    def __init__(self, sock):
        self.sock, self.bytes = sock, 0

    def recv(self):
        more = self.sock.recv(1 << 20)
        if not more:
            raise EOFError
        self.bytes += len(more)
        return more

    def sendall(self, data):
        self.sock.sendall(data)


class Rfb:
    """Reads RFB messages from a transport's byte stream."""

    def __init__(self, transport):
        self.t, self.buf = transport, bytearray()

    def need(self, n):
        while len(self.buf) < n:
            self.buf += self.t.recv()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def skip(self, n):
        take = min(n, len(self.buf))
        del self.buf[:take]
        n -= take
        while n:
            chunk = self.t.recv()
            take = min(n, len(chunk))
            n -= take
            self.buf += chunk[take:]


def measure(transport, encoding, secs):
    rfb = Rfb(transport)
    rfb.need(12)
    transport.sendall(b"RFB 003.008\n")
    types = rfb.need(rfb.need(1)[0])
    assert 1 in types, f"the server wants a password ({list(types)})"
    transport.sendall(b"\x01")
    assert struct.unpack(">I", rfb.need(4))[0] == 0
    transport.sendall(b"\x01")
    width, height = struct.unpack(">HH", rfb.need(4))
    bpp = rfb.need(16)[0]
    rfb.need(struct.unpack(">I", rfb.need(4))[0])
    transport.sendall(struct.pack(">BxHi", 2, 1, encoding))
    request = lambda incremental: struct.pack(">BBHHHH", 3, incremental, 0, 0, width, height)
    transport.sendall(request(0))
    frames, start, first = 0, time.monotonic(), None
    while True:
        kind = rfb.need(1)[0]
        if kind == 0:
            (rects,) = struct.unpack(">xH", rfb.need(3))
            for _ in range(rects):
                _, _, w, h, enc = struct.unpack(">HHHHi", rfb.need(12))
                if enc == RAW:
                    rfb.skip(w * h * bpp // 8)
                elif enc == ZRLE:
                    rfb.skip(struct.unpack(">I", rfb.need(4))[0])
                else:
                    raise SystemExit(f"unexpected encoding {enc}")
            now = time.monotonic()
            if first is None:
                # From the first full frame on: the handshake is not streaming.
                first, base = now, transport.bytes
            else:
                frames += 1
            if now - first >= secs:
                break
            transport.sendall(request(1))
        elif kind == 1:
            _, n = struct.unpack(">xHH", rfb.need(5))
            rfb.need(6 * n)
        elif kind == 2:
            pass
        elif kind == 3:
            rfb.need(struct.unpack(">xxxI", rfb.need(7))[0])
        else:
            raise SystemExit(f"unexpected message {kind}")
    took = time.monotonic() - first
    return {"frames": frames, "secs": took, "fps": frames / took,
            "mbytes_per_sec": (transport.bytes - base) / took / 1e6,
            "size": [width, height]}


def client(args):
    """Measures one path from here; prints the result as JSON."""
    sock = socket.create_connection((args.host, args.port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if args.tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        sock = ctx.wrap_socket(sock, server_hostname=args.host_header)
    transport = Tcp(sock) if args.raw_tcp else WebSocket(sock, args.host_header or args.host)
    print(json.dumps(measure(transport, ZRLE if args.encoding == "zrle" else RAW, args.secs)))


ANIMATE = r"""
# Full screen, flipping between two images of random pixels every 20 ms.
image create photo a -file /tmp/noise-a.ppm
image create photo b -file /tmp/noise-b.ppm
wm attributes . -fullscreen 1
label .l -image a -borderwidth 0
pack .l
proc flip {} {
    .l configure -image [expr {[.l cget -image] eq "a" ? "b" : "a"}]
    after 20 flip
}
flip
"""


def creates(n):
    """`Sandbox.create()` of the desktop SDK, `n` times: from the request to
    Xfce up (the SDK's own ready check); each sandbox killed after."""
    from e2b_desktop import Sandbox

    took = []
    for _ in range(n):
        start = time.monotonic()
        sbx = Sandbox.create(timeout=120)
        took.append(time.monotonic() - start)
        sbx.kill()
    print(f"`Sandbox.create()` (e2b-desktop), {n} in a row: median {statistics.median(took):.2f} s, "
          f"min {min(took):.2f} s, max {max(took):.2f} s\n")


def bench(args):
    from e2b_desktop import Sandbox

    if args.creates:
        creates(args.creates)
    here = open(__file__).read()
    sbx = Sandbox.create(timeout=1800)
    try:
        w, h = sbx.get_screen_size()
        for name in ["a", "b"]:
            noise = f"P6 {w} {h} 255\n".encode() + os.urandom(w * h * 3)
            sbx.files.write(f"/tmp/noise-{name}.ppm", noise)
        sbx.files.write("/tmp/animate.tcl", ANIMATE)
        sbx.files.write("/tmp/desktop_stream.py", here)
        sbx.commands.run("wish /tmp/animate.tcl", background=True, timeout=0)
        sbx.wait(2000)
        sbx.stream.start()
        host = sbx.get_host(6080)
        gw_host, gw_port = args.gateway.rsplit(":", 1)
        tls_host, tls_port = args.tls_gateway.rsplit(":", 1)
        paths = [
            ("sandbox 5900 (x11vnc)", "inside", ["--port", "5900", "--raw-tcp"]),
            ("sandbox 6080 (websockify)", "inside", ["--port", "6080"]),
            ("gateway ws://", "host", ["--host", gw_host, "--port", gw_port, "--host-header", host]),
            ("gateway wss://", "host", ["--host", tls_host, "--port", tls_port, "--host-header", host, "--tls"]),
        ]
        print(f"desktop {w}x{h}, {args.secs} s per run, median of {args.rounds} interleaved rounds\n")
        runs = {}
        for _ in range(args.rounds):
            for encoding in args.encodings.split():
                for label, where, extra in paths:
                    cmd = ["client", "--encoding", encoding, "--secs", str(args.secs), *extra]
                    if where == "inside":
                        line = sbx.commands.run("python3 /tmp/desktop_stream.py " + " ".join(cmd),
                                                timeout=args.secs + 60).stdout
                    else:
                        line = subprocess.run([sys.executable, __file__, *cmd], check=True,
                                              capture_output=True, text=True,
                                              timeout=args.secs + 60).stdout
                    runs.setdefault((label, encoding), []).append(json.loads(line))
        print("| path | encoding | frames/s | MB/s |")
        print("|---|---|---:|---:|")
        for (label, encoding), got in runs.items():
            fps = statistics.median(r["fps"] for r in got)
            mbs = statistics.median(r["mbytes_per_sec"] for r in got)
            print(f"| {label} | {encoding} | {fps:.1f} | {mbs:.1f} |", flush=True)
        sbx.stream.stop()
    finally:
        sbx.kill()


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("client")
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--host-header", default="")
    c.add_argument("--tls", action="store_true")
    c.add_argument("--raw-tcp", action="store_true")
    c.add_argument("--encoding", choices=["raw", "zrle"], default="raw")
    c.add_argument("--secs", type=float, default=10)
    b = sub.add_parser("bench")
    b.add_argument("--gateway", required=True, help="host:port of the gateway's HTTP listener")
    b.add_argument("--tls-gateway", required=True, help="host:port of its TLS listener")
    b.add_argument("--secs", type=float, default=10)
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--encodings", default="raw zrle")
    b.add_argument("--creates", type=int, default=5, help="creates to time first (0: none)")
    args = p.parse_args()
    (client if args.mode == "client" else bench)(args)


if __name__ == "__main__":
    main()
