#!/usr/bin/env bash
# Compares the host path on a TAP (issue 14's benchmark), both devices serving DPDK's
# virtio-user PMD (testpmd) as the guest, A/B/A/B in one run:
#   A = virtnet backend --tap      B = DPDK testpmd net_vhost0 + net_tap0, io forwarding
# for 64 B and 1500 B frames, both directions:
#   guest -> host: the guest's testpmd in txonly; counted at the TAP (rx_packets: frames the
#                  device wrote into it) and at the guest (testpmd's Tx-pps);
#   host -> guest: trafgen in the namespace sends UDP frames to the guest's MAC through the
#                  TAP; counted at the TAP (tx_packets: frames the device read) and at the
#                  guest (testpmd's Rx-pps, rxonly).
# The TAP is in a network namespace of the script's own (IPv6 off, so nothing else talks on
# it); each figure is the median of the per-second rates of a run, and the table gives the
# median over runs with every run, and the ratios of the medians, of the best and of the
# worst runs.
#
#   --ceiling  also the one-syscall-per-frame ceiling, counted the same way: a C loop
#              (scripts/tap-ceiling.c, built with cc) doing one writev per frame into the
#              TAP, one read per frame out of it while trafgen sends, and one writev per
#              65,000-byte TSO or USO super-frame (Gbit/s at the TAP's rx_bytes); and the
#              same frames through io_uring (liburing, installed when missing): 32 writev
#              per io_uring_enter, with and without SQPOLL, and 32 reads kept posted;
#   --offload  also `virtnet gen --gso tcp|udp --size 65000 --busy-poll --queue-size N` into
#              our backend on the TAP, Gbit/s at the TAP (the udp row says n/a where the
#              kernel's TAP has no USO, so the backend does not offer HOST_USO), A/B with the
#              ceiling loop writing the same super-frames from N buffers in turn: the same
#              memory the kernel's copies read (a 64 KiB copy runs at a third of the speed
#              from a 16 MiB working set as from one frame in this CPU's caches, so a
#              one-buffer ceiling compares the device's memory with a hot cache);
#   --offload-frames N  super-frames in flight for --offload (gen's ring; default 64, 4 MiB:
#              what Linux 6.18 lets one TCP flow keep queued, tcp_limit_output_bytes);
#   --zero-loss S  also S seconds of 64 B guest -> host at full rate into our backend: frames
#              the guest sent (testpmd's TX-packets) against frames at the TAP and frames
#              the backend dropped (only invalid ones may be), with the TAP's push-backs
#              (the guest stops forwarding before its port closes, so that nothing it
#              counted sent is left on the ring);
#   --tap-io-ab  also our backend's two ways of writing guest tx into the TAP, A/B/A/B:
#              --tap-io uring (up to 64 writev per io_uring_enter, the default) against
#              --tap-io syscalls (one writev system call per frame), guest -> host, 64 and
#              1500 B, counted at the TAP;
#   --tcp-rx   also host → guest TCP with offloads: a sender (python3) in the namespace
#              streams to `virtnet gen --mode tcp-sink --busy-poll` (198.18.0.1) through our
#              backend, which negotiates GUEST_TSO4 so the TAP passes the stack's super-frames
#              whole; Gbit/s at the sender and at the TAP (tx_bytes: what the device read),
#              whether the sink got every byte in order, and for scale the same sender into a
#              receiver over the namespace's loopback on the same two CPUs (no device). The
#              sender runs on DEV_CPU, beside the device: gen busy polls GUEST_CPU;
#   --against BIN  also our backend A/B/B/A against another virtnet binary (the one before a
#              change: "no slower than before"), guest -> host, 64 and 1500 B, at the TAP;
#   --no-compare  only the parts asked for with --ceiling / --offload / --zero-loss /
#              --tap-io-ab / --tcp-rx / --against.
#
# CPUs: the device on DEV_CPU (0), the guest (and virtnet gen) on GUEST_CPU (1), trafgen on
# the CPU the device does not use, GEN_CPU (GUEST_CPU), where it shares the CPU with the
# guest's busy-polling lcore: the script prints what trafgen offered at the TAP, so that a
# generator-bound host -> guest figure shows as one. VIRTNET_BIN picks the binary
# (default target/release/virtnet, built when missing); KEEP_LOGS=1 keeps the logs in
# /tmp/vnt-tap-logs.
#
# Usage: scripts/tap-compare.sh [--rounds N] [--seconds S] [--busy-poll-us US]
#                               [--ceiling] [--offload] [--offload-frames N]
#                               [--zero-loss S] [--tap-io-ab]
#                               [--tcp-rx] [--against BIN] [--no-compare]
# Needs root; installs dpdk-dev and netsniff-ng (trafgen) when missing. Prints Markdown.
set -euo pipefail

rounds=2
seconds=8
busy_poll_us=1000
compare=1
ceiling=0
offload=0
offload_frames=64
zero_loss=0
tap_io_ab=0
tcp_rx=0
against=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --busy-poll-us) busy_poll_us=$2; shift 2 ;;
    --ceiling) ceiling=1; shift ;;
    --offload) offload=1; shift ;;
    --offload-frames) offload_frames=$2; shift 2 ;;
    --zero-loss) zero_loss=$2; shift 2 ;;
    --tap-io-ab) tap_io_ab=1; shift ;;
    --tcp-rx) tcp_rx=1; shift ;;
    --against) against=$2; shift 2 ;;
    --no-compare) compare=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, TAP devices)" >&2; exit 1; }

dev_cpu=${DEV_CPU:-0}
guest_cpu=${GUEST_CPU:-1}
gen_cpu=${GEN_CPU:-$guest_cpu}
guest_mac=52:54:00:12:34:56
our_tap=vntc0
dpdk_tap=vntd0

. "$(dirname "$0")/compare-lib.sh"
missing=()
command -v dpdk-testpmd >/dev/null || missing+=(dpdk-dev)
command -v trafgen >/dev/null || missing+=(netsniff-ng)
if [ "$ceiling" = 1 ] || [ "$offload" = 1 ]; then
  command -v cc >/dev/null || missing+=(gcc)
  [ -e /usr/include/liburing.h ] || missing+=(liburing-dev)
fi
[ "$tcp_rx" = 1 ] && ! command -v python3 >/dev/null && missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi

work=$(mktemp -d /tmp/vnt-tap-XXXX)
ns=vnt-tapcmp-$$
pids=()
groups=()
stop_pid() { # pid signal: signal, then KILL if it has not exited within 3 s
  kill "-$2" "$1" 2>/dev/null || return 0
  for _ in $(seq 30); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
# trafgen runs in a process group of its own: it forks one sender per CPU, and a sender
# outlives a parent that is killed, so the whole group is signalled.
stop_group() { # pgid
  kill -INT -- "-$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 -- "-$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && stop_pid "$p" TERM; done
  for g in "${groups[@]:-}"; do [ -n "$g" ] && stop_group "$g"; done
  if [ -n "${KEEP_LOGS:-}" ]; then rm -rf /tmp/vnt-tap-logs; cp -r "$work" /tmp/vnt-tap-logs; fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work" /var/run/dpdk/vnt-t*
}
trap cleanup EXIT

# For short commands only: a background process must be started with `ip netns exec` itself,
# so that $! is its pid (ip execs the program) and not a subshell's.
in_ns() { ip netns exec "$ns" "$@"; }

ip netns add "$ns"
in_ns ip link set lo up
in_ns sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
# Our TAP is persistent, created as `virtnet backend` opens it; DPDK's net_tap creates its own
# (testpmd runs inside the namespace, so the TAP is born there).
in_ns ip tuntap add dev "$our_tap" mode tap multi_queue vnet_hdr
in_ns ip link set "$our_tap" up

helper=$work/tap-ceiling
if [ "$ceiling" = 1 ] || [ "$offload" = 1 ]; then
  cc -O2 -Wall -DHAVE_URING -o "$helper" "$root/scripts/tap-ceiling.c" -luring
fi

# A trafgen config sending one SIZE-byte IPv4/UDP frame to the guest's MAC from GEN_CPU only
# (trafgen starts one process per CPU from 0 and pins each to its CPU; the others idle).
trafgen_cfg() { # size -> path
  local f=$work/trafgen-$1.cfg mac
  mac=$(echo "$guest_mac" | sed 's/\([0-9a-f][0-9a-f]\)/0x\1/g; s/:/, /g')
  cat >"$f" <<EOF
cpu($gen_cpu): {
  $mac, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, c16(0x0800),
  0x45, 0x00, c16($(($1 - 14))), c16(1), 0x40, 0x00, 64, 17, csumip(14, 33),
  198, 18, 0, 2, 198, 18, 0, 1,
  c16(9), c16(9), c16($(($1 - 34))), c16(0),
  fill(0x00, $(($1 - 42)))
}
EOF
  echo "$f"
}
start_trafgen() { # dev size; the group goes to $groups
  local cfg
  cfg=$(trafgen_cfg "$2")
  rm -f "$work/trafgen.pgid"
  # The session leader writes its own id, which names the group (setsid may have forked).
  # shellcheck disable=SC2016 # expanded by that shell, not this one
  setsid sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$work/trafgen.pgid" \
    ip netns exec "$ns" trafgen --dev "$1" --conf "$cfg" --cpus $((gen_cpu + 1)) \
    --no-sock-mem --no-cpu-stats >"$work/trafgen.log" 2>&1 &
  wait_for "trafgen" test -s "$work/trafgen.pgid"
  groups+=("$(cat "$work/trafgen.pgid")")
}
stop_trafgen() {
  for g in "${groups[@]:-}"; do [ -n "$g" ] && stop_group "$g"; done
  groups=()
}

# The TAP's counters, summed: "tx_packets tx_dropped" gives what was offered to its reader.
tap_counter() { # dev "counter..."
  local c path=""
  for c in $2; do path="$path /sys/class/net/$1/statistics/$c"; done
  # shellcheck disable=SC2086 # the paths are split on purpose
  in_ns cat $path 2>/dev/null | awk '{s += $1} END {print s + 0}'
}
# One line per second for `seconds` seconds: the per-second rate of each counter set given,
# one column each.
sample_tap() { # dev out "counter..."...
  local dev=$1 out=$2 t0 t1 prev=() cur=() line i
  shift 2
  for c in "$@"; do prev+=("$(tap_counter "$dev" "$c")"); done
  t0=$(date +%s.%N)
  : >"$out"
  for _ in $(seq "$seconds"); do
    sleep 1
    cur=()
    for c in "$@"; do cur+=("$(tap_counter "$dev" "$c")"); done
    t1=$(date +%s.%N)
    line=
    for i in "${!cur[@]}"; do
      line="$line $(awk -v a="${prev[$i]}" -v b="${cur[$i]}" -v s="$t0" -v e="$t1" \
        'BEGIN {printf "%.0f", (b - a) / (e - s)}')"
    done
    echo "$line" >>"$out"
    prev=("${cur[@]}"); t0=$t1
  done
}
median_of() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print 0; else print a[int((NR+1)/2)]}'; }
# The median per-second rate in column COL (from 1), scaled: 1e6 for Mpps, 1.25e8 for Gbit/s
# out of bytes.
scaled_median() { # file scale [col]
  awk -v c="${3:-1}" '{print $c}' "$1" | median_of | awk -v s="$2" '{printf "%.3f", $1 / s}'
}
# testpmd's per-second rates for the sampled window: its last `seconds` values of FIELD.
guest_rate() { # log field
  grep -o "$2: *[0-9]*" "$1" | awk '{print $2}' | tail -n "$seconds" | median_of |
    awk '{printf "%.3f", $1 / 1e6}'
}
wait_for() { # what test...
  local what=$1; shift
  for _ in $(seq 100); do "$@" && return 0; sleep 0.1; done
  echo "timed out waiting for $what" >&2
  return 1
}

device_virtnet() { # sock [tap-io]
  ip netns exec "$ns" taskset -c "$dev_cpu" "$virtnet" backend --tap "$our_tap" --socket-path "$1" \
    --busy-poll-us "$busy_poll_us" --worker-cpu "$dev_cpu" --mac "$guest_mac" \
    --tap-io "${2:-uring}" --ctl "$work/ctl.sock" >"$work/dev.log" 2>&1 &
  pids+=($!)
}
device_syscalls() { device_virtnet "$1" syscalls; }
device_against() { local virtnet=$against; device_virtnet "$1"; }
# Our backend on $work/s.sock (its ctl socket fresh), once that socket is there; its pid is
# the last in pids.
start_our_device() {
  rm -f "$work/s.sock" "$work/ctl.sock"
  device_virtnet "$work/s.sock"
  wait_for "the device's socket" test -S "$work/s.sock"
}
# testpmd's main lcore must not share a CPU with its forwarding lcore while the vhost-user
# handshake runs (scripts/dpdk-compare.sh): each side's main lcore sits on the other CPU.
device_dpdk() { # sock
  ip netns exec "$ns" dpdk-testpmd --lcores "0@$guest_cpu,1@$dev_cpu" --no-huge -m 1024 --no-pci \
    --file-prefix vnt-tdev --vdev "net_vhost0,iface=$1,queues=1" \
    --vdev "net_tap0,iface=$dpdk_tap" -- --forward-mode=io --stats-period 1 \
    >"$work/dev.log" 2>&1 &
  pids+=($!)
}
# The guest: testpmd on virtio-user, printing its rates each second, or, given COMMANDS (a
# FIFO), interactive and taking its commands from there.
guest_testpmd() { # mode size sock [commands]
  local app=(--stats-period 1) input=/dev/null
  if [ -n "${4:-}" ]; then app=(-i) input=$4; fi
  dpdk-testpmd --lcores "0@$dev_cpu,1@$guest_cpu" --no-huge -m 1024 --no-pci \
    --file-prefix vnt-tdrv --vdev "net_virtio_user0,path=$3,queues=1,mac=$guest_mac" -- \
    "${app[@]}" --forward-mode="$1" --txpkts="$2" <"$input" >"$work/drv.log" 2>&1 &
  pids+=($!)
}
stop_last() { # signal
  stop_pid "${pids[-1]}" "$1"
  unset 'pids[-1]'
}

# One run of a device with the guest; writes "Mpps-at-TAP Mpps-at-guest Mpps-offered" to
# $work/result, the last what trafgen offered the TAP's reader (tx_packets + tx_dropped; for
# host -> guest only).
# (Not called in $(...): the processes it starts must stay in this shell's list.)
run_pair() { # which dir size
  local which=$1 dir=$2 size=$3 sock=$work/s.sock tap=$our_tap
  # virtnet: --tap-io uring; syscalls: virtnet backend --tap-io syscalls; against: the binary
  # --against names; dpdk: DPDK's pair.
  rm -f "$sock"
  if [ "$which" = dpdk ]; then tap=$dpdk_tap; fi
  "device_$which" "$sock"
  local dev=${pids[-1]}
  wait_for "the device's socket" test -S "$sock"
  # testpmd creates the socket before its ports are started: give it time to finish.
  if [ "$which" = dpdk ]; then sleep 2; fi
  wait_for "the TAP $tap" in_ns test -e "/sys/class/net/$tap"
  in_ns ip link set "$tap" up
  local gmode=txonly counter=rx_packets field=Tx-pps
  if [ "$dir" = rx ]; then gmode=rxonly counter=tx_packets field=Rx-pps; fi
  guest_testpmd "$gmode" "$size" "$sock"
  local guest=${pids[-1]}
  wait_for "the guest's first stats" grep -q "$field" "$work/drv.log"
  if [ "$dir" = rx ]; then start_trafgen "$tap" "$size"; fi
  sleep 1
  sample_tap "$tap" "$work/tap.rates" "$counter" "tx_packets tx_dropped"
  cp "$work/drv.log" "$work/drv-$which-$dir-$size-$(date +%s%N).log"
  # The guest stops first, then the generator, then the device: testpmd and trafgen catch
  # INT, virtnet backend wants TERM.
  stop_pid "$guest" INT
  stop_trafgen
  if [ "$which" = dpdk ]; then stop_pid "$dev" INT; else stop_pid "$dev" TERM; fi
  pids=()
  rm -rf /var/run/dpdk/vnt-t*
  echo "$(scaled_median "$work/tap.rates" 1e6) $(guest_rate "$work/drv.log" "$field")" \
    "$(scaled_median "$work/tap.rates" 1e6 2)" >"$work/result"
}

# S seconds of 64 B guest -> host into our backend at full rate; writes "sent at-TAP dropped
# pushbacks" to $work/result.
run_zero_loss() { # seconds
  start_our_device
  local sock=$work/s.sock dev=${pids[-1]}
  local before after
  before=$(in_ns cat "/sys/class/net/$our_tap/statistics/rx_packets")
  # The guest's testpmd takes its commands from a FIFO: it must stop forwarding, and the
  # backend take what is left on the ring, before the port closes. A port that closes while
  # frames sit on the avail ring leaves them there (GET_VRING_BASE stops the ring where it
  # is, as vhost_net does), though testpmd counted them sent.
  local cmds=$work/testpmd.cmds
  rm -f "$cmds" && mkfifo "$cmds"
  guest_testpmd txonly 64 "$sock" "$cmds"
  local guest=${pids[-1]}
  exec 3>"$cmds"
  echo start >&3
  sleep "$1"
  # testpmd prints its totals when forwarding stops (they reach the log when it exits); a
  # second is ample for the backend to take the ring's last frames.
  echo stop >&3
  sleep 1
  after=$(in_ns cat "/sys/class/net/$our_tap/statistics/rx_packets")
  echo quit >&3
  exec 3>&-
  wait_for "the guest to quit" eval '! kill -0 "$guest" 2>/dev/null'
  stop_pid "$guest" INT
  local sent counters
  sent=$(awk '/Forward statistics for port 0/ {f = 1}
    f { for (i = 1; i < NF; i++) if ($i == "TX-packets:") { print $(i + 1); exit } }' "$work/drv.log")
  counters=$("$virtnet" ctl --socket "$work/ctl.sock" stats | python3 -c '
import json, sys
q = [q for q in json.load(sys.stdin)["queues"] if q["kind"] == "tx"][0]
print(q["dropped"], q["host_pushback"])')
  stop_pid "$dev" TERM
  pids=()
  rm -rf /var/run/dpdk/vnt-t*
  echo "${sent:-?} $((after - before)) $counters" >"$work/result"
}

# The ceiling loop on DEV_CPU (with trafgen for `read`); writes the median rate at the TAP
# (Mpps, or Gbit/s for super-frames) to $work/result. BUFFERS: the frame written from that
# many buffers in turn (write, tso, uso).
run_ceiling() { # mode size [buffers]
  local mode=$1 size=$2 buffers=${3:-1} counter=rx_packets scale=1e6
  case "$mode" in
    read | uread) counter=tx_packets ;;
    tso | uso) counter=rx_bytes scale=1.25e8 ;;
  esac
  if [ "$mode" = read ] || [ "$mode" = uread ]; then
    ip netns exec "$ns" taskset -c "$dev_cpu" "$helper" "$mode" "$our_tap" $((seconds + 3)) >"$work/helper.log" 2>&1 &
    pids+=($!)
    sleep 0.5
    start_trafgen "$our_tap" "$size"
  else
    ip netns exec "$ns" taskset -c "$dev_cpu" "$helper" "$mode" "$our_tap" "$size" $((seconds + 2)) \
      "$buffers" >"$work/helper.log" 2>&1 &
    pids+=($!)
  fi
  sleep 1
  sample_tap "$our_tap" "$work/tap.rates" "$counter"
  stop_trafgen
  for p in "${pids[@]}"; do stop_pid "$p" INT; done
  pids=()
  scaled_median "$work/tap.rates" "$scale" >"$work/result"
}

# `virtnet gen --gso PROTO --size 65000` into our backend on the TAP; writes "Gbit/s-at-TAP
# Gbit/s-by-gen", or "n/a" when the device does not offer the offload, to $work/result.
run_offload() { # proto
  start_our_device
  local sock=$work/s.sock dev=${pids[-1]}
  taskset -c "$guest_cpu" "$virtnet" gen --socket "$sock" --gso "$1" --size 65000 \
    --busy-poll --queue-size "$offload_frames" --duration $((seconds + 2)) >"$work/gen.log" 2>&1 &
  pids+=($!)
  local gen=${pids[-1]}
  sleep 1
  if ! kill -0 "$gen" 2>/dev/null; then
    wait "$gen" 2>/dev/null || true
    if grep -q "lacks HOST_USO" "$work/gen.log"; then
      echo "n/a (HOST_USO not offered)" >"$work/result"
    else
      echo "n/a (gen failed: $(tail -n 1 "$work/gen.log"))" >"$work/result"
    fi
  else
    sample_tap "$our_tap" "$work/tap.rates" rx_bytes
    wait "$gen" 2>/dev/null || true
    local by_gen
    by_gen=$(awk '/^  tx / {print $4}' "$work/gen.log")
    echo "$(scaled_median "$work/tap.rates" 1.25e8) ${by_gen:-n/a}" >"$work/result"
  fi
  cp "$work/gen.log" "$work/gen-$1-$(date +%s%N).log"
  stop_pid "$dev" TERM
  pids=()
}

# The TCP sender and the loopback receiver of --tcp-rx.
tcp_py() {
  cat >"$work/tcp.py" <<'PY'
import socket, sys, time
if sys.argv[1] == "send":  # send HOST SECONDS: prints "bytes Gbit/s"
    s = socket.create_connection((sys.argv[2], 5201), timeout=10)
    buf, n = b"\xab" * (1 << 20), 0
    t0 = time.time()
    end = t0 + float(sys.argv[3])
    while time.time() < end:
        n += s.send(buf)
    dt = time.time() - t0
    s.shutdown(socket.SHUT_WR)
    s.settimeout(3)
    try:
        s.recv(16)
    except OSError:
        pass
    print(n, "%.3f" % (n * 8 / dt / 1e9))
else:  # recv: one connection on 127.0.0.1:5201, read to its end
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", 5201))
    l.listen(1)
    c, _ = l.accept()
    buf = bytearray(1 << 20)
    while c.recv_into(buf):
        pass
PY
}

# A TCP stream from the namespace into `virtnet gen --mode tcp-sink` through our backend;
# writes "Gbit/s-at-sender Gbit/s-at-TAP all-in-order" to $work/result.
run_tcp_rx() {
  start_our_device
  local sock=$work/s.sock dev=${pids[-1]}
  taskset -c "$guest_cpu" "$virtnet" gen --socket "$sock" --mode tcp-sink --busy-poll \
    --duration $((seconds + 3)) >"$work/gen.log" 2>&1 &
  pids+=($!)
  local gen=${pids[-1]}
  sleep 1
  ip netns exec "$ns" taskset -c "$dev_cpu" python3 "$work/tcp.py" send 198.18.0.1 "$seconds" \
    >"$work/sender.log" 2>&1 &
  pids+=($!)
  local sender=${pids[-1]}
  sample_tap "$our_tap" "$work/tap.rates" tx_bytes
  wait "$sender" 2>/dev/null || true
  wait "$gen" 2>/dev/null || true
  local sent gbps got whole=no
  read -r sent gbps <"$work/sender.log" || true
  got=$(grep -o '[0-9]* bytes in order' "$work/gen.log" | awk '{print $1}')
  [ -n "$sent" ] && [ "$sent" = "${got:-}" ] && grep -q ' 0 out of order' "$work/gen.log" &&
    whole=yes
  echo "${gbps:-0} $(scaled_median "$work/tap.rates" 1.25e8) $whole" >"$work/result"
  stop_pid "$dev" TERM
  pids=()
}

# The same sender into a receiver over the namespace's loopback; writes its Gbit/s.
run_tcp_loopback() {
  ip netns exec "$ns" taskset -c "$guest_cpu" python3 "$work/tcp.py" recv &
  pids+=($!)
  local recv=${pids[-1]}
  sleep 0.5
  ip netns exec "$ns" taskset -c "$dev_cpu" python3 "$work/tcp.py" send 127.0.0.1 "$seconds" \
    >"$work/sender.log" 2>&1 || true
  wait "$recv" 2>/dev/null || true
  pids=()
  awk '{print $2}' "$work/sender.log" >"$work/result"
}


cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
echo "CPU: $cpu ($(nproc) CPUs), Linux $(uname -r). Device on CPU $dev_cpu, guest on CPU $guest_cpu, trafgen on CPU $gen_cpu; $rounds round(s) of $seconds s; $(date -u +%Y-%m-%dT%H:%MZ)."
echo

# Medians of our backend at the TAP, kept for the ceiling's ratios.
declare -A ours
offered=()
if [ "$compare" = 1 ]; then
  echo "| frames | direction | counted at | virtnet backend --tap Mpps: median (each run) | DPDK net_vhost + net_tap Mpps: median (each run) | ratio of medians | of bests | of worsts |"
  echo "|---|---|---|---|---|---|---|---|"
  for size in 64 1500; do
    for dir in tx rx; do
      at=(); ag=(); ao=(); bt=(); bg=(); bo=()
      for _ in $(seq "$rounds"); do
        run_pair virtnet "$dir" "$size"; read -r t g o <"$work/result"; at+=("$t"); ag+=("$g"); ao+=("$o")
        run_pair dpdk "$dir" "$size"; read -r t g o <"$work/result"; bt+=("$t"); bg+=("$g"); bo+=("$o")
      done
      if [ "$dir" = rx ]; then
        offered+=("$size B: $(pick median "${ao[@]}") with virtnet, $(pick median "${bo[@]}") with DPDK")
      fi
      label="guest → host"
      [ "$dir" = rx ] && label="host → guest"
      for where in TAP guest; do
        if [ "$where" = TAP ]; then a=("${at[@]}"); b=("${bt[@]}"); else a=("${ag[@]}"); b=("${bg[@]}"); fi
        ma=$(pick median "${a[@]}"); mb=$(pick median "${b[@]}")
        [ "$where" = TAP ] && ours[$dir-$size]=$ma
        echo "| $size B | $label | $where | $ma (${a[*]}) | $mb (${b[*]}) | $(ratio "$ma" "$mb") |" \
          "$(ratio "$(pick max "${a[@]}")" "$(pick max "${b[@]}")") |" \
          "$(ratio "$(pick min "${a[@]}")" "$(pick min "${b[@]}")") |"
      done
    done
  done
  echo
  # When trafgen offers little more than the device takes, the generator bounds the rate
  # (it shares GEN_CPU with the guest's busy-polling lcore), not the device.
  echo "host → guest, trafgen's offer at the TAP (tx_packets + tx_dropped), Mpps medians: $(
    printf '%s; ' "${offered[@]}" | sed 's/; $//')."
  echo
fi

# Rows of guest -> host at the TAP, device A against device B (run_pair's names), A/B then
# B/A in alternate rounds, 64 and 1500 B.
ab_rows() { # a b "A's column" "B's column"
  echo "| frames | guest → host, at the TAP | $3 Mpps: median (each run) | $4 Mpps: median (each run) | ratio of medians | of bests | of worsts |"
  echo "|---|---|---|---|---|---|---|"
  for size in 64 1500; do
    a=(); b=()
    for r in $(seq "$rounds"); do
      order="$1 $2"
      [ $((r % 2)) = 0 ] && order="$2 $1"
      for which in $order; do
        run_pair "$which" tx "$size"; read -r t _ _ <"$work/result"
        if [ "$which" = "$1" ]; then a+=("$t"); else b+=("$t"); fi
      done
    done
    ma=$(pick median "${a[@]}"); mb=$(pick median "${b[@]}")
    echo "| $size B | TAP | $ma (${a[*]}) | $mb (${b[*]}) | $(ratio "$ma" "$mb") |" \
      "$(ratio "$(pick max "${a[@]}")" "$(pick max "${b[@]}")") |" \
      "$(ratio "$(pick min "${a[@]}")" "$(pick min "${b[@]}")") |"
  done
  echo
}
if [ "$tap_io_ab" = 1 ]; then
  ab_rows virtnet syscalls "virtnet --tap-io uring" "virtnet --tap-io syscalls"
fi
if [ -n "$against" ]; then
  ab_rows virtnet against "virtnet backend --tap ($virtnet)" "the same, $against"
fi

declare -A ceil
if [ "$ceiling" = 1 ]; then
  echo "| ceiling (C loop on CPU $dev_cpu, counted at the TAP) | frames | median (each run) | best | worst | virtnet backend --tap / ceiling (medians) |"
  echo "|---|---|---|---|---|---|"
  for c in "write 64 tx" "write 1500 tx" "uwrite 64 -" "swrite 64 -" "read 64 rx" "read 1500 rx" \
    "uread 64 -" "tso 65000 -" "uso 65000 -"; do
    read -r mode size dir <<<"$c"
    v=()
    for _ in $(seq "$rounds"); do run_ceiling "$mode" "$size"; v+=("$(cat "$work/result")"); done
    m=$(pick median "${v[@]}")
    ceil[$mode]=$m
    case "$mode" in
      write) what="one writev per frame, Mpps (guest → host)" ;;
      uwrite) what="io_uring: 32 writev per io_uring_enter, Mpps (guest → host)" ;;
      swrite) what="io_uring with SQPOLL: 32 writev per batch, Mpps (guest → host)" ;;
      read) what="one read per frame, trafgen sending, Mpps (host → guest)" ;;
      uread) what="io_uring: 32 reads kept posted, trafgen sending, Mpps (host → guest)" ;;
      tso) what="one writev per TSO super-frame, Gbit/s" ;;
      uso) what="one writev per USO super-frame, Gbit/s" ;;
    esac
    vs="–"
    [ "$dir" != - ] && [ -n "${ours[$dir-$size]:-}" ] && vs=$(ratio "${ours[$dir-$size]}" "$m")
    echo "| $what | $size B | $m (${v[*]}) | $(pick max "${v[@]}") | $(pick min "${v[@]}") | $vs |"
  done
  echo
fi

if [ "$offload" = 1 ]; then
  mib=$(awk -v n="$offload_frames" 'BEGIN {printf "%.1f", n * 65000 / 1048576}')
  echo "| offload stream, $offload_frames super-frames in flight (~$mib MiB) | virtnet gen → virtnet backend --tap, Gbit/s at the TAP: median (each run) | ceiling loop from $offload_frames buffers (each run) | ratio of medians | of bests | of worsts | Gbit/s by gen (each run) | / one-buffer ceiling (--ceiling) |"
  echo "|---|---|---|---|---|---|---|---|"
  for proto in tcp udp; do
    key=tso
    [ "$proto" = udp ] && key=uso
    # (Names of their own: sample_tap sets c.)
    odev=(); oceil=(); ogen=(); na=
    for r in $(seq "$rounds"); do
      # A/B, then B/A.
      order="device ceiling"
      [ $((r % 2)) = 0 ] && order="ceiling device"
      for which in $order; do
        if [ "$which" = ceiling ]; then
          run_ceiling "$key" 65000 "$offload_frames"; oceil+=("$(cat "$work/result")")
          continue
        fi
        run_offload "$proto"
        if grep -q '^n/a' "$work/result"; then na=$(cat "$work/result"); break 2; fi
        read -r a b <"$work/result"; odev+=("$a"); ogen+=("$b")
      done
    done
    what="--gso $proto --size 65000"
    if [ -n "$na" ]; then
      echo "| $what | $na | | | | | | |"
      continue
    fi
    m=$(pick median "${odev[@]}"); mc=$(pick median "${oceil[@]}")
    vs="–"
    [ -n "${ceil[$key]:-}" ] && vs=$(ratio "$m" "${ceil[$key]}")
    echo "| $what | $m (${odev[*]}) | $mc (${oceil[*]}) | $(ratio "$m" "$mc") |" \
      "$(ratio "$(pick max "${odev[@]}")" "$(pick max "${oceil[@]}")") |" \
      "$(ratio "$(pick min "${odev[@]}")" "$(pick min "${oceil[@]}")") | ${ogen[*]} | $vs |"
  done
  echo
fi

if [ "$tcp_rx" = 1 ]; then
  tcp_py
  in_ns ip addr add 198.18.0.2/24 dev "$our_tap"
  in_ns ip neigh add 198.18.0.1 lladdr "$guest_mac" dev "$our_tap" nud permanent
  s=(); t=(); w=(); l=()
  for _ in $(seq "$rounds"); do
    run_tcp_rx
    read -r a b c <"$work/result"; s+=("$a"); t+=("$b"); w+=("$c")
    run_tcp_loopback
    l+=("$(cat "$work/result")")
  done
  # The address only for this part: testpmd's txonly frames go to 198.18.0.2.
  in_ns ip neigh del 198.18.0.1 dev "$our_tap"
  in_ns ip addr del 198.18.0.2/24 dev "$our_tap"
  m=$(pick median "${s[@]}")
  lm=$(pick median "${l[@]}")
  echo "| host → guest TCP stream | Gbit/s at the sender: median (each run) | Gbit/s at the TAP (each run) | every byte in order at the sink (each run) | loopback TCP, same CPUs: Gbit/s (each run) | device / loopback (medians) |"
  echo "|---|---|---|---|---|---|"
  echo "| python3 sender → TAP → virtnet backend → virtnet gen --mode tcp-sink | $m (${s[*]}) | $(pick median "${t[@]}") (${t[*]}) | ${w[*]} | $lm (${l[*]}) | $(ratio "$m" "$lm") |"
  echo
fi

if [ "$zero_loss" != 0 ]; then
  run_zero_loss "$zero_loss"
  read -r sent at_tap dropped pushback <"$work/result"
  echo "| zero loss: $zero_loss s of 64 B guest → host at full rate | sent by the guest | at the TAP | dropped by the backend | TAP push-backs |"
  echo "|---|---|---|---|---|"
  echo "| virtnet backend --tap | $sent | $at_tap | $dropped | $pushback |"
  echo
fi
