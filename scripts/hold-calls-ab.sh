#!/bin/bash
# A/B: virtnet backend --hold-calls auto vs off; virtnet gen MODE SIZE in its interrupt mode.
# Usage: scripts/hold-calls-ab.sh MODE SIZE ROUNDS   (e.g. io 1500 3; needs a release build)
# The backend on CPU 1 (null io), the driver on CPU 0, 2 s a run.
root=$(cd "$(dirname "$0")/.." && pwd)
B=${VIRTNET_BIN:-$root/target/release/virtnet}
w=$(mktemp -d /tmp/vnt-hold-XXXX); trap "rm -rf $w" EXIT
mode=$1; size=$2; rounds=$3
for r in $(seq $rounds); do
 for hc in auto off; do
  s=$w/s.sock; c=$w/s.ctl; rm -f $s $c
  taskset -c 1 $B backend --socket-path $s --io null --size $size --hold-calls $hc --ctl $c --sandbox off >$w/b.log 2>&1 &
  bp=$!
  sleep 0.3
  taskset -c 0 $B gen --socket $s --mode $mode --size $size --duration 2 --json >$w/g.json 2>/dev/null
  $B ctl --socket $c stats >$w/st.json
  kill $bp; wait $bp 2>/dev/null
  W=$w HC=$hc python3 - <<'PY'
import json, os
d = json.load(open(os.environ['W'] + '/g.json')); s = d['summary']
st = json.load(open(os.environ['W'] + '/st.json'))
held = sum(q['calls_held'] for q in st['queues']); calls = sum(q['calls'] for q in st['queues'])
print(os.environ['HC'], 'rx %.2f tx %.2f Gbit/s, interrupts/packet %.5f, driver cpu %.1f%%, calls %d held %d'
      % (s.get('rx_gbps', 0), s.get('tx_gbps', 0), s.get('interrupts_per_packet', 0), d.get('cpu_pct', 0), calls, held))
PY
 done
done
