#!/bin/sh
# /init of the virtnet test guest (built by crates/testkit/src/image.rs).
#
# Mounts proc/sys/dev, loads the virtio-net modules, brings up the first ethernet interface
# with the address given as vn_ip= on the kernel command line, runs /test.sh, prints results
# between @@VN:...@@ markers on the serial console, and powers off.
# Every vn_KEY=VALUE word of the kernel command line is exported as VN_KEY=VALUE.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t devpts devpts /dev/pts

uptime() { cut -d' ' -f1 /proc/uptime; }
fail() {
    echo "@@VN:FAIL $*@@"
    echo "@@VN:DMESG-BEGIN@@"; dmesg; echo "@@VN:DMESG-END@@"
    echo "@@VN:DONE uptime=$(uptime)@@"
    poweroff -f
    sleep 10
}
echo "@@VN:INIT uptime=$(uptime)@@"

for word in $(cat /proc/cmdline); do
    case "$word" in
    vn_*=*)
        key=$(echo "${word%%=*}" | tr a-z A-Z)
        export "$key=${word#*=}"
        ;;
    esac
done

# Kernel messages would cut through the markers: keep only emergencies on the console and
# print the kernel log at the end when asked (vn_dmesg=1) or on failure.
dmesg -n 1
for m in @MODULES@; do
    [ -e "/lib/modules/$m.ko" ] || continue  # built into this kernel
    insmod "/lib/modules/$m.ko" || fail "insmod $m"
done

ip link set lo up
i=0
while :; do
    VN_IF=$(ls /sys/class/net | grep -v '^lo$' | head -n 1)
    [ -n "$VN_IF" ] && break
    i=$((i + 1)); [ $i -gt 100 ] && fail "no network interface appeared"
    sleep 0.1
done
export VN_IF
[ -n "$VN_MTU" ] && { ip link set "$VN_IF" mtu "$VN_MTU" || fail "mtu $VN_MTU"; }
[ -n "$VN_IP" ] && { ip addr add "$VN_IP" dev "$VN_IF" || fail "address $VN_IP"; }
ip link set "$VN_IF" up || fail "link up"
i=0
while [ "$(cat /sys/class/net/$VN_IF/carrier 2>/dev/null)" != 1 ]; do
    i=$((i + 1)); [ $i -gt 100 ] && fail "no carrier on $VN_IF"
    sleep 0.1
done
echo "@@VN:READY uptime=$(uptime) if=$VN_IF mac=$(cat /sys/class/net/$VN_IF/address) driver=$(basename $(readlink /sys/class/net/$VN_IF/device/driver))@@"

echo "@@VN:BEGIN@@"
timeout -s KILL "${VN_TIMEOUT:-600}" sh -e -c '. /lib/vn.sh; . /test.sh' </dev/null 2>&1
rc=$?
echo "@@VN:END rc=$rc@@"

for dir in /sys/class/net/*/statistics; do
    iface=$(basename "$(dirname "$dir")")
    [ "$iface" = lo ] && continue
    line=""
    for f in "$dir"/*; do line="$line $(basename "$f")=$(cat "$f")"; done
    echo "@@VN:STAT $iface$line@@"
done
if [ "$rc" != 0 ] || [ "$VN_DMESG" = 1 ]; then
    echo "@@VN:DMESG-BEGIN@@"; dmesg; echo "@@VN:DMESG-END@@"
fi
echo "@@VN:DONE uptime=$(uptime)@@"
poweroff -f
