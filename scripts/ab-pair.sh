#!/usr/bin/env bash
# The paired A/B inside one process: `virtnet switch` built with the backend's `ab` feature
# (crates/backend/src/ab.rs), its two ports driven by one DPDK testpmd as both guests (two
# virtio-user ports, io forwarding, `start tx_first 32`, as scripts/switch-compare.sh), the
# switch flipping between the code's variants A and B every VIRTNET_AB_MS ms (100). Each two
# neighbouring periods (one of each variant) give a ratio of their rates (frames the worker
# forwarded per second), B/A; the table gives each variant's median and the median of those
# ratios with its quartiles. Neighbouring periods see the same level of a machine whose
# level moves by 2x within seconds, so the ratio resolves a few per cent where alternating
# invocations do not resolve thirty.
#
# What B is: the code under test reads `virtnet_backend::ab::b()` where the two versions part
# (`if ab::b() { new } else { old }`); nothing in main does (add it for an experiment, and do
# not commit it). With no such call the two variants are the same code, and the ratio is the
# instrument's own spread (A/A: 0.999, quartiles 0.962-1.034, and 1.000, 0.959-1.023, in two
# 20 s runs on AMD EPYC family 25 model 1, 2026-12-07).
#
# Usage: scripts/ab-pair.sh [--seconds S] [--size BYTES] [--runs N]
# Needs root and dpdk-dev (installed when missing); the switch on CPU 0 (DEV_CPU), testpmd's
# forwarding lcore on CPU 1 (GUEST_CPU). The first 4 and the last 2 periods of a run are left
# out (start-up and shutdown). Prints Markdown.
set -euo pipefail

seconds=25
size=64
runs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
dev_cpu=${DEV_CPU:-0}
guest_cpu=${GUEST_CPU:-1}
root=$(cd "$(dirname "$0")/.." && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "needs root (testpmd's vhost-user sockets, hugepage-free memory)" >&2
  exit 1
fi
command -v dpdk-testpmd >/dev/null || {
  apt-get update >&2 && apt-get install -y --no-install-recommends dpdk-dev >&2
}
target=${AB_TARGET_DIR:-$root/target/ab}
(cd "$root" && cargo build --release -q -p virtnet-cli --features virtnet-backend/ab \
  --target-dir "$target")
virtnet=$target/release/virtnet

work=$(mktemp -d /tmp/vnt-ab-XXXX)
sw=
cleanup() {
  [ -n "$sw" ] && kill -TERM "$sw" 2>/dev/null && wait "$sw" 2>/dev/null
  rm -rf "$work" /var/run/dpdk/vnt-ab
}
trap cleanup EXIT

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | xargs); $size B frames; $runs run(s) of $seconds s; $(date -u +%FT%RZ)."
echo
echo "| run | A Mpps: median (min..max), periods | B Mpps: median (min..max), periods | B/A paired: median | quartiles |"
echo "|---|---|---|---|---|"
for r in $(seq "$runs"); do
  rm -f "$work"/*.sock
  taskset -c "$dev_cpu" "$virtnet" switch --sandbox off --cpus "$dev_cpu" \
    --port "name=a,socket=$work/a.sock,spoof-check=off" \
    --port "name=b,socket=$work/b.sock,spoof-check=off" 2>"$work/sw.log" &
  sw=$!
  for _ in $(seq 50); do [ -S "$work/b.sock" ] && break; sleep 0.1; done
  sleep 1
  { sleep 1; echo "start tx_first 32"; sleep "$seconds"; echo quit; } |
    dpdk-testpmd --lcores "0@$dev_cpu,1@$guest_cpu" --no-huge -m 1024 --no-pci \
      --file-prefix vnt-ab --vdev "net_virtio_user0,path=$work/a.sock,queues=1" \
      --vdev "net_virtio_user1,path=$work/b.sock,queues=1" -- -i --forward-mode=io \
      --txpkts="$size" >"$work/guest.log" 2>&1
  kill -TERM "$sw"; wait "$sw" 2>/dev/null || true
  sw=
  rm -rf /var/run/dpdk/vnt-ab
  grep '^AB ' "$work/sw.log" | python3 -c '
import statistics as st, sys
rows = [(int(v), float(m)) for _, v, m in (l.split() for l in sys.stdin)]
rows = [x for x in rows if x[1] > 0][4:-2]
pairs = [(b / a) for (va, a), (vb, b) in
         (((x, y) if x[0] == 0 else (y, x)) for x, y in zip(rows, rows[1:]))
         if va == 0 and vb == 1]
a = [m for v, m in rows if v == 0]
b = [m for v, m in rows if v == 1]
if len(pairs) < 4:
    print(f"| '"$r"' | too few periods ({len(rows)}) | | | |")
    sys.exit()
q = st.quantiles(pairs, n=4)
print(f"| '"$r"' | {st.median(a):.3f} ({min(a):.2f}..{max(a):.2f}), {len(a)} | "
      f"{st.median(b):.3f} ({min(b):.2f}..{max(b):.2f}), {len(b)} | "
      f"**{st.median(pairs):.3f}** | {q[0]:.3f}..{q[2]:.3f} |")
'
done
