#!/usr/bin/env bash
# The cold-gateway storm: SANDBOXES live sandboxes, steady traffic across
# them through one gateway whose route cache holds them all, then the
# gateway is restarted and comes back with an empty cache. Prints a
# timeline and how long until its hit ratio recovers, what the scheduler
# went through meanwhile (lookups/s, CPU) and what clients saw (p99,
# failures).
#
# The store gets SANDBOXES running sandboxes (`warren-bench seed`, straight
# into the scheduler's tables), their routes all pointing at a stand-in
# upstream, nginx answering `200 ok` (what is measured is the gateway and
# the scheduler, not a node). The gateway's cache is filled first (every
# sandbox asked for once), then `warren-bench http-load` offers RATE
# requests/s from CONNECTIONS keep-alive connections (RATE=0: each sends
# as soon as answered), each for a random sandbox (uniform, or skewed with
# HOT_IDS/HOT_SHARE), for STEADY seconds; then the gateway gets SIGTERM,
# and as soon as it has exited it is started again on the same ports,
# with the same flags plus GATEWAY_ARGS; traffic goes on for AFTER
# seconds (uniform traffic touches 99 % of the sandboxes in about
# 4.6 x SANDBOXES / RATE seconds: a cold cache cannot recover sooner
# without a warm-up). Clients dial again after a refused or cut
# connection; each failure is counted. Latency is from when a request was
# due, so RATE must stay below what the machine serves, or the backlog
# is what gets measured. Four times an interval the gateway's and the
# scheduler's /metrics, their /proc/<pid>/stat and the machine's
# /proc/stat are sampled. Internal hops are plain TCP (--insecure-internal).
#
# Usage: bench/storm.sh [SANDBOXES=100000] [RATE=4000] [CONNECTIONS=64]
#   env: STEADY=10, AFTER=150, INTERVAL_MS=1000, THRESHOLD=99 (hit ratio %),
#        HOT_IDS=0 HOT_SHARE=0 (e.g. 0.1 and 0.9: 90 % of requests for 10 %
#        of the sandboxes), BACKEND=sqlite|postgres, WORKERS=2 (gateway and
#        scheduler threads), LOAD_THREADS=2, GATEWAY_ARGS="" (extra gateway
#        flags, both starts), CARGO_TARGET_DIR, KEEP=1
# Needs: nginx, python3, curl; PostgreSQL's initdb/pg_ctl for
# BACKEND=postgres; builds warren and warren-bench in release mode.
# Everything listens on 127.0.0.1 and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

SANDBOXES="${1:-100000}"
RATE="${2:-4000}"
CONNS="${3:-64}"
STEADY="${STEADY:-10}"
AFTER="${AFTER:-150}"
INTERVAL_MS="${INTERVAL_MS:-1000}"
THRESHOLD="${THRESHOLD:-99}"
HOT_IDS="${HOT_IDS:-0}"
HOT_SHARE="${HOT_SHARE:-0}"
BACKEND="${BACKEND:-sqlite}"
WORKERS="${WORKERS:-2}"
LOAD_THREADS="${LOAD_THREADS:-2}"
read -r -a EXTRA <<<"${GATEWAY_ARGS:-}"

for tool in nginx python3 curl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is required (Debian: apt-get install $tool)" >&2; exit 1; }
done
case "$BACKEND" in sqlite|postgres) ;; *) echo "bench: BACKEND is sqlite or postgres, not $BACKEND" >&2; exit 64 ;; esac
cargo build --release -q -p warren -p warren-bench
TARGET="${CARGO_TARGET_DIR:-$PWD/target}/release"
BIN="$TARGET/warren"
DRIVER="$TARGET/warren-bench"
WORK="$(mktemp -d /tmp/warren-bench-storm.XXXXXX)"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  [ -f "$WORK/nginx.pid" ] && kill -TERM "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  for _ in $(seq 1 100); do
    local alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "bench: logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now_ms() { date +%s%3N; }
# start NAME WAIT_FOR ARGS...: leaves ADDR and PID (never run in $(...)).
start() {
  local name="$1" want="$2"; shift 2
  WARREN_LOG=warn WARREN_EXIT_WITH_PARENT=1 TOKIO_WORKER_THREADS="$WORKERS" \
    "$BIN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PID=$!
  PIDS+=("$PID")
  for _ in $(seq 1 1500); do
    if grep -q "^$want listening on" "$WORK/$name.out" 2>/dev/null; then
      ADDR=$(grep "^$want listening on" "$WORK/$name.out" | head -1 | sed 's/.* listening on //')
      return 0
    fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.02
  done
  echo "bench: $name did not start; its log:" >&2; cat "$WORK/$name.err" >&2; exit 1
}

# The stand-in upstream.
UPSTREAM_PORT=$(free_port)
cat >"$WORK/nginx.conf" <<NGINX
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$UPSTREAM_PORT; location / { return 200 "ok\n"; } }
}
NGINX
nginx -c "$WORK/nginx.conf" -p "$WORK" -e "$WORK/nginx.err"

db_args=()
case "$BACKEND" in
  sqlite) url="sqlite://$WORK/sched/scheduler.db" ;;
  postgres)
    coproc PG { "$DRIVER" postgres; }
    PIDS+=("$PG_PID")
    read -r _ url <&"${PG[0]}"
    (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$WORK/store.key")
    db_args=(--database-url "$url" --store-key-file "$WORK/store.key") ;;
esac
start scheduler "scheduler grpc" scheduler --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --data-dir "$WORK/sched" "${db_args[@]}" --insecure-internal
SCHED="$ADDR"; SCHED_PID="$PID"
SCHED_ADMIN=$(grep "^scheduler admin listening on" "$WORK/scheduler.out" | sed 's/.* listening on //')
"$DRIVER" seed --database-url "$url" --count "$SANDBOXES" \
  --endpoint "127.0.0.1:$UPSTREAM_PORT" --team bench >&2

KEY="bench_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
# The key in the environment, never on the command line.
export WARREN_GATEWAY_API_KEY="$KEY:bench"
GW="127.0.0.1:$(free_port)"
GW_ADMIN="127.0.0.1:$(free_port)"
gateway() {
  start gateway "gateway http" gateway --listen "$GW" --admin-listen "$GW_ADMIN" \
    --scheduler "http://$SCHED" --insecure-internal \
    --route-cache-capacity $((SANDBOXES * 2)) --route-cache-ttl 24h --worker-threads "$WORKERS" \
    "${EXTRA[@]}"
  GW_PID="$PID"
  echo "$GW_PID" >"$WORK/gateway.pid"
}
gateway
metric() { curl -sf "http://$GW_ADMIN/metrics" | awk -v m="$1" '$1 == m {print $2}' | head -1; }
load() {
  TOKIO_WORKER_THREADS="$LOAD_THREADS" "$DRIVER" http-load --target "$GW" --count "$SANDBOXES" "$@"
}

echo "bench: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); $BACKEND, $SANDBOXES sandboxes" >&2
t0=$SECONDS
load --walk --connections 32 --duration 3600 --interval-ms 5000 >"$WORK/fill.tsv"
entries=$(metric warren_gateway_route_cache_entries)
echo "bench: filled: ${entries%.*} routes cached in $((SECONDS - t0)) s; $(grep '^# total' "$WORK/fill.tsv")" >&2
[ "${entries%.*}" -ge "$SANDBOXES" ] || echo "bench: warning: the cache holds ${entries%.*} of $SANDBOXES routes" >&2

# The sampler: four times every INTERVAL_MS, both /metrics and both /proc/<pid>/stat.
python3 - "$INTERVAL_MS" "http://$GW_ADMIN/metrics" "http://$SCHED_ADMIN/metrics" "$WORK/gateway.pid" "$SCHED_PID" \
  >"$WORK/samples.tsv" 2>"$WORK/sampler.err" <<'PY' &
import sys, time, urllib.request
interval, gw_url, sched_url, gw_pid_file, sched_pid = sys.argv[1:]
# Four samples an interval, so each interval's counters are read within
# a quarter interval of its edges.
interval = int(interval) / 4000

def scrape(url, want):
    out = dict.fromkeys(want, 0.0)
    try:
        text = urllib.request.urlopen(url, timeout=interval).read().decode()
    except Exception:
        return None
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, value = line.rpartition(" ")
        for w, match in want.items():
            if match(name):
                out[w] += float(value)
    return out

def ticks(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return -1
    f = stat[stat.rindex(")") + 2:].split()
    return int(f[11]) + int(f[12])

gw_want = {
    "hits": lambda n: n == "warren_gateway_route_cache_hits_total",
    "misses": lambda n: n == "warren_gateway_route_cache_misses_total",
    "lookups": lambda n: n == "warren_gateway_scheduler_lookups_total",
    "coalesced": lambda n: n == "warren_gateway_route_cache_coalesced_total",
}
# Routes the scheduler answered (one per id, whether a LookupNode or one id
# of a gateway's LookupNodes batch; from its route view or its store).
sched_want = {"lookups": lambda n: n.startswith("warren_scheduler_lookups_total{")}
def machine():
    # All CPUs' busy and total ticks (`cpu` line of /proc/stat).
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)

print("#unix_ms\tgw_pid\tgw_up\tgw_hits\tgw_misses\tgw_lookups\tgw_coalesced\tgw_ticks\tsched_lookups\tsched_ticks\tbusy\ttotal", flush=True)
next_at = time.time()
while True:
    next_at += interval
    time.sleep(max(0.0, next_at - time.time()))
    try:
        gw_pid = open(gw_pid_file).read().strip()
    except OSError:
        gw_pid = "0"
    g = scrape(gw_url, gw_want)
    s = scrape(sched_url, sched_want) or {"lookups": -1}
    gv = [g[k] for k in gw_want] if g else [0, 0, 0, 0]
    row = [int(time.time() * 1000), gw_pid, int(g is not None), *gv, ticks(gw_pid), s["lookups"], ticks(sched_pid), *machine()]
    print("\t".join(str(int(v)) if isinstance(v, float) else str(v) for v in row), flush=True)
PY
PIDS+=("$!")

load --rate "$RATE" --connections "$CONNS" --duration $((STEADY + AFTER)) --interval-ms "$INTERVAL_MS" \
  --hot-ids "$HOT_IDS" --hot-share "$HOT_SHARE" --histograms "$WORK/hist.tsv" \
  >"$WORK/load.tsv" 2>"$WORK/load.err" &
LOAD_PID=$!
PIDS+=("$LOAD_PID")
sleep "$STEADY"
t_term=$(now_ms)
kill -TERM "$GW_PID"
for _ in $(seq 1 1500); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.02; done
kill -0 "$GW_PID" 2>/dev/null && { echo "bench: the gateway did not exit within 30 s of SIGTERM" >&2; exit 1; }
t_down=$(now_ms)
gateway
t_up=$(now_ms)
echo "bench: gateway restarted: SIGTERM at $t_term, exited +$((t_down - t_term)) ms, listening again +$((t_up - t_term)) ms" >&2
wait "$LOAD_PID" || { echo "bench: http-load failed:" >&2; cat "$WORK/load.err" >&2; exit 1; }
sleep "$(python3 -c "print($INTERVAL_MS * 1.5 / 1000)")"
cat "$WORK/load.err" >&2

python3 - "$WORK" "$t_term" "$t_down" "$t_up" "$THRESHOLD" "$(getconf CLK_TCK)" "$INTERVAL_MS" <<'PY'
import bisect, re, sys
work, t_term, t_down, t_up, threshold, hz, interval = sys.argv[1:]
t_term, t_down, t_up, hz, interval = int(t_term), int(t_down), int(t_up), float(hz), int(interval)
threshold = float(threshold) / 100

def rows(path):
    return [l.rstrip("\n").split("\t") for l in open(path) if l.strip() and not l.startswith("#")]

load = [(int(r[0]), int(r[1]), int(r[2]), int(r[3]), r[4], r[5], r[6]) for r in rows(f"{work}/load.tsv")]
comments = [l.strip() for l in open(f"{work}/load.tsv") if l.startswith("# ")]
hist = {int(r[0]): r[1] if len(r) > 1 else "" for r in rows(f"{work}/hist.tsv")}
samples = [r for r in rows(f"{work}/samples.tsv")]
samples = [(int(r[0]), r[1], int(r[2]), *map(int, r[3:])) for r in samples]
times = [s[0] for s in samples]

def sample_at(t):
    """The last sample taken at or before t (the metrics as of then)."""
    i = bisect.bisect_right(times, t) - 1
    return samples[i] if i >= 0 else None

def delta(a, b, field):
    """Counter increase from sample a to b; a gateway restart starts its
    counters again from 0."""
    if a is None or b is None or not b[2]:
        return None
    va, vb = a[field], b[field]
    if a[1] != b[1] or not a[2]:
        va = 0
    return max(vb - va, 0)

def ticks(a, b, field):
    if a is None or b is None or a[field] < 0 or b[field] < 0:
        return None
    if field == 7 and a[1] != b[1]:
        return None
    return b[field] - a[field]

def merged(ts):
    counts = {}
    for t in ts:
        for pair in filter(None, hist.get(t, "").split(",")):
            v, c = pair.split(":")
            counts[int(v)] = counts.get(int(v), 0) + int(c)
    return counts

def pct(counts, q):
    n = sum(counts.values())
    if n == 0:
        return float("nan")
    rank, seen = max(1, -(-q * n // 1)), 0
    for v in sorted(counts):
        seen += counts[v]
        if seen >= rank:
            return v / 1000
    return float("nan")

HITS, MISSES, GW_LOOKUPS, COALESCED, GW_TICKS, S_LOOKUPS, S_TICKS, BUSY, TOTAL = 3, 4, 5, 6, 7, 8, 9, 10, 11
cpus = __import__("os").cpu_count()
timeline = []
prev_end = load[0][0] - interval if load else 0
for end, ok, other, failed, p50, p99, mx in load:
    a, b = sample_at(prev_end), sample_at(end)
    secs = max(end - prev_end, 1) / 1000
    hits, misses = delta(a, b, HITS), delta(a, b, MISSES)
    ratio = hits / (hits + misses) if hits is not None and misses is not None and hits + misses > 0 else None
    sl = None
    if a and b and a[S_LOOKUPS] >= 0 and b[S_LOOKUPS] >= 0:
        sl = b[S_LOOKUPS] - a[S_LOOKUPS]
    st, gt = ticks(a, b, S_TICKS), ticks(a, b, GW_TICKS)
    span = (b[0] - a[0]) / 1000 if a and b and b[0] > a[0] else None
    timeline.append(dict(
        end=end, t=(end - t_term) / 1000, rps=(ok + other) / secs, ok=ok, other=other, failed=failed,
        p50=p50, p99=p99, max=mx, ratio=ratio,
        lookups=sl / span if sl is not None and span else None,
        sched_cpu=st / hz / span * 100 if st is not None and span else None,
        gw_cpu=gt / hz / span * 100 if gt is not None and span else None,
        machine=(b[BUSY] - a[BUSY]) / (b[TOTAL] - a[TOTAL]) * cpus * 100 if a and b and b[TOTAL] > a[TOTAL] else None,
    ))
    prev_end = end

f = lambda v, fmt: "-" if v is None else format(v, fmt)
print("| t s | req/s | p50 ms | p99 ms | max ms | non-2xx | failed | hit ratio % | scheduler lookups/s | scheduler CPU % | gateway CPU % | machine CPU % |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in timeline:
    print(f"| {r['t'] + 0:+.1f} | {r['rps']:,.0f} | {r['p50']} | {r['p99']} | {r['max']} | {r['other']} | {r['failed']} | "
          f"{f(None if r['ratio'] is None else r['ratio'] * 100, '.1f')} | {f(r['lookups'], ',.0f')} | "
          f"{f(r['sched_cpu'], '.0f')} | {f(r['gw_cpu'], '.0f')} | {f(r['machine'], '.0f')} |")

# Steady: before SIGTERM, leaving out the first 2 s (connections opening).
steady = [r for r in timeline if r["end"] <= t_term and r["end"] - load[0][0] >= 2000]
after = [r for r in timeline if r["end"] > t_term]
first_served = next((r for r in after if r["end"] > t_up and r["ok"] > 0), None)
reached = lambda th: next((r for r in after if r["end"] > t_up and r["ratio"] is not None and r["ratio"] >= th), None)
recovered = reached(threshold)
storm = [r for r in after if recovered is None or r["end"] <= recovered["end"]]
gap = re.search(r"longest without a 2xx answer: ([\d.]+) ms, ended at (\d+)", " ".join(comments))
peak = lambda k, rs: max((r[k] for r in rs if r[k] is not None), default=None)
print()
for c in comments:
    print(c)
# The script polls for these two; the clients' longest gap is the exact view.
print(f"- gateway: SIGTERM at 0 s, seen exited at +{(t_down - t_term) / 1000:.2f} s, seen listening again at +{(t_up - t_term) / 1000:.2f} s")
if gap:
    print(f"- longest time without a 2xx answer: {float(gap.group(1)) / 1000:.2f} s (ended at +{(int(gap.group(2)) - t_term) / 1000:.2f} s)")
print(f"- first interval with answers after the restart ends at: {f(first_served and first_served['t'], '+.1f')} s")
for th in sorted({0.9, threshold}):
    r = reached(th)
    print(f"- hit ratio ≥ {th * 100:g} % in an interval: {'never, in ' + str(len(after)) + ' intervals' if r is None else format(r['t'], '+.1f') + ' s after SIGTERM, ' + format((r['end'] - t_up) / 1000, '.1f') + ' s after the new gateway listened'}")
print(f"- scheduler lookups/s: steady peak {f(peak('lookups', steady), ',.0f')}, storm peak {f(peak('lookups', after), ',.0f')}; "
      f"scheduler CPU %: steady peak {f(peak('sched_cpu', steady), '.0f')}, storm peak {f(peak('sched_cpu', after), '.0f')} (100 = one core); "
      f"machine CPU % (all processes, of {cpus * 100}): steady peak {f(peak('machine', steady), '.0f')}, storm peak {f(peak('machine', after), '.0f')}")
ps, pt = merged([r["end"] for r in steady]), merged([r["end"] for r in storm])
print(f"- client latency, steady ({len(steady)} intervals): p50 {pct(ps, 0.5):.2f} ms, p99 {pct(ps, 0.99):.2f} ms, max {pct(ps, 1):.2f} ms; "
      f"storm (SIGTERM to hit ratio ≥ {threshold * 100:g} %, {len(storm)} intervals): p50 {pct(pt, 0.5):.2f} ms, p99 {pct(pt, 0.99):.2f} ms, max {pct(pt, 1):.2f} ms")
print(f"- failed requests: {sum(r['failed'] for r in timeline)} (all after SIGTERM: {sum(r['failed'] for r in after)}); non-2xx: {sum(r['other'] for r in timeline)}; "
      f"answered req/s steady {sum(r['ok'] + r['other'] for r in steady) / max(len(steady), 1) / interval * 1000:,.0f}, storm {sum(r['ok'] + r['other'] for r in storm) / max(len(storm), 1) / interval * 1000:,.0f}")
PY
echo "bench: load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
