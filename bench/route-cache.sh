#!/usr/bin/env bash
# The route cache at scale: a gateway holding 1 000 routes, then 1 000 000,
# serving random sandboxes among them from the cache. Prints the gateway's
# memory (RSS) and its hit-path cost (CPU µs per request) at each size.
#
# The store gets SANDBOXES running sandboxes (`warren-bench seed`, straight
# into the scheduler's tables). Their routes all point at one stand-in
# upstream, nginx answering `200 ok` to anything: a real node would answer
# "not hosted" for sandboxes that do not exist, and what is measured here
# is the gateway's cache, not the node. For each size the gateway's cache
# is filled first (wrk walking the ids: one LookupNode each), then wrk
# -t$WRK_THREADS -c$CONNECTIONS asks for random ids among them for ROUNDS
# x DURATION seconds (bench/route-cache.lua); scheduler lookups during
# those rounds show every request was a hit. Internal hops are plain TCP
# (--insecure-internal): TLS costs the same at any cache size.
#
# Usage: bench/route-cache.sh [SANDBOXES=1000000] [DURATION=10] [CONNECTIONS=32]
#   env: SMALL=1000, ROUNDS=3, WRK_THREADS=2, WORKERS=2, CARGO_TARGET_DIR, KEEP=1
# Needs: wrk, nginx, python3, curl; builds warren and warren-bench in
# release mode. Everything listens on 127.0.0.1 and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

SANDBOXES="${1:-1000000}"
DURATION="${2:-10}"
CONNS="${3:-32}"
SMALL="${SMALL:-1000}"
ROUNDS="${ROUNDS:-3}"
THREADS="${WRK_THREADS:-2}"
WORKERS="${WORKERS:-2}"

for tool in wrk nginx python3 curl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is required (Debian: apt-get install $tool)" >&2; exit 1; }
done
cargo build --release -q -p warren -p warren-bench
TARGET="${CARGO_TARGET_DIR:-$PWD/target}/release"
BIN="$TARGET/warren"
DRIVER="$TARGET/warren-bench"
WORK="$(mktemp -d /tmp/warren-bench-cache.XXXXXX)"
HZ="$(getconf CLK_TCK)"
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
# start NAME WAIT_FOR ARGS...: leaves ADDR and PID (never run in $(...)).
start() {
  local name="$1" want="$2"; shift 2
  WARREN_LOG=warn WARREN_EXIT_WITH_PARENT=1 TOKIO_WORKER_THREADS="$WORKERS" \
    "$BIN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PID=$!
  PIDS+=("$PID")
  for _ in $(seq 1 300); do
    if grep -q "^$want listening on" "$WORK/$name.out" 2>/dev/null; then
      ADDR=$(grep "^$want listening on" "$WORK/$name.out" | head -1 | sed 's/.* listening on //')
      return 0
    fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
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
  server { listen 127.0.0.1:$UPSTREAM_PORT; location / { return 200 "ok\n"; } }
}
NGINX
nginx -c "$WORK/nginx.conf" -p "$WORK" -e "$WORK/nginx.err"

KEY="bench_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
start scheduler "scheduler grpc" scheduler --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --data-dir "$WORK/sched" --insecure-internal
SCHED="$ADDR"
"$DRIVER" seed --database-url "sqlite://$WORK/sched/scheduler.db" --count "$SANDBOXES" \
  --endpoint "127.0.0.1:$UPSTREAM_PORT" --team bench >&2
# The key in the environment, never on the command line.
export WARREN_GATEWAY_API_KEY="$KEY:bench"
start gateway "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "http://$SCHED" --insecure-internal \
  --route-cache-capacity $((SANDBOXES * 2)) --route-cache-ttl 24h --worker-threads "$WORKERS"
GW="$ADDR"; GW_PID="$PID"
GW_ADMIN=$(grep " admin listening on" "$WORK/gateway.out" | sed 's/.* listening on //')

metric() { curl -sf "http://$GW_ADMIN/metrics" | awk -v m="$1" '$1 == m {print $2}' | head -1; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$GW_PID/status"; }
cpu_ticks() { sed 's/.*) //' "/proc/$GW_PID/stat" | awk '{print $12 + $13}'; }
wrk_run() { # IDS MODE SECONDS OUT [START]
  IDS="$1" MODE="$2" START="${5:-0}" WRK_THREADS="$THREADS" wrk -t"$THREADS" -c"$CONNS" -d"$3s" --latency \
    -s bench/route-cache.lua "http://$GW/health" >"$4"
}

# fill IDS: walks the ids until the cache holds that many routes, each
# walk going on from about where the last one stopped.
fill() {
  local ids="$1" t0=$SECONDS from=0 entries
  while :; do
    wrk_run "$ids" seq 20 "$WORK/fill.txt" "$from"
    entries=$(metric warren_gateway_route_cache_entries)
    entries="${entries%.*}"
    echo "bench: filling: $entries routes cached ($((SECONDS - t0)) s)" >&2
    [ "$entries" -ge "$ids" ] && break
    from=$((entries > 2000 ? entries - 2000 : 0))
  done
}

echo "bench: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); gateway RSS empty: $(( $(rss_kib) / 1024 )) MiB" >&2
echo "0 $(rss_kib) - - - - - -" >"$WORK/rows"
for size in "$SMALL" "$SANDBOXES"; do
  fill "$size"
  for round in $(seq 1 "$ROUNDS"); do
    l0=$(metric warren_gateway_scheduler_lookups_total); c0=$(cpu_ticks)
    wrk_run "$size" random "$DURATION" "$WORK/wrk-$size-$round.txt"
    c1=$(cpu_ticks); l1=$(metric warren_gateway_scheduler_lookups_total)
    python3 - "$size" "$(rss_kib)" "$WORK/wrk-$size-$round.txt" "$((c1 - c0))" "$HZ" "$l0" "$l1" <<'PY' >>"$WORK/rows"
import re, sys
size, rss, path, ticks, hz, l0, l1 = sys.argv[1:]
text = open(path).read()
def lat(p):
    m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
reqs = int(re.search(r"(\d+) requests in", text).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
cpu = int(ticks) / float(hz) * 1e6 / reqs
print(size, rss, rps, lat(50), lat(99), cpu, int(float(l1) - float(l0)), non2xx.group(1) if non2xx else 0)
PY
    echo "bench: $size routes, round $round: $(tail -1 "$WORK/rows")" >&2
  done
done

python3 - "$WORK/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
empty = int(rows[0][1])
print("| routes cached | gateway RSS MiB | bytes per added route | req/s | p50 ms | p99 ms | gateway CPU µs/request | scheduler lookups | non-2xx |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
print(f"| 0 | {empty / 1024:.0f} | - | - | - | - | - | - | - |")
sizes, prev = [], (0, empty)
for r in rows[1:]:
    if r[0] not in sizes:
        sizes.append(r[0])
for size in sizes:
    rs = [r for r in rows[1:] if r[0] == size]
    med = lambda i: statistics.median(float(r[i]) for r in rs)
    rss = max(int(r[1]) for r in rs)
    # Against the previous size: what each further route costs.
    per = (rss - prev[1]) * 1024 / (int(size) - prev[0])
    prev = (int(size), rss)
    print(f"| {int(size):,} | {rss / 1024:.0f} | {per:.0f} | {med(2):,.0f} | {med(3):.2f} | {med(4):.2f} | {med(5):.1f} | {sum(int(r[6]) for r in rs)} | {sum(int(r[7]) for r in rs)} |")
PY
echo "bench: load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
