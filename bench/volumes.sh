#!/usr/bin/env bash
# Volume content throughput: SIZE bytes written and read back through a
# volume's content API with the real e2b SDK, beside the same bytes through a
# sandbox's envd (`files.write`/`files.read`, the path sandbox files take)
# and through a local file (the floor), on one `warren dev --nodes 1`
# (isolated runtime; the volume local to the node, an ext4 image) started
# here (bench/volumes.py). Prints a Markdown table.
#
# Usage: bench/volumes.sh [SIZE_MIB=1024] [ROUNDS=3]   (env: PROFILE=release|debug)
# Needs: root, the base template, .venv with the e2b SDK
# (scripts/setup-test-env), SIZE of free space in /tmp and the node's data
# dir. Traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB="${1:-1024}"
ROUNDS="${2:-3}"
PROFILE="${PROFILE:-release}"
PY="${WARREN_E2B_PYTHON:-$PWD/.venv/bin/python}"
[ -x "$PY" ] || { echo "bench: $PY missing (run scripts/setup-test-env)" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
  cargo build --release -q -p warren
else
  cargo build -q -p warren
fi
BIN="${CARGO_TARGET_DIR:-$PWD/target}/$PROFILE/warren"
WORK="$(mktemp -d /tmp/warren-volume-bench.XXXXXX)"
PID=""
cleanup() {
  # SIGTERM: warren dev stops every part (and the sandbox); SIGKILL after 20 s.
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
KEY="e2b_$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')"
WARREN_LOG=warn WARREN_DEV_API_KEY="$KEY" "$BIN" dev --data-dir "$WORK/dev" --nodes 1 \
  --runtime isolated --listen "127.0.0.1:$PORT" >"$WORK/dev.out" 2>"$WORK/dev.err" &
PID=$!
for _ in $(seq 1 1200); do
  grep -q "^dev gateway-1 listening on" "$WORK/dev.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "^dev gateway-1 listening on" "$WORK/dev.out" || { cat "$WORK/dev.err" >&2; exit 1; }
GW="http://$(grep "^dev gateway-1 listening on" "$WORK/dev.out" | head -1 | sed 's/.* listening on //')"

echo "volume content, $SIZE_MIB MiB, $ROUNDS rounds, $PROFILE build, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
E2B_API_URL="$GW" E2B_SANDBOX_URL="$GW" E2B_VOLUME_API_URL="$GW" E2B_API_KEY="$KEY" \
  "$PY" bench/volumes.py "$((SIZE_MIB << 20))" "$ROUNDS"
