#!/usr/bin/env bash
# Scheduler throughput: LookupNode calls/s with SANDBOXES sandboxes in the
# store, and Place + RecordAssignment creates/s, on SQLite (the embedded
# default) and on PostgreSQL (a private server), each over internal mutual
# TLS as gateways call it.
#
# For each backend: a scheduler is started; `warren-bench create` runs
# Place + RecordAssignment (onto a node it registers and heartbeats) for
# DURATION seconds from each CREATE_CONCURRENCY of callers; SANDBOXES
# running sandboxes are written into the store (`warren-bench seed`:
# straight into the tables, on one node whose lease never runs out);
# the scheduler restarts (its route view loads them: the seed writes no
# change rows); `warren-bench lookup` calls LookupNode for random ones
# from each CONCURRENCY of callers, answered from the view (and in
# `LookupNodes` batches of each BATCH size from BATCH_CALLERS callers;
# those rows count ids, not calls), then again
# with `--lookup-view false` (a store query each, the reference); and the
# creates run again with the store full.
# The scheduler's CPU time per call comes from /proc/<pid>/stat. One table.
#
# Usage: bench/scheduler.sh [SANDBOXES=1000000] [DURATION=10]
#   env: BACKENDS="sqlite postgres", CONCURRENCY="16 64",
#        CREATE_CONCURRENCY="1 16", BATCH="16 64" (ids per LookupNodes
#        call, as a gateway batches concurrent misses; "" for none),
#        BATCH_CALLERS=8, CARGO_TARGET_DIR, KEEP=1
# Needs: curl; PostgreSQL's initdb/pg_ctl for the postgres backend (Debian:
# apt-get install postgresql); builds warren and warren-bench in release
# mode. Everything runs on 127.0.0.1 and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

SANDBOXES="${1:-1000000}"
DURATION="${2:-10}"
BACKENDS="${BACKENDS:-sqlite postgres}"
CONCURRENCY="${CONCURRENCY:-16 64}"
CREATE_CONCURRENCY="${CREATE_CONCURRENCY:-1 16}"
BATCH="${BATCH:-16 64}"
BATCH_CALLERS="${BATCH_CALLERS:-8}"

cargo build --release -q -p warren -p warren-bench
TARGET="${CARGO_TARGET_DIR:-$PWD/target}/release"
BIN="$TARGET/warren"
DRIVER="$TARGET/warren-bench"
WORK="$(mktemp -d /tmp/warren-bench-sched.XXXXXX)"
HZ="$(getconf CLK_TCK)"
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

CERTS="$WORK/certs"
"$BIN" certs --dir "$CERTS" init >/dev/null
"$BIN" certs --dir "$CERTS" issue --role scheduler --name bench --host 127.0.0.1 >/dev/null
"$BIN" certs --dir "$CERTS" issue --role gateway --name bench >/dev/null
"$BIN" certs --dir "$CERTS" issue --role node --name bench-create --host 127.0.0.1 >/dev/null
GW_TLS=(--tls-ca "$CERTS/ca.pem" --tls-cert "$CERTS/gateway-bench.pem" --tls-key "$CERTS/gateway-bench.key")

cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

# measure LABEL SCHED_PID CMD... : runs the driver, appends "label result cpu_us_per_call".
measure() {
  local label="$1" pid="$2"; shift 2
  local t0 t1 out
  t0=$(cpu_ticks "$pid")
  # A run that fails (the store gave up) is a row too, not the end.
  out=$("$@" 2>&1) || true
  t1=$(cpu_ticks "$pid")
  echo "$out" >&2
  python3 - "$label" "$out" "$((t1 - t0))" "$HZ" <<'PY' >>"$WORK/rows"
import re, sys
label, out, ticks, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
m = re.search(r"(\d+) ok, (\d+) errors in ([\d.]+) s with (\d+) callers: (\d+)/s, p50 ([\d.]+) ms, p99 ([\d.]+) ms", out)
if not m:
    lines = out.strip().splitlines()
    why = [l.strip() for l in lines if "message" in l] or lines or ["?"]
    print("|".join([label, "-", "failed", "-", "-", why[0].replace("|", "/")[:100], "-"]))
    sys.exit(0)
ok, errors, secs, callers, rate, p50, p99 = m.groups()
per = ticks / hz * 1e6 / max(int(ok), 1)
print("|".join([label, callers, rate, p50, p99, errors, f"{per:.0f}"]))
PY
}

: >"$WORK/rows"
for backend in $BACKENDS; do
  db_args=()
  case "$backend" in
    sqlite)
      url="sqlite://$WORK/sched-sqlite/scheduler.db" ;;
    postgres)
      coproc PG { "$DRIVER" postgres; }
      PIDS+=("$PG_PID")
      read -r _ url <&"${PG[0]}"
      (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$WORK/store.key")
      db_args=(--database-url "$url" --store-key-file "$WORK/store.key") ;;
  esac
  # start_sched [FLAGS...]: leaves pid, addr and admin.
  start_sched() {
    WARREN_LOG=warn,warren_scheduler::route_view=info WARREN_EXIT_WITH_PARENT=1 "$BIN" scheduler --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
      --data-dir "$WORK/sched-$backend" "${db_args[@]}" --creating-timeout 1h --quota-sandboxes 0 \
      --tls-ca "$CERTS/ca.pem" --tls-cert "$CERTS/scheduler-bench.pem" --tls-key "$CERTS/scheduler-bench.key" \
      "$@" >"$WORK/sched-$backend.out" 2>"$WORK/sched-$backend.err" &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 300); do grep -q "^scheduler admin listening" "$WORK/sched-$backend.out" && break; sleep 0.1; done
    addr=$(grep "^scheduler grpc listening" "$WORK/sched-$backend.out" | sed 's/.* on //')
    admin=$(grep "^scheduler admin listening" "$WORK/sched-$backend.out" | sed 's/.* on //')
    [ -n "$addr" ] || { echo "bench: the $backend scheduler did not start:" >&2; cat "$WORK/sched-$backend.err" >&2; exit 1; }
  }
  stop_sched() {
    kill -TERM "$pid"
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  }
  # view_loaded: waits until the route view answers lookups; prints how
  # long its load took and the scheduler's RSS then.
  view_loaded() {
    for _ in $(seq 1 1200); do
      [ "$(curl -sf "http://$admin/metrics" | awk '$1 == "warren_scheduler_route_view_ready" {print $2}')" = 1 ] && break
      sleep 0.1
    done
    echo "bench: $backend: $(grep -o 'route view loaded.*' "$WORK/sched-$backend.err" | tail -1); scheduler RSS $(( $(awk '/^VmRSS/ {print $2}' "/proc/$pid/status") / 1024 )) MiB" >&2
  }
  start_sched
  echo "bench: $backend: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  create() { # LABEL CALLERS
    measure "$backend $1" "$pid" "$DRIVER" create --scheduler "http://$addr" "${GW_TLS[@]}" \
      --node-cert "$CERTS/node-bench-create.pem" --node-key "$CERTS/node-bench-create.key" \
      --concurrency "$2" --duration "$DURATION"
  }
  # Creates into an empty store, then with SANDBOXES sandboxes in it.
  for c in $CREATE_CONCURRENCY; do create "Place+RecordAssignment (empty store)" "$c"; done
  "$DRIVER" seed --database-url "$url" --count "$SANDBOXES" --endpoint 127.0.0.1:9 >&2
  lookups() { # LABEL
    for c in $CONCURRENCY; do
      measure "$backend $1" "$pid" "$DRIVER" lookup --scheduler "http://$addr" "${GW_TLS[@]}" \
        --count "$SANDBOXES" --concurrency "$c" --duration "$DURATION"
    done
    for b in $BATCH; do
      measure "$backend $1 in LookupNodes of $b (per id)" "$pid" "$DRIVER" lookup --scheduler "http://$addr" \
        "${GW_TLS[@]}" --count "$SANDBOXES" --concurrency "$BATCH_CALLERS" --batch "$b" --duration "$DURATION"
    done
  }
  # The seed writes no change rows: a restart loads what it wrote into the
  # route view, as any restart over a full store does. Then the reference,
  # the same lookups with the view off (a query each).
  stop_sched; start_sched; view_loaded
  lookups "LookupNode"
  stop_sched; start_sched --lookup-view false
  echo "bench: $backend: --lookup-view false: scheduler RSS $(( $(awk '/^VmRSS/ {print $2}' "/proc/$pid/status") / 1024 )) MiB" >&2
  lookups "LookupNode (--lookup-view false)"
  stop_sched; start_sched; view_loaded
  for c in $CREATE_CONCURRENCY; do create "Place+RecordAssignment ($SANDBOXES in the store)" "$c"; done
done

echo "| store | call | callers | calls/s | p50 ms | p99 ms | errors | scheduler CPU µs/call |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
while IFS='|' read -r label callers rate p50 p99 errors per; do
  echo "| ${label%% *} | ${label#* } | $callers | $rate | $p50 | $p99 | $errors | $per |"
done <"$WORK/rows"
echo "bench: load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
