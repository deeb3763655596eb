"""Template builds `from_image(...)` as a user of the unmodified `e2b`
Python SDK sees them through a gateway: `ubuntu:22.04` is the operator's
`ubuntu-22.04` template (no registry is pulled from), its steps run on
Ubuntu as E2B's `user` (sudo works) or as root; an image no template
stands for is refused, naming the images there are.

Run by `crates/warren/tests/template_images.rs`, one case per invocation:

    python template_images.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY. Prints one JSON line of
facts (`RESULT {...}`); exits non-zero on a failed assertion.
"""

import os
import sys

from e2b import Sandbox, Template

from common import result, run

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def from_ubuntu():
    logs = []
    template = (
        Template()
        .from_image("ubuntu:22.04")
        .run_cmd("whoami > /tmp/step-user.txt && sudo -n true && echo sudo-ok > /tmp/sudo.txt")
        .run_cmd(". /etc/os-release && echo \"$ID $VERSION_ID\" > /tmp/step-os.txt")
        .run_cmd("test -f /home/user/.bashrc && readlink /bin/sh > /tmp/sh.txt")
        .run_cmd("apt-get --version > /dev/null && whoami > /tmp/root.txt", user="root")
    )
    Template.build(template, "ti-ubuntu", cpu_count=1, memory_mb=512,
                   on_build_logs=lambda e: logs.append(e.message))
    assert any("ubuntu-22.04" in m for m in logs), logs

    sbx = Sandbox.create("ti-ubuntu", timeout=120)
    facts = {key: sbx.files.read(path).strip() for key, path in [
        ("step_user", "/tmp/step-user.txt"),
        ("sudo", "/tmp/sudo.txt"),
        ("step_os", "/tmp/step-os.txt"),
        ("sh", "/tmp/sh.txt"),
        ("root", "/tmp/root.txt"),
    ]}
    facts["os_release"] = sbx.files.read("/etc/os-release")
    _, whoami, _, _ = run(sbx, "whoami")
    _, pwd, _, _ = run(sbx, "pwd")
    facts.update(whoami=whoami.strip(), pwd=pwd.strip())
    sbx.kill()

    # An image no template stands for: the registry 400, naming what there is.
    alpine = Template().from_image("alpine:3.20").run_cmd("true")
    try:
        Template.build(alpine, "ti-alpine", cpu_count=1, memory_mb=512)
        raise AssertionError("alpine:3.20 built")
    except AssertionError:
        raise
    except Exception as e:  # the SDK's classes differ by status
        facts["unknown_image"] = str(e)
    facts["alpine_recorded"] = Template.exists("ti-alpine")
    result(**facts)


if __name__ == "__main__":
    CASES[sys.argv[1]]()
