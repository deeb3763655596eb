#!/usr/bin/env bash
# Create-to-first-command latency: `Sandbox.create()` -> `commands.run("true")`
# -> `kill()` with the real e2b SDK (bench/create.py), N sequential cycles on
# two `warren dev --nodes 1` clusters started here in the same run:
#   isolated  the `isolated` runtime, template `base` (its own root, user
#             namespace, cgroups, disk, slirp4netns egress);
#   process   the `process` runtime (no namespaces: the reference floor).
# Then cycles/s with 1 and 8 concurrent clients on `isolated` (bounded count).
# Prints Markdown tables.
#
# Usage: bench/create.sh [N=30]   (env: PROFILE=release|debug, TOTAL=96
#        cycles per concurrency level, CONCURRENCY=1,8,32, WARMUP=2)
# Needs: root (isolated runtime), the base template, .venv with the e2b SDK
# (scripts/setup-test-env). Traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

N="${1:-30}"
PROFILE="${PROFILE:-release}"
TOTAL="${TOTAL:-96}"
CONCURRENCY="${CONCURRENCY:-1,8,32}"
WARMUP="${WARMUP:-2}"
PY="${WARREN_E2B_PYTHON:-$PWD/.venv/bin/python}"
[ -x "$PY" ] || { echo "bench: $PY missing (run scripts/setup-test-env)" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
  cargo build --release -q -p warren
else
  cargo build -q -p warren
fi
BIN="${CARGO_TARGET_DIR:-$PWD/target}/$PROFILE/warren"
WORK="$(mktemp -d /tmp/warren-create-bench.XXXXXX)"
PIDS=()
cleanup() {
  # SIGTERM: warren dev stops its gateways, nodes (and their sandboxes) and
  # scheduler; whatever is left after 20 s gets SIGKILL (its children die
  # with it: they run with a parent-death signal).
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 1 200); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

KEY="bench_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"

# start NAME ARGS... : runs `warren dev ARGS` in the background (recorded in
# PIDS, so the trap stops it) and waits for its gateway's announce line;
# the address is then in $WORK/NAME.addr.
start() {
  local name="$1"; shift
  WARREN_LOG=warn WARREN_DEV_API_KEY="$KEY" "$BIN" dev --sandbox-http off --data-dir "$WORK/$name" --nodes 1 \
    --listen "127.0.0.1:$(free_port)" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PIDS+=("$!")
  for _ in $(seq 1 1200); do
    if grep -q "^dev gateway-1 listening on" "$WORK/$name.out" 2>/dev/null; then
      grep "^dev gateway-1 listening on" "$WORK/$name.out" | head -1 \
        | sed 's/.* listening on //' >"$WORK/$name.addr"
      return 0
    fi
    sleep 0.1
  done
  echo "bench: warren dev ($name) did not start; its log:" >&2
  cat "$WORK/$name.err" >&2
  exit 1
}

start isolated --runtime isolated
start process --runtime process
ISO="http://$(cat "$WORK/isolated.addr")"
PROC="http://$(cat "$WORK/process.addr")"

echo "warren create bench: $PROFILE build, commit $(git rev-parse --short HEAD), $(nproc) CPUs," \
  "load $(cut -d' ' -f1-3 /proc/loadavg), N=$N"
"$PY" bench/create.py --key "$KEY" --n "$N" --warmup "$WARMUP" \
  --target "isolated=$ISO" --target "process=$PROC" \
  --rate-target isolated --concurrency "$CONCURRENCY" --total "$TOTAL"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
