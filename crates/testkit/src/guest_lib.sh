# /lib/vn.sh: helpers sourced before the test script (which runs under `sh -e`).
#
# Variables: VN_IF (the interface), VN_IP and every other vn_KEY=VALUE of the kernel command
# line as VN_KEY.

# vn_result KEY VALUE: a result the host reads as GuestRun::result("KEY").
vn_result() {
    echo "@@VN:RESULT $1=$2@@"
}

# vn_mark TEXT: a progress marker the host can wait for (Guest::wait_marker).
vn_mark() {
    echo "@@VN:MARK $*@@"
}

# vn_counter NAME: one counter of the interface, e.g. vn_counter rx_packets.
vn_counter() {
    cat "/sys/class/net/$VN_IF/statistics/$1"
}
