#!/usr/bin/env bash
# Whether the guests or the switch set the guest-to-guest figure (issue 39: "the same guest
# against a forwarder that does nothing else"). Builds virtnet with the `ab` feature and one of
# the patches here applied (in a scratch worktree of HEAD: nothing in this tree changes), run in
# its variant B throughout, then runs scripts/switch-compare.sh with it as a third arm
# (`--null`), A/B/N/A/B/N, so the table gives the switch, testpmd's two net_vhost ports and that
# forwarder with the same guests:
#   descriptors-only  the switch's own ring path: each frame's descriptors popped and completed
#                     on both sides as the switch does it, a header written, no byte of a frame
#                     read, classified or copied (what the switch's data work costs)
#   raw               the least a forwarder between two split rings does: avail entries and
#                     descriptors read in three prefetched passes, a 12-byte header and a used
#                     element written per frame, nothing walked, checked or copied (the floor:
#                     when it waits for the guests, they set the figure; `virtnet ctl ports`
#                     gives its frames a batch, of 64 at most)
#
# Usage: scripts/ab/forwarder.sh descriptors-only|raw [switch-compare.sh options...]
# Needs root and dpdk-dev, as switch-compare.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
which=${1:?descriptors-only or raw}
shift
[ -f "$root/scripts/ab/$which.patch" ] || { echo "no scripts/ab/$which.patch" >&2; exit 2; }
target=$root/target/ab-$which
tree=$(mktemp -d /tmp/vnt-null-XXXX)
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
git -C "$root" worktree add -q --detach "$tree" HEAD
git -C "$tree" apply "$root/scripts/ab/$which.patch"
(cd "$tree" && cargo build --release -q -p virtnet-cli --features virtnet-backend/ab \
  --target-dir "$target")
bash "$root/scripts/switch-compare.sh" --null "$target/release/virtnet" "$@"
