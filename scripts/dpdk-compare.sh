#!/usr/bin/env bash
# Compares device halves serving DPDK's virtio-user PMD (issue 3's benchmark):
#   A = virtnet backend --io null     B = DPDK's vhost PMD (testpmd net_vhost0)
# for 64 B and 1500 B frames, both directions, A/B/A/B in one run, median of the per-second
# rates of each run. One core per side: the device on CPU 0, the driver on CPU 1.
#
# Usage: scripts/dpdk-compare.sh [--rounds N] [--seconds S] [--busy-poll-us US]
#        [--sizes "64 1500"] [--directions "rx tx"]
# Needs root and dpdk-dev (installed when missing). Prints a Markdown table.
set -euo pipefail

rounds=2
seconds=8
busy_poll_us=1000
sizes="64 1500"
directions="rx tx"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --busy-poll-us) busy_poll_us=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --directions) directions=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

. "$(dirname "$0")/compare-lib.sh"
need_testpmd

work=$(mktemp -d /tmp/vnt-dpdk-XXXX)
pids=()
cleanup() {
  stop_all "${pids[@]:-}"
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$work" /tmp/vnt-dpdk-logs
  rm -rf "$work" /var/run/dpdk/vnt-*
}
trap cleanup EXIT

# testpmd's main lcore must not share a CPU with its forwarding lcore while the vhost-user
# handshake runs, or the handshake stalls: each side's main lcore sits on the other CPU.
device_testpmd() { # mode size sock log
  dpdk-testpmd --lcores 0@1,1@0 --no-huge -m 1024 --no-pci --file-prefix vnt-dev \
    --vdev "net_vhost0,iface=$3,queues=1" -- --forward-mode="$1" --txpkts="$2" \
    --stats-period 1 >"$4" 2>&1 &
  pids+=($!)
}
device_virtnet() { # mode size sock log
  taskset -c 0 "$virtnet" backend --io null --size "$2" --socket-path "$3" \
    --busy-poll-us "$busy_poll_us" >"$4" 2>&1 &
  pids+=($!)
}
driver_testpmd() { # mode size sock log
  timeout -s INT "$seconds" dpdk-testpmd --lcores 0@0,1@1 --no-huge -m 1024 --no-pci \
    --file-prefix vnt-drv --vdev "net_virtio_user0,path=$3,queues=1" -- \
    --forward-mode="$1" --txpkts="$2" --stats-period 1 >"$4" 2>&1 || true
}

# Median of the per-second rates (skipping the first two seconds of ramp-up).
median_rate() { # log field
  grep -o "$2: *[0-9]*" "$1" | awk '{print $2}' | tail -n +3 | sort -n |
    awk -v file="$1" '{a[NR]=$1} END {
      if (NR > 0) { print a[int((NR+1)/2)]; exit }
      print 0
      print "dpdk-compare: no per-second rate after the ramp-up in " file ": --seconds too short" > "/dev/stderr"
    }'
}

run_device() { # which dir size -> Mpps seen by the DPDK driver
  local which=$1 dir=$2 size=$3 sock=$work/s.sock
  rm -f "$sock"
  # Guest rx: the device generates (txonly / null), the driver receives (rxonly).
  # Guest tx: the driver generates (txonly), the device drops (rxonly / null).
  local dmode=txonly fmode=rxonly field=Rx-pps
  if [ "$dir" = tx ]; then dmode=rxonly fmode=txonly field=Tx-pps; fi
  "device_$which" "$dmode" "$size" "$sock" "$work/dev.log"
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  # testpmd creates the socket before its port is started: give it time to finish.
  sleep 2
  driver_testpmd "$fmode" "$size" "$sock" "$work/drv.log"
  cp "$work/drv.log" "$work/drv-$which-$dir-$size.log"
  # Background jobs of a script ignore SIGINT; testpmd catches it anyway, virtnet wants TERM.
  if [ "$which" = virtnet ]; then kill -TERM "${pids[-1]}"; else kill -INT "${pids[-1]}"; fi 2>/dev/null || true
  wait "${pids[-1]}" 2>/dev/null || true
  unset 'pids[-1]'
  rm -rf /var/run/dpdk/vnt-*
  awk -v r="$(median_rate "$work/drv.log" "$field")" 'BEGIN {printf "%.3f", r / 1e6}'
}


echo "| frames | direction | virtnet backend Mpps: median (each run) | DPDK vhost PMD Mpps: median (each run) | ratio of medians | of bests | of worsts |"
echo "|---|---|---|---|---|---|---|"
for size in $sizes; do
  for dir in $directions; do
    a=(); b=()
    for _ in $(seq "$rounds"); do
      a+=("$(run_device virtnet "$dir" "$size")")
      b+=("$(run_device testpmd "$dir" "$size")")
    done
    ma=$(pick median "${a[@]}"); mb=$(pick median "${b[@]}")
    echo "| $size B | guest $dir | $ma (${a[*]}) | $mb (${b[*]}) | $(ratio "$ma" "$mb") |" \
      "$(ratio "$(pick max "${a[@]}")" "$(pick max "${b[@]}")") |" \
      "$(ratio "$(pick min "${a[@]}")" "$(pick min "${b[@]}")") |"
  done
done
