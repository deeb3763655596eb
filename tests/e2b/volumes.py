"""E2B's persistent volumes as a user of the unmodified `e2b` Python SDK sees
them through a gateway (`E2B_VOLUME_API_URL` is the gateway's URL), on the
`isolated` runtime: the volume API, the content API without any sandbox,
mounts into sandboxes, and what neither a path, a symlink, another team nor
another volume's token can reach.

Run by `crates/warren/tests/volumes.rs`, one case per invocation:

    python volumes.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL, E2B_API_KEY (team
A), WARREN_OTHER_API_KEY (team B) and, for `attacks`, WARREN_HOST_SECRET (a
file on the host no volume call may read) and WARREN_HOST_TRAP (a directory
on the host no volume call may write into). Prints one JSON line of facts
(`RESULT {...}`); exits non-zero on a failed assertion.
"""

import hashlib
import io
import os
import sys
import threading
import time
import uuid

from e2b import Sandbox, Volume
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    VolumeException,
)

from common import http, result, run

API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ.get("WARREN_OTHER_API_KEY", "")
VOLUME_URL = os.environ["E2B_VOLUME_API_URL"]


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def sandbox(mounts, **kw):
    return Sandbox.create(timeout=240, allow_internet_access=False, volume_mounts=mounts, **kw)


def sh(sbx, cmd, user=None):
    """stdout of `cmd`, which must succeed."""
    code, out, err, _ = run(sbx, cmd, user=user)
    assert code == 0, (cmd, code, out, err)
    return out


def raises(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        return str(e)
    raise AssertionError(f"{fn.__name__}{args} did not raise {exc.__name__}")


def content(method, vol_id, op, token, query="", body=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http(method, f"/volumecontent/{vol_id}/{op}{query}", headers=headers,
                body=body, base=VOLUME_URL)


def round_trip():
    """The volume API and the content API, two sandboxes on one volume, a
    fork mounting its parent's, a snapshot without the volume's contents,
    pauses of either kind resumed with the volume, the data outliving every
    sandbox, a delete refused while mounted."""
    vname = name("data")
    vol = Volume.create(vname)
    assert vol.name == vname and vol.volume_id and vol.token, vol
    taken = raises(VolumeException, Volume.create, vname)
    assert "409" in taken, taken
    assert any(v.volume_id == vol.volume_id for v in Volume.list())
    info = Volume.get_info(vol.volume_id)
    assert info.token == vol.token and info.name == vname, info
    again = Volume.connect(vol.volume_id)

    # The content API, no sandbox anywhere.
    w = again.write_file("/hello.txt", "from the api")
    assert w.type.value == "file" and w.size == 12 and w.uid == 1000, w
    d = vol.make_dir("/d/e/f", force=True)
    assert d.type.value == "directory" and d.path == "/d/e/f", d
    raises(NotFoundException, vol.make_dir, "/x/y")
    assert vol.exists("/d/e") and not vol.exists("/nope")
    listed = sorted(e.path for e in vol.list("/", depth=3))
    assert listed == ["/d", "/d/e", "/d/e/f", "/hello.txt"], listed
    m = vol.update_metadata("/hello.txt", mode=0o600)
    assert m.mode == 0o600, m
    assert vol.read_file("/hello.txt") == "from the api"
    assert vol.read_file("/hello.txt", format="bytes") == b"from the api"
    vol.write_file("/hello.txt", "replaced", mode=0o644)
    assert vol.read_file("/hello.txt") == "replaced"

    # Mounted into a sandbox: `user` reads and writes there.
    a = sandbox({"/mnt/data": vol})
    assert sh(a, "cat /mnt/data/hello.txt") == "replaced"
    sh(a, "echo -n 'from sandbox a' > /mnt/data/from-a.txt", user="user")
    assert sh(a, "stat -c '%U %a' /mnt/data/from-a.txt").strip() == "user 644"
    assert sh(a, "stat -c '%U' /mnt/data").strip() == "user"
    assert vol.read_file("/from-a.txt") == "from sandbox a"
    assert vol.get_info("/from-a.txt").uid == 1000
    a.files.write("/mnt/data/via-envd.txt", "written with files.write")
    assert vol.read_file("/via-envd.txt") == "written with files.write"
    mounts = Sandbox.get_info(a.sandbox_id).volume_mounts
    assert mounts == [{"name": vname, "path": "/mnt/data"}], mounts

    # A second sandbox on the same volume (another host id range), at
    # another path: each sees what the other writes.
    b = sandbox({"/data": vname})
    assert sh(b, "cat /data/from-a.txt") == "from sandbox a"
    sh(b, "echo -n 'from sandbox b' > /data/from-b.txt", user="user")
    assert sh(a, "cat /mnt/data/from-b.txt") == "from sandbox b"
    ranges = {sh(s, "cat /proc/self/uid_map").split()[1] for s in (a, b)}
    assert len(ranges) == 2, ranges

    # A fork mounts its parent's volumes.
    fork = a.fork()[0]
    assert not isinstance(fork, Exception), fork
    sh(fork, "echo -n 'from the fork' > /mnt/data/from-fork.txt", user="user")
    assert sh(b, "cat /data/from-fork.txt") == "from the fork"
    # A snapshot does not include a volume's contents: a sandbox made from
    # it has the mount point, empty.
    snap = a.create_snapshot()
    from_snap = Sandbox.create(snap.snapshot_id, timeout=120, allow_internet_access=False)
    assert sh(from_snap, "ls -A /mnt/data").strip() == ""
    from_snap.kill()
    fork.kill()
    Sandbox.delete_snapshot(snap.snapshot_id)
    # Paused (memory kept, and filesystem-only), then resumed: mounted again.
    for keep in (True, False):
        assert a.pause(mode="full" if keep else "filesystem") is True
        a = Sandbox.connect(a.sandbox_id, timeout=240)
        assert sh(a, "cat /mnt/data/from-b.txt") == "from sandbox b", keep
    sh(a, "echo -n again > /mnt/data/after-pause.txt", user="user")
    assert vol.read_file("/after-pause.txt") == "again"

    # Mounted: no delete.
    refused = raises(VolumeException, Volume.destroy, vol.volume_id)
    assert "409" in refused and "mounted" in refused, refused
    a.kill()
    b.kill()

    # Every sandbox gone: the data is still there, and in a new sandbox.
    assert vol.read_file("/from-b.txt") == "from sandbox b"
    c = sandbox({"/home/user/work": vol})
    assert sh(c, "cat /home/user/work/from-a.txt /home/user/work/from-b.txt") == \
        "from sandbox afrom sandbox b"
    c.kill()

    vol.remove("/d")
    assert not vol.exists("/d/e/f")
    raises(NotFoundException, vol.remove, "/d")
    assert Volume.destroy(vol.volume_id) is True
    raises(NotFoundException, Volume.get_info, vol.volume_id)
    assert Volume.destroy(vol.volume_id) is False
    assert all(v.volume_id != vol.volume_id for v in Volume.list())
    # Its token opens nothing any more.
    raises(AuthenticationException, vol.read_file, "/hello.txt")
    result(volume=vol.volume_id, ranges=sorted(ranges))


def isolation():
    """Another team's volume is not found; a volume's token opens only it."""
    vname = name("mine")
    vol = Volume.create(vname)
    vol.write_file("/secret.txt", "team a's")
    raises(NotFoundException, Volume.get_info, vol.volume_id, api_key=OTHER_KEY)
    assert Volume.destroy(vol.volume_id, api_key=OTHER_KEY) is False
    assert all(v.volume_id != vol.volume_id for v in Volume.list(api_key=OTHER_KEY))
    # Team B cannot mount it by name: it has no volume of that name.
    err = raises(Exception, Sandbox.create, timeout=60, allow_internet_access=False,
                 volume_mounts={"/mnt/x": vname}, api_key=OTHER_KEY)
    assert "404" in err or "not found" in err.lower(), err
    # Its own volume of the same name is another volume.
    theirs = Volume.create(vname, api_key=OTHER_KEY)
    assert theirs.volume_id != vol.volume_id
    b = Sandbox.create(timeout=120, allow_internet_access=False,
                       volume_mounts={"/mnt/x": vname}, api_key=OTHER_KEY)
    code, out, _, _ = run(b, "ls -A /mnt/x")
    assert code == 0 and out.strip() == "", out
    b.kill()

    # A token used on another volume (of the same team, and of another).
    other = Volume.create(name("other"))
    forged = Volume(volume_id=other.volume_id, name=other.name, token=vol.token)
    raises(AuthenticationException, forged.read_file, "/secret.txt")
    raises(AuthenticationException, forged.write_file, "/planted.txt", "x")
    forged = Volume(volume_id=theirs.volume_id, name=vname, token=vol.token)
    raises(AuthenticationException, forged.list, "/")
    # No token, a wrong one, another volume's: 401 each, never the data.
    for token in ["", "vt_wrong", other.token]:
        status, _, body = content("GET", vol.volume_id, "file", token, "?path=/secret.txt")
        assert status == 401, (token, status, body)
        assert b"team a's" not in body
    status, _, body = content("GET", vol.volume_id, "file", vol.token, "?path=/secret.txt")
    assert status == 200 and body == b"team a's", (status, body)
    for v, key in [(vol, API_KEY), (other, API_KEY), (theirs, OTHER_KEY)]:
        assert Volume.destroy(v.volume_id, api_key=key) is True
    result(volume=vol.volume_id, theirs=theirs.volume_id)


def attacks():
    """Paths and symlinks never lead out of a volume: not `..`, not a
    symlink a sandbox plants, not one it swaps in while calls are in
    flight; the mount is nosuid and nodev."""
    secret = os.environ["WARREN_HOST_SECRET"]
    trap = os.environ["WARREN_HOST_TRAP"]
    secret_text = open(secret).read()
    vol = Volume.create(name("attacked"))
    vol.write_file("/inside.txt", "inside")
    tok = vol.token

    # `..` in any spelling: 400, nothing read or written.
    for path in ["/../../../../../../etc/passwd", "../x", "/a/../../x", "/.."]:
        status, _, body = content("GET", vol.volume_id, "file", tok, f"?path={path}")
        assert status == 400, (path, status, body)
    for q in ["?path=%2e%2e%2f%2e%2e%2fetc%2fpasswd", "?path=/%2e%2e/x"]:
        status, _, body = content("GET", vol.volume_id, "file", tok, q)
        assert status == 400, (q, status, body)
    status, _, _ = content("PUT", vol.volume_id, "file", tok, f"?path=/../../{trap}/a.txt", b"x")
    assert status == 400, status

    # Symlinks planted from inside a sandbox, as root and as user.
    s = sandbox({"/mnt/data": vol})
    sh(s, f"sudo ln -s {os.path.dirname(secret)} /mnt/data/host-dir")
    sh(s, f"ln -s {secret} /mnt/data/host-file", user="user")
    sh(s, "ln -s / /mnt/data/root-link", user="user")
    sh(s, "ln -s ../../../../../../../../ /mnt/data/up", user="user")
    sh(s, f"ln -s {trap} /mnt/data/trap", user="user")
    sh(s, "ln -s inside.txt /mnt/data/inside-link", user="user")
    name_only = os.path.basename(secret)
    for path in [f"/host-dir/{name_only}", "/host-file", f"/root-link{secret}",
                 f"/up{secret}", "/root-link/etc/shadow"]:
        status, _, body = content("GET", vol.volume_id, "file", tok, f"?path={path}")
        assert status == 400, (path, status, body)
        assert secret_text.encode() not in body
    for path in ["/trap/pwned.txt", f"/root-link{trap}/pwned.txt", f"/up{trap}/pwned.txt"]:
        status, _, body = content("PUT", vol.volume_id, "file", tok, f"?path={path}", b"pwned")
        assert status == 400, (path, status, body)
        status, _, body = content("POST", vol.volume_id, "dir", tok,
                                  f"?path={path}.d&force=true")
        assert status == 400, (path, status, body)
    status, _, body = content("GET", vol.volume_id, "dir", tok, "?path=/root-link&depth=1")
    assert status == 400, (status, body)
    status, _, body = content("PATCH", vol.volume_id, "path", tok, "?path=/host-file",
                              b'{"mode": 511}')
    assert status == 400, (status, body)
    status, _, body = content("PATCH", vol.volume_id, "path", tok, "?path=/trap",
                              b'{"uid": 0, "gid": 0}')
    assert status == 200, (status, body)
    # A symlink is itself: listed, stat'ed and removed as a link.
    link = vol.get_info("/host-file")
    assert link.type.value == "symlink" and link.target == secret, link
    assert vol.read_file("/inside-link") == "inside"
    vol.remove("/root-link")
    assert not vol.exists("/root-link")

    # Swapped while calls are in flight: a sandbox root loop turns `race`
    # into a directory, a symlink to /, and back, as fast as it can.
    sh(s, "sudo sh -c 'echo $$ > /tmp/race.pid; while :; do mkdir -p /mnt/data/race/tmp; "
          "rm -rf /mnt/data/race; ln -s / /mnt/data/race; rm -f /mnt/data/race; done' "
          "> /dev/null 2>&1 &")
    leaked = []
    seen = {}

    def hammer(n):
        for i in range(n):
            status, _, body = content("GET", vol.volume_id, "file", tok, f"?path=/race{secret}")
            seen[status] = seen.get(status, 0) + 1
            if status == 200 or secret_text.encode() in body:
                leaked.append(("read", status, body[:80]))
            status, _, body = content("PUT", vol.volume_id, "file", tok,
                                      f"?path=/race{trap}/race-{i}.txt", b"pwned")
            if status == 201 and os.listdir(trap):
                leaked.append(("write", status, body[:80]))
            content("POST", vol.volume_id, "dir", tok, f"?path=/race{trap}/d{i}&force=true")
            content("DELETE", vol.volume_id, "path", tok, f"?path=/race{trap}")

    threads = [threading.Thread(target=hammer, args=(100,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    swaps = sh(s, "sudo kill $(cat /tmp/race.pid) && echo stopped")
    assert swaps.strip() == "stopped", swaps
    assert not leaked, leaked
    # The race was run: reads met the link (400) and the directory or
    # nothing (404).
    assert seen.get(400, 0) > 0 and seen.get(404, 0) > 0, seen
    assert os.listdir(trap) == [], os.listdir(trap)
    assert open(secret).read() == secret_text

    # Inside: the mount is nosuid, nodev; a set-user-ID copy of a root
    # program runs as the user who ran it; the volume's parent is the
    # sandbox's own /mnt, nothing of the host.
    opts = sh(s, "findmnt -no OPTIONS /mnt/data")
    assert "nosuid" in opts and "nodev" in opts, opts
    sh(s, "sudo cp /usr/bin/id /mnt/data/id && sudo chmod 4755 /mnt/data/id")
    assert sh(s, "/mnt/data/id -u", user="user").strip() == "1000"
    assert sh(s, "ls -A /mnt").split() == ["data"]
    code, out, err, _ = run(s, "sudo mknod /mnt/data/dev c 1 3")
    assert code != 0, (out, err)
    # Nor can the sandbox's root take the flags off (seccomp refuses mount).
    code, out, err, _ = run(s, "sudo mount -o remount,suid,dev /mnt/data")
    assert code != 0, (out, err)
    opts = sh(s, "findmnt -no OPTIONS /mnt/data")
    assert "nosuid" in opts and "nodev" in opts, opts
    s.kill()
    assert Volume.destroy(vol.volume_id)
    result(volume=vol.volume_id, secret=secret, race_reads=seen)


def size_limit():
    """Past its limit a volume is full: ENOSPC inside a sandbox, 507 naming
    the limit on the content API, and nothing half-written is left."""
    limit = int(os.environ["WARREN_VOLUME_LIMIT"])
    vol = Volume.create(name("small"))
    s = sandbox({"/mnt/data": vol})
    total = int(sh(s, "df -B1 --output=size /mnt/data | tail -1").strip())
    assert limit * 0.8 < total <= limit, (total, limit)
    code, out, err, _ = run(s, f"dd if=/dev/zero of=/mnt/data/fill bs=1M count={limit // 2**20 + 16}",
                            user="user")
    assert code != 0 and "No space left on device" in err, (code, out, err)
    sh(s, "rm /mnt/data/fill")
    big = io.BytesIO(b"\0" * (limit + (8 << 20)))
    full = raises(VolumeException, vol.write_file, "/big.bin", big)
    assert "507" in full and str(limit) in full, full
    assert [e.name for e in vol.list("/")] == [], vol.list("/")
    # Still usable below the limit.
    vol.write_file("/small.txt", "fits")
    assert sh(s, "cat /mnt/data/small.txt") == "fits"
    s.kill()
    assert Volume.destroy(vol.volume_id)
    result(volume=vol.volume_id, total=total, message=full)


class Pattern(io.RawIOBase):
    """`size` bytes of a repeating pattern, made as they are read, hashed
    on the way: nothing holds the whole file."""

    def __init__(self, size):
        self.left = size
        self.block = hashlib.sha256(b"warren").digest() * (1 << 15)  # 1 MiB
        self.sha = hashlib.sha256()

    def readable(self):
        return True

    def read(self, n=-1):
        if self.left == 0:
            return b""
        n = len(self.block) if n is None or n < 0 else min(n, len(self.block))
        chunk = self.block[: min(n, self.left)]
        self.left -= len(chunk)
        self.sha.update(chunk)
        return chunk

    def readinto(self, b):
        chunk = self.read(len(b))
        b[: len(chunk)] = chunk
        return len(chunk)


def big_write():
    """A 1 GiB file written through the content API and read back, both
    streamed."""
    size = int(os.environ.get("WARREN_BIG_BYTES", str(1 << 30)))
    vol = Volume.create(name("big"))
    src = Pattern(size)
    started = time.monotonic()
    e = vol.write_file("/big.bin", src)
    wrote = time.monotonic() - started
    assert e.size == size, e
    sha = hashlib.sha256()
    got = 0
    started = time.monotonic()
    for chunk in vol.read_file("/big.bin", format="stream"):
        sha.update(chunk)
        got += len(chunk)
    read = time.monotonic() - started
    assert got == size and sha.hexdigest() == src.sha.hexdigest(), (got, size)
    assert Volume.destroy(vol.volume_id)
    result(volume=vol.volume_id, bytes=size, write_s=round(wrote, 1), read_s=round(read, 1))


if __name__ == "__main__":
    cases = {f.__name__: f for f in [round_trip, isolation, attacks, size_limit, big_write]}
    cases[sys.argv[1]]()
