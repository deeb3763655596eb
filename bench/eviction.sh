#!/usr/bin/env bash
# Delete -> eviction on another gateway: a scheduler, one node
# (`--runtime process`), gateways A and B, all over internal mutual TLS.
# bench/eviction.py creates sandboxes through A in batches, makes B cache
# each route (one data-plane request through B), deletes them through A
# one by one and measures how long until B has dropped the route — which B
# learns only from the scheduler's WatchBindings stream. Prints p50/p99.
#
# Usage: bench/eviction.sh [TOTAL=1000]   (env: BATCH=100 sandboxes alive
#        at a time, CARGO_TARGET_DIR, KEEP=1)
# Needs: python3; builds warren in release mode. Everything listens on
# 127.0.0.1 and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

TOTAL="${1:-1000}"
BATCH="${BATCH:-100}"
cargo build --release -q -p warren
BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/warren"
WORK="$(mktemp -d /tmp/warren-bench-evict.XXXXXX)"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
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

# start NAME WAIT_FOR ARGS...: leaves ADDR (never run in $(...)).
start() {
  local name="$1" want="$2"; shift 2
  WARREN_LOG=warn WARREN_EXIT_WITH_PARENT=1 "$BIN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 300); do
    if grep -q "^$want listening on" "$WORK/$name.out" 2>/dev/null; then
      ADDR=$(grep "^$want listening on" "$WORK/$name.out" | head -1 | sed 's/.* listening on //')
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench: $name did not start; its log:" >&2; cat "$WORK/$name.err" >&2; exit 1
}
tls() { echo "--tls-ca $WORK/certs/ca.pem --tls-cert $WORK/certs/$1-$2.pem --tls-key $WORK/certs/$1-$2.key"; }

"$BIN" certs --dir "$WORK/certs" init >/dev/null
"$BIN" certs --dir "$WORK/certs" issue --role scheduler --name bench --host 127.0.0.1 >/dev/null
"$BIN" certs --dir "$WORK/certs" issue --role node --name bench-node --host 127.0.0.1 >/dev/null
"$BIN" certs --dir "$WORK/certs" issue --role gateway --name a >/dev/null
"$BIN" certs --dir "$WORK/certs" issue --role gateway --name b >/dev/null
KEY="bench_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
# shellcheck disable=SC2046
start scheduler "scheduler grpc" scheduler --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --data-dir "$WORK/sched" $(tls scheduler bench)
SCHED="$ADDR"
# shellcheck disable=SC2046
start node "node http" node --node-id bench-node --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "http://$SCHED" --data-dir "$WORK/node" --runtime process $(tls node bench-node)
# Gateways take their keys from the environment, never the command line.
export WARREN_GATEWAY_API_KEY="$KEY:bench"
# shellcheck disable=SC2046
start gw-a "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "http://$SCHED" $(tls gateway a)
A="$ADDR"
# shellcheck disable=SC2046
start gw-b "gateway http" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "http://$SCHED" $(tls gateway b)
B="$ADDR"
echo "bench: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 bench/eviction.py --a "$A" --b "$B" --key "$KEY" --total "$TOTAL" --batch "$BATCH"
echo "bench: load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
