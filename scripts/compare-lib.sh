# Sourced by the comparison scripts (dpdk-compare.sh, switch-compare.sh, tap-compare.sh):
# the binary under test, DPDK's testpmd, and the medians and ratios of their tables.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
virtnet=${VIRTNET_BIN:-$root/target/release/virtnet}
[ -x "$virtnet" ] || (cd "$root" && cargo build --release -p virtnet-cli >&2)

# Installs DPDK (dpdk-dev: testpmd) when it is missing.
need_testpmd() {
  command -v dpdk-testpmd >/dev/null || {
    apt-get update >&2 && apt-get install -y --no-install-recommends dpdk-dev >&2
  }
}

# Stops the processes given: SIGINT (testpmd's clean exit) and SIGTERM, a second's grace, then
# SIGKILL for any that are left.
stop_all() { # pids...
  local p
  for p in "$@"; do kill -INT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done
}

# The rates of one pair jump between two or three levels from run to run and even within a
# run (on AMD EPYC vCPUs by up to 3x, for DPDK's device as for ours), so besides the ratio of
# the medians the tables give the ratio of the best runs and of the worst runs: each compares
# the two at the same level when both had a run there.
pick() { # median|max|min values...
  local how=$1; shift
  printf '%s\n' "$@" | sort -n | awk -v how="$how" '{v[NR]=$1}
    END {print (how == "max") ? v[NR] : (how == "min") ? v[1] : v[int((NR+1)/2)]}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
