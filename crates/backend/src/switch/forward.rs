//! The forwarding decision for one frame (a Linux bridge's `br_handle_frame_finish`; VPP's
//! `l2-learn`, `l2-fwd` and `l2-flood` nodes in one pass): given the port it came from and the
//! addresses of its Ethernet header, where it goes. And the table of ports the decision reads:
//! each port's address, port security and receive filter.
//!
//! In order:
//! 1. **Source checks.** A source that is multicast or zero is dropped (as Linux does). Port
//!    security: a port with spoof-check on ([`PortAddress::Checked`]) sends only from its own
//!    MAC; a frame from any other is dropped. A source that is another port's own MAC is
//!    dropped too: a loop bringing a local guest's frame back, or an impersonation (VPP drops
//!    these as MAC move violations; Linux only warns).
//! 2. **Learning** the source ([`FdbRead::try_learn`]); when that needs the write lock the
//!    decision hands the caller a [`Learn`] for [`Fdb::learn`](super::fdb::Fdb::learn) after
//!    its batch. A frame dropped in step 3 or 4 is still learned from, as a bridge does.
//! 3. **Destination.** A known unicast goes to its port alone; a destination known on the
//!    source port itself is dropped (hairpin off: the frame is already on that segment).
//!    Unknown unicast, broadcast and multicast are flooded to every other port, the uplink
//!    included; never back to the source.
//! 4. **Receive filters.** Each destination port's [`RxFilter`] takes or refuses the frame,
//!    as its virtio-net device would; a frame no port takes is dropped. The running switch
//!    keeps these promiscuous and applies each guest's own filter where it delivers
//!    (`Shared::accepts`, the backend's, fed by the guest's control queue); [`Ports::set_filter`]
//!    serves the model and the tests of this step.
//!
//! Drops are counted per source port, by reason ([`PortCounters`]). The decision allocates
//! nothing: destinations are a [`PortSet`], which the caller walks to batch its output per port.
//!
//! **Concurrency.** [`Ports`] changes rarely (a port added or removed, a guest's control-queue
//! command) and is read for every frame: the caller keeps it behind an `RwLock`, and a worker
//! takes its read lock, then the FDB's ([`Fdb::read`](super::fdb::Fdb::read)), once per batch.
//! `Ports::add` and `remove` take the FDB's write lock while the caller holds the port table's:
//! always in that order.

use super::error::SwitchError;
use super::fdb::{Fdb, FdbRead, Learn, Learned, Refusal};
use super::filter::RxFilter;
use super::mac::Mac;
use super::port::{PortId, PortSet, MAX_PORTS};
use super::tick::Tick;

/// A port's own address and whether it may send from others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortAddress {
    /// No MAC of its own (the TAP uplink): sends from any source, learned like any port's.
    None,
    /// Its own MAC, and the only source it may send from (port security: spoof-check on).
    Checked(Mac),
    /// Its own MAC, but it may send from others (spoof-check off: a guest that bridges or
    /// routes for others, whose sources are learned).
    Unchecked(Mac),
}

impl PortAddress {
    pub fn mac(self) -> Option<Mac> {
        match self {
            PortAddress::None => None,
            PortAddress::Checked(m) | PortAddress::Unchecked(m) => Some(m),
        }
    }
}

/// How a port is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortConfig {
    pub address: PortAddress,
    /// The most MACs it learns (its own aside): FDB entries reserved for it.
    pub learn_limit: usize,
}

impl PortConfig {
    /// A guest with port security: it sends from `mac` only, so it learns nothing.
    pub fn guest(mac: Mac) -> PortConfig {
        PortConfig {
            address: PortAddress::Checked(mac),
            learn_limit: 0,
        }
    }

    /// The TAP uplink: the host and the LAN behind it, from up to `learn_limit` MACs.
    pub fn uplink(learn_limit: usize) -> PortConfig {
        PortConfig {
            address: PortAddress::None,
            learn_limit,
        }
    }
}

vnet::counters! {
    /// Frames from one port that the switch dropped, by reason. Bumped by the port's workers.
    pub struct PortCounters / PortCountersSnapshot of SharedCounter {
        /// From a multicast or zero source.
        invalid_source,
        /// From another source than the port's own MAC, with spoof-check on.
        spoofed,
        /// From another port's own MAC.
        static_source,
        /// To a MAC on the port itself.
        hairpin,
        /// Refused by the receive filter of every port it was for.
        filtered,
        /// Nowhere to go: no other port on the switch.
        no_destination,
    }
}

#[derive(Debug)]
struct Port {
    config: PortConfig,
    filter: RxFilter,
    counters: PortCounters,
}

/// The switch's ports: what the forwarding decision needs of each.
#[derive(Debug)]
pub struct Ports {
    ports: Vec<Option<Port>>,
    present: PortSet,
}

impl Default for Ports {
    fn default() -> Ports {
        Ports::new()
    }
}

impl Ports {
    pub fn new() -> Ports {
        Ports {
            ports: (0..MAX_PORTS).map(|_| None).collect(),
            present: PortSet::EMPTY,
        }
    }

    fn get(&self, id: PortId) -> Option<&Port> {
        self.ports[id.index()].as_ref()
    }

    /// Attaches port `id` to the switch and to `fdb` (its own MAC a static entry, its learn
    /// limit reserved), with a promiscuous filter until its driver sets one, as QEMU starts a
    /// virtio-net device.
    pub fn add(
        &mut self,
        fdb: &Fdb,
        id: PortId,
        config: PortConfig,
        now: Tick,
    ) -> Result<(), SwitchError> {
        if self.present.contains(id) {
            return Err(SwitchError::PortExists { port: id });
        }
        fdb.add_port(id, config.address.mac(), config.learn_limit, now)?;
        self.ports[id.index()] = Some(Port {
            config,
            filter: RxFilter::promiscuous(config.address.mac()),
            counters: PortCounters::default(),
        });
        self.present.insert(id);
        Ok(())
    }

    /// Detaches port `id`, and removes its FDB entries. False if it was not attached.
    pub fn remove(&mut self, fdb: &Fdb, id: PortId) -> bool {
        fdb.remove_port(id);
        self.present.remove(id);
        self.ports[id.index()].take().is_some()
    }

    /// Sets port `id`'s receive filter (its driver sent an RX or MAC command). False if it is
    /// not attached.
    pub fn set_filter(&mut self, id: PortId, filter: RxFilter) -> bool {
        match self.ports[id.index()].as_mut() {
            Some(p) => {
                p.filter = filter;
                true
            }
            None => false,
        }
    }

    pub fn filter(&self, id: PortId) -> Option<&RxFilter> {
        self.get(id).map(|p| &p.filter)
    }

    pub fn config(&self, id: PortId) -> Option<PortConfig> {
        self.get(id).map(|p| p.config)
    }

    pub fn counters(&self, id: PortId) -> Option<&PortCounters> {
        self.get(id).map(|p| &p.counters)
    }

    /// The attached ports.
    pub fn present(&self) -> PortSet {
        self.present
    }
}

/// What the decision needs of a frame: the addresses of its Ethernet header (the caller
/// copies the header out of guest memory once) and whether it is an announcement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub dst: Mac,
    pub src: Mac,
    /// A RARP, or a gratuitous ARP from `src`: the caller recognises them; the FDB moves the
    /// source at once.
    pub announce: bool,
}

/// Why a frame goes nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The source port is not attached (the caller's mistake; not counted).
    NoSuchPort,
    InvalidSource,
    Spoofed,
    StaticSource,
    Hairpin,
    Filtered,
    NoDestination,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// To these ports, never empty, never the source.
    Forward(PortSet),
    Drop(DropReason),
}

/// Where a frame goes, and what is left to learn from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The source needs the FDB's write lock: pass it to `Fdb::learn` once the batch's
    /// [`FdbRead`] is dropped.
    pub learn: Option<Learn>,
}

impl Decision {
    fn drop(reason: DropReason, learn: Option<Learn>) -> Decision {
        Decision {
            verdict: Verdict::Drop(reason),
            learn,
        }
    }
}

/// Decides where `frame`, from port `from`, goes (see the module documentation), under the
/// batch's read locks.
pub fn decide(ports: &Ports, fdb: &FdbRead<'_>, from: PortId, frame: Frame, now: Tick) -> Decision {
    let Some(source) = ports.get(from) else {
        return Decision::drop(DropReason::NoSuchPort, None);
    };
    let counters = &source.counters;
    if !frame.src.is_valid_source() {
        counters.invalid_source.add(1);
        return Decision::drop(DropReason::InvalidSource, None);
    }
    if let PortAddress::Checked(own) = source.config.address {
        if frame.src != own {
            counters.spoofed.add(1);
            return Decision::drop(DropReason::Spoofed, None);
        }
    }
    let req = Learn {
        mac: frame.src,
        port: from,
        announce: frame.announce,
    };
    let learn = match fdb.try_learn(req, now) {
        None => Some(req),
        Some(Learned::Refused(Refusal::Static { .. })) => {
            counters.static_source.add(1);
            return Decision::drop(DropReason::StaticSource, None);
        }
        Some(_) => None,
    };

    let mut flood = ports.present;
    flood.remove(from);
    let candidates = if frame.dst.is_multicast() {
        flood
    } else {
        match fdb.lookup(frame.dst) {
            Some(to) if to == from => {
                counters.hairpin.add(1);
                return Decision::drop(DropReason::Hairpin, learn);
            }
            // A port the FDB knows but the port table no longer has: flooded, as unknown.
            Some(to) if ports.present.contains(to) => PortSet::one(to),
            _ => flood,
        }
    };
    if candidates.is_empty() {
        counters.no_destination.add(1);
        return Decision::drop(DropReason::NoDestination, learn);
    }
    // Most filters take everything (promiscuous, the driver's default): only those that do
    // not are looked at per destination.
    let mut to = candidates;
    for p in candidates.iter() {
        if !ports.get(p).is_some_and(|p| p.filter.accepts(frame.dst)) {
            to.remove(p);
        }
    }
    if to.is_empty() {
        counters.filtered.add(1);
        return Decision::drop(DropReason::Filtered, learn);
    }
    Decision {
        verdict: Verdict::Forward(to),
        learn,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::fdb::FdbConfig;
    use super::*;

    const UPLINK: usize = 0;
    const GROUP: Mac = Mac::new([0x01, 0x00, 0x5e, 0, 0, 1]);

    fn p(n: usize) -> PortId {
        PortId::new(n).unwrap()
    }

    fn mac(n: u64) -> Mac {
        Mac::from_u64(0x02 | n << 8)
    }

    fn set(ports: &[usize]) -> PortSet {
        ports.iter().map(|n| p(*n)).collect()
    }

    fn now() -> Tick {
        Tick::from_millis(1_000)
    }

    /// The uplink (port 0) and guests 1, 2, 3 with port security, each guest n with MAC
    /// `mac(n)`.
    fn switch() -> (Fdb, Ports) {
        let fdb = Fdb::new(FdbConfig {
            capacity: 1024,
            age: Duration::from_secs(300),
            move_hold: Duration::from_secs(1),
        })
        .unwrap();
        let mut ports = Ports::new();
        ports
            .add(&fdb, p(UPLINK), PortConfig::uplink(64), now())
            .unwrap();
        for n in 1..=3 {
            let config = PortConfig::guest(mac(n as u64));
            ports.add(&fdb, p(n), config, now()).unwrap();
        }
        (fdb, ports)
    }

    /// Decides, then learns what the decision leaves to learn, as a worker does after its batch.
    fn send(fdb: &Fdb, ports: &Ports, from: usize, dst: Mac, src: Mac) -> Decision {
        let frame = Frame {
            dst,
            src,
            announce: false,
        };
        let d = decide(ports, &fdb.read(), p(from), frame, now());
        if let Some(l) = d.learn {
            fdb.learn(l, now());
        }
        d
    }

    fn forward(ports: &[usize]) -> Verdict {
        Verdict::Forward(set(ports))
    }

    fn closed(own: Mac) -> RxFilter {
        let mut f = RxFilter::promiscuous(Some(own));
        f.promisc = false;
        f
    }

    fn dropped(ports: &Ports, n: usize) -> PortCountersSnapshot {
        ports.counters(p(n)).unwrap().snapshot()
    }

    #[test]
    fn known_unicast_goes_to_its_port_only() {
        let (fdb, ports) = switch();
        let d = send(&fdb, &ports, 1, mac(2), mac(1));
        assert_eq!(d.verdict, forward(&[2]));
        // A host on the uplink, once learned, is reached there alone.
        let host = mac(100);
        assert_eq!(
            send(&fdb, &ports, UPLINK, mac(1), host).verdict,
            forward(&[1])
        );
        assert_eq!(
            send(&fdb, &ports, 3, host, mac(3)).verdict,
            forward(&[UPLINK])
        );
    }

    #[test]
    fn unknown_unicast_broadcast_and_multicast_flood_to_every_other_port() {
        let (fdb, ports) = switch();
        for dst in [mac(99), Mac::BROADCAST, GROUP] {
            let d = send(&fdb, &ports, 2, dst, mac(2));
            assert_eq!(d.verdict, forward(&[UPLINK, 1, 3]), "{dst}");
            let d = send(&fdb, &ports, UPLINK, dst, mac(100));
            assert_eq!(d.verdict, forward(&[1, 2, 3]), "{dst}");
        }
    }

    #[test]
    fn a_frame_to_its_own_port_is_dropped_yet_learned_from() {
        let (fdb, ports) = switch();
        let host = mac(100);
        send(&fdb, &ports, UPLINK, Mac::BROADCAST, mac(101));
        let d = send(&fdb, &ports, UPLINK, mac(101), host);
        assert_eq!(d.verdict, Verdict::Drop(DropReason::Hairpin));
        assert!(d.learn.is_some(), "the source is new");
        assert_eq!(fdb.read().lookup(host), Some(p(UPLINK)));
        assert_eq!(dropped(&ports, UPLINK).hairpin, 1);
        // A guest's frame to itself too.
        let d = send(&fdb, &ports, 1, mac(1), mac(1));
        assert_eq!(d.verdict, Verdict::Drop(DropReason::Hairpin));
    }

    #[test]
    fn receive_filters_apply_per_destination() {
        let (fdb, mut ports) = switch();
        // Guest 1 promisc off; guest 2 promisc off but all-multicast; guest 3 promiscuous.
        ports.set_filter(p(1), closed(mac(1)));
        let mut f2 = closed(mac(2));
        f2.allmulti = true;
        ports.set_filter(p(2), f2);
        let from_uplink = |dst| send(&fdb, &ports, UPLINK, dst, mac(100)).verdict;
        assert_eq!(from_uplink(Mac::BROADCAST), forward(&[1, 2, 3]));
        assert_eq!(from_uplink(GROUP), forward(&[2, 3]));
        assert_eq!(from_uplink(mac(99)), forward(&[3]), "unknown unicast");
        assert_eq!(from_uplink(mac(1)), forward(&[1]));
        // Guest 1 joins the group through MAC_TABLE_SET.
        let mut f1 = closed(mac(1));
        f1.set_mac_table(&[], &[GROUP]);
        ports.set_filter(p(1), f1);
        assert_eq!(
            send(&fdb, &ports, 3, GROUP, mac(3)).verdict,
            forward(&[UPLINK, 1, 2])
        );
        assert_eq!(dropped(&ports, UPLINK).filtered, 0);
    }

    #[test]
    fn a_frame_every_destination_refuses_is_dropped_and_counted() {
        let (fdb, mut ports) = switch();
        // Guest 1 changed its address (MAC_ADDR_SET) and dropped promiscuous mode: frames to
        // the MAC the switch knows it by are refused.
        ports.set_filter(p(1), closed(mac(50)));
        let d = send(&fdb, &ports, 2, mac(1), mac(2));
        assert_eq!(d.verdict, Verdict::Drop(DropReason::Filtered));
        let mut nobcast = closed(mac(1));
        nobcast.nobcast = true;
        for n in [1, 3] {
            ports.set_filter(p(n), nobcast.clone());
        }
        ports.set_filter(p(UPLINK), nobcast);
        let d = send(&fdb, &ports, 2, Mac::BROADCAST, mac(2));
        assert_eq!(d.verdict, Verdict::Drop(DropReason::Filtered));
        assert_eq!(dropped(&ports, 2).filtered, 2);
    }

    #[test]
    fn spoofed_sources_are_dropped_and_counted_unless_spoof_check_is_off() {
        let (fdb, mut ports) = switch();
        let d = send(&fdb, &ports, 1, Mac::BROADCAST, mac(77));
        assert_eq!(d, Decision::drop(DropReason::Spoofed, None));
        assert_eq!(dropped(&ports, 1).spoofed, 1);
        assert_eq!(fdb.read().lookup(mac(77)), None, "not learned");
        // Guest 4, spoof-check off, may send for others; they are learned.
        let config = PortConfig {
            address: PortAddress::Unchecked(mac(4)),
            learn_limit: 8,
        };
        ports.add(&fdb, p(4), config, now()).unwrap();
        let d = send(&fdb, &ports, 4, Mac::BROADCAST, mac(77));
        assert_eq!(d.verdict, forward(&[UPLINK, 1, 2, 3]));
        assert_eq!(fdb.read().lookup(mac(77)), Some(p(4)));
        // The uplink has no spoof-check: any source.
        let d = send(&fdb, &ports, UPLINK, Mac::BROADCAST, mac(78));
        assert_eq!(d.verdict, forward(&[1, 2, 3, 4]));
        assert_eq!(dropped(&ports, UPLINK), PortCountersSnapshot::default());
    }

    #[test]
    fn multicast_and_zero_sources_are_dropped() {
        let (fdb, ports) = switch();
        for src in [GROUP, Mac::BROADCAST, Mac::ZERO] {
            let d = send(&fdb, &ports, UPLINK, mac(1), src);
            assert_eq!(d, Decision::drop(DropReason::InvalidSource, None));
        }
        assert_eq!(dropped(&ports, UPLINK).invalid_source, 3);
        assert_eq!(fdb.len(), 3, "the guests' own MACs only");
    }

    #[test]
    fn a_guests_own_mac_from_another_port_is_dropped() {
        let (fdb, ports) = switch();
        // Looped back, or impersonated, on the uplink.
        let d = send(&fdb, &ports, UPLINK, Mac::BROADCAST, mac(1));
        assert_eq!(d, Decision::drop(DropReason::StaticSource, None));
        assert_eq!(dropped(&ports, UPLINK).static_source, 1);
        assert_eq!(fdb.read().lookup(mac(1)), Some(p(1)));
    }

    #[test]
    fn the_decision_leaves_only_writes_to_learn() {
        let (fdb, ports) = switch();
        let frame = Frame {
            dst: Mac::BROADCAST,
            src: mac(100),
            announce: false,
        };
        let decide_now = || decide(&ports, &fdb.read(), p(UPLINK), frame, now());
        let want = Learn {
            mac: mac(100),
            port: p(UPLINK),
            announce: false,
        };
        assert_eq!(decide_now().learn, Some(want));
        assert_eq!(fdb.learn(want, now()), Learned::New);
        assert_eq!(decide_now().learn, None, "refreshed under the read lock");
        // A guest's own MAC is known from the start.
        let d = send(&fdb, &ports, 1, Mac::BROADCAST, mac(1));
        assert_eq!(d.learn, None);
    }

    #[test]
    fn an_announcement_moves_its_source_at_once() {
        let (fdb, mut ports) = switch();
        let config = PortConfig {
            address: PortAddress::Unchecked(mac(4)),
            learn_limit: 8,
        };
        ports.add(&fdb, p(4), config, now()).unwrap();
        // A nested VM behind guest 4, known there, migrates behind the uplink.
        let nested = mac(200);
        send(&fdb, &ports, 4, Mac::BROADCAST, nested);
        let plain = send(&fdb, &ports, UPLINK, Mac::BROADCAST, nested);
        assert_eq!(plain.learn, None, "held");
        assert_eq!(fdb.read().lookup(nested), Some(p(4)));
        let rarp = Frame {
            dst: Mac::BROADCAST,
            src: nested,
            announce: true,
        };
        let d = decide(&ports, &fdb.read(), p(UPLINK), rarp, now());
        assert_eq!(d.verdict, forward(&[1, 2, 3, 4]));
        let l = d.learn.expect("a move");
        assert!(l.announce);
        assert_eq!(fdb.learn(l, now()), Learned::Moved { from: p(4) });
        assert_eq!(
            send(&fdb, &ports, 1, nested, mac(1)).verdict,
            forward(&[UPLINK])
        );
    }

    #[test]
    fn a_port_alone_has_nowhere_to_send() {
        let fdb = Fdb::new(FdbConfig::default()).unwrap();
        let mut ports = Ports::new();
        ports
            .add(&fdb, p(5), PortConfig::guest(mac(5)), now())
            .unwrap();
        let d = send(&fdb, &ports, 5, Mac::BROADCAST, mac(5));
        assert_eq!(d.verdict, Verdict::Drop(DropReason::NoDestination));
        assert_eq!(dropped(&ports, 5).no_destination, 1);
        let d = send(&fdb, &ports, 6, Mac::BROADCAST, mac(6));
        assert_eq!(d, Decision::drop(DropReason::NoSuchPort, None));
    }

    #[test]
    fn a_removed_port_receives_nothing_and_its_mac_is_unknown_again() {
        let (fdb, mut ports) = switch();
        assert!(ports.remove(&fdb, p(2)));
        assert!(!ports.remove(&fdb, p(2)));
        assert_eq!(ports.present(), set(&[UPLINK, 1, 3]));
        assert_eq!(fdb.read().lookup(mac(2)), None);
        let d = send(&fdb, &ports, 1, mac(2), mac(1));
        assert_eq!(d.verdict, forward(&[UPLINK, 3]), "flooded as unknown");
        assert!(!ports.set_filter(p(2), closed(mac(2))));
        assert_eq!(ports.counters(p(2)).map(|c| c.snapshot()), None);
        // Re-added, with another MAC.
        ports
            .add(&fdb, p(2), PortConfig::guest(mac(22)), now())
            .unwrap();
        assert_eq!(ports.config(p(2)), Some(PortConfig::guest(mac(22))));
        assert_eq!(
            ports.filter(p(2)),
            Some(&RxFilter::promiscuous(Some(mac(22))))
        );
    }

    #[test]
    fn adding_a_port_twice_or_with_a_taken_mac_is_refused_and_changes_nothing() {
        let (fdb, mut ports) = switch();
        let err = ports.add(&fdb, p(1), PortConfig::guest(mac(9)), now());
        assert_eq!(err, Err(SwitchError::PortExists { port: p(1) }));
        let err = ports.add(&fdb, p(9), PortConfig::guest(mac(1)), now());
        assert!(matches!(err, Err(SwitchError::MacInUse { .. })), "{err:?}");
        assert_eq!(ports.present(), set(&[UPLINK, 1, 2, 3]));
        assert_eq!(ports.config(p(1)), Some(PortConfig::guest(mac(1))));
    }
}
