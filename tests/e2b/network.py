"""E2B's network API as a user of an `isolated` sandbox notices it, with the
unmodified `e2b` Python SDK (and raw HTTP) through a gateway:
`Sandbox.update_network` changes a running sandbox's egress at once (an
address refused, then allowed, then refused again; a sandbox created
without a network gets one); bad rules are a 400 naming the entry, another
team's sandbox a 404; `allow_public_traffic=False` makes the sandbox's ports
answer 403 without its traffic access token (envd needs none);
`mask_request_host` is the Host a server in the sandbox sees. The `process`
runtime cannot change egress (501), but its ports are private and masked too.

Run by `crates/warren/tests/network.rs`, one case per invocation:

    python network.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and case-specific WARREN_*
variables: WARREN_TARGET (`address:port` of a listener the host routes to
but that is none of the host's own addresses), WARREN_OTHER_KEY (another
team's API key), WARREN_RESOLVERS (a JSON list of the host's resolvers, as
its /etc/resolv.conf names them), WARREN_SANDBOX (a sandbox an earlier case
left running). Each case prints one `RESULT {json}` line of facts.

Also: `allowOut`/`denyOut` past 1 000 entries are a 400 naming the field
and the limit, and a sandbox at the limit enforces it (the Rust side reads
its nftables table back); DNS follows the policy (no internet and no
domain: no DNS; a `denyOut` naming the resolver refuses it); a sandbox's
slirp4netns survives a pause and goes with a kill while paused.
"""

import json
import os
import shlex
import sys
import time

from e2b import Sandbox

from common import http, ok, result, run

API_KEY = os.environ["E2B_API_KEY"]
SANDBOX_URL = os.environ["E2B_SANDBOX_URL"]

# Connects to host:port from inside: prints "ok", "refused", "timeout" or
# "unreachable: ..." (see sandboxes.py's probe for why the state is read).
PROBE = r'''
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
s.settimeout(5)
try:
    s.connect((host, port))
except ConnectionRefusedError:
    print("refused"); sys.exit()
except socket.timeout:
    print("timeout"); sys.exit()
except OSError as e:
    print("unreachable: %s" % e); sys.exit()
deadline = time.monotonic() + 5
while s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 2 and time.monotonic() < deadline:
    time.sleep(0.01)
print("ok" if s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in (1, 8) else "unreachable")
'''

# A server on PORT that answers every GET with the Host header it got (and
# writes it to /tmp/host.txt).
HOST_ECHO = r'''
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        host = self.headers.get("Host", "")
        seen = sorted(self.headers.keys())
        with open("/tmp/host.txt", "w") as f:
            f.write(host)
        body = ("%s\n%s" % (host, ",".join(seen))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
'''


def start_echo(sbx, port):
    """Starts HOST_ECHO on `port` in the background (inline: a `process`
    sandbox's files and its commands do not share one /tmp)."""
    sbx.commands.run(f"python3 -c {shlex.quote(HOST_ECHO)} {port}", background=True)


def target():
    host, port = os.environ["WARREN_TARGET"].rsplit(":", 1)
    return host, int(port)


def probe(sbx):
    host, port = target()
    code, out, err, _ = run(sbx, f"python3 /tmp/probe.py {host} {port}", timeout=30)
    assert code == 0, (code, out, err)
    return out.strip()


def eventually(fn, what, tries=40, pause=0.5):
    last = None
    for _ in range(tries):
        last = fn()
        if last:
            return last
        time.sleep(pause)
    raise AssertionError(f"{what}: never happened (last: {last!r})")


def answered(get, what, status=200):
    """Repeats `get()` (a request) until it answers `status`; returns that
    answer, or fails with the last one."""
    last = []

    def once():
        r = get()
        last[:] = [r[0], r[2][:300]]
        return r if r[0] == status else None
    try:
        return eventually(once, what)
    except AssertionError as e:
        raise AssertionError(f"{e}; last answer: {last}")


def port_get(sbx, port, headers=None):
    """GET / on the sandbox's `port` through the gateway (E2b-Sandbox-*
    headers, as the SDK addresses a sandbox with E2B_SANDBOX_URL)."""
    h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)}
    h.update(headers or {})
    return http("GET", "/", h, base=SANDBOX_URL)


def info(sbx_id, key=API_KEY):
    status, _, raw = http("GET", f"/sandboxes/{sbx_id}", {"X-API-Key": key})
    assert status == 200, (status, raw)
    return json.loads(raw)


def put_network(sbx_id, body, key=API_KEY):
    status, _, raw = http("PUT", f"/sandboxes/{sbx_id}/network",
                          {"X-API-Key": key, "Content-Type": "application/json"},
                          json.dumps(body).encode())
    return status, (json.loads(raw) if raw else None)


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def update_egress():
    host, _ = target()
    sbx = Sandbox.create(timeout=300, network={"deny_out": [f"{host}/32"]})
    sbx.files.write("/tmp/probe.py", PROBE)
    steps = {}
    steps["created denying it"] = probe(sbx)
    assert steps["created denying it"] != "ok", steps

    # An empty update clears every rule: the address connects.
    sbx.update_network({})
    steps["after {}"] = probe(sbx)
    assert steps["after {}"] == "ok", steps
    assert info(sbx.sandbox_id)["network"]["denyOut"] == [], info(sbx.sandbox_id)

    # Denied again, live.
    sbx.update_network({"deny_out": [host]})
    steps["denied again"] = probe(sbx)
    assert steps["denied again"] != "ok", steps
    got = sbx.get_info()
    assert got.network and got.network.get("deny_out") == [host], got.network
    assert info(sbx.sandbox_id)["allowInternetAccess"] is True

    # Deny everything but allow it: allowOut wins, as in E2B.
    sbx.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": [host]})
    steps["only it allowed"] = probe(sbx)
    assert steps["only it allowed"] == "ok", steps

    # No internet at all.
    sbx.update_network({"allow_internet_access": False})
    steps["no internet"] = probe(sbx)
    assert steps["no internet"] != "ok", steps
    assert info(sbx.sandbox_id)["allowInternetAccess"] is False

    # Bad rules: a 400 naming the entry, and nothing changed.
    errors = {}
    for body, entry in [({"denyOut": ["example.com"]}, "example.com"),
                        ({"allowOut": ["10.0.0.0/99"]}, "10.0.0.0/99"),
                        ({"allowOut": "1.1.1.1"}, "allowOut"),
                        ({"egressProxy": {"address": "proxy:1080"}}, "egressProxy")]:
        status, err = put_network(sbx.sandbox_id, body)
        assert status == 400 and entry in err["message"], (body, status, err)
        errors[entry] = err["message"]
    try:
        sbx.update_network({"deny_out": ["not an address"]})
    except Exception as e:  # the SDK's InvalidArgumentException
        sdk_error = f"{type(e).__name__}: {e}"
    else:
        raise AssertionError("a bad deny_out entry was accepted")
    assert "not an address" in sdk_error, sdk_error
    assert probe(sbx) != "ok"

    # Another team's sandbox is not found; an unknown one neither.
    other = os.environ["WARREN_OTHER_KEY"]
    status, err = put_network(sbx.sandbox_id, {}, key=other)
    assert status == 404, (status, err)
    assert probe(sbx) != "ok", "another team's update changed the sandbox"
    status, _ = put_network("nosuchsandbox0000000", {})
    assert status == 404, status

    assert ok(sbx)
    sbx.kill()
    result(sandbox=sbx.sandbox_id, steps=steps, errors=errors, sdk_error=sdk_error)


@case
def network_given_later():
    """A sandbox created without a network (no tap0 at all) gets one from
    an update, and loses it again."""
    sbx = Sandbox.create(timeout=300, allow_internet_access=False)
    sbx.files.write("/tmp/probe.py", PROBE)
    steps = {"created without": probe(sbx)}
    assert steps["created without"] != "ok", steps
    sbx.update_network({"allow_internet_access": True})
    steps["given"] = probe(sbx)
    assert steps["given"] == "ok", steps
    sbx.update_network({"allow_internet_access": False})
    steps["taken away"] = probe(sbx)
    assert steps["taken away"] != "ok", steps
    assert ok(sbx)
    sbx.kill()
    result(sandbox=sbx.sandbox_id, steps=steps)


@case
def private_traffic():
    # auto_resume: the pause below is woken by traffic (the SDK allows it
    # only with on_timeout=pause).
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False},
                         lifecycle={"on_timeout": "pause", "auto_resume": True})
    token = sbx.traffic_access_token
    assert token, "a private sandbox has a traffic access token"

    # envd needs no traffic token: the SDK's own calls work.
    start_echo(sbx, 8080)

    with_token = answered(lambda: port_get(sbx, 8080, {"e2b-traffic-access-token": token}),
                         "the server answers with the token")
    seen = [k.lower() for k in with_token[2].decode().split("\n")[1].split(",")]
    assert "e2b-traffic-access-token" not in seen, seen

    status, _, raw = port_get(sbx, 8080)
    assert status == 403, (status, raw)
    missing = json.loads(raw)
    assert missing["code"] == 403 and "e2b-traffic-access-token" in missing["message"], missing
    status, _, raw = port_get(sbx, 8080, {"e2b-traffic-access-token": token[:-1] + "x"})
    assert status == 403, (status, raw)
    # Another sandbox's token is not this one's.
    other = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    status, _, _ = port_get(sbx, 8080, {"e2b-traffic-access-token": other.traffic_access_token})
    assert status == 403, status
    assert other.traffic_access_token != token
    other.kill()

    # envd's port without it.
    assert ok(sbx)
    status, _, _ = port_get(sbx, 49983)
    assert status != 403, status

    # What the API reports; connect hands the same token out again.
    detail = info(sbx.sandbox_id)
    assert detail["network"]["allowPublicTraffic"] is False, detail
    assert token not in json.dumps(detail), "GET /sandboxes/{id} carries the traffic token"
    status, _, raw = http("GET", "/v2/sandboxes", {"X-API-Key": API_KEY})
    assert status == 200 and token not in raw.decode(), "a listing carries the traffic token"
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.traffic_access_token == token, again.traffic_access_token

    # Paused, it is woken only by a request it would let through.
    sbx.pause()
    assert info(sbx.sandbox_id)["state"] == "paused"
    status, _, raw = port_get(sbx, 8080)
    assert status == 403, (status, raw)
    assert info(sbx.sandbox_id)["state"] == "paused", "a request without the token woke it"
    woken = answered(lambda: port_get(sbx, 8080, {"e2b-traffic-access-token": token}),
                     "the paused sandbox's server answers with the token")
    assert info(sbx.sandbox_id)["state"] == "running"

    # A public sandbox: no token, its port answers anyone.
    pub = Sandbox.create(timeout=120)
    assert pub.traffic_access_token is None
    start_echo(pub, 8080)
    answered(lambda: port_get(pub, 8080), "a public sandbox's port answers")
    assert info(pub.sandbox_id)["network"]["allowPublicTraffic"] is True
    pub.kill()
    sbx.kill()
    result(sandbox=sbx.sandbox_id, missing=missing)


@case
def mask_host():
    sbx = Sandbox.create(timeout=300,
                         network={"mask_request_host": "custom-host.example.com:${PORT}"})
    start_echo(sbx, 8080)
    r = answered(lambda: port_get(sbx, 8080), "the server answers")
    seen = r[2].decode().split("\n")[0]
    assert seen == "custom-host.example.com:8080", seen
    # Header names as E2B's proxy writes them (servers may look at the case).
    names = r[2].decode().split("\n")[1].split(",")
    assert "Host" in names and "User-Agent" in names, names
    inside = sbx.files.read("/tmp/host.txt")
    assert inside == "custom-host.example.com:8080", inside
    detail = info(sbx.sandbox_id)
    assert detail["network"]["maskRequestHost"] == "custom-host.example.com:${PORT}", detail
    # Without a mask the Host is what the client sent.
    plain = Sandbox.create(timeout=120)
    start_echo(plain, 8080)
    r = answered(lambda: port_get(plain, 8080), "the unmasked server answers")
    plain_host = r[2].decode().split("\n")[0]
    assert "custom-host" not in plain_host, plain_host
    plain.kill()
    # A bad mask is refused at create, naming it.
    try:
        Sandbox.create(timeout=60, network={"mask_request_host": "bad host\r\nX: y"})
    except Exception as e:
        bad = f"{type(e).__name__}: {e}"
    else:
        raise AssertionError("a bad mask was accepted")
    assert "maskRequestHost" in bad, bad
    sbx.kill()
    result(sandbox=sbx.sandbox_id, seen=seen, plain=plain_host, bad=bad)


@case
def no_isolation():
    """The process runtime has no network isolation: an update says so."""
    sbx = Sandbox.create(timeout=120)
    status, err = put_network(sbx.sandbox_id, {"denyOut": ["10.0.0.1"]})
    assert status == 501 and "process runtime" in err["message"], (status, err)
    try:
        sbx.update_network({"deny_out": ["10.0.0.1"]})
    except Exception as e:
        sdk_error = f"{type(e).__name__}: {e}"
    else:
        raise AssertionError("update_network on a process sandbox succeeded")
    assert "process runtime" in sdk_error, sdk_error
    assert ok(sbx)
    sbx.kill()
    result(status=status, message=err["message"], sdk_error=sdk_error)


@case
def private_process():
    """A private sandbox on the process runtime: its port needs the token
    too (the node checks it, whatever the runtime), its Host is masked."""
    port = int(os.environ["WARREN_PORT"])
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False,
                                               "mask_request_host": "masked.example:${PORT}"})
    token = sbx.traffic_access_token
    start_echo(sbx, port)
    r = answered(lambda: port_get(sbx, port, {"e2b-traffic-access-token": token}),
                 "the server answers")
    assert r[2].decode().split("\n")[0] == f"masked.example:{port}", r
    status, _, raw = port_get(sbx, port)
    assert status == 403, (status, raw)
    result(sandbox=sbx.sandbox_id, token=token, status=status)


# Asks the resolver at argv[1] (port 53, UDP) for pypi.org's A record:
# prints "answered" or "no answer" (three tries of 3 s).
DNS_QUERY = r"""
import socket, sys
q = (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
     b"\x04pypi\x03org\x00\x00\x01\x00\x01")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
for _ in range(3):
    try:
        s.sendto(q, (sys.argv[1], 53))
        data, _ = s.recvfrom(512)
        if data[:2] == b"\x12\x34":
            print("answered"); sys.exit()
    except OSError:
        pass
print("no answer")
"""

# Resolves argv[1] with the sandbox's resolver (glibc, /etc/resolv.conf):
# prints the first address or "error: ...".
RESOLVE = r"""
import socket, sys
try:
    print(socket.getaddrinfo(sys.argv[1], 443, socket.AF_INET)[0][4][0])
except Exception as e:
    print("error: %s" % e)
"""


def spread(n, first, second=0):
    """`n` single addresses `first.second+.x.1`, none next to another (so
    no two merge into one range; keep them away from the target's
    198.19.0.0/16 too, or one may merge with it)."""
    return [f"{first}.{second + i // 125}.{(i % 125) * 2}.1" for i in range(n)]


def host_uid(sbx):
    """The host uid the sandbox's root is (its uid_map's line for 0)."""
    code, out, err, _ = run(sbx, "cat /proc/self/uid_map", user="root")
    assert code == 0, (out, err)
    for line in out.splitlines():
        inside, outside, _ = line.split()
        if inside == "0":
            return int(outside)
    raise AssertionError(out)


@case
def bounded_lists():
    """Past 1 000 entries: a 400 naming the field and the limit, at create
    (SDK and raw HTTP) and at update. At the limit: enforced. Leaves two
    sandboxes running, one at the limit and one with one entry a list, for
    the Rust side to read their tables."""
    host, _ = target()
    errors = {}
    try:
        Sandbox.create(timeout=60, network={"deny_out": spread(1001, 100, 64)})
    except Exception as e:  # the SDK's InvalidArgumentException
        errors["sdk create denyOut"] = f"{type(e).__name__}: {e}"
    else:
        raise AssertionError("a create with 1001 denyOut entries was accepted")
    assert "denyOut" in errors["sdk create denyOut"] and "1000" in errors["sdk create denyOut"], errors
    body = json.dumps({"templateID": "base", "network": {"allowOut": spread(1001, 100, 64)}}).encode()
    status, _, raw = http("POST", "/sandboxes", {"X-API-Key": API_KEY,
                                                "Content-Type": "application/json"}, body)
    assert status == 400 and b"allowOut" in raw and b"1000" in raw, (status, raw)
    errors["http create allowOut"] = json.loads(raw)["message"]

    # At the limit: the target among 1 000 denied addresses is refused, and
    # 1 000 allowed ones change nothing else.
    deny = spread(999, 100, 64) + [host]
    full = Sandbox.create(timeout=300, network={"deny_out": deny,
                                                "allow_out": spread(1000, 203, 0)})
    full.files.write("/tmp/probe.py", PROBE)
    steps = {"denied among 1000": probe(full)}
    assert steps["denied among 1000"] != "ok", steps
    status, err = put_network(full.sandbox_id, {"denyOut": spread(1001, 100, 64)})
    assert status == 400 and "denyOut" in err["message"] and "1000" in err["message"], (status, err)
    errors["put denyOut"] = err["message"]
    assert probe(full) != "ok", "a refused update changed the policy"
    # allowOut wins, at the limit too: the target among 1 000 allowed.
    full.update_network({"deny_out": deny, "allow_out": spread(999, 203, 0) + [host]})
    steps["allowed among 1000"] = probe(full)
    assert steps["allowed among 1000"] == "ok", steps
    small = Sandbox.create(timeout=300, network={"deny_out": ["100.64.0.1"],
                                                 "allow_out": ["203.0.0.1"]})
    assert ok(full) and ok(small)
    result(full=host_uid(full), small=host_uid(small), steps=steps, errors=errors)


@case
def dns_under_policy():
    """DNS follows the policy. Inside, the resolver is slirp4netns's
    10.0.2.3, which forwards to the host's resolvers (WARREN_RESOLVERS): a
    query to either, and a name lookup, succeed or fail together."""
    resolvers = json.loads(os.environ["WARREN_RESOLVERS"])
    resolver = resolvers[0]
    host, port = target()

    def facts(sbx):
        sbx.files.write("/tmp/probe.py", PROBE)
        sbx.files.write("/tmp/dns.py", DNS_QUERY)
        sbx.files.write("/tmp/resolve.py", RESOLVE)
        out = {}
        for name, cmd in [("lookup", "python3 /tmp/resolve.py pypi.org"),
                          ("slirp resolver", "python3 /tmp/dns.py 10.0.2.3"),
                          ("host resolver", f"python3 /tmp/dns.py {resolver}"),
                          ("host resolver tcp", f"python3 /tmp/probe.py {resolver} 53")]:
            code, o, e, _ = run(sbx, cmd, timeout=90)
            assert code == 0, (name, o, e)
            out[name] = o.strip()
        return out

    def resolves(f):
        return not f["lookup"].startswith("error") and f["slirp resolver"] == "answered" \
            and f["host resolver"] == "answered"

    def refused(f):
        return f["lookup"].startswith("error") and f["slirp resolver"] == "no answer" \
            and f["host resolver"] == "no answer" and f["host resolver tcp"] == "refused"

    seen = {}
    # Control: a default sandbox resolves.
    sbx = Sandbox.create(timeout=300)
    seen["default"] = facts(sbx)
    assert resolves(seen["default"]), seen
    # denyOut naming the resolver refuses it (it came before the denials).
    sbx.update_network({"deny_out": [resolver]})
    seen["denyOut resolver (update)"] = facts(sbx)
    assert refused(seen["denyOut resolver (update)"]), seen
    # ... unless allowOut names it too: allowOut wins.
    sbx.update_network({"deny_out": [resolver], "allow_out": [resolver]})
    seen["allowOut and denyOut resolver"] = facts(sbx)
    assert resolves(seen["allowOut and denyOut resolver"]), seen
    sbx.kill()

    sbx = Sandbox.create(timeout=300, network={"deny_out": [f"{resolver}/32"]})
    seen["denyOut resolver"] = facts(sbx)
    assert refused(seen["denyOut resolver"]), seen
    sbx.kill()

    # No internet, an address allowed (so a tap0): no DNS.
    sbx = Sandbox.create(timeout=300, allow_internet_access=False,
                         network={"allow_out": [host]})
    seen["no internet, address allowed"] = facts(sbx)
    assert refused(seen["no internet, address allowed"]), seen
    sbx.files.write("/tmp/probe.py", PROBE)
    assert probe(sbx) == "ok", "the allowed address"
    sbx.kill()

    # No internet, a domain allowed: DNS works (the domain must resolve).
    sbx = Sandbox.create(timeout=300, allow_internet_access=False,
                         network={"allow_out": ["pypi.org"]})
    seen["no internet, domain allowed"] = facts(sbx)
    assert resolves(seen["no internet, domain allowed"]), seen
    sbx.kill()

    # No internet at all: no tap0, nothing resolves.
    sbx = Sandbox.create(timeout=300, allow_internet_access=False)
    sbx.files.write("/tmp/resolve.py", RESOLVE)
    code, o, _, _ = run(sbx, "python3 /tmp/resolve.py pypi.org", timeout=90)
    seen["no internet"] = o.strip()
    assert seen["no internet"].startswith("error"), seen
    sbx.kill()
    result(resolver=resolver, seen=seen)


@case
def slirp_running():
    """A sandbox with internet, left running: the Rust side finds its
    slirp4netns."""
    sbx = Sandbox.create(timeout=300)
    sbx.files.write("/tmp/probe.py", PROBE)
    assert probe(sbx) == "ok", "the target"
    result(sandbox=sbx.sandbox_id, uid=host_uid(sbx))


@case
def slirp_pause_kill():
    """The running sandbox WARREN_SANDBOX (its slirp4netns in its cgroups)
    pauses and resumes with its network, then is killed while paused."""
    sbx = Sandbox.connect(os.environ["WARREN_SANDBOX"])
    sbx.pause()
    assert info(sbx.sandbox_id)["state"] == "paused"
    sbx = Sandbox.connect(sbx.sandbox_id)  # resumes it
    assert info(sbx.sandbox_id)["state"] == "running"
    after = probe(sbx)
    assert after == "ok", f"the network after a resume: {after}"
    sbx.pause()
    assert info(sbx.sandbox_id)["state"] == "paused"
    sbx.kill()
    status, _, _ = http("GET", f"/sandboxes/{sbx.sandbox_id}", {"X-API-Key": API_KEY})
    assert status == 404, status
    result(sandbox=sbx.sandbox_id, after_resume=after)


if __name__ == "__main__":
    CASES[sys.argv[1]]()
