"""Calls of the E2B API an SDK user makes beyond the SDK's own methods,
through the pinned `e2b` SDK's generated client, against a gateway:
a sandbox's logs (v1 and v2, while it runs and once it ended, through
another gateway), keeping a sandbox alive (`refreshes`), and a built
template's management (its builds, a build's log, its tags).

Run by `crates/warren/tests/e2b_surface.rs` (and, for `manage`, by
`e2b_cli.rs` on the template the CLI built), one case per invocation:

    python every_call.py CASE

with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (team `team-a`),
WARREN_OTHER_KEY (team `team-b`) and WARREN_OTHER_GATEWAY (the second
gateway's URL). Each case asserts what the user sees and prints one
`RESULT {...}` line.
"""

import datetime
import os
import sys
import time

from e2b import Sandbox
from e2b.api.client.api.tags import (
    delete_templates_tags,
    get_templates_template_id_tags as tags_list,
    get_templates_template_id_tags_count as tags_count,
    get_templates_template_id_tags_exists as tags_exists,
    get_templates_template_id_tags_groups as tags_groups,
    get_templates_template_id_tags_tag_assignments as tags_assignments,
    post_templates_tags,
)
from e2b.api.client.api.templates import (
    get_default_templates,
    get_templates_template_id as template_with_builds,
    get_templates_template_id_builds_build_id_logs as build_logs,
    get_v2_templates,
)
from e2b.api.client.api.sandboxes import (
    get_sandboxes_sandbox_id_logs as logs_v1,
    get_v_2_sandboxes_sandbox_id_logs as logs_v2,
    post_sandboxes_sandbox_id_refreshes as refreshes,
)
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import (
    AssignTemplateTagsRequest,
    DeleteTemplateTagsRequest,
    GetTemplatesTemplateIDTagsGroupsSort,
    LogLevel,
    LogsDirection,
    SandboxRefreshRequest,
    TemplateBuildStatus,
)

from common import result, run

API_URL = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["WARREN_OTHER_KEY"]
OTHER_GATEWAY = os.environ.get("WARREN_OTHER_GATEWAY", API_URL)

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def client(key=KEY, url=API_URL):
    return AuthenticatedClient(
        base_url=url, token=key, prefix="", auth_header_name="X-API-KEY"
    )


def wait_for(what, fn, within=30):
    deadline = time.monotonic() + within
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {within}s; last: {got!r}")
        time.sleep(0.2)


@case
def logs():
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    code, out, _, _ = run(sbx, "echo hello-from-logs")
    assert code == 0 and out.strip() == "hello-from-logs", (code, out)
    code, _, _, _ = run(sbx, "sh -c 'exit 3'")
    assert code == 3, code

    # v2: structured entries, newest first by default.
    r = logs_v2.sync_detailed(sid, client=client())
    assert r.status_code == 200, (r.status_code, r.content)
    entries = r.parsed.logs
    messages = [e.message for e in entries]
    assert "Process started" in messages and "Process exited" in messages, messages
    assert entries == sorted(entries, key=lambda e: e.timestamp, reverse=True), "newest first"
    started = [e for e in entries if e.message == "Process started"]
    assert any("hello-from-logs" in e.fields["cmd"] for e in started), [
        e.fields.additional_properties for e in started
    ]
    assert all(e.fields["logger"] == "process" for e in started)
    failed = [e for e in entries if e.message == "Process exited" and e.fields["exit_code"] == "3"]
    assert len(failed) == 1 and failed[0].level == LogLevel.WARN, failed
    # The node's own entry of its creation.
    assert any(e.message == "Sandbox created" and e.fields["logger"] == "node" for e in entries)

    # Filters: level (and above), a case-sensitive search, forward from a
    # cursor, a limit.
    warned = logs_v2.sync_detailed(sid, client=client(), level=LogLevel.WARN).parsed.logs
    assert [e.fields["exit_code"] for e in warned] == ["3"], warned
    found = logs_v2.sync_detailed(sid, client=client(), search="exited").parsed.logs
    assert found and all("exited" in e.message for e in found), found
    none = logs_v2.sync_detailed(sid, client=client(), search="EXITED").parsed.logs
    assert none == [], none
    first = min(e.timestamp for e in entries)
    cursor = int(first.timestamp() * 1000)
    fwd = logs_v2.sync_detailed(
        sid, client=client(), direction=LogsDirection.FORWARD, cursor=cursor, limit=2
    ).parsed.logs
    assert len(fwd) == 2 and fwd[0].timestamp <= fwd[1].timestamp, fwd
    bad = logs_v2.sync_detailed(sid, client=client(), limit=1001)
    assert bad.status_code == 400, bad.status_code
    bad = logs_v2.sync_detailed(sid, client=client(), search="x" * 257)
    assert bad.status_code == 400, bad.status_code

    # v1: the CLI's shape, each line a JSON object with level and logger.
    r1 = logs_v1.sync_detailed(sid, client=client())
    assert r1.status_code == 200, (r1.status_code, r1.content)
    v1 = r1.parsed
    assert len(v1.logs) == len(v1.log_entries) == len(entries), (len(v1.logs), len(entries))
    import json

    lines = [json.loads(l.line) for l in v1.logs]
    assert all("level" in l and "logger" in l and "message" in l for l in lines), lines
    assert v1.logs == sorted(v1.logs, key=lambda l: l.timestamp), "oldest first"
    later = int(v1.logs[-1].timestamp.timestamp() * 1000) + 1
    assert logs_v1.sync_detailed(sid, client=client(), start=later).parsed.logs == []

    # Another team's sandbox: 404, as for an unknown one.
    assert logs_v2.sync_detailed(sid, client=client(OTHER_KEY)).status_code == 404
    assert logs_v1.sync_detailed(sid, client=client(OTHER_KEY)).status_code == 404

    # Ended: the logs outlive the sandbox and its node's memory of it, and
    # any gateway answers them (the scheduler keeps them).
    assert sbx.kill() is True
    ended = wait_for(
        "the ended sandbox's logs through the other gateway",
        lambda: (
            lambda r: r.parsed.logs
            if r.status_code == 200 and any(e.message == "Sandbox killed" for e in r.parsed.logs)
            else None
        )(logs_v2.sync_detailed(sid, client=client(url=OTHER_GATEWAY))),
    )
    assert any(
        e.message == "Process started" and "hello-from-logs" in e.fields["cmd"] for e in ended
    ), [e.message for e in ended]
    assert logs_v2.sync_detailed(sid, client=client(OTHER_KEY, OTHER_GATEWAY)).status_code == 404
    assert logs_v2.sync_detailed("neverexisted0000", client=client()).status_code == 404
    result(entries=len(entries), ended=len(ended), sandbox=sid)


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def near(t, lo, hi, slack=2.0):
    """`t` within [lo - slack, hi + slack] seconds."""
    return (lo - datetime.timedelta(seconds=slack)) <= t <= (hi + datetime.timedelta(seconds=slack))


@case
def refresh():
    sbx = Sandbox.create(timeout=30)
    sid = sbx.sandbox_id
    before = Sandbox.get_info(sid).end_at
    t0 = now()
    r = refreshes.sync_detailed(sid, client=client(), body=SandboxRefreshRequest(duration=600))
    t1 = now()
    assert r.status_code == 204, (r.status_code, r.content)
    after = Sandbox.get_info(sid).end_at
    assert after > before, (before, after)
    span = datetime.timedelta(seconds=600)
    assert near(after, t0 + span, t1 + span), (t0, after, t1)
    # A refresh never shortens the end; a short one is raised to 15 s.
    r = refreshes.sync_detailed(sid, client=client(), body=SandboxRefreshRequest(duration=1))
    assert r.status_code == 204, r.status_code
    assert Sandbox.get_info(sid).end_at == after
    short = Sandbox.create(timeout=10)
    t0 = now()
    r = refreshes.sync_detailed(short.sandbox_id, client=client(), body=SandboxRefreshRequest())
    t1 = now()
    assert r.status_code == 204, (r.status_code, r.content)
    end = Sandbox.get_info(short.sandbox_id).end_at
    floor = datetime.timedelta(seconds=15)
    assert near(end, t0 + floor, t1 + floor), (t0, end, t1)
    # Out of range: 400 naming the field; another team's: 404.
    r = refreshes.sync_detailed(sid, client=client(), body=SandboxRefreshRequest(duration=3601))
    assert r.status_code == 400 and b"duration" in r.content, (r.status_code, r.content)
    r = refreshes.sync_detailed(sid, client=client(OTHER_KEY), body=SandboxRefreshRequest(duration=60))
    assert r.status_code == 404, r.status_code
    sbx.kill()
    short.kill()
    result(extended_s=round((after - before).total_seconds()))


@case
def web_server():
    """A web server in a sandbox on port 8080, and its `get_host(8080)`:
    the caller opens it with curl and a browser."""
    sbx = Sandbox.create(timeout=300)
    marker = f"served-from-{sbx.sandbox_id}"
    sbx.files.write("/home/user/site/index.html", f"<html><body><p id='m'>{marker}</p></body></html>")
    sbx.commands.run(
        "cd /home/user/site && python3 -m http.server 8080 --bind 127.0.0.1", background=True
    )
    wait_for(
        "the server to answer inside the sandbox",
        lambda: run(sbx, "curl -fsS http://127.0.0.1:8080/index.html")[1].find(marker) >= 0,
    )
    result(host=sbx.get_host(8080), sandbox=sbx.sandbox_id, marker=marker, domain=sbx.sandbox_domain)


@case
def manage():
    """The template WARREN_TEMPLATE (built once, tag `default`, with a RUN
    step that prints `cli-step-output`): its builds, a build's log paged
    as E2B pages it, its tags as assign/remove change them."""
    name = os.environ["WARREN_TEMPLATE"]
    c = client()
    t = template_with_builds.sync_detailed(name, client=c)
    assert t.status_code == 200, (t.status_code, t.content)
    t = t.parsed
    assert t.template_id == name and t.public is False, t
    assert len(t.builds) >= 1 and t.builds[0].status == TemplateBuildStatus.READY, t.builds
    build = str(t.builds[0].build_id)
    assert t.build_id == build, (t.build_id, build)
    # The build's log, with its step's own output, paged forward.
    page = build_logs.sync_detailed(name, build, client=c, limit=100)
    assert page.status_code == 200, (page.status_code, page.content)
    entries = page.parsed.logs
    out = [e for e in entries if "cli-step-output" in e.message and not e.message.startswith("[")]
    assert out and out[0].step not in (None, "", "finalize"), [(e.message, e.step) for e in entries]
    two = build_logs.sync_detailed(name, build, client=c, limit=2).parsed.logs
    assert [e.message for e in two] == [e.message for e in entries[:2]], two
    cursor = int(entries[-1].timestamp.timestamp() * 1000)
    back = build_logs.sync_detailed(
        name, build, client=c, direction=LogsDirection.BACKWARD, cursor=cursor, limit=1
    ).parsed.logs
    assert back and back[0].timestamp <= entries[-1].timestamp, back
    assert build_logs.sync_detailed(name, build, client=client(OTHER_KEY)).status_code == 404
    # Tags: what assign and remove change.
    tags = tags_list.sync_detailed(name, client=c).parsed
    assert [x.tag for x in tags] == ["default"] and str(tags[0].build_id) == build, tags
    r = post_templates_tags.sync_detailed(
        client=c, body=AssignTemplateTagsRequest(target=f"{name}:default", tags=["v2"])
    )
    assert r.status_code == 201, (r.status_code, r.content)
    assert tags_count.sync_detailed(name, client=c).parsed.total == 2
    yes = tags_exists.sync_detailed(name, client=c, tag="v2").parsed
    assert yes.exists is True and yes.normalized_tag == "v2", yes
    assert tags_exists.sync_detailed(name, client=c, tag="nope").parsed.exists is False
    groups = tags_groups.sync_detailed(
        name, client=c, sort=GetTemplatesTemplateIDTagsGroupsSort.NAME_ASC
    ).parsed
    assert [g.tag for g in groups.tags] == ["default", "v2"], groups
    assert groups.next_cursor is None
    one = tags_groups.sync_detailed(name, client=c, tags_limit=1).parsed
    assert len(one.tags) == 1 and one.next_cursor, one
    assigned = tags_assignments.sync_detailed(name, "v2", client=c).parsed
    assert len(assigned.data) == 1 and str(assigned.data[0].build_id) == build, assigned
    assert tags_assignments.sync_detailed(name, "nope", client=c).status_code == 404
    r = delete_templates_tags.sync_detailed(
        client=c, body=DeleteTemplateTagsRequest(name=name, tags=["v2"])
    )
    assert r.status_code == 204, (r.status_code, r.content)
    assert tags_count.sync_detailed(name, client=c).parsed.total == 1
    assert tags_list.sync_detailed(name, client=client(OTHER_KEY)).status_code == 404
    # Listings.
    listed = get_v2_templates.sync_detailed(client=c, limit=100).parsed
    assert name in [x.template_id for x in listed], [x.template_id for x in listed]
    defaults = get_default_templates.sync_detailed(client=c).parsed
    assert "base" in [x.template_id for x in defaults] and all(x.is_default for x in defaults)
    assert name not in [x.template_id for x in defaults]
    result(build=build, log_entries=len(entries))


if __name__ == "__main__":
    CASES[sys.argv[1]]()
