#!/usr/bin/env bash
# Frames per second and bandwidth of a desktop sandbox's stream through
# warren against a direct connection (bench/desktop_stream.py says how):
# `warren dev --nodes 1 --runtime isolated` started here with a gateway
# TLS listener on a free port (a certificate made for the run), one
# desktop sandbox made with the e2b-desktop SDK. Prints the SDK's create
# time and a Markdown table.
#
# Usage: bench/desktop-stream.sh [SECS=10]   (env: PROFILE=release|debug,
#        ROUNDS=3, ENCODINGS="raw zrle", CREATES=5)
# Needs: root, the desktop template (scripts/test builds it), .venv with the
# SDK (scripts/setup-test-env), openssl. Traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-10}"
PROFILE="${PROFILE:-release}"
ROUNDS="${ROUNDS:-3}"
ENCODINGS="${ENCODINGS:-raw zrle}"
CREATES="${CREATES:-5}"
PY="${WARREN_E2B_PYTHON:-$PWD/.venv/bin/python}"
[ -x "$PY" ] || { echo "bench: $PY missing (run scripts/setup-test-env)" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
  cargo build --release -q -p warren
else
  cargo build -q -p warren
fi
BIN="${CARGO_TARGET_DIR:-$PWD/target}/$PROFILE/warren"
WORK="$(mktemp -d /tmp/warren-desktop-bench.XXXXXX)"
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

DOMAIN=warren.localhost
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=*.$DOMAIN" -addext "subjectAltName=DNS:*.$DOMAIN" \
  -keyout "$WORK/leaf.key" -out "$WORK/leaf.pem" 2>/dev/null
KEY="e2b_$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')"
WARREN_LOG=warn WARREN_DEV_API_KEY="$KEY" "$BIN" dev --data-dir "$WORK/dev" --nodes 1 \
  --runtime isolated --listen 127.0.0.1:0 \
  --gateway-args "--domain $DOMAIN --public-tls-listen 127.0.0.1:0 \
    --public-tls-cert $WORK/leaf.pem --public-tls-key $WORK/leaf.key" \
  >"$WORK/dev.out" 2>"$WORK/dev.err" &
PID="$!"
for _ in $(seq 1 1200); do
  grep -q "^dev gateway-1 listening on" "$WORK/dev.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "^dev gateway-1 listening on" "$WORK/dev.out" || {
  echo "bench: warren dev did not start; its log:" >&2; cat "$WORK/dev.err" >&2; exit 1; }
HTTP="$(sed -n 's/^dev gateway-1 listening on //p' "$WORK/dev.out")"
HTTPS="$(sed -n 's/^dev gateway-1 https listening on //p' "$WORK/dev.out")"

echo "warren desktop stream bench: $PROFILE build, commit $(git rev-parse --short HEAD)," \
  "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
E2B_API_URL="http://$HTTP" E2B_SANDBOX_URL="http://$HTTP" E2B_API_KEY="$KEY" \
  "$PY" bench/desktop_stream.py bench --gateway "$HTTP" --tls-gateway "$HTTPS" \
  --secs "$SECS" --rounds "$ROUNDS" --encodings "$ENCODINGS" --creates "$CREATES"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
