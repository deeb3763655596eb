"""Create latency, throughput and idle memory, driven by the real `e2b` SDK
(run by bench/create.sh, which starts the clusters and says what each is).

Every cycle is `Sandbox.create()` (template base) -> `commands.run("true")`
-> `kill()`; *create* is the create call, *first command* runs from before
the create until `true` has exited (kill is not counted in either).

Phases, each printing a Markdown table (nothing asserts on the numbers):
1. serial: WARMUP unrecorded cycles, then N, on each --target;
2. where a cold create's time goes: the node's
   `warren_node_create_step_seconds{step}` over the serial phase (mean
   per start), and the CPU every part of the cluster spent per cycle
   (utime + stime from /proc: the node with every process it started and
   reaped — sandboxes, helpers — the gateway, the scheduler);
3. throughput: C concurrent clients (C in --concurrency) sharing TOTAL
   cycles, per --rate-target;
4. idle memory on --memory-target: K idle sandboxes (K in --idle), the
   drop in MemAvailable per sandbox, the sandboxes' memory cgroups, and
   each host-side process kind's Pss and private memory;
5. the most idle sandboxes (--max-idle): batches of --max-step until one
   does not answer `true` within 1 s, a create fails, or MemAvailable or
   the data dir's free space would fall under the floors.
"""

import argparse
import concurrent.futures as futures
import json
import math
import os
import re
import shutil
import statistics
import threading
import time
import urllib.request

from e2b import Sandbox


def pct(values, p):
    """The p-th percentile (nearest rank) of `values`, in ms."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k] * 1000


def fmt(values, p):
    return f"{pct(values, p):.1f}" if values else "-"


class Cluster:
    """One `warren dev` started by create.sh: its gateway URL, node pid and
    metrics URL, gateway and scheduler pids."""

    def __init__(self, spec):
        d = json.loads(spec)
        self.label = d["label"]
        self.url = d["url"]
        self.node_pid = int(d["node_pid"])
        self.node_metrics = d["node_metrics"]
        self.other_pids = [int(p) for p in d.get("other_pids", [])]
        self.data_dir = d.get("data_dir", "/")

    def create(self, key, timeout=300):
        return Sandbox.create(template="base", timeout=timeout, api_key=key,
                              api_url=self.url, sandbox_url=self.url)


def cycle(cluster, key):
    """One create -> `true` -> kill; returns (create s, create->first command s)."""
    t0 = time.perf_counter()
    sbx = cluster.create(key, timeout=120)
    t1 = time.perf_counter()
    r = sbx.commands.run("true")
    t2 = time.perf_counter()
    assert r.exit_code == 0, r
    sbx.kill()
    return t1 - t0, t2 - t0


def cpu_ticks(pid):
    """utime + stime + cutime + cstime of `pid` (clock ticks): the process
    and every child it has reaped (with theirs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return [int(x) for x in rest[11:15]]
    except OSError:
        return [0, 0, 0, 0]


def cpu_snapshot(cluster):
    node = cpu_ticks(cluster.node_pid)
    others = [sum(cpu_ticks(p)[:2]) for p in cluster.other_pids]
    return node, others


def cpu_row(label, cycles, before, after):
    """CPU ms per cycle from two snapshots."""
    hz = os.sysconf("SC_CLK_TCK")
    (nb, ob), (na, oa) = before, after
    per = lambda ticks: ticks * 1000 / hz / max(cycles, 1)
    node_self = per(na[0] + na[1] - nb[0] - nb[1])
    node_kids = per(na[2] + na[3] - nb[2] - nb[3])
    others = per(sum(oa) - sum(ob))
    sys_share = (na[1] + na[3] - nb[1] - nb[3]) / max(1, sum(na) - sum(nb)) * 100
    return (f"| {label} | {cycles} | {node_self:.1f} | {node_kids:.1f} | {others:.1f} "
            f"| {node_self + node_kids + others:.1f} | {sys_share:.0f} % |")


def metrics(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def step_sums(text, source="launch"):
    """{step: (sum s, count)} of warren_node_create_step_seconds for starts
    from `source` (launch: started for the create; pool: taken from one)."""
    out = {}
    pattern = (r'^warren_node_create_step_seconds_(sum|count)'
               r'\{step="([a-z_]+)"(?:,source="(\w+)")?\} (\S+)$')
    for m in re.finditer(pattern, text, re.M):
        if m.group(3) not in (None, source):
            continue
        kind, step, v = m.group(1), m.group(2), float(m.group(4))
        s, c = out.get(step, (0.0, 0.0))
        out[step] = (s + v, c) if kind == "sum" else (s, c + v)
    return out


def sequential(cluster, key, n, warmup):
    for _ in range(warmup):
        cycle(cluster, key)
    creates, firsts = [], []
    for _ in range(n):
        c, f = cycle(cluster, key)
        creates.append(c)
        firsts.append(f)
    return creates, firsts


def rate(cluster, key, clients, total):
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
                c, f = cycle(cluster, key)
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


def meminfo(field="MemAvailable"):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def mem_available_settled():
    """MemAvailable, the median of five reads a second apart."""
    vals = []
    for _ in range(5):
        vals.append(meminfo())
        time.sleep(1)
    return statistics.median(vals)


# What the kernel's own counters say an idle sandbox is made of.
KERNEL_FIELDS = ["AnonPages", "Shmem", "SUnreclaim", "SReclaimable", "KernelStack",
                 "PageTables", "Percpu"]


def kernel_counters():
    return {f: meminfo(f) for f in KERNEL_FIELDS}


def children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid):
    kids, out, todo = children_map(), [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kind_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    words = [a.decode(errors="replace") for a in argv]
    joined = " ".join(words)
    if "slirp4netns" in words[0]:
        return "slirp4netns"
    if "sandbox-launch" in joined:
        return "launcher"
    if "sandbox-init" in joined:
        return "pid 1"
    if len(words) > 1 and words[1] == "envd":
        return "envd"
    return None


def rollup(pid):
    """(Pss, private) bytes from smaps_rollup."""
    pss = private = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k == "Pss":
                    pss = int(v.split()[0]) * 1024
                elif k in ("Private_Clean", "Private_Dirty"):
                    private += int(v.split()[0]) * 1024
    except OSError:
        pass
    return pss, private


def sandbox_cgroups_memory(node_pid):
    """Sum of the node's sandboxes' memory cgroups' usage (v2 memory.current,
    v1 memory.usage_in_bytes), found from its launchers' /proc/<pid>/cgroup."""
    total, seen = 0, set()
    for pid in descendants(node_pid):
        if kind_of(pid) != "launcher":
            continue
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            _, ctrls, path = line.split(":", 2)
            if ctrls == "" and os.path.exists(f"/sys/fs/cgroup{path}/memory.current"):
                p = f"/sys/fs/cgroup{path}/memory.current"
            elif "memory" in ctrls.split(","):
                p = f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"
            else:
                continue
            if p in seen:
                continue
            seen.add(p)
            try:
                with open(p) as f:
                    total += int(f.read())
            except (OSError, ValueError):
                pass
    return total


def create_many(cluster, key, n, workers=8):
    """n idle sandboxes (timeout 1 h), created by `workers` clients."""
    with futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda _: cluster.create(key, timeout=3600), range(n)))


def kill_all(sandboxes, workers=8):
    with futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda s: s.kill(), sandboxes))


MIB = 1 << 20


def idle_memory(cluster, key, counts):
    print("\nIdle memory: K idle `base` sandboxes on one node (no warm pool); "
          "MemAvailable is the machine's (other processes move it too), the "
          "cgroup figure is the sandboxes' own memory cgroups (their processes, "
          "slirp4netns included, and the kernel memory charged to them), Pss "
          "and private are per process (mean over the sandboxes)\n")
    print("| idle sandboxes | MemAvailable drop per sandbox MiB | memory cgroups per sandbox MiB "
          "| launcher Pss / private KiB | pid 1 Pss / private KiB | envd Pss / private KiB "
          "| slirp4netns Pss / private KiB | host processes per sandbox |")
    print("|---:|---:|---:|---|---|---|---|---:|")
    parts = []
    for k in counts:
        before = mem_available_settled()
        kb = kernel_counters()
        sandboxes = create_many(cluster, key, k)
        time.sleep(5)
        after = mem_available_settled()
        ka = kernel_counters()
        parts.append((k, {f: (ka[f] - kb[f]) / k for f in KERNEL_FIELDS}))
        kinds = {}
        for pid in descendants(cluster.node_pid):
            kd = kind_of(pid)
            if kd:
                kinds.setdefault(kd, []).append(rollup(pid))
        cg = sandbox_cgroups_memory(cluster.node_pid)
        cells = []
        for kd in ("launcher", "pid 1", "envd", "slirp4netns"):
            v = kinds.get(kd, [])
            if v:
                cells.append(f"{statistics.mean(p for p, _ in v) / 1024:.0f} / "
                             f"{statistics.mean(q for _, q in v) / 1024:.0f}")
            else:
                cells.append("-")
        procs = sum(len(v) for v in kinds.values()) / k
        print(f"| {k} | {(before - after) / k / MIB:.2f} | {cg / k / MIB:.2f} | "
              + " | ".join(cells) + f" | {procs:.1f} |", flush=True)
        kill_all(sandboxes)
        time.sleep(3)
    print("\nWhat the kernel's counters grew by per idle sandbox (KiB, /proc/meminfo; "
          "the machine's, so other processes move them too)\n")
    print("| idle sandboxes | " + " | ".join(KERNEL_FIELDS) + " |")
    print("|---:|" + "---:|" * len(KERNEL_FIELDS))
    for k, d in parts:
        print(f"| {k} | " + " | ".join(f"{d[f] / 1024:.0f}" for f in KERNEL_FIELDS) + " |")


def answers_within(sandboxes, limit):
    """How many of `sandboxes` fail to run `true` within `limit` s, and the
    slowest answer."""
    slow, worst = 0, 0.0
    for s in sandboxes:
        t0 = time.perf_counter()
        try:
            r = s.commands.run("true", request_timeout=limit * 5)
            ok = r.exit_code == 0
        except Exception:
            ok = False
        took = time.perf_counter() - t0
        worst = max(worst, took)
        if not ok or took > limit:
            slow += 1
    return slow, worst


def max_idle(cluster, key, step, mem_floor, disk_floor, ceiling):
    baseline = mem_available_settled()
    print(f"\nThe most idle `base` sandboxes: batches of {step}, then `true` in every "
          "one; stops at the first batch where one takes over 1 s (or fails), a "
          f"create fails, MemAvailable would fall under {mem_floor // MIB} MiB or "
          f"the data dir's free space under {disk_floor // MIB} MiB, or at {ceiling}\n")
    print("| idle sandboxes | MemAvailable MiB | data dir free MiB | slowest `true` ms "
          "| over 1 s | batch create s |")
    print("|---:|---:|---:|---:|---:|---:|")
    held, best, why = [], 0, "reached the ceiling"
    try:
        while len(held) + step <= ceiling:
            avail = meminfo()
            free = shutil.disk_usage(cluster.data_dir).free
            # What a batch will take, from what the ones so far took.
            per = (baseline - avail) / len(held) if held else 32 * MIB
            if avail - per * step < mem_floor:
                why = "MemAvailable floor"
                break
            if free < disk_floor:
                why = "disk floor"
                break
            t0 = time.perf_counter()
            try:
                held += create_many(cluster, key, step)
            except Exception as e:
                why = f"a create failed: {e!r}"[:200]
                break
            took = time.perf_counter() - t0
            slow, worst = answers_within(held, 1.0)
            print(f"| {len(held)} | {meminfo() // MIB} | "
                  f"{shutil.disk_usage(cluster.data_dir).free // MIB} | {worst * 1000:.0f} "
                  f"| {slow} | {took:.1f} |", flush=True)
            if slow:
                why = "a sandbox took over 1 s"
                break
            best = len(held)
    finally:
        print(f"\nMost idle sandboxes all answering within 1 s: **{best}** (stopped: {why})")
        kill_all(held, workers=16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", action="append", required=True,
                    help='JSON: {"label", "url", "node_pid", "node_metrics", "other_pids", "data_dir"}')
    ap.add_argument("--key", required=True)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps-of", default="", help="cluster whose create steps are tabled")
    ap.add_argument("--rate-target", action="append", default=[])
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--total", type=int, default=64, help="cycles per concurrency level")
    ap.add_argument("--memory-target", default="")
    ap.add_argument("--idle", default="10,100,500")
    ap.add_argument("--max-idle-target", default="")
    ap.add_argument("--max-step", type=int, default=100)
    ap.add_argument("--max-ceiling", type=int, default=4000)
    ap.add_argument("--mem-floor-mib", type=int, default=2048)
    ap.add_argument("--disk-floor-mib", type=int, default=2048)
    args = ap.parse_args()
    clusters = {c.label: c for c in map(Cluster, args.cluster)}

    print(f"\nSerial: {args.n} cycles of create -> commands.run('true') -> kill per cluster "
          f"({args.warmup} warm-up cycles not recorded), template base\n")
    print("| cluster | create p50 ms | create p99 ms | create→first command p50 ms "
          "| create→first command p99 ms | mean ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    cpu = []
    steps = {}
    for label, c in clusters.items():
        for _ in range(args.warmup):
            cycle(c, args.key)
        s0 = step_sums(metrics(c.node_metrics)) if label == args.steps_of else None
        b = cpu_snapshot(c)
        creates, firsts = sequential(c, args.key, args.n, 0)
        cpu.append(cpu_row(f"{label}, serial", args.n, b, cpu_snapshot(c)))
        if s0 is not None:
            s1 = step_sums(metrics(c.node_metrics))
            steps = {k: (v[0] - s0.get(k, (0, 0))[0], v[1] - s0.get(k, (0, 0))[1])
                     for k, v in s1.items()}
            steps["_create"] = (statistics.mean(creates), 1)
        print(f"| {label} | {fmt(creates, 50)} | {fmt(creates, 99)} "
              f"| {fmt(firsts, 50)} | {fmt(firsts, 99)} "
              f"| {statistics.mean(firsts) * 1000:.1f} | {max(firsts) * 1000:.1f} |", flush=True)

    if steps:
        print(f"\nWhere {args.steps_of}'s serial creates spent their time (mean per start, "
              "from the node's warren_node_create_step_seconds; `total` is the node's "
              "whole start, the last row what the create call spent beyond it: gateway, "
              "scheduler, SDK)\n")
        print("| step | mean ms | share of the create call |")
        print("|---|---:|---:|")
        create_ms = steps.pop("_create")[0] * 1000
        total = steps.get("total", (0, 1))
        order = ["ids", "layers", "disk", "cgroups", "userns", "root", "launcher",
                 "holder_exit", "pool", "egress", "stdin", "envd_ready", "start_cmd",
                 "record", "total"]
        for k in sorted(steps, key=lambda k: order.index(k) if k in order else len(order)):
            s, n = steps[k]
            if n:
                ms = s / n * 1000
                print(f"| {k} | {ms:.2f} | {ms / create_ms * 100:.0f} % |")
        if total[1]:
            rest = create_ms - total[0] / total[1] * 1000
            print(f"| gateway, scheduler and SDK | {rest:.2f} | {rest / create_ms * 100:.0f} % |")

    for label in args.rate_target:
        c = clusters[label]
        print(f"\nThroughput on {label}: {args.total} create -> `true` -> kill cycles per row, "
              "shared by C concurrent clients\n")
        print("| clients | cycles/s | wall s | create p50 ms | create p99 ms "
              "| create→first command p50 ms | create→first command p99 ms | errors |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in (int(x) for x in args.concurrency.split(",")):
            b = cpu_snapshot(c)
            per_s, creates, firsts, errors, wall = rate(c, args.key, n, args.total)
            cpu.append(cpu_row(f"{label}, {n} clients", len(creates), b, cpu_snapshot(c)))
            print(f"| {n} | {per_s:.2f} | {wall:.1f} | {fmt(creates, 50)} "
                  f"| {fmt(creates, 99)} | {fmt(firsts, 50)} | {fmt(firsts, 99)} "
                  f"| {len(errors)} |", flush=True)
            for e in errors[:3]:
                print(f"  error: {e}")

    print("\nCPU per cycle (ms; utime + stime from /proc: the node itself, what it "
          "started and reaped — sandboxes' processes, helpers — and the gateway and "
          "scheduler; kernel threads' work, such as loop devices' I/O, is not counted)\n")
    print("| run | cycles | node | node's children | gateway + scheduler | total | kernel share |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in cpu:
        print(row)

    if args.memory_target:
        idle_memory(clusters[args.memory_target], args.key,
                    [int(x) for x in args.idle.split(",") if x])
    if args.max_idle_target:
        max_idle(clusters[args.max_idle_target], args.key, args.max_step,
                 args.mem_floor_mib * MIB, args.disk_floor_mib * MIB, args.max_ceiling)


if __name__ == "__main__":
    main()
