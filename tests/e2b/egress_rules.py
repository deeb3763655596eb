"""E2B's secrets and egress rules as a user notices them, with the
unmodified `e2b` Python SDK (and raw HTTP) through a gateway, against an
HTTPS server of the Rust test's own in a network namespace (its own CA,
which the node trusts through --egress-ca-file; the sandbox does not):

- the secrets API (`Secret.create/update/get_info/list/exists/destroy`,
  raw `/secrets`): values never in an answer; another team sees nothing;
- a `curl` in the sandbox gets `Authorization: Bearer <value>` injected,
  over h2; a secret updated now is used by the next request;
- a host without rules is not intercepted (the sandbox sees the server's
  own certificate); one with rules is (the server's CA alone fails);
- an unknown secret, another team's secret name, a destination whose
  certificate does not verify: refused at the proxy, clearly, nothing sent;
- a WebSocket upgrade passes, with the header;
- kept across a pause, frozen or filesystem-only (the same CA);
- the policy decides first (`denyOut` the server: the proxy cannot reach
  it either); rules replaced live (`update_network`), removed and back;
- the attacker's view from inside: environment, files, /proc, the proxy's
  listener and its error messages never show a value.

Run by `crates/warren/tests/secrets.rs`:

    python egress_rules.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and WARREN_TARGET_IP (the
server's address for the good hosts), WARREN_ROGUE_IP (a server whose
certificate no trusted CA signed), WARREN_TARGET_CA (the server CA, PEM),
WARREN_OTHER_KEY (team B's key). Prints one `RESULT {json}` line. (Not
`secrets.py`: that would shadow Python's own `secrets` module.)
"""

import json
import os
import shlex
import sys
import uuid

from e2b import Sandbox, Secret
from e2b.exceptions import SecretNotFoundException

from common import API_URL, http, ok, result, run

API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["WARREN_OTHER_KEY"]
TARGET_IP = os.environ["WARREN_TARGET_IP"]
ROGUE_IP = os.environ["WARREN_ROGUE_IP"]
TARGET_CA = os.environ["WARREN_TARGET_CA"]

# A WebSocket client: handshake, one masked text frame, the echo back.
WS = r'''
import base64, json, os, socket, ssl, sys
host, path, addr = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context()
s = ctx.wrap_socket(socket.create_connection((addr, 443), timeout=10), server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, host, key)).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    chunk = s.recv(4096)
    if not chunk:
        break
    buf += chunk
head, _, rest = buf.partition(b"\r\n\r\n")
status = head.split(b"\r\n")[0].decode()
msg = b"hello over a websocket"
mask = os.urandom(4)
s.sendall(bytes([0x81, 0x80 | len(msg)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
data = rest
while len(data) < 2:
    data += s.recv(4096)
n = data[1] & 0x7F
while len(data) < 2 + n:
    data += s.recv(4096)
print(json.dumps({"status": status, "echo": data[2:2 + n].decode()}))
'''


# The test's hosts, resolved as curl's --resolve says (the sandbox's
# /etc/hosts is its own again at every boot).
RESOLVE = " ".join(
    [f"--resolve {h}:443:{TARGET_IP}" for h in
     ("api.test", "other.test", "ws.test", "missing.test", "theirs.test")]
    + [f"--resolve bad.test:443:{ROGUE_IP}"])


def curl(sbx, url, extra=""):
    """curl from inside: (exit code, HTTP status, body, curl's stderr)."""
    code, out, err, _ = run(
        sbx,
        f"curl -sS --max-time 20 {RESOLVE} {extra} -w '\\n%{{http_code}} %{{http_version}}' "
        f"{shlex.quote(url)}",
        timeout=40,
    )
    body, _, tail = out.rpartition("\n")
    status, _, version = tail.partition(" ")
    return code, status, version, body, err


def echo(body):
    return json.loads(body)


def api(method, path, body=None, key=API_KEY):
    data = None if body is None else json.dumps(body).encode()
    status, headers, raw = http(method, path, headers={"X-API-Key": key, "Content-Type": "application/json"}, body=data)
    return status, headers, raw.decode()


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def secrets_and_rules():
    tag = uuid.uuid4().hex[:8]
    v1 = f"v1-{uuid.uuid4().hex}"
    v2 = f"v2-{uuid.uuid4().hex}"
    name = f"API-token-{tag}"
    theirs = f"theirs-{tag}"
    facts = {"values": [v1, v2]}
    answers = []  # every API answer, checked for values at the end

    # ---- The secrets API.
    info = Secret.create(name, v1, metadata={"purpose": "test"})
    assert info.name == name.lower() and info.version == 1, info
    assert Secret.exists(name) and Secret.exists(info.secret_id)
    assert Secret.get_info(name.lower()).secret_id == info.secret_id
    # Team B: the same name is its own; it cannot see team A's.
    Secret.create(theirs, f"b-{uuid.uuid4().hex}", api_key=OTHER_KEY)
    assert not Secret.exists(info.secret_id, api_key=OTHER_KEY)
    assert not Secret.exists(name, api_key=OTHER_KEY)
    status, _, body = api("POST", f"/secrets/{info.secret_id}", {"value": "x"}, key=OTHER_KEY)
    assert status == 404, (status, body)
    answers.append(body)
    status, _, body = api("POST", "/secrets", {"name": name, "value": "dup"})
    assert status == 409, (status, body)
    answers.append(body)
    status, _, body = api("POST", "/secrets", {"name": "sec_taken", "value": "x"})
    assert status == 400 and "reserved" in body, (status, body)
    status, _, body = api("POST", "/secrets", {"name": "ok-name", "value": "a\r\nX-Evil: 1"})
    assert status == 400 and "Evil" not in body, (status, body)
    # Pages: X-Next-Token, as the SDK's paginator reads it.
    extra = [Secret.create(f"page-{tag}-{i}", "p") for i in range(3)]
    paged, token = [], None
    while True:
        q = "?limit=2" + (f"&nextToken={token}" if token else "")
        status, headers, body = api("GET", "/secrets" + q)
        assert status == 200, (status, body)
        answers.append(body)
        page = json.loads(body)
        assert len(page) <= 2
        paged += [s["name"] for s in page]
        token = {k.lower(): v for k, v in headers.items()}.get("x-next-token")
        if not token:
            break
    assert name.lower() in paged and all(e.name in paged for e in extra), paged
    assert theirs not in paged
    sdk_listed = []
    p = Secret.list(limit=2)
    while p.has_next:
        sdk_listed += [s.name for s in p.next_items()]
    assert sorted(sdk_listed) == sorted(paged), (sdk_listed, paged)
    for e in extra:
        assert Secret.destroy(e.secret_id)
    assert not Secret.destroy(extra[0].secret_id)
    with_meta = api("GET", f"/secrets/{name.lower()}")[2]
    answers.append(with_meta)
    assert json.loads(with_meta)["metadata"] == {"purpose": "test"}, with_meta

    # ---- A sandbox with rules.
    bearer = {"transform": {"headers": {"Authorization": "Bearer " + Secret.fill(name)}}}
    rules = {
        "api.test": [bearer],
        "ws.test": [bearer],
        "bad.test": [bearer],
        "missing.test": [{"transform": {"headers": {"X-Key": Secret.fill(f"nope-{tag}")}}}],
        "theirs.test": [{"transform": {"headers": {"X-Key": Secret.fill(theirs)}}}],
    }
    sbx = Sandbox.create(timeout=600, network={"rules": rules})
    sbx.files.write("/tmp/target-ca.pem", TARGET_CA)
    sbx.files.write("/tmp/ws.py", WS)
    got = Sandbox.get_info(sbx.sandbox_id)
    shown = json.dumps(got.network)
    answers.append(shown)
    assert Secret.fill(name) in shown and v1 not in shown, shown
    facts["sandbox"] = sbx.sandbox_id

    # Injected, over h2.
    code, status, version, body, err = curl(sbx, "https://api.test/echo", "--http2")
    assert code == 0 and status == "200", (code, status, body, err)
    seen = echo(body)
    facts["inject"] = {"authorization": seen["headers"].get("authorization"),
                       "server_version": seen["version"], "curl_version": version}
    assert seen["headers"].get("authorization") == f"Bearer {v1}", seen
    assert version == "2" and seen["version"] == "HTTP/2.0", (version, seen)
    # Rotated: the next request uses the new value.
    Secret.update(name, v2)
    code, status, _, body, err = curl(sbx, "https://api.test/rotated", "--http1.1")
    assert code == 0 and status == "200", (code, status, body, err)
    seen = echo(body)
    assert seen["headers"].get("authorization") == f"Bearer {v2}", seen
    assert seen["version"] == "HTTP/1.1", seen
    facts["rotated"] = seen["headers"]["authorization"]
    # Intercepted: the server's CA alone does not verify the proxy's certificate.
    code, _, _, _, err = curl(sbx, "https://api.test/echo", "--cacert /tmp/target-ca.pem")
    assert code == 60, (code, err)
    # A host without rules: the sandbox's own TLS, the server's certificate.
    code, status, _, body, err = curl(sbx, "https://other.test/plain", "--cacert /tmp/target-ca.pem -v")
    assert code == 0 and status == "200", (code, status, body, err)
    issuer = [line for line in err.splitlines() if "issuer:" in line]
    assert issuer and "warren test target CA" in issuer[0], err
    assert "authorization" not in echo(body)["headers"], body
    facts["not_intercepted_issuer"] = issuer[0].strip()

    # Refused at the proxy: an unknown secret, another team's, a bad certificate.
    refusals = {}
    for host, needle in [("missing.test", f"nope-{tag}"), ("theirs.test", theirs),
                         ("bad.test", "certificate")]:
        code, status, _, body, err = curl(sbx, f"https://{host}/refused", "-i")
        refusals[host] = body
        answers.append(body)
        assert code == 0 and status in ("502", "503"), (host, code, status, body, err)
        assert needle in body and "x-warren-egress: refused" in body.lower(), (host, body)
    facts["refusals"] = refusals

    # A WebSocket through the proxy, with the header.
    code, out, err, _ = run(sbx, f"python3 /tmp/ws.py ws.test /ws {TARGET_IP}", timeout=40)
    assert code == 0, (code, out, err)
    facts["websocket"] = json.loads(out)
    assert facts["websocket"]["status"].endswith("101 Switching Protocols"), facts["websocket"]
    assert facts["websocket"]["echo"] == "hello over a websocket", facts["websocket"]

    # The policy decides first: with the server denied, the proxy cannot
    # reach it either (its connections are the sandbox's).
    sbx.update_network({"deny_out": [f"{TARGET_IP}/32"], "rules": rules})
    code, status, _, body, err = curl(sbx, "https://api.test/denied", "-i")
    answers.append(body)
    assert status == "502" and "refused" in body, (code, status, body, err)
    facts["denied"] = body.splitlines()[-1] if body else ""
    # Rules removed live: the sandbox's own TLS again.
    sbx.update_network({})
    code, _, _, _, err = curl(sbx, "https://api.test/unruled")
    assert code == 60, (code, err)
    code, status, _, body, err = curl(sbx, "https://api.test/unruled", "--cacert /tmp/target-ca.pem")
    assert code == 0 and "authorization" not in echo(body)["headers"], (code, body, err)
    # And back.
    sbx.update_network({"rules": {"api.test": [bearer]}})
    code, status, _, body, err = curl(sbx, "https://api.test/again")
    assert code == 0 and echo(body)["headers"].get("authorization") == f"Bearer {v2}", (code, body, err)
    assert Sandbox.get_info(sbx.sandbox_id).network["rules"] == {"api.test": [bearer]}

    # Kept across pauses: frozen in place, and filesystem-only (a cold boot
    # from its disk, its proxy and CA set up again, the same CA).
    trust = ("sha256sum /usr/local/share/ca-certificates/warren-egress-ca.crt; "
             "grep -c 'warren sandbox egress CA: begin' /etc/ssl/certs/ca-certificates.crt")
    before = run(sbx, trust)[1]
    for mode in ("full", "filesystem"):
        sbx.pause(mode=mode)
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=600)
        code, status, _, body, err = curl(sbx, f"https://api.test/after-{mode}")
        assert code == 0 and echo(body)["headers"].get("authorization") == f"Bearer {v2}", \
            (mode, code, status, body, err)
    after = run(sbx, trust)[1]
    assert after == before and after.strip().endswith("\n1"), (before, after)

    # ---- The attacker's view, as the sandbox's root.
    look = {}
    for what, cmd in [
        ("environment", "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"),
        ("cmdlines", "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '"),
        ("files", "grep -rIl -e V1 -e V2 /etc /home /root /tmp /var /run /opt /usr/local 2>/dev/null | head -5"),
        ("sockets", "cat /proc/net/tcp /proc/net/tcp6 /proc/net/unix 2>/dev/null; ss -tanp 2>/dev/null"),
    ]:
        code, out, err, _ = run(sbx, cmd.replace("V1", v1).replace("V2", v2), user="root", timeout=60)
        look[what] = out + err
    # The proxy's listener, dialed directly: nothing comes back.
    code, out, err, _ = run(sbx, r'''python3 - <<'EOF'
import re, socket
port = None
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    f = line.split()
    if f[3] == "0A" and f[1].startswith("0100007F:"):
        port = int(f[1].split(":")[1], 16)
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
        try:
            print(port, repr(s.recv(4096)))
        except Exception as e:
            print(port, "error", e)
EOF''', user="root")
    look["direct"] = out + err
    facts["look"] = {k: len(v) for k, v in look.items()}
    for what, text in look.items():
        for v in (v1, v2):
            assert v not in text, f"{what} shows a secret value"
    for text in answers:
        assert v1 not in text and v2 not in text, text
    assert ok(sbx)
    sbx.kill()
    Secret.destroy(name)
    Secret.destroy(theirs, api_key=OTHER_KEY)
    try:
        Secret.update(name, "again")
        raise AssertionError("a destroyed secret was updated")
    except SecretNotFoundException:
        pass
    result(**facts)


if __name__ == "__main__":
    CASES[sys.argv[1]]()
