#!/usr/bin/env bash
# What sandboxes' egress rules cost every other process on the host: TCP
# connect latency on loopback (a root process, no sandbox uid) with 0, 1 and
# 2 sandboxes' tables of ENTRIES denyOut entries each, in the layout nodes
# used before (one rule per entry on the output hook, each starting
# `meta skuid <range>`, so every host packet walked them all) and in today's
# (one `meta skuid <range> jump` rule in the hooked chain, entries in
# interval sets: crates/node/src/runtime/egress/rules.rs). The tables are
# written by this script in those two shapes (the "new" one as rules.rs
# writes it), over uid ranges no process has, named `wrnbench_*` (a node's
# sweep never touches them) and removed on exit. Needs root and nft.
#
# Usage: bench/egress-rules.sh [ENTRIES=10000] [CONNECTS=500]
#   env: LAYOUTS="old new", SANDBOXES="0 1 2", ROUNDS=3
# ENTRIES past 1 000 is what an old node accepted; a node now refuses more
# than 1 000 a list (400), and the new layout's cost does not depend on it.
# Mind the machine: while the old layout's tables are loaded, every `nft`
# command on the host (nodes' included) reads them all (at 45 000 entries
# and two sandboxes, `nft list tables` took tens of seconds and 460 MB).
set -euo pipefail
cd "$(dirname "$0")/.."

ENTRIES="${1:-10000}"
CONNECTS="${2:-500}"
LAYOUTS="${LAYOUTS:-old new}"
SANDBOXES="${SANDBOXES:-0 1 2}"
ROUNDS="${ROUNDS:-3}"
WORK="$(mktemp -d /tmp/warren-bench-egress.XXXXXX)"

cleanup() {
  nft list tables 2>/dev/null | awk '/^table inet wrnbench_/ {print $3}' |
    while read -r t; do nft delete table inet "$t" || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# The script of sandbox `k`'s table in `layout`, over uids far above any
# node's ranges.
table_script() {
  python3 - "$1" "$2" "$ENTRIES" <<'PY'
import sys
layout, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
first = 3_500_000_000 + k * 65536
uids = f"{first}-{first + 65535}"
name = f"wrnbench_{layout}_{k}"
# n single addresses in 198.18.0.0/15, none next to another.
addrs = [f"198.{18 + (i >> 15)}.{(i >> 7) & 255}.{(i & 127) * 2}" for i in range(n)]
host = ["fib daddr type local", "ip daddr 169.254.0.0/16", "ip6 daddr fe80::/10"]
refuse = lambda m: [f"{m} meta l4proto tcp reject with tcp reset".strip(), f"{m} reject".strip()]
out = [f"table inet {name}", f"delete table inet {name}", f"table inet {name} {{"]
if layout == "old":
    rules = [r for h in host for r in refuse(h)]
    rules += [r for a in addrs for r in refuse(f"ip daddr {a}/32")]
    out += ["  chain out {", "    type filter hook output priority 0; policy accept;"]
    out += [f"    meta skuid {uids} {r}" for r in rules]
    out += ["  }"]
else:
    sets = {"allow4": ("ipv4_addr", []), "allow6": ("ipv6_addr", []),
            "deny4": ("ipv4_addr", addrs), "deny6": ("ipv6_addr", []),
            "dns4": ("ipv4_addr", []), "dns6": ("ipv6_addr", [])}
    for s, (kind, el) in sets.items():
        elements = f" elements = {{ {', '.join(el)} }}" if el else ""
        out.append(f"  set {s} {{ type {kind}; flags interval;{elements} }}")
    out += ["  chain out {", "    type filter hook output priority 0; policy accept;",
            f"    meta skuid {uids} jump egress", "  }", "  chain egress {"]
    rules = [f"{f} daddr @dns{v} {p} dport 53 accept" for f, v in (("ip", 4), ("ip6", 6)) for p in ("udp", "tcp")]
    rules += [r for h in host for r in refuse(h)]
    rules += ["ip daddr @allow4 accept", "ip6 daddr @allow6 accept"]
    rules += refuse("ip daddr @deny4") + refuse("ip6 daddr @deny6")
    out += [f"    {r}" for r in rules] + ["  }"]
out.append("}")
print("\n".join(out))
PY
}

# Median and p99 of CONNECTS loopback TCP connects (µs), one line.
measure() {
  python3 - "$CONNECTS" <<'PY'
import socket, sys, time
n = int(sys.argv[1])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(512)
addr = srv.getsockname()
took = []
for _ in range(n):
    c = socket.socket()
    t = time.perf_counter()
    c.connect(addr)
    took.append((time.perf_counter() - t) * 1e6)
    srv.accept()[0].close(); c.close()
took.sort()
print(f"{took[len(took) // 2]:.0f} {took[int(len(took) * 0.99)]:.0f}")
PY
}

# Rules every host packet meets on the output hook in the bench tables:
# the hooked chains' rules of the scripts loaded (counted in the scripts: an
# `nft list` of the old layout's tables is itself slow).
hooked_rules() {
  cat "$WORK"/*.nft 2>/dev/null | awk '
    /^  chain out/ {c=1; next} /^  }/ {c=0} c && /^    meta skuid/ {n++} END {print n+0}'
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| layout | sandboxes | entries each | rules on the output hook | connect p50 µs | connect p99 µs | p50 every round |\n'
printf '|---|---:|---:|---:|---:|---:|---|\n'
for layout in $LAYOUTS; do
  for n in $SANDBOXES; do
    [ "$layout" = new ] && [ "$n" = 0 ] && continue  # the same as old with 0
    cleanup; WORK="$(mktemp -d /tmp/warren-bench-egress.XXXXXX)"
    for ((k = 0; k < n; k++)); do
      table_script "$layout" "$k" > "$WORK/$k.nft"
      nft -f "$WORK/$k.nft"
    done
    p50s=(); p99s=()
    for ((r = 0; r < ROUNDS; r++)); do
      read -r p50 p99 < <(measure)
      p50s+=("$p50"); p99s+=("$p99")
    done
    med() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
    label=$layout; [ "$n" = 0 ] && label="none"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$n" "$([ "$n" = 0 ] && echo - || echo "$ENTRIES")" \
      "$(hooked_rules)" "$(med "${p50s[@]}")" "$(med "${p99s[@]}")" "$(IFS=/; echo "${p50s[*]}")"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
