#!/usr/bin/env python3
"""An HTTP echo server on port 8080, answering as go-httpbin does (what
E2B's `httpbin` template runs): header values as lists, header names in
Go's canonical form (`X-Test-Token`), JSON bodies. It serves the few
endpoints E2B's tests and a person poking at a sandbox use:

  /headers          {"headers": {...}}
  /get              {"args", "headers", "method", "origin", "url"}
  /anything[/...]   the same for any method, with "data" and "json"
  /status/<code>    that status, empty body
  /ip               {"origin"}
  /                 a line of text (the template's ready command)

Standard library only (Debian's python3 in `base`).
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = 8080
MAX_BODY = 1 << 20


def canonical(name):
    """Go's http.CanonicalHeaderKey: each dash-separated word capitalized."""
    return "-".join(w[:1].upper() + w[1:].lower() for w in name.split("-"))


class Handler(BaseHTTPRequestHandler):
    server_version = "warren-httpbin"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("httpbin: " + (fmt % args) + "\n")

    def headers_json(self):
        out = {}
        for name, value in self.headers.items():
            out.setdefault(canonical(name), []).append(value)
        return out

    def reply(self, status, body=None):
        data = b"" if body is None else (json.dumps(body, indent=2) + "\n").encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(length, MAX_BODY)) if length > 0 else b""

    def common(self):
        url = urlsplit(self.path)
        host = self.headers.get("Host", "")
        return {
            "args": parse_qs(url.query),
            "headers": self.headers_json(),
            "method": self.command,
            "origin": self.client_address[0],
            "url": f"http://{host}{self.path}",
        }

    def route(self):
        path = urlsplit(self.path).path
        if path == "/":
            data = b"warren httpbin\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        elif path == "/headers":
            self.reply(200, {"headers": self.headers_json()})
        elif path == "/ip":
            self.reply(200, {"origin": self.client_address[0]})
        elif path == "/get" and self.command in ("GET", "HEAD"):
            self.reply(200, self.common())
        elif path == "/anything" or path.startswith("/anything/"):
            raw = self.body()
            out = self.common()
            out["data"] = raw.decode("utf-8", "replace")
            try:
                out["json"] = json.loads(raw) if raw else None
            except ValueError:
                out["json"] = None
            self.reply(200, out)
        elif path.startswith("/status/"):
            try:
                code = int(path.split("/")[2])
            except ValueError:
                code = 0
            if 100 <= code <= 599:
                self.reply(code)
            else:
                self.reply(400, {"error": "invalid status code"})
        else:
            self.reply(404, {"error": "not found"})

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = route


if __name__ == "__main__":
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
