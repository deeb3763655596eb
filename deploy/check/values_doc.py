#!/usr/bin/env python3
"""Every value of a chart's values.yaml is documented twice: a `# --`
comment above it in values.yaml (or above the mapping it belongs to, for
a mapping given whole such as `issuerRef`), and a row of the README's
values table (`| `key` | default | ... |`).

    values_doc.py CHART           # check
    values_doc.py --table CHART   # print the README's table from values.yaml
"""

import json
import os
import re
import sys

import yaml


def leaves(d, docs, prefix=""):
    """The values: a mapping with a comment of its own is one value
    (given whole, e.g. `resources`), others are walked into."""
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key not in docs:
            yield from leaves(v, docs, key + ".")
        else:
            yield key, v


def comments(text):
    """key (dotted) -> the `# --` comment block right above its line."""
    out = {}
    stack = []
    block = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            block.append(s.lstrip("#").strip())
            continue
        m = re.match(r"^( *)([A-Za-z0-9_]+):", line)
        if m:
            depth = len(m.group(1)) // 2
            stack = stack[:depth] + [m.group(2)]
            if block and block[0].startswith("-- "):
                out[".".join(stack)] = " ".join([block[0][3:]] + block[1:])
        block = []
    return out


def documented(key, docs):
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        k = ".".join(parts[:i])
        if k in docs:
            return docs[k]
    return None


def show(v):
    if isinstance(v, str):
        return f"`{json.dumps(v)}`"
    return f"`{json.dumps(v, separators=(',', ':'))}`"


def main():
    args = sys.argv[1:]
    table = args[:1] == ["--table"]
    chart = args[-1]
    text = open(os.path.join(chart, "values.yaml")).read()
    values = yaml.safe_load(text)
    docs = comments(text)
    all_leaves = list(leaves(values, docs))
    if table:
        print("| value | default | what |")
        print("|---|---|---|")
        for key, v in all_leaves:
            doc = (documented(key, docs) or "").replace("|", "\\|")
            print(f"| `{key}` | {show(v)} | {doc} |")
        return 0
    problems = []
    readme = open(os.path.join(chart, "README.md")).read()
    in_table = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, re.M))
    keys = {k for k, _ in all_leaves}
    for key in sorted(keys):
        if documented(key, docs) is None:
            problems.append(f"{key}: no `# --` comment above it (or its mapping) in values.yaml")
        if key not in in_table:
            problems.append(f"{key}: not in the README's values table (values_doc.py --table prints it)")
    for key in sorted(in_table - keys):
        problems.append(f"{key}: in the README's values table but not a value")
    for p in problems:
        print(f"values_doc.py: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"values_doc.py: {len(keys)} values, each described in values.yaml and the README")
    return 0


if __name__ == "__main__":
    sys.exit(main())
