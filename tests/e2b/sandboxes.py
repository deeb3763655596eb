"""What a user of an `isolated` sandbox notices: packages install from the
internet (pip as `user`, apt-get through sudo), the network policy holds
(no internet, denied addresses, never the host or another sandbox), writes
stay in the sandbox, templates are listed and used. The unmodified `e2b`
Python SDK (and raw HTTP) through a gateway, with nothing but an API key.

Run by `crates/warren/tests/sandboxes.rs`, one case per invocation:

    python sandboxes.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and case-specific WARREN_*
variables set by the Rust test, which checks the host side (the template's
root, a host listener). Each case asserts what the user sees and prints one
JSON line of facts (`RESULT {...}`); it exits non-zero on a failed assertion.
It runs as root on the host: `host_without_own_table` removes the sandbox's
own nftables table itself (the fault that case tests).
"""

import json
import os
import socket
import subprocess
import sys
import time
from e2b import Sandbox

from common import API_URL, http, ok, result, run

SANDBOX_URL = os.environ["E2B_SANDBOX_URL"]
API_KEY = os.environ["E2B_API_KEY"]


def sh(sbx, cmd, user=None, timeout=60):
    """Runs `cmd`; returns (exit code, stdout, stderr) without raising."""
    return run(sbx, cmd, user=user, timeout=timeout)[:3]


def must(sbx, cmd, user=None, timeout=60):
    """Runs `cmd`, asserts it succeeded; returns its stdout."""
    code, out, err = sh(sbx, cmd, user=user, timeout=timeout)
    assert code == 0, f"{cmd!r} exited {code}:\n{out}\n{err}"
    return out


# A probe run inside a sandbox: `python3 probe.py JSON [ROUNDS]` where JSON
# is a list of [host, port]; prints, per target, "ok", "refused", "timeout",
# "unreachable: ..." or "dns: ..." as one JSON list; with ROUNDS, tries each
# target that many times and prints, per target, {outcome: count}.
#
# "ok" means the handshake completed: the socket is established (or the peer
# already closed its side). connect() alone is not trusted: when an ICMP
# error answers the SYN (slirp does so for its own addresses), Linux queues
# the error and wakes the waiting connect() before it records the error, so
# a connect with a timeout (poll, then SO_ERROR) may read "no error" and
# return for a socket that never connected (here up to about one connect in
# 500 to slirp's 10.0.2.2, more when the two run on different CPUs).
PROBE = r'''
import collections, json, os, socket, sys, time
STATES = {1: "established", 2: "syn-sent", 7: "closed", 8: "close-wait"}

def state(s):
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]

def attempt(host, port):
    try:
        addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    except Exception as e:
        return "dns: %s" % e
    s = socket.socket()
    s.settimeout(5)
    try:
        try:
            s.connect(addr)
        except ConnectionRefusedError:
            return "refused"
        except socket.timeout:
            return "timeout"
        except OSError as e:
            return "unreachable: %s" % e
        deadline = time.monotonic() + 5
        while state(s) == 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        st = state(s)
        if st in (1, 8):
            return "ok"
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return "unreachable: connect() returned, the socket is %s (%s)" % (
            STATES.get(st, st), os.strerror(err) if err else "no error")
    finally:
        s.close()

targets = json.loads(sys.argv[1])
if len(sys.argv) > 2:
    rounds = int(sys.argv[2])
    out = [collections.Counter() for _ in targets]
    for _ in range(rounds):
        for i, (host, port) in enumerate(targets):
            out[i][attempt(host, port)] += 1
    print(json.dumps(out))
else:
    print(json.dumps([attempt(host, port) for host, port in targets]))
'''

# Resolves names inside a sandbox: `python3 resolve.py NAME...` prints
# {name: [ipv4...] or "error"}.
RESOLVE = r'''
import json, socket, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = sorted({a[4][0] for a in socket.getaddrinfo(name, 443, socket.AF_INET)})
    except Exception as e:
        out[name] = "error: %s" % e
print(json.dumps(out))
'''


def install_tools(sbx):
    sbx.files.write("/tmp/probe.py", PROBE)
    sbx.files.write("/tmp/resolve.py", RESOLVE)


def probe(sbx, targets, user=None):
    """Connects to each (host, port) from inside; returns the outcomes."""
    out = must(sbx, "python3 /tmp/probe.py '%s'" % json.dumps(targets), user=user,
               timeout=30 + 6 * len(targets))
    return json.loads(out)


def probe_rounds(sbx, targets, rounds, user=None):
    """Connects to each (host, port) `rounds` times (none may time out);
    returns, per target, {outcome: count}."""
    out = must(sbx, "python3 /tmp/probe.py '%s' %d" % (json.dumps(targets), rounds),
               user=user, timeout=60 + len(targets) * rounds // 10)
    return json.loads(out)


def resolve(sbx, *names):
    return json.loads(must(sbx, "python3 /tmp/resolve.py " + " ".join(names)))


def eventually(fn, what, tries=30, pause=1.0):
    """Retries `fn` until it returns something truthy (bounded); returns it."""
    last = None
    for _ in range(tries):
        last = fn()
        if last:
            return last
        time.sleep(pause)
    raise AssertionError(f"{what}: never happened (last: {last!r})")


def host_ports():
    """The ports of the host's warren services and of the Rust side's
    listener on every address (WARREN_HOST_PORT)."""
    return {
        "gateway": int(API_URL.rsplit(":", 1)[1]),
        "node": int(os.environ["WARREN_NODE_ADDR"].rsplit(":", 1)[1]),
        "scheduler": int(os.environ["WARREN_SCHEDULER_URL"].rsplit(":", 1)[1]),
        "host listener": int(os.environ["WARREN_HOST_PORT"]),
    }


def host_uid(sbx):
    """The host uid the sandbox's root is (its first uid_map line)."""
    for line in must(sbx, "cat /proc/self/uid_map", user="root").splitlines():
        inside, outside, _ = line.split()
        if inside == "0":
            return int(outside)
    raise AssertionError("no uid_map line for root")


def own_tables(uid):
    """The host's nftables tables whose rules name the sandbox's uids
    `uid`..`uid+65535` (its own; the node's guard names every range)."""
    out = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True,
                         check=True).stdout
    mine, name = [], None
    for line in out.splitlines():
        if line.startswith("table inet "):
            name = line.split()[2]
        elif name and f"meta skuid {uid}-{uid + 65535} " in line and name not in mine:
            mine.append(name)
    return mine


def host_ipv4s():
    """The host's own non-loopback IPv4 addresses."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                         text=True, check=True).stdout
    addrs = []
    for line in out.splitlines():
        addr = line.split()[3].split("/")[0]
        if not addr.startswith("127."):
            addrs.append(addr)
    return addrs


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def pip_install():
    sbx = Sandbox.create(timeout=600)
    code, _, _ = sh(sbx, "python3 -c 'import tomli_w'")
    assert code != 0, "tomli_w is already in the template: pick another package"
    out = must(sbx, "pip install --user --no-cache-dir tomli-w", timeout=300)
    who = must(sbx, "whoami").strip()
    assert who == "user", who
    printed = must(sbx, "python -c 'import tomli_w; print(tomli_w.dumps({\"a\": 1}), end=\"\")'")
    assert printed.strip() == "a = 1", printed
    where = must(sbx, "python -c 'import tomli_w; print(tomli_w.__file__)'").strip()
    assert where.startswith("/home/user/.local/"), where
    sbx.kill()
    result(sandbox=sbx.sandbox_id, module=where, pip_tail=out.strip().splitlines()[-1:])


@case
def apt_install():
    sbx = Sandbox.create(timeout=900)
    code, _, _ = sh(sbx, "test -e /usr/games/cowsay")
    assert code != 0, "cowsay is already in the template: pick another package"
    must(sbx, "sudo apt-get update -q", timeout=400)
    must(sbx, "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q cowsay", timeout=400)
    out = must(sbx, "/usr/games/cowsay moo")
    assert "< moo >" in out, out
    sbx.kill()
    result(sandbox=sbx.sandbox_id, cow=out)


@case
def no_internet():
    # The same probes from a default sandbox connect: what fails below fails
    # because of the policy.
    control = Sandbox.create(timeout=300)
    install_tools(control)
    names = eventually(lambda: (lambda r: r if isinstance(r["pypi.org"], list) else None)(
        resolve(control, "pypi.org")), "pypi.org resolves in a default sandbox")
    pypi = names["pypi.org"][0]
    eventually(lambda: probe(control, [["1.1.1.1", 443], [pypi, 443]]) == ["ok", "ok"],
               "a default sandbox connects out")
    control.kill()

    sbx = Sandbox.create(timeout=300, allow_internet_access=False)
    install_tools(sbx)
    assert must(sbx, "echo hello").strip() == "hello"
    ifaces = sorted(line.split(":")[0].strip()
                    for line in must(sbx, "cat /proc/net/dev").splitlines()[2:])
    assert ifaces == ["lo"], ifaces
    for user in (None, "root"):
        got = probe(sbx, [["1.1.1.1", 443], [pypi, 443], ["8.8.8.8", 53]], user=user)
        assert all(g != "ok" for g in got), (user, got)
    names = resolve(sbx, "pypi.org", "deb.debian.org")
    assert all(isinstance(v, str) for v in names.values()), names
    code, _, _ = sh(sbx, "curl -sS --max-time 10 https://pypi.org/simple/ -o /dev/null")
    assert code != 0, "curl reached pypi.org"
    # Commands, files and the port relay keep working.
    sbx.files.write("/home/user/f.txt", "still here")
    assert sbx.files.read("/home/user/f.txt") == "still here"
    assert ok(sbx)
    sbx.kill()
    result(sandbox=sbx.sandbox_id, probes=got, dns=names, interfaces=ifaces)


@case
def deny_out():
    _, _, denied = socket.gethostbyname_ex("pypi.org")
    denied = sorted(set(denied))
    assert denied, "pypi.org resolves on the host"
    cidrs = [f"{a}/32" for a in denied]

    # Control: a default sandbox reaches those addresses.
    control = Sandbox.create(timeout=300)
    install_tools(control)
    eventually(lambda: probe(control, [[denied[0], 443]]) == ["ok"],
               "a default sandbox connects to pypi.org's address")
    control.kill()

    sbx = Sandbox.create(timeout=300, network={"deny_out": cidrs})
    install_tools(sbx)
    inside = eventually(lambda: (lambda r: r if isinstance(r["pypi.org"], list) else None)(
        resolve(sbx, "pypi.org", "deb.debian.org")), "pypi.org resolves inside (DNS is not denied)")
    # Every denied address, and pypi.org as the sandbox resolves it.
    targets = [[a, 443] for a in denied] + [[a, 80] for a in denied] + [["pypi.org", 443]]
    for user in (None, "root"):
        got = probe(sbx, targets, user=user)
        assert all(g != "ok" for g in got), (user, list(zip(targets, got)))
    # Another host, at an address not denied, still connects. (Behind an
    # egress proxy every name may resolve to one address: then a literal.)
    other = None
    for name in ("deb.debian.org", "1.1.1.1"):
        addrs = inside.get(name) if name in inside else [name]
        if isinstance(addrs, list) and addrs and not set(addrs) & set(denied):
            other = (name, addrs[0])
            break
    assert other, ("no other host at an address that is not denied", inside, denied)
    eventually(lambda: probe(sbx, [[other[1], 443]]) == ["ok"],
               f"{other[0]} ({other[1]}) connects while pypi.org is denied")
    assert ok(sbx)
    sbx.kill()
    result(sandbox=sbx.sandbox_id, denied=denied, inside=inside, other=other,
           probes=dict(zip([f"{h}:{p}" for h, p in targets], got)))


@case
def no_host_no_neighbour():
    ports = host_ports()
    host_addrs = ["127.0.0.1", "10.0.2.2", "10.0.2.3"] + host_ipv4s()

    b = Sandbox.create(timeout=300)
    marker = f"neighbour-{os.getpid()}-{time.time_ns()}"
    b.files.write("/home/user/www/index.html", marker)
    b.commands.run("cd /home/user/www && exec python3 -m http.server 8000", background=True)
    # Through the gateway's port relay B's server answers.
    relay = {"E2b-Sandbox-Id": b.sandbox_id, "E2b-Sandbox-Port": "8000"}
    eventually(lambda: http("GET", "/", relay, base=SANDBOX_URL)[2] == marker.encode(),
               "B's server answers through the gateway's port relay", tries=60, pause=0.5)
    # Every address B has, as B sees them, and its name.
    b_addrs = must(b, "hostname -I; hostname").split()

    a = Sandbox.create(timeout=300)
    install_tools(a)
    # A has egress (what fails below fails because of the policy).
    eventually(lambda: probe(a, [["1.1.1.1", 443]]) == ["ok"], "A connects out")
    a_addrs = must(a, "hostname -I").split()
    # Nothing of the host: its services' ports and a listener on every
    # address, by loopback, by slirp's host alias, by the host's own addresses.
    targets = [[h, p] for h in host_addrs for p in ports.values()]
    for user in (None, "root"):
        got = probe(a, targets, user=user)
        reached = [t for t, g in zip(targets, got) if g == "ok"]
        assert not reached, (user, reached, dict(zip([f"{h}:{p}" for h, p in targets], got)),
                             ports, must(a, "ip addr; ip route"))
    # Nor in many tries (a timing window would show here): every target
    # that answered at once, 50 times over, as user and as root.
    quick = [t for t, g in zip(targets, got) if g != "timeout"]
    tries = {}
    for user in (None, "root"):
        counts = probe_rounds(a, quick, 50, user=user)
        reached = {f"{h}:{p}": c for (h, p), c in zip(quick, counts) if c.get("ok")}
        assert not reached, (user, reached, ports)
        for (h, p), c in zip(quick, counts):
            for outcome, n in c.items():
                tries[outcome] = tries.get(outcome, 0) + n
    # Nothing of B by any address A can find: B's, the host's (port 8000).
    fetch = ("import sys, urllib.request\n"
             "for u in sys.argv[1:]:\n"
             "    try:\n"
             "        print(u, urllib.request.urlopen(u, timeout=5).read().decode(errors='replace'))\n"
             "    except Exception as e:\n"
             "        print(u, 'failed', type(e).__name__)\n")
    a.files.write("/tmp/fetch.py", fetch)
    urls = [f"http://{h}:8000/" for h in sorted(set(b_addrs + host_addrs + a_addrs))]
    seen = must(a, "python3 /tmp/fetch.py " + " ".join(urls), timeout=120)
    assert marker not in seen, seen
    # ... while the relay still reaches it.
    status, _, body = http("GET", "/", relay, base=SANDBOX_URL)
    assert status == 200 and body == marker.encode(), (status, body)
    assert ok(a) and ok(b)
    a.kill()
    b.kill()
    result(a=a.sandbox_id, b=b.sandbox_id, b_addrs=b_addrs, tried=urls, fetched=seen,
           host_probes=dict(zip([f"{h}:{p}" for h, p in targets], got)), many_tries=tries)


@case
def host_without_own_table():
    # The sandbox's own table removed under it, as a window at its start or
    # end or an operator's `nft` would leave it: its policy goes, the host
    # stays out of reach (the node's guard table).
    ports = host_ports()
    denied = "1.0.0.1"
    sbx = Sandbox.create(timeout=300, network={"deny_out": [f"{denied}/32"]})
    install_tools(sbx)
    eventually(lambda: probe(sbx, [["1.1.1.1", 443]]) == ["ok"], "the sandbox connects out")
    assert probe(sbx, [[denied, 443]]) == ["refused"], "its policy holds"
    uid = host_uid(sbx)
    tables = own_tables(uid)
    assert len(tables) == 1, ("the sandbox's own table", uid, tables)
    subprocess.run(["nft", "delete", "table", "inet", tables[0]], check=True)
    assert own_tables(uid) == [], own_tables(uid)
    # Its policy is gone: the denied address connects...
    eventually(lambda: probe(sbx, [[denied, 443]]) == ["ok"],
               "the denied address connects once the sandbox's table is gone")
    # ... and the host is still refused, at every address and port.
    targets = [[h, p] for h in ["10.0.2.2"] + host_ipv4s() for p in ports.values()]
    for user in (None, "root"):
        got = probe(sbx, targets, user=user)
        reached = [t for t, g in zip(targets, got) if g == "ok"]
        assert not reached, (user, reached, dict(zip([f"{h}:{p}" for h, p in targets], got)))
    assert ok(sbx)
    sbx.kill()
    result(sandbox=sbx.sandbox_id, uid=uid, removed=tables[0],
           probes=dict(zip([f"{h}:{p}" for h, p in targets], got)))


@case
def writes_stay_in_the_sandbox():
    a = Sandbox.create(timeout=300)
    must(a, "echo changed | sudo tee /usr/share/doc/warren-test")
    must(a, "echo changed | sudo tee /usr/share/doc/sudo/copyright")
    assert must(a, "cat /usr/share/doc/warren-test").strip() == "changed"
    assert must(a, "cat /usr/share/doc/sudo/copyright").strip() == "changed"
    b = Sandbox.create(timeout=300)
    code, _, _ = sh(b, "test -e /usr/share/doc/warren-test")
    assert code != 0, "A's new file under /usr is in B"
    copyright_b = must(b, "cat /usr/share/doc/sudo/copyright")
    assert copyright_b.strip() != "changed" and len(copyright_b) > 100, copyright_b[:200]
    # A still has its own.
    assert must(a, "cat /usr/share/doc/warren-test").strip() == "changed"
    a.kill()
    b.kill()
    result(a=a.sandbox_id, b=b.sandbox_id)


@case
def custom_template():
    name = os.environ["WARREN_TEMPLATE"]
    marker = os.environ["WARREN_MARKER"]
    status, _, raw = http("GET", "/templates", {"X-API-Key": API_KEY})
    assert status == 200, (status, raw)
    listed = json.loads(raw)
    mine = [t for t in listed if t.get("templateID") == name]
    assert len(mine) == 1, [t.get("templateID") for t in listed]
    assert mine[0]["memoryMB"] == 384, mine[0]
    assert any(t.get("templateID") == "base" for t in listed), listed
    sbx = Sandbox.create(template=name, timeout=300)
    assert must(sbx, "cat /etc/warren-marker").strip() == marker
    assert must(sbx, "whoami").strip() == "user"
    sbx.kill()
    result(sandbox=sbx.sandbox_id, template=mine[0])


@case
def unknown_template():
    name = f"no-such-template-{os.getpid()}"
    try:
        sbx = Sandbox.create(template=name, timeout=60)
    except Exception as e:  # the SDK's NotFoundException / SandboxException
        raised = f"{type(e).__name__}: {e}"
    else:
        sbx.kill()
        raise AssertionError("creating from an unknown template succeeded")
    assert name in raised or "not found" in raised.lower(), raised
    body = json.dumps({"templateID": name}).encode()
    status, _, raw = http("POST", "/sandboxes", {"X-API-Key": API_KEY,
                                                "Content-Type": "application/json"}, body)
    assert status == 404, (status, raw)
    err = json.loads(raw)
    assert err.get("error_code") == "template_not_found", err
    result(sdk=raised, status=status, body=err)


if __name__ == "__main__":
    CASES[sys.argv[1]]()
