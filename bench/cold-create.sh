#!/usr/bin/env bash
# Cold against warm creates from a blob store (docs/blobs.md): `warren dev
# --nodes 1 --runtime isolated` with --blob-store on a private Garage server
# (S3 over 127.0.0.1), templates `base` and `big` (base plus a 1 GiB file of
# random bytes, which no compression shrinks), pushed and imported with
# `warren template push --import`. A cold create finds the node's cache
# empty (warren dev restarted on an emptied --cache-dir): it fetches the
# template's blob and unpacks it; a warm one finds the tree there. Each
# create is `POST /sandboxes` with curl (the sandbox is up when it answers),
# then killed. Prints a Markdown table: create time per kind (median, min,
# max) and the bytes a cold create fetched.
#
# Usage: bench/cold-create.sh [COLD=3] [WARM=5]   (env: PROFILE=release|debug,
#        BIG_MIB=1024)
# Needs: root, garage (cargo install garage --locked; .ci/run installs it),
# curl, the base template (scripts/test builds it). Traffic stays on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

COLD="${1:-3}"
WARM="${2:-5}"
PROFILE="${PROFILE:-release}"
BIG_MIB="${BIG_MIB:-1024}"
SHARED="${WARREN_TEMPLATE_DIR:-/var/lib/warren/templates}"
GARAGE="$(command -v garage || echo "$HOME/.cargo/bin/garage")"
[ -x "$GARAGE" ] || { echo "bench: garage missing (cargo install garage --locked)" >&2; exit 1; }
[ -f "$SHARED/templates/base.json" ] || { echo "bench: no base template in $SHARED" >&2; exit 1; }

if [ "$PROFILE" = release ]; then cargo build --release -q -p warren; else cargo build -q -p warren; fi
BIN="${CARGO_TARGET_DIR:-$PWD/target}/$PROFILE/warren"
WORK="$(mktemp -d /tmp/warren-cold-bench.XXXXXX)"
PIDS=()
DEV=
stop_dev() {
  [ -n "$DEV" ] || return 0
  kill -TERM "$DEV" 2>/dev/null || true
  for _ in $(seq 1 200); do kill -0 "$DEV" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$DEV" 2>/dev/null || true
  wait "$DEV" 2>/dev/null || true
  DEV=
}
cleanup() {
  stop_dev
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Garage: one node, one bucket, one key (as crates/harness/src/garage.rs).
S3_PORT="$(free_port)"
RPC_PORT="$(free_port)"
mkdir -p "$WORK/garage"
cat >"$WORK/garage/garage.toml" <<EOF
metadata_dir = "$WORK/garage/meta"
data_dir = "$WORK/garage/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$RPC_PORT"
rpc_public_addr = "127.0.0.1:$RPC_PORT"
rpc_secret = "$(hex 32)"
[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$S3_PORT"
root_domain = ".s3.garage.localhost"
EOF
g() { "$GARAGE" -c "$WORK/garage/garage.toml" "$@"; }
# Started directly (not through `g`, whose subshell would be what the
# trap kills, leaving the server running).
RUST_LOG=warn "$GARAGE" -c "$WORK/garage/garage.toml" server >"$WORK/garage/log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 1 100); do g status >/dev/null 2>&1 && break; sleep 0.1; done
ID="$(g node id -q | cut -d@ -f1)"
g layout assign -z dc1 -c 10G "$ID" >/dev/null
g layout apply --version 1 >/dev/null
export AWS_ACCESS_KEY_ID="GK$(hex 12)" AWS_SECRET_ACCESS_KEY="$(hex 32)"
g key import --yes -n bench "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >/dev/null
g bucket create bench >/dev/null
g bucket allow --read --write --owner bench --key "$AWS_ACCESS_KEY_ID" >/dev/null
OPTS="--blob-store s3://bench --blob-store-option endpoint=http://127.0.0.1:$S3_PORT \
  --blob-store-option region=garage --blob-store-option allow_http=true"

# The templates: base (its blob linked) and big.
STORE="$WORK/store"
mkdir -p "$STORE"/{blobs,rootfs,templates,tmp}
BASE_DIGEST="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["digest"])' "$SHARED/templates/base.json")"
ln "$SHARED/blobs/$BASE_DIGEST.tar" "$STORE/blobs/" 2>/dev/null || cp "$SHARED/blobs/$BASE_DIGEST.tar" "$STORE/blobs/"
cp "$SHARED/templates/base.json" "$STORE/templates/"
mkdir -p "$WORK/extra/opt"
head -c "$((BIG_MIB << 20))" /dev/urandom >"$WORK/extra/opt/big.bin"
tar -cf "$WORK/big.tar" --exclude='./.warren-*' -C "$SHARED/rootfs/${BASE_DIGEST#sha256-}" . -C "$WORK/extra" .
rm -rf "$WORK/extra"
"$BIN" template --template-dir "$STORE" import "$WORK/big.tar" --name big >/dev/null
rm -f "$WORK/big.tar"

KEY="bench_$(hex 8)"
start_dev() {
  WARREN_LOG=warn WARREN_DEV_API_KEY="$KEY" WARREN_TEMPLATE_DIR="$STORE" "$BIN" dev \
    --sandbox-http off --data-dir "$WORK/dev" --nodes 1 --runtime isolated --listen "127.0.0.1:0" \
    --gateway-args "$OPTS" --node-args "$OPTS --cache-dir $WORK/cache" \
    >"$WORK/dev.out" 2>"$WORK/dev.err" &
  DEV="$!"
  for _ in $(seq 1 1200); do
    if grep -q "^dev gateway-1 listening on" "$WORK/dev.out" 2>/dev/null; then
      API="http://$(grep "^dev gateway-1 listening on" "$WORK/dev.out" | head -1 | sed 's/.* listening on //')"
      return 0
    fi
    sleep 0.1
  done
  echo "bench: warren dev did not start; its log:" >&2
  tail -30 "$WORK/dev.err" >&2
  exit 1
}
# create TEMPLATE: seconds the create took (the sandbox is killed after).
create() {
  local out t id
  out="$(curl -sS -o "$WORK/created.json" -w '%{http_code} %{time_total}' -X POST "$API/sandboxes" \
    -H "X-API-Key: $KEY" -H 'content-type: application/json' \
    -d "{\"templateID\":\"$1\",\"timeout\":120,\"allow_internet_access\":false}")"
  [ "${out%% *}" = 201 ] || { echo "bench: create $1 answered $out: $(cat "$WORK/created.json")" >&2; exit 1; }
  t="${out#* }"
  id="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sandboxID"])' "$WORK/created.json")"
  curl -sS -o /dev/null -X DELETE "$API/sandboxes/$id" -H "X-API-Key: $KEY"
  echo "$t"
}
stats() { python3 -c 'import sys,statistics as s; v=[float(x)*1000 for x in sys.argv[1:]]; print(f"{s.median(v):.0f} | {min(v):.0f} | {max(v):.0f}")' "$@"; }

start_dev
E2B_API_URL="$API" E2B_API_KEY="$KEY" "$BIN" template --template-dir "$STORE" push \
  --to s3://bench --blob-option "endpoint=http://127.0.0.1:$S3_PORT" --blob-option region=garage \
  --blob-option allow_http=true --import >"$WORK/push.out"
declare -A SIZE
for t in base big; do
  d="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["digest"])' "$STORE/templates/$t.json")"
  SIZE[$t]="$(stat -c %s "$STORE/blobs/$d.tar")"
done

echo "warren cold/warm create bench: $PROFILE build, commit $(git rev-parse --short HEAD)," \
  "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), Garage on 127.0.0.1, cold=$COLD warm=$WARM"
echo
echo "| template | blob (bytes fetched per cold create) | cold create, ms: median / min / max | warm create, ms: median / min / max |"
echo "|---|---:|---:|---:|"
for t in base big; do
  cold=()
  for _ in $(seq 1 "$COLD"); do
    stop_dev
    rm -rf "$WORK/cache"
    start_dev
    cold+=("$(create "$t")")
  done
  warm=()
  for _ in $(seq 1 "$WARM"); do warm+=("$(create "$t")"); done
  echo "| $t | ${SIZE[$t]} | $(stats "${cold[@]}" | sed 's/ | / \/ /g') | $(stats "${warm[@]}" | sed 's/ | / \/ /g') |"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
