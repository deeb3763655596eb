"""Code interpreter latency, driven by the real `e2b-code-interpreter` SDK
(run by bench/code_interpreter.sh, which starts the cluster).

N sequential cycles of `Sandbox.create()` (template code-interpreter-v1) ->
`run_code("1 + 1")` -> `run_code("x = 2; x * 21")` -> `kill()`, after WARMUP
unrecorded cycles, recording: create (the API call: it answers once the
template's start command is ready, i.e. the default Python kernel runs),
create -> first result (from before the create to the first `run_code`'s
answer), and one more `run_code` on the warm kernel. Then, once per
language, the first `run_code` in a language whose default context starts
on first use. Prints Markdown tables; nothing asserts on the numbers.
"""

import argparse
import math
import statistics
import time

from e2b_code_interpreter import Sandbox


def pct(values, p):
    """The p-th percentile (nearest rank) of `values`, in ms."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k] * 1000


def cycle(url, key):
    t0 = time.perf_counter()
    sbx = Sandbox.create(timeout=120, api_key=key, api_url=url, sandbox_url=url)
    t1 = time.perf_counter()
    first = sbx.run_code("1 + 1")
    t2 = time.perf_counter()
    warm = sbx.run_code("x = 2; x * 21")
    t3 = time.perf_counter()
    assert first.text == "2" and warm.text == "42", (first, warm)
    sbx.kill()
    return t1 - t0, t2 - t0, t3 - t2


def first_in_language(url, key, language, code):
    sbx = Sandbox.create(timeout=120, api_key=key, api_url=url, sandbox_url=url)
    try:
        t0 = time.perf_counter()
        e = sbx.run_code(code, language=language)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        sbx.run_code(code, language=language)
        again = time.perf_counter() - t0
        assert e.error is None, e.error
        return first, again
    finally:
        sbx.kill()


def row(label, values):
    return (f"| {label} | {pct(values, 50):.0f} | {pct(values, 99):.0f} "
            f"| {statistics.mean(values) * 1000:.0f} | {max(values) * 1000:.0f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    for _ in range(args.warmup):
        cycle(args.url, args.key)
    creates, firsts, warms = [], [], []
    for _ in range(args.n):
        c, f, w = cycle(args.url, args.key)
        creates.append(c)
        firsts.append(f)
        warms.append(w)
    print(f"\n{args.n} sequential cycles of create -> run_code -> run_code -> kill "
          f"({args.warmup} warm-up cycles not recorded)\n")
    print("| what | p50 ms | p99 ms | mean ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(row("create (answers once the Python kernel is ready)", creates))
    print(row("create → first `run_code` result", firsts))
    print(row("a `run_code` on the warm kernel", warms))

    print("\nFirst `run_code` in a language whose default context starts on first use "
          "(one sandbox each)\n")
    print("| language | first run_code ms | next run_code ms |")
    print("|---|---:|---:|")
    for language, code in (("javascript", "6 * 7"), ("bash", "echo 42")):
        first, again = first_in_language(args.url, args.key, language, code)
        print(f"| {language} | {first * 1000:.0f} | {again * 1000:.0f} |", flush=True)


if __name__ == "__main__":
    main()
