//! Port numbers and sets of ports. A port is one attachment to the switch: a vhost-user
//! device (one guest's virtio-net) or the TAP uplink. A frame's destinations are a
//! [`PortSet`], a fixed bitset, so a forwarding decision allocates nothing and the caller can
//! batch its output per destination port.

use std::fmt;

use serde::{Serialize, Serializer};

/// The most ports a switch has, uplink included: port numbers are `0..MAX_PORTS`.
pub const MAX_PORTS: usize = 256;

const WORDS: usize = MAX_PORTS / 64;

/// A port number, below [`MAX_PORTS`]: checked once, by [`PortId::new`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId(u16);

impl PortId {
    /// Port `n`, or None when `n` is not below [`MAX_PORTS`].
    pub const fn new(n: usize) -> Option<PortId> {
        if n < MAX_PORTS {
            Some(PortId(n as u16))
        } else {
            None
        }
    }

    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port {}", self.0)
    }
}

impl Serialize for PortId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u16(self.0)
    }
}

/// A set of ports: [`MAX_PORTS`] bits, copied by value.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct PortSet([u64; WORDS]);

impl PortSet {
    pub const EMPTY: PortSet = PortSet([0; WORDS]);

    pub fn one(p: PortId) -> PortSet {
        let mut s = PortSet::EMPTY;
        s.insert(p);
        s
    }

    pub fn insert(&mut self, p: PortId) {
        self.0[p.index() / 64] |= 1 << (p.index() % 64);
    }

    pub fn remove(&mut self, p: PortId) {
        self.0[p.index() / 64] &= !(1 << (p.index() % 64));
    }

    pub fn contains(&self, p: PortId) -> bool {
        self.0[p.index() / 64] & (1 << (p.index() % 64)) != 0
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The ports in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = PortId> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(PortId((i * 64 + bit) as u16))
            })
        })
    }
}

impl fmt::Debug for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(|p| p.0)).finish()
    }
}

impl FromIterator<PortId> for PortSet {
    fn from_iter<I: IntoIterator<Item = PortId>>(iter: I) -> PortSet {
        let mut s = PortSet::EMPTY;
        iter.into_iter().for_each(|p| s.insert(p));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: usize) -> PortId {
        PortId::new(n).unwrap()
    }

    #[test]
    fn port_numbers_are_checked_once() {
        assert_eq!(p(255).index(), 255);
        assert_eq!(PortId::new(MAX_PORTS), None);
    }

    #[test]
    fn sets_hold_every_port_and_iterate_in_order() {
        let mut s = PortSet::EMPTY;
        assert!(s.is_empty());
        for n in [255, 0, 64, 63, 130] {
            s.insert(p(n));
        }
        s.insert(p(64));
        assert_eq!(s.len(), 5);
        assert!(s.contains(p(63)) && !s.contains(p(62)));
        let order: Vec<usize> = s.iter().map(PortId::index).collect();
        assert_eq!(order, [0, 63, 64, 130, 255]);
        s.remove(p(64));
        s.remove(p(1));
        assert_eq!(s, [0, 63, 130, 255].into_iter().map(p).collect());
        assert_eq!(format!("{s:?}"), "{0, 63, 130, 255}");
        assert_eq!(PortSet::one(p(7)).iter().collect::<Vec<_>>(), [p(7)]);
    }
}
