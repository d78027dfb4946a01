#!/usr/bin/env bash
# Guest to guest on one host (issue 39's benchmark). One DPDK testpmd is both guests: two
# virtio-user ports, io forwarding (what one port receives goes out of the other), started
# with `start tx_first 32`, so frames circulate between the two guests through the switch:
#   A = virtnet switch, two ports (spoof-check off: testpmd sends from its own MACs), MAC
#       learning, one worker
#   B = DPDK testpmd with two net_vhost ports and io forwarding (no lookup at all)
#   with --bridge, also C = two `virtnet backend --tap` whose TAPs are ports of a Linux bridge
#   with --null BIN, also N = a forwarder that does nothing else: BIN is virtnet built by
#       scripts/ab/forwarder.sh (descriptors-only: the switch's ring path with no data work;
#       raw: the least two split rings need), run in its variant B throughout
# The rate is the frames both guest ports receive per second, measured by testpmd over
# --seconds after two of ramp-up. A/B/A/B in one run. The switch (or B's forwarder) on CPU 0,
# the guests' forwarder on CPU 1.
#
# Usage: scripts/switch-compare.sh [--rounds N] [--seconds S] [--sizes "64 1500"] [--bridge]
#        [--null BIN]
# SWITCH_CPUS (default 0) gives the switch's --cpus: 0,1 runs two workers, one sharing the
# guests' CPU.
# Needs root and dpdk-dev (installed when missing). Prints a Markdown table.
set -euo pipefail

rounds=2
seconds=6
sizes="64 1500"
bridge=
null=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --bridge) bridge=1; shift ;;
    --null) null=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

. "$(dirname "$0")/compare-lib.sh"
need_testpmd

work=$(mktemp -d /tmp/vnt-sw-XXXX)
pids=()
cleanup() {
  stop_all "${pids[@]:-}"
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$work" /tmp/vnt-sw-logs
  for l in vnswbr vnswa vnswb; do ip link del "$l" 2>/dev/null || true; done
  rm -rf "$work" /var/run/dpdk/vnt-*
}
trap cleanup EXIT

switch_virtnet() { # log [more options of virtnet switch]
  local log=$1; shift
  taskset -c "${SWITCH_CPUS:-0}" "$virtnet" switch --cpus "${SWITCH_CPUS:-0}" \
    --port "name=a,socket=$work/a.sock,spoof-check=off" \
    --port "name=b,socket=$work/b.sock,spoof-check=off" "$@" >"$log" 2>&1 &
  pids+=($!)
}
switch_testpmd() { # log
  dpdk-testpmd --lcores 0@1,1@0 --no-huge -m 1024 --no-pci --file-prefix vnt-sw \
    --vdev "net_vhost0,iface=$work/a.sock,queues=1" \
    --vdev "net_vhost1,iface=$work/b.sock,queues=1" -- --forward-mode=io \
    --stats-period 1 >"$1" 2>&1 &
  pids+=($!)
}

# The forwarder's build (scripts/ab/forwarder.sh), in its variant B from the start (VIRTNET_AB_START) and for good;
# no sandbox: the `ab` feature's reporting thread starts after it would be in place.
switch_null() { # log
  VIRTNET_AB_START=1 VIRTNET_AB_MS=1000000000 virtnet=$null SWITCH_CPUS=0 \
    switch_virtnet "$1" --sandbox off
}

# Two backends on TAPs in a bridge, their workers on CPU 0 (the last pid is the second's).
switch_bridge() { # log
  for t in a b; do
    taskset -c 0 "$virtnet" backend --tap "vnsw$t" --socket-path "$work/$t.sock" \
      --worker-cpu 0 --mac "52:54:00:00:5e:0$([ $t = a ] && echo 1 || echo 2)" >>"$1" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 50); do [ -S "$work/b.sock" ] && break; sleep 0.1; done
  ip link add vnswbr type bridge
  for t in a b; do ip link set "vnsw$t" master vnswbr && ip link set "vnsw$t" up; done
  ip link set vnswbr up
}

# The guests: interactive testpmd fed its commands with pauses; Rx-pps of both ports from the
# last `show port stats all`, which covers the seconds since the one before.
guests() { # size log
  {
    sleep 1
    echo "start tx_first 32"
    sleep 2
    echo "show port stats all"
    sleep "$seconds"
    echo "show port stats all"
    sleep 0.5
    echo "quit"
  } | dpdk-testpmd --lcores 0@0,1@1 --no-huge -m 1024 --no-pci --file-prefix vnt-guest \
    --vdev "net_virtio_user0,path=$work/a.sock,queues=1" \
    --vdev "net_virtio_user1,path=$work/b.sock,queues=1" -- -i --forward-mode=io \
    --txpkts="$1" >"$2" 2>&1 || true
}

run() { # which size -> Mpps received by both guest ports
  local which=$1 size=$2
  rm -f "$work"/a.sock "$work"/b.sock
  "switch_$which" "$work/sw.log"
  for _ in $(seq 50); do [ -S "$work/b.sock" ] && break; sleep 0.1; done
  sleep 2
  guests "$size" "$work/guest.log"
  cp "$work/guest.log" "$work/guest-$which-$size-$RANDOM.log"
  local n=1
  [ "$which" = bridge ] && n=2
  for _ in $(seq $n); do
    if [ "$which" = testpmd ]; then kill -INT "${pids[-1]}"; else kill -TERM "${pids[-1]}"; fi 2>/dev/null || true
    wait "${pids[-1]}" 2>/dev/null || true
    unset 'pids[-1]'
  done
  for l in vnswbr vnswa vnswb; do ip link del "$l" 2>/dev/null || true; done
  rm -rf /var/run/dpdk/vnt-*
  grep -o 'Rx-pps: *[0-9]*' "$work/guest.log" | awk '{print $2}' | tail -n 2 |
    awk '{s += $1} END {printf "%.3f", s / 1e6}'
}


echo "| frames | virtnet switch Mpps: median (each run) | testpmd vhost io fwd Mpps: median (each run) | ratio of medians | of bests | of worsts |${bridge:+ two backends on a bridge Mpps | switch / bridge |}${null:+ forwarder N Mpps | switch / N | testpmd / N |}"
echo "|---|---|---|---|---|---|${bridge:+---|---|}${null:+---|---|---|}"
for size in $sizes; do
  a=(); b=(); c=(); d=()
  for _ in $(seq "$rounds"); do
    a+=("$(run virtnet "$size")")
    b+=("$(run testpmd "$size")")
    [ -n "$bridge" ] && c+=("$(run bridge "$size")")
    [ -n "$null" ] && d+=("$(run null "$size")")
  done
  ma=$(pick median "${a[@]}"); mb=$(pick median "${b[@]}")
  extra=
  if [ -n "$bridge" ]; then
    mc=$(pick median "${c[@]}")
    extra=" $mc (${c[*]}) | $(ratio "$ma" "$mc") |"
  fi
  if [ -n "$null" ]; then
    md=$(pick median "${d[@]}")
    extra+=" $md (${d[*]}) | $(ratio "$ma" "$md") | $(ratio "$mb" "$md") |"
  fi
  echo "| $size B | $ma (${a[*]}) | $mb (${b[*]}) | $(ratio "$ma" "$mb") |" \
    "$(ratio "$(pick max "${a[@]}")" "$(pick max "${b[@]}")") |" \
    "$(ratio "$(pick min "${a[@]}")" "$(pick min "${b[@]}")") |$extra"
done
