#!/bin/bash
# Busy polling between two backend *processes* whose workers share CPU 0 (experiment 7's
# contended load runs both backends in one process; here auto finds the other backend's
# worker on the board of pinned workers, backend/src/siblings.rs). Each backend echoes a
# `virtnet gen --mode rr`, not pinned unless GEN_CPU names a CPU for both (as the seed pins
# each VM's vCPU away from the vhost threads' CPU).
# Usage: scripts/poll-contended.sh [ROUNDS [SECONDS [SETTING...]]]   (3, 3, off 10 50 100 auto;
# needs a release build)
# Prints, per run, the total transactions/s, the split (the slower backend's rate over the
# faster's: 1 is even), and each backend's rate and busy-poll counters.
root=$(cd "$(dirname "$0")/.." && pwd)
B=${VIRTNET_BIN:-$root/target/release/virtnet}
rounds=${1:-3}; secs=${2:-3}; shift $(($# < 2 ? $# : 2))
settings=("$@"); [ ${#settings[@]} -gt 0 ] || settings=(off 10 50 100 auto)
pin=(); [ -n "$GEN_CPU" ] && pin=(taskset -c "$GEN_CPU")
w=$(mktemp -d /tmp/vnt-contended-XXXX)
be=()
cleanup() { kill -TERM "${be[@]}" 2>/dev/null; wait "${be[@]}" 2>/dev/null; rm -rf "$w"; }
trap cleanup EXIT
one() { # setting
  be=()
  for i in 0 1; do
    $B backend --io echo --socket-path $w/$i.sock --worker-cpu 0 --busy-poll "$1" \
      --ctl $w/$i.ctl --sandbox off >$w/$i.log 2>&1 &
    be+=($!)
  done
  for _ in $(seq 50); do
    [ -S $w/0.sock ] && [ -S $w/1.sock ] && [ -S $w/0.ctl ] && [ -S $w/1.ctl ] && break
    sleep 0.1
  done
  local g=()
  for i in 0 1; do
    "${pin[@]}" $B gen --socket $w/$i.sock --mode rr --duration "$secs" --json >$w/$i.json 2>/dev/null &
    g+=($!)
  done
  wait "${g[@]}"
  for i in 0 1; do $B ctl --socket $w/$i.ctl stats >$w/$i.stats; done
  kill -TERM "${be[@]}"; wait "${be[@]}" 2>/dev/null
  rm -f $w/*.sock $w/*.ctl
  W=$w S=$1 python3 - <<'PY'
import json, os
w, total, parts, rates = os.environ['W'], 0, [], []
for i in (0, 1):
    d = json.load(open(f'{w}/{i}.json'))
    tps = sum(p['round_trips'] for p in d['per_pair']) / d['elapsed_s']
    qs = json.load(open(f'{w}/{i}.stats'))['queues']
    s = lambda k: sum(q.get(k, 0) for q in qs)
    parts.append('backend %d %6.0f/s (hits %d, timeouts %d, skipped %d, contended %d)' % (
        i, tps, s('busy_poll_hits'), s('busy_poll_timeouts'), s('busy_poll_skipped'),
        s('busy_poll_contended')))
    total += tps
    rates.append(tps)
print('%-5s total %6.0f/s, split %.2f: %s' % (
    os.environ['S'], total, min(rates) / max(max(rates), 1), '; '.join(parts)))
PY
}
for r in $(seq "$rounds"); do
  for s in "${settings[@]}"; do one "$s"; done
done
