"""Every REST operation of the pinned `e2b` SDK's generated clients
(`e2b/api/client/api/**` and `e2b/volume/client/api/**`), called through
the SDK's own generated functions against a gateway.

An operation fails when the gateway answers it with its unknown-route
answer (`404` with `error_code` `not_found`, "no such endpoint") or a
`405`: it is not served. Any other answer counts as served (ids here name
nothing, so most answers are the endpoint's own `404` or `400`), and the
answer must parse as the SDK parses it. Operations of issues still open
would be listed in PENDING (none are now); one of them that is served is
a failure too, so the list only shrinks.

Run by `crates/warren/tests/e2b_surface.rs` with E2B_API_URL and
E2B_API_KEY set; prints a line per operation and one `RESULT {json}`
line; exits non-zero when any operation fails.
"""

import importlib
import inspect
import json
import os
import pkgutil
import sys
import typing

import e2b.api.client.api as api_ops
import e2b.volume.client.api as volume_ops
from e2b.api.client.client import AuthenticatedClient

# Operations whose issues have not landed: module paths under e2b, by
# prefix. Empty: every operation is served.
PENDING: tuple[str, ...] = ()

API_URL = os.environ["E2B_API_URL"]
API_KEY = os.environ["E2B_API_KEY"]

# Path parameters: ids that are well formed and name nothing.
PATH_VALUES = {
    "sandbox_id": "coverage0sandbox0id",
    "template_id": "coverage-template",
    "build_id": "00000000-0000-4000-a000-000000000000",
    "hash_": "0" * 64,
    "tag": "v1",
    "alias": "coverage-alias",
    "secret_id": "00000000-0000-4000-a000-000000000001",
    "volume_id": "coverage-volume",
    "node_id": "coverage-node",
}


class Body:
    """A request body the generated code serializes: `{}` (or, for a file,
    no bytes)."""

    payload = b""

    def to_dict(self):
        return {}

    def to_multipart(self):
        return {}


def value_for(name, annotation):
    if name in PATH_VALUES:
        return PATH_VALUES[name]
    if name == "body":
        return Body()
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is bytes or bytes in args:
        return b""
    if origin is list or annotation is list:
        return ["coverage0sandbox0id"]
    if annotation is int or int in args:
        return 1
    if annotation is bool or bool in args:
        return False
    return "v1"


def operations():
    for pkg, prefix in ((api_ops, "api.client.api."), (volume_ops, "volume.client.api.")):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.ispkg:
                continue
            mod = importlib.import_module(info.name)
            if hasattr(mod, "sync_detailed") and hasattr(mod, "_get_kwargs"):
                yield info.name.removeprefix("e2b."), mod


def call(name, mod, client):
    sig = inspect.signature(mod._get_kwargs)
    hints = typing.get_type_hints(mod._get_kwargs)
    kwargs = {}
    for p in sig.parameters.values():
        if p.default is inspect.Parameter.empty:
            kwargs[p.name] = value_for(p.name, hints.get(p.name))
    spec = mod._get_kwargs(**kwargs)
    # Unexpected statuses are answered as a Response, not raised; an answer
    # of an expected status that does not parse raises.
    resp = mod.sync_detailed(client=client, **kwargs)
    return spec["method"].upper(), spec["url"], resp


def main():
    client = AuthenticatedClient(
        base_url=API_URL,
        token=API_KEY,
        prefix="",
        auth_header_name="X-API-KEY",
        raise_on_unexpected_status=False,
    )
    served, pending, failed = [], [], []
    for name, mod in sorted(operations()):
        is_pending = name.startswith(PENDING)
        try:
            method, url, resp = call(name, mod, client)
        except Exception as e:  # noqa: BLE001 - a bad answer is a failure
            failed.append(name)
            print(f"FAIL {name}: the SDK could not call it or read the answer: {e!r}")
            continue
        try:
            body = json.loads(resp.content) if resp.content else {}
        except ValueError:
            body = {}
        unknown = resp.status_code == 405 or (
            resp.status_code == 404
            and isinstance(body, dict)
            and body.get("error_code") == "not_found"
            and str(body.get("message", "")).startswith("no such endpoint")
        )
        line = f"{method:6} {url:50} {resp.status_code}"
        if is_pending and unknown:
            pending.append(name)
            print(f"pending {line}  ({name})")
        elif is_pending:
            failed.append(name)
            print(f"FAIL {line}  ({name}): served now; remove it from PENDING")
        elif unknown:
            failed.append(name)
            print(f"FAIL {line}  ({name}): unknown route {body}")
        else:
            served.append(name)
            print(f"ok   {line}")
    print(
        "RESULT "
        + json.dumps(
            {"served": len(served), "pending": len(pending), "failed": failed, "total": len(served) + len(pending) + len(failed)}
        ),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
