#!/usr/bin/env bash
# Gateway proxy benchmark: warren's gateway next to stock nginx and HAProxy,
# in one run on one machine, all in front of the same upstream (a sandbox's
# envd `GET /health`, through its node).
#
# Two clusters run side by side, each a scheduler, one node
# (`--runtime process`), a gateway with its route cache and one sandbox:
#   tls   — internal mutual TLS (the default deployment): the gateway, nginx
#           and HAProxy all dial the node over TLS with a gateway-role client
#           certificate, verify the node's certificate against the cluster
#           CA, and keep connections alive;
#   plain — `--insecure-internal` everywhere, nginx and HAProxy over plain
#           TCP;
#   edge  — (not in the default MODES) as tls, and the client's connection
#           is TLS too: the gateway's own public TLS listener
#           (`--public-tls-listen`), nginx `listen ... ssl`, HAProxy
#           `bind ... ssl`, all with the same certificate; wrk speaks https
#           over kept-alive connections, so this is the cost of TLS records,
#           not of handshakes;
#   h2    — (not in the default MODES) as tls, and the client speaks HTTP/2
#           in clear text (h2c, prior knowledge): the gateway's public
#           listener (which tells h2c from HTTP/1.1 by the preface), nginx
#           `listen ... http2`, HAProxy `bind ... proto h2`. The client is
#           h2load instead of wrk (wrk speaks only HTTP/1.1): CONNECTIONS
#           requests in flight as CONNECTIONS/H2_STREAMS connections of
#           H2_STREAMS concurrent streams each; p50 and p99 come from
#           h2load's per-request log;
#   edge-h2 — as h2, over TLS (ALPN h2) to the public TLS listener, nginx
#           `listen ... ssl http2` and HAProxy `bind ... ssl alpn h2`.
# Every proxy forwards to the node over HTTP/1.1 with kept-alive
# connections in every mode.
# nginx and HAProxy set the headers a gateway sets (X-Warren-Sandbox-Id,
# -Port, -Generation, X-Forwarded-For) statically; the gateway parses the
# E2B target, looks the route up in its cache and rewrites the head.
# Extra paths: `direct` (wrk to the plain node itself, the upstream's own
# ceiling), `gateway-nocache` (the TLS gateway with
# `--route-cache-capacity 0`: one scheduler LookupNode per request) and
# `gateway-hyper` (in the tls and plain modes: a second gateway of the
# cluster with `--proxy-fast-path false`, every request through hyper, to
# see what the fast path saves in the same run).
#
# Every path is driven by `wrk -t$WRK_THREADS -c$CONNECTIONS` for DURATION
# seconds, path after path, round after round (interleaved, so outside load
# falls on all of them alike). For each run it reads the proxy's CPU time
# (utime + stime of every process of the proxy: the gateway, nginx's master
# and workers, HAProxy) from /proc/<pid>/stat before and after, and prints
# per path: the median over rounds of req/s, p50, p99 and proxy CPU µs per
# request, every round's req/s, non-2xx answers, and the ratios against
# nginx and HAProxy.
#
# Usage: bench/gateway.sh [DURATION_SECONDS=6] [CONNECTIONS=32]
#   env: ROUNDS=3, WRK_THREADS=2, WORKERS=2 (gateway tokio worker threads =
#        nginx worker_processes = HAProxy nbthread), MODES="tls plain",
#        EXTRA="direct gateway-nocache gateway-hyper" (or "" for none); MODES="tls plain edge"
#        adds client-side TLS, MODES="h2 edge-h2" client-side HTTP/2,
#        H2_STREAMS=4 (concurrent streams per h2load connection),
#        RUNTIME=process,
#        CARGO_TARGET_DIR, WARREN_BIN (a warren binary to run instead of
#        building this checkout), KEEP=1 (keep the work dir with every log and
#        wrk output), HOLD=1 (start everything, print the addresses and
#        wait, for profiling by hand).
# Needs: wrk, nginx, haproxy, python3, curl (Debian: apt-get install wrk
# nginx haproxy python3 curl), and for the h2 modes h2load (Debian:
# apt-get install nghttp2-client); builds warren in release mode.
# Everything listens on 127.0.0.1; every process it starts is stopped on
# exit, however the script ends (and the warren parts also stop by
# themselves if this shell is SIGKILLed).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-6}"
CONNS="${2:-32}"
ROUNDS="${ROUNDS:-3}"
THREADS="${WRK_THREADS:-2}"
WORKERS="${WORKERS:-${GATEWAY_WORKERS:-2}}"
MODES="${MODES:-tls plain}"
EXTRA="${EXTRA-direct gateway-nocache gateway-hyper}"
H2_STREAMS="${H2_STREAMS:-4}"

for tool in wrk nginx haproxy python3 curl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is required (Debian: apt-get install $tool)" >&2; exit 1; }
done
for m in $MODES; do
  case "$m" in
    tls | plain | edge) ;;
    h2 | edge-h2)
      command -v h2load >/dev/null \
        || { echo "bench: h2load is required for MODES=$m (Debian: apt-get install nghttp2-client)" >&2; exit 1; } ;;
    *) echo "bench: unknown mode $m (tls, plain, edge, h2, edge-h2)" >&2; exit 64 ;;
  esac
done
if [ "$H2_STREAMS" -lt 1 ] || [ $((CONNS % H2_STREAMS)) -ne 0 ]; then
  echo "bench: H2_STREAMS=$H2_STREAMS must divide CONNECTIONS=$CONNS" >&2; exit 64
fi
# Which side of a mode's client connection is TLS, and whether it is h2.
client_tls() { [ "$1" = edge ] || [ "$1" = edge-h2 ]; }
client_h2() { [ "$1" = h2 ] || [ "$1" = edge-h2 ]; }

if [ -n "${WARREN_BIN:-}" ]; then
  # Another build (say, an earlier commit's) to compare with.
  BIN="$WARREN_BIN"
else
  cargo build --release -q -p warren
  BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/warren"
fi
WORK="$(mktemp -d /tmp/warren-bench.XXXXXX)"
HZ="$(getconf CLK_TCK)"

# Every process started here, stopped by `cleanup`. `start` runs in this
# shell (never inside `$(...)`, whose subshell would keep the pid to itself).
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$WORK"/*.pid; do
    [ -f "$p" ] && kill -TERM "$(cat "$p")" 2>/dev/null || true
  done
  # Bounded: whatever has not exited after 10 s is killed.
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

# start NAME WAIT_FOR ARGS... : runs `warren ARGS` in the background, waits
# for its "<WAIT_FOR> listening on" line, and leaves the address in ADDR
# and the pid in PID.
start() {
  local name="$1" want="$2"; shift 2
  WARREN_LOG=warn WARREN_EXIT_WITH_PARENT=1 TOKIO_WORKER_THREADS="$WORKERS" WARREN_GATEWAY_WORKER_THREADS="$WORKERS" \
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
admin_of() { grep " admin listening on" "$WORK/$1.out" | head -1 | sed 's/.* listening on //'; }

KEY="bench_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
# Gateways take their keys from the environment, never the command line.
export WARREN_GATEWAY_API_KEY="$KEY:bench"
CERTS="$WORK/certs"
"$BIN" certs --dir "$CERTS" init >/dev/null
"$BIN" certs --dir "$CERTS" issue --role scheduler --name bench --host 127.0.0.1 >/dev/null
"$BIN" certs --dir "$CERTS" issue --role gateway --name bench >/dev/null
# One node certificate per cluster that dials its node over TLS.
for m in $MODES; do
  [ "$m" = plain ] && continue
  "$BIN" certs --dir "$CERTS" issue --role node --name "bench-$m" --host 127.0.0.1 --host localhost >/dev/null
done
# HAProxy wants the certificate and its key in one file.
cat "$CERTS/gateway-bench.pem" "$CERTS/gateway-bench.key" >"$CERTS/gateway-bench.bundle.pem"
# The edge cluster's node certificate, also its proxies' client-facing one
# (wrk does not verify it).
"$BIN" certs --dir "$CERTS" issue --role node --name bench-edge --host 127.0.0.1 --host localhost >/dev/null
cat "$CERTS/node-bench-edge.pem" "$CERTS/node-bench-edge.key" >"$CERTS/node-bench-edge.bundle.pem"

tls_flags() { # ROLE NAME
  if [ "$MODE" != plain ]; then
    echo "--tls-ca $CERTS/ca.pem --tls-cert $CERTS/$1-$2.pem --tls-key $CERTS/$1-$2.key"
  else
    echo "--insecure-internal"
  fi
}

# One cluster per mode: scheduler, node, caching gateway (+ an uncaching
# one in the tls cluster), one sandbox, and nginx + HAProxy in front of
# the node. Leaves NODE_<mode>, GW_<mode>, SBX_<mode>, ... behind.
setup() {
  MODE="$1"
  local m="$MODE"
  # shellcheck disable=SC2046
  start "sched-$m" "scheduler grpc" scheduler --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --data-dir "$WORK/sched-$m" $(tls_flags scheduler bench)
  local sched="$ADDR"
  # shellcheck disable=SC2046
  start "node-$m" "node http" node --node-id "bench-$m" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --scheduler "http://$sched" --data-dir "$WORK/node-$m" --runtime "${RUNTIME:-process}" \
    $(tls_flags node "bench-$m")
  local node="$ADDR"; NODE_PID="$PID"
  # The edge mode's client side in TLS: the gateway's public TLS listener
  # (what wrk uses in that mode).
  local edge_flags=""
  if client_tls "$m"; then
    edge_flags="--public-tls-listen 127.0.0.1:0 --public-tls-cert $CERTS/node-bench-edge.pem --public-tls-key $CERTS/node-bench-edge.key"
  fi
  # shellcheck disable=SC2046,SC2086
  start "gateway-$m" "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --scheduler "http://$sched" $(tls_flags gateway bench) $edge_flags
  local gw="$ADDR" gw_pid="$PID" nocache="" hyper=""
  if client_tls "$m"; then
    for _ in $(seq 1 50); do grep -q "^gateway https listening on" "$WORK/gateway-$m.out" && break; sleep 0.1; done
    GW_HTTPS="https://$(grep "^gateway https listening on" "$WORK/gateway-$m.out" | head -1 | sed 's/.* listening on //')"
  fi
  if [ "$m" = tls ] && [[ " $EXTRA " == *" gateway-nocache "* ]]; then
    # shellcheck disable=SC2046
    start "gateway-nocache-$m" "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
      --scheduler "http://$sched" --route-cache-capacity 0 $(tls_flags gateway bench)
    nocache="gateway-nocache $ADDR $PID $NODE_PID e2b"
  fi
  if { [ "$m" = tls ] || [ "$m" = plain ]; } && [[ " $EXTRA " == *" gateway-hyper "* ]]; then
    # shellcheck disable=SC2046
    start "gateway-hyper-$m" "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
      --scheduler "http://$sched" --proxy-fast-path false $(tls_flags gateway bench)
    hyper="gateway-hyper $ADDR $PID $NODE_PID e2b"
  fi

  local created sbx token gen
  created=$(curl -sf -X POST "http://$gw/sandboxes" -H "X-API-Key: $KEY" -H 'content-type: application/json' \
    -d '{"templateID":"base","timeout":3600}')
  sbx=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxID"])' <<<"$created")
  token=$(python3 -c 'import json,sys; print(json.load(sys.stdin).get("envdAccessToken") or "")' <<<"$created")
  gen=$(E2B_API_KEY="$KEY" "$BIN" route "$sbx" --api-url "http://$gw" --json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["scheduler"]["generation"])')
  echo "$token" >"$WORK/token-$m"
  echo "$sbx" >"$WORK/sbx-$m"

  local scheme=http nginx_tls="" haproxy_tls=""
  if [ "$m" != plain ]; then
    scheme=https
    nginx_tls="
      proxy_ssl_certificate $CERTS/gateway-bench.pem;
      proxy_ssl_certificate_key $CERTS/gateway-bench.key;
      proxy_ssl_trusted_certificate $CERTS/ca.pem;
      proxy_ssl_verify on;
      proxy_ssl_name localhost;
      proxy_ssl_session_reuse on;"
    haproxy_tls="ssl crt $CERTS/gateway-bench.bundle.pem ca-file $CERTS/ca.pem verify required verifyhost localhost"
  fi
  local auth_nginx="" auth_haproxy=""
  if [ -n "$token" ]; then
    auth_nginx="proxy_set_header X-Access-Token \"$token\";"
    auth_haproxy="http-request set-header X-Access-Token \"$token\""
  fi

  # nginx: keepalive upstream, the headers a gateway sets. nginx cannot
  # listen on :0 and say which port it got, so a free port is picked.
  local nginx_port; nginx_port=$(free_port)
  local haproxy_bind="" front=http nginx_listen="" nginx_cert=""
  if client_tls "$m"; then
    front=https
    haproxy_bind="ssl crt $CERTS/node-bench-edge.bundle.pem"
    nginx_listen=" ssl"
    nginx_cert="ssl_certificate $CERTS/node-bench-edge.pem; ssl_certificate_key $CERTS/node-bench-edge.key;"
  fi
  if client_h2 "$m"; then
    # nginx 1.22 serves h2c with prior knowledge on an `http2` listener
    # (and only h2 there); HAProxy the same with `proto h2`.
    nginx_listen="$nginx_listen http2"
    if client_tls "$m"; then haproxy_bind="$haproxy_bind alpn h2,http/1.1"; else haproxy_bind="proto h2"; fi
  fi
  cat >"$WORK/nginx-$m.conf" <<NGINX
worker_processes $WORKERS;
pid $WORK/nginx-$m.pid;
error_log $WORK/nginx-$m.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  # nginx closes a kept-alive connection after 1000 requests by default,
  # on both sides (a new TLS handshake to the node, and an h2 client's
  # streams in flight cut by GOAWAY); the gateway and HAProxy do not.
  keepalive_requests 1000000;
  upstream node { server $node; keepalive 128; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$nginx_port$nginx_listen;
    $nginx_cert
    location / {
      proxy_pass $scheme://node;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Warren-Sandbox-Id $sbx;
      proxy_set_header X-Warren-Sandbox-Port 49983;
      proxy_set_header X-Warren-Generation $gen;
      $auth_nginx
      $nginx_tls
    }
  }
}
NGINX
  nginx -c "$WORK/nginx-$m.conf" -p "$WORK" -e "$WORK/nginx-$m.err"
  for _ in $(seq 1 50); do [ -s "$WORK/nginx-$m.pid" ] && break; sleep 0.1; done

  # HAProxy: same headers, connections to the node kept and shared.
  local haproxy_port; haproxy_port=$(free_port)
  cat >"$WORK/haproxy-$m.cfg" <<HAPROXY
global
  nbthread $WORKERS
  maxconn 4096
  pidfile $WORK/haproxy-$m.pid
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
  http-reuse always
frontend fe
  bind 127.0.0.1:$haproxy_port $haproxy_bind
  option forwardfor
  http-request set-header X-Warren-Sandbox-Id $sbx
  http-request set-header X-Warren-Sandbox-Port 49983
  http-request set-header X-Warren-Generation $gen
  $auth_haproxy
  default_backend node
backend node
  server node $node $haproxy_tls
HAPROXY
  haproxy -q -f "$WORK/haproxy-$m.cfg" >"$WORK/haproxy-$m.out" 2>"$WORK/haproxy-$m.err" &
  PIDS+=("$!")
  local haproxy_pid=$!

  # Each path: label, address, the pids whose CPU counts ("nginx" is
  # resolved to its master and workers when measured), the node's pid,
  # and which headers wrk sends.
  if client_tls "$m"; then
    echo "gateway $GW_HTTPS $gw_pid $NODE_PID e2b" >>"$WORK/paths.$m"
  else
    echo "gateway $gw $gw_pid $NODE_PID e2b" >>"$WORK/paths.$m"
  fi
  echo "nginx $front://127.0.0.1:$nginx_port nginx-$m $NODE_PID none" >>"$WORK/paths.$m"
  echo "haproxy $front://127.0.0.1:$haproxy_port $haproxy_pid $NODE_PID none" >>"$WORK/paths.$m"
  if [ "$m" = plain ] && [[ " $EXTRA " == *" direct "* ]]; then
    echo "direct $node - $NODE_PID warren:$gen" >>"$WORK/paths.$m"
  fi
  if [ -n "$nocache" ]; then echo "$nocache" >>"$WORK/paths.$m"; fi
  if [ -n "$hyper" ]; then echo "$hyper" >>"$WORK/paths.$m"; fi
  echo "bench: $m: sandbox $sbx (generation $gen) on node $node; gateway $gw," \
    "nginx 127.0.0.1:$nginx_port, haproxy 127.0.0.1:$haproxy_port" >&2
}

# pids_of SPEC: the processes whose CPU a path is charged: a pid, or
# nginx-<mode> for that nginx's master and its workers.
pids_of() {
  case "$1" in
    -) ;;
    nginx-*)
      local master; master=$(cat "$WORK/$1.pid")
      echo "$master"; ps -o pid= --ppid "$master" | tr -d " " ;;
    *) echo "$1" ;;
  esac
}
# cpu_ticks PID...: utime + stime of all of them (all their threads), in
# clock ticks.
cpu_ticks() {
  local total=0 p
  for p in "$@"; do
    # Fields 14 and 15 after the parenthesised command name.
    local t; t=$(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')
    total=$((total + t))
  done
  echo "$total"
}

# run MODE LABEL ADDR PIDSPEC NODEPID HEADERS → one row in $WORK/rows:
# mode label rps p50 p99 requests non2xx proxy_ticks node_ticks
run() {
  local m="$1" label="$2" addr="$3" spec="$4" node_pid="$5" hdrs="$6"
  local sbx token; sbx=$(cat "$WORK/sbx-$m"); token=$(cat "$WORK/token-$m")
  local args=()
  case "$hdrs" in
    e2b) args+=(-H "E2b-Sandbox-Id: $sbx" -H "E2b-Sandbox-Port: 49983") ;;
    warren:*) args+=(-H "X-Warren-Sandbox-Id: $sbx" -H "X-Warren-Sandbox-Port: 49983"
                     -H "X-Warren-Generation: ${hdrs#warren:}") ;;
  esac
  if [ "$hdrs" != none ] && [ -n "$token" ]; then args+=(-H "X-Access-Token: $token"); fi
  local pids; mapfile -t pids < <(pids_of "$spec")
  local p0=0 n0; [ "${#pids[@]}" -gt 0 ] && p0=$(cpu_ticks "${pids[@]}")
  n0=$(cpu_ticks "$node_pid")
  local url="$addr/health"
  [[ "$addr" == *://* ]] || url="http://$url"
  local out="$WORK/wrk-$m-$label.txt"
  if client_h2 "$m"; then
    # CONNS requests in flight, as wrk has, H2_STREAMS per connection;
    # every request's duration logged for the percentiles.
    h2load -t"$THREADS" -c$((CONNS / H2_STREAMS)) -m"$H2_STREAMS" -D"$DURATION" \
      --log-file="$out.log" "${args[@]}" "$url" >"$out"
  else
    wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "${args[@]}" "$url" >"$out"
  fi
  local p1=0 n1; [ "${#pids[@]}" -gt 0 ] && p1=$(cpu_ticks "${pids[@]}")
  n1=$(cpu_ticks "$node_pid")
  python3 - "$m" "$label" "$out" "$((p1 - p0))" "$((n1 - n0))" "${#pids[@]}" <<'PY' >>"$WORK/rows"
import re, sys
mode, label, path, pticks, nticks, npids = sys.argv[1:]
text = open(path).read()
if text.startswith("starting benchmark"):
    # h2load: counts from its summary, percentiles from its log
    # (start µs, status, duration µs per request).
    rps = float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", text).group(1))
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", text)
    reqs = int(m.group(1))
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    bad = int(m.group(3)) + int(m.group(4)) + int(m.group(5)) + int(codes.group(2)) + int(codes.group(3)) + int(codes.group(4))
    durations = sorted(int(line.split()[2]) for line in open(path + ".log") if line.strip())
    def lat(p):
        if not durations: return float("nan")
        return durations[min(len(durations) - 1, int(len(durations) * p / 100))] / 1000
else:
    def lat(p):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        if not m: return float("nan")
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    reqs = int(re.search(r"(\d+) requests in", text).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: (.*)", text)
    bad = int(non2xx.group(1)) if non2xx else 0
    if errors:
        bad += sum(int(n) for n in re.findall(r"\d+", errors.group(1)))
pt = pticks if int(npids) > 0 else "-"
print(mode, label, rps, lat(50), lat(99), reqs, bad, pt, nticks)
PY
}

: >"$WORK/rows"
for m in $MODES; do setup "$m"; done
if [ "${HOLD:-0}" = 1 ]; then
  # For profiling by hand: everything stays up until this script is stopped.
  for m in $MODES; do
    echo "bench: $m paths (label address pids node-pid headers): sandbox $(cat "$WORK/sbx-$m")" >&2
    cat "$WORK/paths.$m" >&2
  done
  echo "bench: HOLD=1: holding; stop with Ctrl-C" >&2
  # In the background, so that a signal runs the exit trap at once (bash
  # waits for a foreground child before it runs a trap).
  # (The sleep is in PIDS so that the exit trap stops it rather than
  # waiting for it.)
  while :; do sleep 3600 & PIDS+=("$!"); wait $!; done
fi
{
  echo "bench: wrk -t$THREADS -c$CONNS -d${DURATION}s x $ROUNDS rounds; gateway, nginx and HAProxy with $WORKERS workers;"
  echo "bench: h2 modes: h2load -t$THREADS -c$((CONNS / H2_STREAMS)) -m$H2_STREAMS -D$DURATION"
  echo "bench: $(nproc) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >&2
for round in $(seq 1 "$ROUNDS"); do
  for m in $MODES; do
    while read -r label addr spec node_pid hdrs; do
      run "$m" "$label" "$addr" "$spec" "$node_pid" "$hdrs"
    done <"$WORK/paths.$m"
  done
  echo "bench: round $round of $ROUNDS done (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
done

python3 - "$WORK/rows" "$HZ" "$MODES" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
hz = float(sys.argv[2])
modes = sys.argv[3].split()
order = ["gateway", "gateway-hyper", "nginx", "haproxy", "direct", "gateway-nocache"]
def us_per_req(ticks, reqs):
    return float("nan") if ticks == "-" else int(ticks) / hz * 1e6 / int(reqs)
stats = {}
for mode in modes:
    for label in order:
        runs = [r for r in rows if r[0] == mode and r[1] == label]
        if not runs:
            continue
        med = lambda xs: statistics.median(xs)
        stats[(mode, label)] = {
            "rps": med([float(r[2]) for r in runs]),
            "p50": med([float(r[3]) for r in runs]),
            "p99": med([float(r[4]) for r in runs]),
            "cpu": med([us_per_req(r[7], r[5]) for r in runs]),
            "node": med([us_per_req(r[8], r[5]) for r in runs]),
            "bad": sum(int(r[6]) for r in runs),
            "every": " / ".join(f"{float(r[2]):,.0f}" for r in runs),
        }
print("| mode | proxy | req/s | req/s (every round) | p50 ms | p99 ms | proxy CPU µs/req | node CPU µs/req | errors |")
print("|---|---|---:|---|---:|---:|---:|---:|---:|")
for (mode, label), s in stats.items():
    cpu = "-" if s["cpu"] != s["cpu"] else f"{s['cpu']:.1f}"
    print(f"| {mode} | {label} | {s['rps']:,.0f} | {s['every']} | {s['p50']:.2f} | {s['p99']:.2f} | {cpu} | {s['node']:.1f} | {s['bad']} |")
print()
for mode in modes:
    g = stats.get((mode, "gateway"))
    if not g:
        continue
    parts = []
    for other in ("nginx", "haproxy", "gateway-hyper"):
        o = stats.get((mode, other))
        if o:
            parts.append(f"gateway/{other}: CPU/req {g['cpu'] / o['cpu']:.2f}, req/s {g['rps'] / o['rps']:.2f}, p99 {g['p99'] / o['p99']:.2f}")
    print(f"{mode}: " + " · ".join(parts))
PY
echo "bench: load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
