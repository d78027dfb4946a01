#!/usr/bin/env bash
# Whether the guests or the switch set the guest-to-guest figure (issue 39: "the same guest
# against a forwarder that does nothing else"). Builds virtnet with the `ab` feature and
# descriptors-only.patch applied (in a scratch worktree of HEAD: nothing in this tree changes),
# whose variant B pops each frame's descriptors on one side and the other, writes a header and
# completes both, reading, classifying and copying no byte of the frame; then runs
# scripts/switch-compare.sh with it as a third arm (`--null`), A/B/N/A/B/N, so the table gives
# the switch, testpmd's two net_vhost ports and that forwarder with the same guests.
#
# Usage: scripts/ab/descriptors-only.sh [switch-compare.sh options...]
# Needs root and dpdk-dev, as switch-compare.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
target=$root/target/ab-descriptors-only
tree=$(mktemp -d /tmp/vnt-null-XXXX)
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
git -C "$root" worktree add -q --detach "$tree" HEAD
git -C "$tree" apply "$root/scripts/ab/descriptors-only.patch"
(cd "$tree" && cargo build --release -q -p virtnet-cli --features virtnet-backend/ab \
  --target-dir "$target")
bash "$root/scripts/switch-compare.sh" --null "$target/release/virtnet" "$@"
