"""Run inside a desktop sandbox by the desktop tests (tests/e2b/desktop.py,
tests/js-desktop/desktop.mjs): reads the first messages of the RFB (VNC)
server on 127.0.0.1:PORT — its version, the security types it offers and,
when it offers none (type 1), the framebuffer's size from ServerInit, which
is what a VNC viewer learns first — and prints them as one JSON line.

    python3 rfb_hello.py PORT
"""

import json
import socket
import struct
import sys

sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)


def exact(n):
    got = b""
    while len(got) < n:
        more = sock.recv(n - len(got))
        if not more:
            raise SystemExit("the server closed the connection")
        got += more
    return got


out = {"version": exact(12).decode().strip()}
sock.sendall(b"RFB 003.008\n")
out["security"] = list(exact(exact(1)[0]))
if 1 in out["security"]:
    sock.sendall(b"\x01")
    assert struct.unpack(">I", exact(4))[0] == 0, "the security handshake failed"
    sock.sendall(b"\x01")  # ClientInit: shared
    out["width"], out["height"] = struct.unpack(">HH", exact(4))
print(json.dumps(out))
