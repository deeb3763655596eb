#!/usr/bin/env bash
# Gateway proxy benchmark: the same upstream (a sandbox's envd `GET /health`,
# through its node) driven four ways in one run on one machine:
#   (a) the node directly (the X-Warren-* headers a gateway would add),
#   (b) the gateway with its route cache,
#   (c) the gateway with the route cache disabled (--route-cache-capacity 0),
#   (d) stock nginx as a reverse proxy in front of the same node
#       (keepalive upstream, worker_processes = the gateway's worker threads).
# Prints req/s and p50/p99 latency for each, the ratios gateway/nginx and
# gateway/direct, and scheduler lookups per request for (b) and (c).
#
# Usage: bench/gateway.sh [DURATION_SECONDS] [CONNECTIONS]   (env: ROUNDS=3,
#        WRK_THREADS=2, GATEWAY_WORKERS=2, RUNTIME=process, CARGO_TARGET_DIR)
# Needs: wrk, nginx, python3, curl; builds warren in release mode.
# Traffic stays on 127.0.0.1; every load run is bounded by DURATION.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-10}"
CONNS="${2:-32}"
ROUNDS="${ROUNDS:-3}"
THREADS="${WRK_THREADS:-2}"
WORKERS="${GATEWAY_WORKERS:-2}"   # gateway tokio worker threads = nginx worker_processes

for tool in wrk nginx python3 curl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is required (Debian: apt-get install $tool)" >&2; exit 1; }
done

cargo build --release -q -p warren
BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/warren"
WORK="$(mktemp -d /tmp/warren-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# start NAME WAIT_FOR ARGS... : runs warren ARGS, waits for "<WAIT_FOR> listening on".
start() {
  local name="$1" want="$2"; shift 2
  WARREN_LOG=warn TOKIO_WORKER_THREADS="$WORKERS" "$BIN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PIDS+=("$!")
  for _ in $(seq 1 300); do
    if grep -q "^$want listening on" "$WORK/$name.out" 2>/dev/null; then
      grep "^$want listening on" "$WORK/$name.out" | head -1 | sed 's/.* listening on //'
      return 0
    fi
    sleep 0.1
  done
  echo "bench: $name did not start; its log:" >&2; cat "$WORK/$name.err" >&2; exit 1
}
admin_of() { grep " admin listening on" "$WORK/$1.out" | head -1 | sed 's/.* listening on //'; }

KEY="bench_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
SCHED=$(start scheduler "scheduler grpc" scheduler --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$WORK/sched")
NODE=$(start node "node http" node --node-id bench-node --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "http://$SCHED" --data-dir "$WORK/node" --runtime "${RUNTIME:-process}")
GW_CACHE=$(start gw-cache "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "http://$SCHED" --api-key "$KEY:bench")
GW_NOCACHE=$(start gw-nocache "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "http://$SCHED" --api-key "$KEY:bench" --route-cache-capacity 0)

# One sandbox, created through the caching gateway.
CREATED=$(curl -sf -X POST "http://$GW_CACHE/sandboxes" -H "X-API-Key: $KEY" -H 'content-type: application/json' \
  -d '{"templateID":"base","timeout":3600}')
SBX=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxID"])' <<<"$CREATED")
TOKEN=$(python3 -c 'import json,sys; print(json.load(sys.stdin).get("envdAccessToken") or "")' <<<"$CREATED")
GEN=$(curl -sf "http://$GW_CACHE/sandboxes/$SBX" -H "X-API-Key: $KEY" >/dev/null; \
  "$BIN" route "$SBX" --api-url "http://$GW_CACHE" --api-key "$KEY" --json 2>/dev/null \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["scheduler"]["generation"])' 2>/dev/null || echo 1)

# nginx in front of the node, adding the headers a gateway adds.
cat >"$WORK/nginx.conf" <<NGINX
worker_processes $WORKERS;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream node { server $NODE; keepalive 128; }
  server {
    listen 127.0.0.1:0;
    location / {
      proxy_pass http://node;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Warren-Sandbox-Id $SBX;
      proxy_set_header X-Warren-Sandbox-Port 49983;
      proxy_set_header X-Warren-Generation $GEN;
      proxy_set_header X-Access-Token "$TOKEN";
    }
  }
}
NGINX
# nginx cannot listen on :0 and report the port; pick a free one.
NGINX_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed -i "s/listen 127.0.0.1:0;/listen 127.0.0.1:$NGINX_PORT;/" "$WORK/nginx.conf"
nginx -c "$WORK/nginx.conf" -p "$WORK"
NGINX_ADDR="127.0.0.1:$NGINX_PORT"

lookups() { curl -sf "http://$(admin_of "$1")/metrics" | awk '/^warren_gateway_scheduler_lookups_total/ {print $2}' | head -1; }

# run LABEL URL HEADERS... → prints "label rps p50 p99 requests"
run() {
  local label="$1" url="$2"; shift 2
  local args=()
  for h in "$@"; do args+=(-H "$h"); done
  wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "${args[@]}" "$url" >"$WORK/wrk-$label.txt"
  python3 - "$label" "$WORK/wrk-$label.txt" <<'PY'
import re, sys
label, path = sys.argv[1], sys.argv[2]
text = open(path).read()
def lat(p):
    m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    if not m: return float("nan")
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
reqs = int(re.search(r"(\d+) requests in", text).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
print(label, rps, lat(50), lat(99), reqs, non2xx.group(1) if non2xx else 0)
PY
}

AUTH=()
[ -n "$TOKEN" ] && AUTH=("X-Access-Token: $TOKEN")
echo "bench: sandbox $SBX on node $NODE; wrk -t$THREADS -c$CONNS -d${DURATION}s x $ROUNDS rounds;" \
  "gateway and nginx with $WORKERS workers" >&2

# Paths are interleaved round by round, so load from anything else on the
# machine falls on all of them alike; each path's median round is reported.
: >"$WORK/rows"
L_CACHE=0; L_NOCACHE=0
for round in $(seq 1 "$ROUNDS"); do
  run direct "http://$NODE/health" "X-Warren-Sandbox-Id: $SBX" "X-Warren-Sandbox-Port: 49983" \
    "X-Warren-Generation: $GEN" "${AUTH[@]}" >>"$WORK/rows"
  before=$(lookups gw-cache)
  run gateway-cache "http://$GW_CACHE/health" "E2b-Sandbox-Id: $SBX" "E2b-Sandbox-Port: 49983" "${AUTH[@]}" >>"$WORK/rows"
  L_CACHE=$(python3 -c "print($L_CACHE + $(lookups gw-cache) - $before)")
  before=$(lookups gw-nocache)
  run gateway-nocache "http://$GW_NOCACHE/health" "E2b-Sandbox-Id: $SBX" "E2b-Sandbox-Port: 49983" "${AUTH[@]}" >>"$WORK/rows"
  L_NOCACHE=$(python3 -c "print($L_NOCACHE + $(lookups gw-nocache) - $before)")
  run nginx "http://$NGINX_ADDR/health" >>"$WORK/rows"
  echo "bench: round $round of $ROUNDS done" >&2
done

python3 - "$WORK/rows" "$L_CACHE" "$L_NOCACHE" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
lookups = {"gateway-cache": float(sys.argv[2]), "gateway-nocache": float(sys.argv[3])}
order = ["direct", "gateway-cache", "gateway-nocache", "nginx"]
by = {}
for label in order:
    runs = sorted((r for r in rows if r[0] == label), key=lambda r: float(r[1]))
    by[label] = (runs[(len(runs) - 1) // 2], runs)
print("| path | req/s (median) | req/s (all rounds) | p50 ms | p99 ms | non-2xx | lookups/request |")
print("|---|---:|---|---:|---:|---:|---:|")
for label in order:
    (_, rps, p50, p99, _, _), runs = by[label]
    total = sum(int(r[4]) for r in runs)
    bad = sum(int(r[5]) for r in runs)
    every = " / ".join(f"{float(r[1]):,.0f}" for r in runs)
    lpr = f"{lookups[label] / total:.4f}" if label in lookups and total else "-"
    print(f"| {label} | {float(rps):,.0f} | {every} | {float(p50):.3f} | {float(p99):.3f} | {bad} | {lpr} |")
med = {k: float(v[0][1]) for k, v in by.items()}
g = med["gateway-cache"]
print()
print(f"gateway(cache)/nginx req/s: {g / med['nginx']:.2f}   gateway(cache)/direct req/s: {g / med['direct']:.2f}   "
      f"gateway(no cache)/gateway(cache): {med['gateway-nocache'] / g:.2f}")
PY
