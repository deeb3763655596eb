"""Run by bench/volumes.sh: moves SIZE bytes (a pattern made as it is read,
hashed on the way) through three paths with the real `e2b` SDK and prints
one Markdown row per path and direction:

  volume   a volume's content API (`Volume.write_file` / `read_file` stream):
           the client -> gateway -> node -> the volume's ext4 image;
  sandbox  a sandbox's envd (`files.write` / `files.read` stream), the path
           files already take: client -> gateway -> node -> envd -> disk;
  local    the same bytes written to and read from a file in /tmp by this
           process: the floor (no network, no proxy).

Usage: python volumes.py SIZE ROUNDS (E2B_* variables set)."""

import hashlib
import io
import os
import sys
import tempfile
import time

from e2b import Sandbox, Volume

SIZE = int(sys.argv[1])
ROUNDS = int(sys.argv[2])
BLOCK = hashlib.sha256(b"bench").digest() * (1 << 15)  # 1 MiB


class Pattern(io.RawIOBase):
    """`size` bytes made as they are read: nothing holds the whole file."""

    def __init__(self, size):
        self.left = size

    def readable(self):
        return True

    def readinto(self, b):
        chunk = self.read(len(b))
        b[: len(chunk)] = chunk
        return len(chunk)

    def read(self, n=-1):
        if self.left == 0:
            return b""
        n = len(BLOCK) if n is None or n < 0 else min(n, len(BLOCK))
        chunk = BLOCK[: min(n, self.left)]
        self.left -= len(chunk)
        return chunk


def timed(fn):
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def drain(chunks):
    got = 0
    for c in chunks:
        got += len(c)
    assert got == SIZE, (got, SIZE)


def main():
    vol = Volume.create(f"bench-{os.getpid()}")
    sbx = Sandbox.create(timeout=600, allow_internet_access=False)
    tmp = tempfile.NamedTemporaryFile(dir="/tmp", delete=False)
    tmp.close()

    def local_write():
        with open(tmp.name, "wb") as f:
            src = Pattern(SIZE)
            while chunk := src.read(1 << 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())

    def local_read():
        with open(tmp.name, "rb") as f:
            drain(iter(lambda: f.read(1 << 20), b""))

    paths = {
        "volume": (lambda: vol.write_file("/f.bin", Pattern(SIZE)),
                   lambda: drain(vol.read_file("/f.bin", format="stream"))),
        "sandbox": (lambda: sbx.files.write("/home/user/f.bin", Pattern(SIZE)),
                    lambda: drain(sbx.files.read("/home/user/f.bin", format="stream"))),
        "local": (local_write, local_read),
    }
    rows = []
    for name, (write, read) in paths.items():
        for direction, fn in (("write", write), ("read", read)):
            times = sorted(timed(fn) for _ in range(ROUNDS))
            best, median = times[0], times[len(times) // 2]
            mib = SIZE / (1 << 20)
            rows.append(f"| {name} | {direction} | {mib:.0f} | {median:.2f} | "
                        f"{mib / median:.0f} | {mib / best:.0f} |")
    sbx.kill()
    Volume.destroy(vol.volume_id)
    os.unlink(tmp.name)
    print("| path | direction | MiB | median s | median MiB/s | best MiB/s |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))


main()
