//! A port's receive filter: which destination MACs its guest wants, as the driver sets them
//! on the control virtqueue (VIRTIO 1.2 5.1.6.5.1 "Packet Receive Filtering", the RX class:
//! PROMISC, ALLMULTI and, with CTRL_RX_EXTRA, ALLUNI, NOMULTI, NOUNI, NOBCAST; 5.1.6.5.2
//! "Setting MAC Address Filtering": MAC_ADDR_SET and MAC_TABLE_SET). The switch applies it to
//! every frame it sends the port, as QEMU's virtio-net device does on receive, so a guest
//! with promiscuous mode off sees only its own unicast, broadcast and the multicast it asked
//! for.
//!
//! The forwarding decision reads an [`RxFilter`] per port; the running switch keeps every one
//! promiscuous and applies the guest's own filter at delivery (`Shared::accepts`, which the
//! control queue feeds), so this one serves the model and the decision's tests.

use vnet::ctrl::MacTable;

use super::mac::Mac;

/// Addresses a MAC_TABLE_SET list keeps, per list (vnet's [`vnet::ctrl::MacTable`], as the
/// backend's filter keeps them: QEMU's `MAC_TABLE_ENTRIES`); a longer list overflows.
pub const MAC_LIST_MAX: usize = vnet::ctrl::MAC_TABLE_ENTRIES;

/// The receive filter of one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RxFilter {
    /// RX_PROMISC: every frame, whatever the rest says.
    pub promisc: bool,
    /// RX_ALLMULTI: every multicast frame.
    pub allmulti: bool,
    /// RX_ALLUNI: every unicast frame.
    pub alluni: bool,
    /// RX_NOMULTI, RX_NOUNI, RX_NOBCAST: no multicast (broadcast aside), no unicast, no
    /// broadcast frame. They win over ALLMULTI, ALLUNI and the lists (not over PROMISC).
    pub nomulti: bool,
    pub nouni: bool,
    pub nobcast: bool,
    /// The device's own address (the config space's `mac`, then MAC_ADDR_SET's); None for a
    /// port without one, the uplink.
    pub mac: Option<Mac>,
    unicast: MacTable,
    multicast: MacTable,
}

impl RxFilter {
    /// The filter of a device whose driver has set none: promiscuous, as QEMU starts a
    /// virtio-net device (and as the uplink, whose kernel does its own filtering, stays).
    pub fn promiscuous(mac: Option<Mac>) -> RxFilter {
        RxFilter {
            promisc: true,
            allmulti: false,
            alluni: false,
            nomulti: false,
            nouni: false,
            nobcast: false,
            mac,
            unicast: MacTable::default(),
            multicast: MacTable::default(),
        }
    }

    /// MAC_TABLE_SET: the unicast and the multicast addresses the guest wants besides its
    /// own. Each list replaces the last; one longer than [`MAC_LIST_MAX`] overflows.
    pub fn set_mac_table(&mut self, unicast: &[Mac], multicast: &[Mac]) {
        let table =
            |macs: &[Mac]| MacTable::new(&macs.iter().map(|m| m.bytes()).collect::<Vec<_>>());
        self.unicast = table(unicast);
        self.multicast = table(multicast);
    }

    /// Whether the guest wants a frame sent to `dst`.
    pub fn accepts(&self, dst: Mac) -> bool {
        if self.promisc {
            true
        } else if dst.is_broadcast() {
            !self.nobcast
        } else if dst.is_multicast() {
            !self.nomulti && (self.allmulti || self.multicast.accepts(&dst.bytes()))
        } else {
            !self.nouni
                && (self.alluni || self.mac == Some(dst) || self.unicast.accepts(&dst.bytes()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: Mac = Mac::new([2, 0, 0, 0, 0, 1]);
    const OTHER: Mac = Mac::new([2, 0, 0, 0, 0, 2]);
    const LISTED: Mac = Mac::new([2, 0, 0, 0, 0, 3]);
    const GROUP: Mac = Mac::new([0x01, 0x00, 0x5e, 0, 0, 1]);
    const GROUP2: Mac = Mac::new([0x33, 0x33, 0, 0, 0, 1]);

    fn closed() -> RxFilter {
        RxFilter {
            promisc: false,
            ..RxFilter::promiscuous(Some(OWN))
        }
    }

    fn accepted(f: &RxFilter) -> [bool; 6] {
        [OWN, OTHER, LISTED, GROUP, GROUP2, Mac::BROADCAST].map(|m| f.accepts(m))
    }

    #[test]
    fn promiscuous_takes_everything_even_with_the_no_flags() {
        let mut f = RxFilter::promiscuous(None);
        f.nouni = true;
        f.nomulti = true;
        f.nobcast = true;
        assert_eq!(accepted(&f), [true; 6]);
    }

    #[test]
    fn promisc_off_takes_its_own_mac_and_broadcast() {
        assert_eq!(
            accepted(&closed()),
            [true, false, false, false, false, true]
        );
        let mut f = closed();
        f.mac = None;
        assert_eq!(accepted(&f), [false, false, false, false, false, true]);
    }

    #[test]
    fn allmulti_and_alluni_open_their_kind() {
        let mut f = closed();
        f.allmulti = true;
        assert_eq!(accepted(&f), [true, false, false, true, true, true]);
        let mut f = closed();
        f.alluni = true;
        assert_eq!(accepted(&f), [true, true, true, false, false, true]);
    }

    #[test]
    fn mac_table_lists_add_addresses_of_their_kind() {
        let mut f = closed();
        // A multicast address in the unicast list (and the reverse) matches nothing.
        f.set_mac_table(&[LISTED, GROUP2], &[GROUP, OTHER]);
        assert_eq!(accepted(&f), [true, false, true, true, false, true]);
        // Each set replaces the last.
        f.set_mac_table(&[], &[GROUP2]);
        assert_eq!(accepted(&f), [true, false, false, false, true, true]);
    }

    #[test]
    fn an_overflowing_list_accepts_its_whole_kind() {
        let mut f = closed();
        let many: Vec<Mac> = (0..=MAC_LIST_MAX as u64)
            .map(|i| Mac::from_u64(0x1000 + (i << 8)))
            .collect();
        f.set_mac_table(&many, &[]);
        assert_eq!(accepted(&f), [true, true, true, false, false, true]);
        f.set_mac_table(&many[..MAC_LIST_MAX], &many);
        // The multicast list overflowed: every group address, though `many` holds none.
        assert_eq!(accepted(&f), [true, false, false, true, true, true]);
    }

    #[test]
    fn the_no_flags_win_over_the_rest() {
        let mut f = closed();
        f.allmulti = true;
        f.alluni = true;
        f.nomulti = true;
        assert_eq!(accepted(&f), [true, true, true, false, false, true]);
        f.nobcast = true;
        assert_eq!(accepted(&f), [true, true, true, false, false, false]);
        f.nouni = true;
        f.nomulti = false;
        assert_eq!(accepted(&f), [false, false, false, true, true, false]);
    }
}
