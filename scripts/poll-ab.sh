#!/bin/bash
# Two busy-poll settings of one backend, in turn (A B, B A, ...), on one load from a shell:
# the backend's worker on CPU 1, `virtnet gen` (interrupt mode) on CPU 0.
#   rr      echo io, `gen --mode rr`, 64 B: transactions/s
#   bursty  the same in bursts (`--on-off 2:8`)
#   stream  null io, `gen --mode txonly --size 1500`: Gbit/s
# Usage: scripts/poll-ab.sh LOAD A B [ROUNDS [SECONDS]]   (4 rounds of 2 s; e.g. stream auto 50;
# needs a release build, or VIRTNET_BIN; VIRTNET_BACKEND_ARGS adds backend options)
# Prints one line per run: the setting, the rate, the driver's kicks and interrupts per packet,
# the backend's busy-poll counters (hits, timeouts, turns skipped, contention stops), and the
# steal time of CPUs 0 and 1 over the run (the hypervisor running something else).
root=$(cd "$(dirname "$0")/.." && pwd)
B=${VIRTNET_BIN:-$root/target/release/virtnet}
load=$1 a=$2 b=$3 rounds=${4:-4} secs=${5:-2}
case "$load" in
  rr) io=echo; gen=(--mode rr) ;;
  bursty) io=echo; gen=(--mode rr --on-off 2:8) ;;
  stream) io=null; gen=(--mode txonly --size 1500) ;;
  *) echo "usage: $0 rr|bursty|stream A B [ROUNDS [SECONDS]]" >&2; exit 2 ;;
esac
w=$(mktemp -d /tmp/vnt-poll-ab-XXXX)
be=
trap '[ -n "$be" ] && kill -TERM $be 2>/dev/null; rm -rf "$w"' EXIT
one() { # setting
  rm -f $w/be.sock $w/be.ctl
  $B backend --io $io --socket-path $w/be.sock --worker-cpu 1 --busy-poll "$1" --ctl $w/be.ctl \
    $VIRTNET_BACKEND_ARGS >$w/be.log 2>&1 &
  be=$!
  for _ in $(seq 50); do [ -S $w/be.sock ] && [ -S $w/be.ctl ] && break; sleep 0.1; done
  grep -E '^cpu[01] ' /proc/stat >$w/stat0
  taskset -c 0 $B gen --socket $w/be.sock "${gen[@]}" --duration "$secs" --json >$w/gen.json \
    2>/dev/null
  grep -E '^cpu[01] ' /proc/stat >$w/stat1
  $B ctl --socket $w/be.ctl stats >$w/stats.json
  kill -TERM $be; wait $be 2>/dev/null; be=
  L=$load S=$1 W=$w python3 - <<'PY'
import json, os
w, load = os.environ['W'], os.environ['L']
g = json.load(open(f'{w}/gen.json'))
s = g['summary']
rate = ('%8.2f Gbit/s' % s['tx_gbps']) if load == 'stream' else (
    '%8.0f transactions/s' % (sum(p['round_trips'] for p in g['per_pair']) / g['elapsed_s']))
qs = json.load(open(f'{w}/stats.json'))['queues']
c = lambda k: sum(q.get(k, 0) for q in qs)
# Steal: the share of each vCPU's time the hypervisor gave to others while it wanted to run
# (field 8 of /proc/stat's cpuN lines, in clock ticks of 1/100 s).
steal = lambda f: [int(l.split()[8]) for l in open(f)]
st = [(b - a) / (100 * g['elapsed_s']) for a, b in zip(steal(f'{w}/stat0'), steal(f'{w}/stat1'))]
print('%-5s %s  kicks/pkt %.5f irq/pkt %.5f  hits %d timeouts %d skipped %d contended %d'
      '  steal %s' % (
    os.environ['S'], rate, s['kicks_per_packet'], s['interrupts_per_packet'],
    c('busy_poll_hits'), c('busy_poll_timeouts'), c('busy_poll_skipped'),
    c('busy_poll_contended'), '/'.join('%.0f%%' % (100 * x) for x in st)))
PY
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then one "$a"; one "$b"; else one "$b"; one "$a"; fi
done
