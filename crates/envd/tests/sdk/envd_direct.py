"""The unmodified e2b SDK against one warren envd, in the SDK's debug mode
(no control plane: E2B_SANDBOX_URL points straight at envd). Exits non-zero
on the first mismatch; prints `ok` at the end."""
import io
import os

from e2b import Sandbox
from e2b.exceptions import FileNotFoundException
from e2b.sandbox.commands.command_handle import CommandExitException

sbx = Sandbox.create(debug=True)

r = sbx.commands.run("echo hello; echo err >&2")
assert (r.stdout, r.stderr, r.exit_code) == ("hello\n", "err\n", 0), r

try:
    sbx.commands.run("exit 3")
    raise AssertionError("exit 3 did not raise")
except CommandExitException as e:
    assert e.exit_code == 3, e

h = sbx.commands.run("sleep 30", background=True)
assert h.pid in [p.pid for p in sbx.commands.list()]
assert sbx.commands.kill(h.pid) is True

h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "from stdin\n")
sbx.commands.close_stdin(h.pid)
assert h.wait().stdout == "from stdin\n"

h = sbx.commands.run("sleep 0.3; echo late", background=True)
assert sbx.commands.connect(h.pid).wait().stdout == "late\n"

data = os.urandom(200_000)
info = sbx.files.write("dir/blob.bin", data)
assert info.path == "/home/user/dir/blob.bin", info
assert bytes(sbx.files.read("dir/blob.bin", format="bytes")) == data
sbx.files.write("stream.bin", io.BytesIO(data))
assert bytes(sbx.files.read("stream.bin", format="bytes")) == data
sbx.files.write("gz.bin", data, gzip=True)
assert bytes(sbx.files.read("gz.bin", format="bytes", gzip=True)) == data
sbx.files.write_files([{"path": "m1.txt", "data": "one"}, {"path": "/tmp/m2.txt", "data": "two"}])
assert sbx.files.read("/tmp/m2.txt") == "two"

names = [e.name for e in sbx.files.list("/home/user")]
assert names == ["dir", "gz.bin", "m1.txt", "stream.bin"], names
assert sbx.files.exists("m1.txt") and not sbx.files.exists("nope")
assert sbx.files.make_dir("newdir") is True
assert sbx.files.make_dir("newdir") is False
assert sbx.files.rename("m1.txt", "newdir/m1.txt").path == "/home/user/newdir/m1.txt"
e = sbx.files.get_info("newdir/m1.txt")
assert (e.size, e.permissions[0]) == (3, "-"), e
sbx.files.remove("newdir")
assert not sbx.files.exists("newdir")
try:
    sbx.files.read("nope.txt")
    raise AssertionError("reading a missing file did not raise")
except FileNotFoundException:
    pass

print("ok")
