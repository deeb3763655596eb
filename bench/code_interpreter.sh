#!/usr/bin/env bash
# Code interpreter latency with the real e2b-code-interpreter SDK
# (bench/code_interpreter.py) on a `warren dev --nodes 1 --runtime isolated`
# started here: create -> first run_code result, a warm run_code, and the
# first run_code in JavaScript and bash. Prints Markdown tables.
#
# Usage: bench/code_interpreter.sh [N=20]   (env: PROFILE=release|debug, WARMUP=2)
# Needs: root, the base and code-interpreter-v1 templates (scripts/test builds
# them), .venv with the SDK (scripts/setup-test-env). Traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

N="${1:-20}"
PROFILE="${PROFILE:-release}"
WARMUP="${WARMUP:-2}"
PY="${WARREN_E2B_PYTHON:-$PWD/.venv/bin/python}"
[ -x "$PY" ] || { echo "bench: $PY missing (run scripts/setup-test-env)" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
  cargo build --release -q -p warren
else
  cargo build -q -p warren
fi
BIN="${CARGO_TARGET_DIR:-$PWD/target}/$PROFILE/warren"
WORK="$(mktemp -d /tmp/warren-ci-bench.XXXXXX)"
PID=""
cleanup() {
  # SIGTERM: warren dev stops its parts (and their sandboxes); SIGKILL after 20 s.
  if [ -n "$PID" ]; then
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 1 200); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
KEY="bench_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
WARREN_LOG=warn WARREN_DEV_API_KEY="$KEY" "$BIN" dev --sandbox-http off --data-dir "$WORK/dev" --nodes 1 --runtime isolated \
  --listen "127.0.0.1:$PORT" >"$WORK/dev.out" 2>"$WORK/dev.err" &
PID="$!"
for _ in $(seq 1 1200); do
  grep -q "^dev gateway-1 listening on" "$WORK/dev.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "^dev gateway-1 listening on" "$WORK/dev.out" || {
  echo "bench: warren dev did not start; its log:" >&2; cat "$WORK/dev.err" >&2; exit 1; }

echo "warren code interpreter bench: $PROFILE build, commit $(git rev-parse --short HEAD)," \
  "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), N=$N"
"$PY" bench/code_interpreter.py --url "http://127.0.0.1:$PORT" --key "$KEY" --n "$N" --warmup "$WARMUP"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
