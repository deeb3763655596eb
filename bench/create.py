"""Create-to-first-command latency, driven by the real `e2b` SDK (run by
bench/create.sh, which starts the clusters).

For each target (label=gateway URL): WARMUP unrecorded cycles, then N
sequential cycles of `Sandbox.create()` -> `commands.run("true")` -> `kill()`,
recording create latency (the API call) and create->first-command latency
(from before the create to the command's exit). Then, for the targets named
by --rate-target, cycles/s with C concurrent clients (C in --concurrency),
each client running cycles until TOTAL cycles are done. Prints a Markdown
table; nothing asserts on the numbers.
"""

import argparse
import math
import statistics
import threading
import time

from e2b import Sandbox


def pct(values, p):
    """The p-th percentile (nearest rank) of `values`, in ms."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k] * 1000


def cycle(url, key):
    """One create -> `true` -> kill; returns (create s, create->first command s)."""
    t0 = time.perf_counter()
    sbx = Sandbox.create(template="base", timeout=120, api_key=key, api_url=url, sandbox_url=url)
    t1 = time.perf_counter()
    r = sbx.commands.run("true")
    t2 = time.perf_counter()
    assert r.exit_code == 0, r
    sbx.kill()
    return t1 - t0, t2 - t0


def sequential(url, key, n, warmup):
    for _ in range(warmup):
        cycle(url, key)
    creates, firsts = [], []
    for _ in range(n):
        c, f = cycle(url, key)
        creates.append(c)
        firsts.append(f)
    return creates, firsts


def rate(url, key, clients, total):
    """`clients` threads share `total` cycles; returns (cycles/s, create
    latencies, create->first command latencies, errors, wall seconds)."""
    lock = threading.Lock()
    left = [total]
    creates, firsts, errors = [], [], []

    def worker():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                c, f = cycle(url, key)
                with lock:
                    creates.append(c)
                    firsts.append(f)
            except Exception as e:  # counted, not fatal: the table says so
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return len(creates) / wall, creates, firsts, errors, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", action="append", required=True, help="label=http://host:port")
    ap.add_argument("--key", required=True)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rate-target", action="append", default=[])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--total", type=int, default=32, help="cycles per concurrency level")
    args = ap.parse_args()
    targets = dict(t.split("=", 1) for t in args.target)

    print(f"\nSequential: {args.n} cycles of create -> commands.run('true') -> kill "
          f"per runtime ({args.warmup} warm-up cycles not recorded), template base\n")
    print("| runtime | create p50 ms | create p99 ms | create→first command p50 ms "
          "| create→first command p99 ms | mean ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, url in targets.items():
        creates, firsts = sequential(url, args.key, args.n, args.warmup)
        print(f"| {label} | {pct(creates, 50):.1f} | {pct(creates, 99):.1f} "
              f"| {pct(firsts, 50):.1f} | {pct(firsts, 99):.1f} "
              f"| {statistics.mean(firsts) * 1000:.1f} | {max(firsts) * 1000:.1f} |", flush=True)

    if args.rate_target:
        print(f"\nThroughput: {args.total} create -> `true` -> kill cycles per row, "
              "shared by C concurrent clients\n")
        print("| runtime | clients | cycles/s | wall s | create p50 ms | create p99 ms "
              "| create→first command p50 ms | create→first command p99 ms | errors |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label in args.rate_target:
            url = targets[label]
            for c in (int(x) for x in args.concurrency.split(",")):
                per_s, creates, firsts, errors, wall = rate(url, args.key, c, args.total)
                p = lambda v, q: f"{pct(v, q):.1f}" if v else "-"
                print(f"| {label} | {c} | {per_s:.2f} | {wall:.1f} | {p(creates, 50)} "
                      f"| {p(creates, 99)} | {p(firsts, 50)} | {p(firsts, 99)} "
                      f"| {len(errors)} |", flush=True)
                for e in errors[:3]:
                    print(f"  error: {e}")


if __name__ == "__main__":
    main()
