#!/usr/bin/env bash
# Sandbox creates, in one run: latency (cold and from a warm pool), where a
# cold create's time and CPU go, throughput at 1/8/32/64 clients, host memory
# per idle sandbox at 10/100/500, and the most idle sandboxes the machine
# holds answering within 1 s — with the real e2b SDK (bench/create.py) on
# `warren dev --nodes 1` clusters started here in the same run:
#   cold     `--runtime isolated`, template `base`, no warm pool;
#   pool     the same with `--warm-pool base=$POOL` (skipped with POOL=0);
#   process  `--runtime process` (no namespaces: the reference floor).
# Sandboxes run the small static `warren-sandbox` (built here: profile
# `sandbox`, target x86_64-unknown-linux-musl) unless SANDBOX_BIN=self.
# Prints Markdown tables, the commit and the load average before and after.
#
# Usage: bench/create.sh [N=30]
#   env: PROFILE=release|debug, TOTAL=64 cycles per concurrency level,
#        CONCURRENCY=1,8,32,64, WARMUP=2, POOL=8, IDLE=10,100,500,
#        MAX_IDLE=1 (0 skips the last phase), MAX_STEP=100, MAX_CEILING=4000,
#        MEM_FLOOR_MIB=2048, DISK_FLOOR_MIB=2048, SANDBOX_BIN=static|self,
#        WARREN_BIN=path (run that build of warren instead of building one)
# Needs: root, the base template, .venv with the e2b SDK
# (scripts/setup-test-env), the musl target (`rustup target add
# x86_64-unknown-linux-musl`). Traffic stays on 127.0.0.1. Record a run
# under `flock /work/wt/locks/bench` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."

N="${1:-30}"
PROFILE="${PROFILE:-release}"
TOTAL="${TOTAL:-64}"
CONCURRENCY="${CONCURRENCY:-1,8,32,64}"
WARMUP="${WARMUP:-2}"
POOL="${POOL:-8}"
IDLE="${IDLE:-10,100,500}"
MAX_IDLE="${MAX_IDLE:-1}"
SANDBOX_BIN="${SANDBOX_BIN:-static}"
PY="${WARREN_E2B_PYTHON:-$PWD/.venv/bin/python}"
[ -x "$PY" ] || { echo "bench: $PY missing (run scripts/setup-test-env)" >&2; exit 1; }

TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
if [ -n "${WARREN_BIN:-}" ]; then
  BIN="$WARREN_BIN"   # another build of warren (an earlier commit's), as is
elif [ "$PROFILE" = release ]; then
  cargo build --release -q -p warren
  BIN="$TARGET_DIR/$PROFILE/warren"
else
  cargo build -q -p warren
  BIN="$TARGET_DIR/$PROFILE/warren"
fi
NODE_BIN_ARGS=""
if [ "$SANDBOX_BIN" = static ]; then
  cargo build -q -p warren-sandbox --profile sandbox --target x86_64-unknown-linux-musl
  SBIN="$TARGET_DIR/x86_64-unknown-linux-musl/sandbox/warren-sandbox"
  NODE_BIN_ARGS="--envd-bin $SBIN"
fi
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

# start NAME NODE_ARGS DEV_ARGS... : runs `warren dev DEV_ARGS` with
# `--node-args NODE_ARGS` in the background (recorded in PIDS, so the trap
# stops it), waits for its gateway's announce line and writes the cluster's
# description (create.py's --cluster) to $WORK/NAME.json.
start() {
  local name="$1" node_args="$2"; shift 2
  WARREN_LOG=warn WARREN_DEV_API_KEY="$KEY" "$BIN" dev --sandbox-http off --data-dir "$WORK/$name" --nodes 1 \
    --listen "127.0.0.1:$(free_port)" --node-args "$node_args" \
    --scheduler-args "--quota-sandboxes 100000" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PIDS+=("$!")
  for _ in $(seq 1 1200); do
    if grep -q "^dev gateway-1 listening on" "$WORK/$name.out" 2>/dev/null; then
      "$PY" - "$name" "$WORK" <<'PY'
import json, re, sys
name, work = sys.argv[1], sys.argv[2]
out = open(f"{work}/{name}.out").read()
pid = lambda part: re.search(rf"^  {part} +pid (\d+)", out, re.M).group(1)
node_metrics = re.search(r"^  node-1 +pid \d+ +metrics (\S+)", out, re.M).group(1)
url = "http://" + re.search(r"^dev gateway-1 listening on (\S+)", out, re.M).group(1)
json.dump({"label": name, "url": url, "node_pid": pid("node-1"), "node_metrics": node_metrics,
           "other_pids": [pid("gateway-1"), pid("scheduler")], "data_dir": f"{work}/{name}"},
          open(f"{work}/{name}.json", "w"))
PY
      return 0
    fi
    sleep 0.1
  done
  echo "bench: warren dev ($name) did not start; its log:" >&2
  cat "$WORK/$name.err" >&2
  exit 1
}

# Capacity for the idle phases: the node's default (100) would end them
# early, as would the team's quota (the scheduler's, raised above).
start cold "--capacity 5000 $NODE_BIN_ARGS" --runtime isolated
CLUSTERS=(--cluster "$(cat "$WORK/cold.json")")
RATE=(--rate-target cold)
if [ "$POOL" != 0 ]; then
  start pool "--warm-pool base=$POOL $NODE_BIN_ARGS" --runtime isolated
  CLUSTERS+=(--cluster "$(cat "$WORK/pool.json")")
  RATE+=(--rate-target pool)
fi
start process "" --runtime process
CLUSTERS+=(--cluster "$(cat "$WORK/process.json")")

echo "warren create bench: $PROFILE build, commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo '+changes'), $(nproc) CPUs," \
  "$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg), N=$N"
if [ "$SANDBOX_BIN" = static ]; then
  echo "sandbox binary: $(stat -c %s "$SBIN") bytes, $(file -b "$SBIN" | grep -o 'static[-a-z]* linked' || echo 'dynamically linked')"
fi
MAX_ARGS=()
[ "$MAX_IDLE" = 1 ] && MAX_ARGS=(--max-idle-target cold)
"$PY" bench/create.py --key "$KEY" --n "$N" --warmup "$WARMUP" "${CLUSTERS[@]}" \
  --steps-of cold "${RATE[@]}" --concurrency "$CONCURRENCY" --total "$TOTAL" \
  --memory-target cold --idle "$IDLE" "${MAX_ARGS[@]}" \
  --max-step "${MAX_STEP:-100}" --max-ceiling "${MAX_CEILING:-4000}" \
  --mem-floor-mib "${MEM_FLOOR_MIB:-2048}" --disk-floor-mib "${DISK_FLOOR_MIB:-2048}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
