//! The `switch_forward` seeds: flooding, known unicast and hairpin; port security and
//! learning; announcements; offloads passed on or resolved in software (checksums, TCPv4,
//! TCPv6 and UDP segmentation); malformed headers; short, tagged and odd frames; full,
//! mergeable, too small, broken and stopped rings; two pairs and receive filters; frames from
//! the host through the uplink (resolved for a guest without the offloads, flooded, learned up
//! to the uplink's limit); a guest's driver changing how many queue pairs it uses. Each is run
//! against the models (which check every step) and checked for what its name promises.

use super::{replay, write_corpus};
use crate::encode::Encode;
use crate::switch_forward::{
    self as sf, guest_mac, Body, Built, FrameSpec, Hdr, HostFrame, HostHdr, Outcome, PortSetup,
    RxSetup, Step, SwitchInput, TxFrame, L4,
};

/// A broadcast's MAC number (`switch::model::mac`), a host behind the uplink, and others.
const BCAST: u8 = 1;
const HOST: u8 = 30;

/// Bits of [`PortSetup::features`] (`switch_forward::FEATURES`).
const MRG: u16 = 1 << 0;
const CSUM: u16 = 1 << 1;
const GUEST_CSUM: u16 = 1 << 2;
const HOST_TSO4: u16 = 1 << 3;
const HOST_TSO6: u16 = 1 << 4;
const HOST_USO: u16 = 1 << 6;
const GUEST_TSO4: u16 = 1 << 7;
const GUEST_TSO6: u16 = 1 << 8;
/// What a Linux guest sends with, and takes.
const OFFLOADS: u16 = MRG | CSUM | GUEST_CSUM | HOST_TSO4 | HOST_TSO6 | GUEST_TSO4 | GUEST_TSO6;

/// A guest with spoof-check on, `features`, 16 buffers of 2048 bytes.
fn guest(features: u16) -> PortSetup {
    PortSetup {
        unchecked: false,
        learn_limit: 0,
        features,
        mtu: 0,
        filter: 0,
        two_pairs: false,
        rx: RxSetup {
            size_log2: 4,
            buffers: 16,
            lens: [2048, 2048],
            readable_at: None,
            stopped: false,
        },
    }
}

fn mac(n: usize) -> u8 {
    guest_mac(n)
}

fn built(dst: u8, src: u8, body: Body) -> Built {
    Built {
        dst,
        src,
        vlans: Vec::new(),
        body,
        cut: None,
    }
}

fn tx(hdr: Hdr, b: Built) -> TxFrame {
    TxFrame {
        hdr,
        frame: FrameSpec::Built(b),
        cuts: Vec::new(),
    }
}

fn tcp4(dst: u8, src: u8, payload: u16) -> Built {
    let l4 = L4::Tcp {
        options: 3,
        flags: 0x18,
        seq: 7,
    };
    built(
        dst,
        src,
        Body::Ipv4 {
            l4,
            options: 0,
            payload,
        },
    )
}

fn send(port: u8, frames: Vec<TxFrame>) -> Step {
    Step::Send { port, frames }
}

fn arp(src: u8, spa: u8, tpa: u8) -> Built {
    built(BCAST, src, Body::Arp { spa, tpa })
}

fn host(hdr: HostHdr, b: Built) -> HostFrame {
    HostFrame {
        hdr,
        frame: FrameSpec::Built(b),
        stale: 0x7777,
    }
}

fn from_host(frames: Vec<HostFrame>) -> Step {
    Step::Uplink { frames }
}

/// A host behind the uplink whose TCP flow to `dst` hashes to pair `pair` of two.
fn host_on_pair(dst: u8, pair: u32) -> u8 {
    (HOST..HOST + 50)
        .find(|&h| {
            let (f, _) = tcp4(dst, h, 10).bytes(false);
            // The uplink's prefix is the whole frame.
            virtnet_backend::switch::flow::hash(&f) % 2 == pair
        })
        .expect("a flow on each pair")
}

type Seed = (&'static str, SwitchInput, fn(&Outcome));

fn seeds() -> Vec<Seed> {
    let plain = |b| tx(Hdr::Plain, b);
    // Guests 0, 1, 2 (ports 1, 2, 3) and the uplink.
    let three = || vec![guest(0), guest(0), guest(0)];
    let forwarding = SwitchInput {
        uplink: Some(4),
        ports: three(),
        steps: vec![
            send(0, vec![plain(arp(mac(0), 1, 2))]),
            send(1, vec![plain(tcp4(mac(0), mac(1), 100))]),
            // To a host not known yet: flooded.
            send(2, vec![plain(tcp4(HOST, mac(2), 10))]),
            // A guest's own MAC as a destination from itself: hairpin.
            send(2, vec![plain(tcp4(mac(2), mac(2), 10))]),
        ],
    };
    let mut unchecked = guest(0);
    unchecked.unchecked = true;
    unchecked.learn_limit = 2;
    let learning = SwitchInput {
        uplink: None,
        ports: vec![guest(0), unchecked],
        steps: vec![
            // Guest 0 spoofs: dropped. Guest 1 (spoof-check off) sends from two hosts and a
            // third beyond its limit, then guest 0 reaches the first directly.
            send(0, vec![plain(tcp4(BCAST, HOST, 10))]),
            send(
                1,
                vec![
                    plain(tcp4(BCAST, HOST, 10)),
                    plain(tcp4(BCAST, HOST + 1, 10)),
                    plain(tcp4(BCAST, HOST + 2, 10)),
                    // Learned only after the batch: still flooded (to guest 0 alone).
                    plain(tcp4(HOST, mac(1), 10)),
                ],
            ),
            send(0, vec![plain(tcp4(HOST, mac(0), 10))]),
            // A source that is guest 0's own MAC, and a multicast source: dropped.
            send(1, vec![plain(tcp4(BCAST, mac(0), 10))]),
            send(1, vec![plain(tcp4(BCAST, 2, 10))]),
        ],
    };
    let mut rarp = built(BCAST, HOST, Body::Rarp);
    rarp.vlans = vec![5];
    let announce = SwitchInput {
        uplink: Some(2),
        ports: vec![guest(0), unchecked_guest()],
        steps: vec![
            // The uplink never sends here; guest 1 learns HOST, then a gratuitous ARP and a
            // tagged RARP from it move nothing (it is already there), and guest 0 finds it.
            send(1, vec![plain(arp(HOST, 9, 9)), plain(rarp)]),
            send(0, vec![plain(tcp4(HOST, mac(0), 20))]),
        ],
    };
    let offloads = SwitchInput {
        uplink: None,
        ports: vec![guest(OFFLOADS), guest(0), guest(OFFLOADS), guest(MRG)],
        steps: vec![
            send(
                0,
                vec![
                    // A TCPv4 super-frame of 4 segments: whole to guest 2, cut for 1 and 3.
                    tx(
                        Hdr::Gso {
                            mss: 1000,
                            ecn: false,
                        },
                        tcp4(BCAST, mac(0), 4000),
                    ),
                    // Its checksum asked for: finished for 1 and 3.
                    tx(Hdr::Csum, tcp4(BCAST, mac(0), 300)),
                    tx(
                        Hdr::Gso {
                            mss: 1200,
                            ecn: false,
                        },
                        built(
                            BCAST,
                            mac(0),
                            Body::Ipv6 {
                                l4: L4::Tcp {
                                    options: 0,
                                    flags: 0x19,
                                    seq: u32::MAX - 10,
                                },
                                payload: 3000,
                            },
                        ),
                    ),
                    tx(
                        Hdr::Csum,
                        built(
                            BCAST,
                            mac(0),
                            Body::Ipv6 {
                                l4: L4::Udp,
                                payload: 333,
                            },
                        ),
                    ),
                ],
            ),
            Step::Refill { port: 1 },
            Step::Refill { port: 3 },
        ],
    };
    let mut uso_sender = guest(OFFLOADS | HOST_USO);
    uso_sender.rx.buffers = 0;
    let uso = SwitchInput {
        uplink: None,
        ports: vec![uso_sender, guest(0)],
        steps: vec![send(
            0,
            vec![tx(
                Hdr::Gso {
                    mss: 500,
                    ecn: false,
                },
                built(
                    mac(1),
                    mac(0),
                    Body::Ipv4 {
                        l4: L4::Udp,
                        options: 2,
                        payload: 1800,
                    },
                ),
            )],
        )],
    };
    let raw = |b: [u8; 12]| tx(Hdr::Raw(b), tcp4(BCAST, mac(0), 50));
    let malformed = SwitchInput {
        uplink: None,
        ports: vec![guest(CSUM), guest(0)],
        steps: vec![send(
            0,
            vec![
                plain(tcp4(BCAST, mac(0), 1)),
                // DATA_VALID, a driver's to never set.
                raw([2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
                // TSO not negotiated.
                raw([1, 1, 54, 0, 100, 0, 34, 0, 16, 0, 0, 0]),
                // The checksum past the frame.
                raw([1, 0, 0, 0, 0, 0, 0xff, 0, 16, 0, 0, 0]),
                // An unknown GSO type.
                raw([0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
                // num_buffers, which the receiver must not see.
                raw([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 7]),
                tx(Hdr::Short(5), tcp4(BCAST, mac(0), 1)),
                plain(tcp4(BCAST, mac(0), 2)),
            ],
        )],
    };
    let mut tagged = tcp4(BCAST, mac(0), 40);
    tagged.vlans = vec![7, 8];
    let mut cut_short = tcp4(BCAST, mac(0), 40);
    cut_short.cut = Some(30);
    let odd = SwitchInput {
        uplink: Some(1),
        ports: vec![guest(0), guest(0)],
        steps: vec![send(
            0,
            vec![
                TxFrame {
                    hdr: Hdr::Plain,
                    frame: FrameSpec::Raw(vec![0xff; 13]),
                    cuts: vec![3, 0, 4],
                },
                TxFrame {
                    hdr: Hdr::Plain,
                    frame: FrameSpec::Raw(Vec::new()),
                    cuts: Vec::new(),
                },
                plain(tagged),
                plain(cut_short),
                plain(built(
                    BCAST,
                    mac(0),
                    Body::Other {
                        ethertype: 0x88cc,
                        bytes: vec![1, 2, 3],
                    },
                )),
                plain(built(
                    BCAST,
                    mac(0),
                    Body::Ipv4 {
                        l4: L4::Other(47),
                        options: 1,
                        payload: 9,
                    },
                )),
            ],
        )],
    };
    let mut small = guest(0);
    small.rx.buffers = 2;
    let mut merged = guest(MRG);
    merged.rx.lens = [100, 60];
    let mut broken = guest(0);
    broken.rx.readable_at = Some(1);
    let mut stopped = guest(0);
    stopped.rx.stopped = true;
    let mut tiny = guest(0);
    tiny.rx.lens = [100, 100];
    let frames = |n| {
        (0..n)
            .map(|i| plain(tcp4(BCAST, mac(0), 1000 + i)))
            .collect()
    };
    let rings = SwitchInput {
        uplink: None,
        ports: vec![guest(0), small, merged, broken],
        steps: vec![
            send(0, frames(4)),
            Step::Refill { port: 1 },
            send(0, frames(1)),
        ],
    };
    let small_rings = SwitchInput {
        uplink: None,
        ports: vec![guest(0), stopped, tiny],
        steps: vec![send(0, frames(4)), send(0, frames(1))],
    };
    let mut two = guest(0);
    two.two_pairs = true;
    let mut closed = guest(0);
    closed.filter = 1;
    let mut small_mtu = guest(0);
    small_mtu.mtu = 1;
    let mut flows: Vec<TxFrame> = (0..6)
        .map(|i| {
            let mut b = tcp4(BCAST, mac(0), 10);
            if let Body::Ipv4 {
                l4: L4::Tcp { seq, .. },
                ..
            } = &mut b.body
            {
                *seq = i;
            }
            b.src = mac(0);
            b.dst = if i % 2 == 0 { BCAST } else { mac(1) };
            let mut f = plain(b);
            f.cuts = vec![i as u16 * 7];
            f
        })
        .collect();
    // Flooded: the closed filter refuses it, and it is longer than the smallest MTU.
    flows.push(plain(tcp4(HOST, mac(0), 200)));
    let pairs_and_filters = SwitchInput {
        uplink: None,
        ports: vec![guest(0), two, closed, small_mtu],
        steps: vec![send(0, flows)],
    };

    let gso = |mss| HostHdr::Gso {
        mss,
        ecn: false,
        linear: 100,
    };
    let mut runt = host(HostHdr::Plain, tcp4(BCAST, HOST, 0));
    runt.frame = FrameSpec::Raw(vec![0xff; 13]);
    let host_frames = SwitchInput {
        uplink: Some(4),
        ports: vec![guest(OFFLOADS), guest(0)],
        steps: vec![from_host(vec![
            // A TCPv4 super-frame of 4 segments: whole to guest 0, cut for guest 1.
            host(gso(1000), tcp4(mac(0), HOST, 4000)),
            host(gso(1000), tcp4(mac(1), HOST, 4000)),
            // A partial checksum: finished for guest 1.
            host(HostHdr::Csum, tcp4(mac(1), HOST + 1, 300)),
            // Checked by the host's NIC already.
            host(HostHdr::DataValid, tcp4(mac(0), HOST + 1, 300)),
            // Shorter than a header, and than an Ethernet header.
            host(HostHdr::Short(5), tcp4(mac(0), HOST, 1)),
            runt,
        ])],
    };
    let host_flood = SwitchInput {
        uplink: Some(1),
        ports: three(),
        steps: vec![
            // Flooded to every guest; HOST learned, HOST + 1 beyond the uplink's limit.
            from_host(vec![
                host(HostHdr::Plain, arp(HOST, 1, 2)),
                host(HostHdr::Plain, arp(HOST + 1, 1, 2)),
            ]),
            // HOST is known behind the uplink: no guest gets it; HOST + 1 is not: flooded.
            send(0, vec![plain(tcp4(HOST, mac(0), 10))]),
            send(0, vec![plain(tcp4(HOST + 1, mac(0), 10))]),
        ],
    };
    let mut two_pairs = guest(0);
    two_pairs.two_pairs = true;
    let on_one = host_on_pair(mac(0), 1);
    let flow = || from_host(vec![host(HostHdr::Plain, tcp4(mac(0), on_one, 10))]);
    let pairs = |pairs| Step::Pairs { port: 0, pairs };
    let pairs_change = SwitchInput {
        uplink: Some(4),
        ports: vec![two_pairs, guest(0)],
        steps: vec![
            // On pair 1 of two; none, three or two pairs asked of the one-pair guest: refused.
            flow(),
            pairs(0),
            pairs(3),
            Step::Pairs { port: 1, pairs: 2 },
            flow(),
            // One pair: the flow moves to pair 0; two again: back on pair 1.
            pairs(1),
            flow(),
            pairs(2),
            flow(),
        ],
    };

    vec![
        ("forwarding", forwarding, |o| {
            assert_eq!(o.received, [2, 2, 1]);
            assert_eq!(o.not_forwarded, 1, "the hairpin");
        }),
        ("learning_and_port_security", learning, |o| {
            assert_eq!(o.received, [4, 1]);
            assert_eq!(o.not_forwarded, 3);
        }),
        ("announcements", announce, |o| {
            assert_eq!(o.received, [2, 1]);
        }),
        ("offloads", offloads, |o| {
            assert_eq!(o.resolved, 8);
            assert_eq!(o.segments, 4 + 4 + 3 + 3);
            assert_eq!(o.received, [0, 4 + 1 + 3 + 1, 4, 4 + 1 + 3 + 1]);
        }),
        ("uso", uso, |o| {
            assert_eq!((o.resolved, o.segments), (1, 4));
            assert_eq!(o.received, [0, 4]);
        }),
        ("malformed_headers", malformed, |o| {
            assert_eq!(o.refused, 5);
            assert_eq!(o.received, [0, 3]);
        }),
        ("short_tagged_and_odd_frames", odd, |o| {
            assert_eq!(o.not_forwarded, 2);
            assert_eq!(o.received, [0, 4]);
        }),
        ("full_merged_and_broken_rings", rings, |o| {
            // Guest 1's two buffers, refilled; guest 2's merged buffers hold one frame;
            // guest 3's first frame is lost with its ring, broken by the second: the four
            // frames of that chunk and the one after are missed there.
            assert_eq!(o.received, [0, 3, 1, 0]);
            assert_eq!(o.rx_missed, 2 + 4 + 5);
            assert_eq!(o.broken, 1);
        }),
        ("stopped_and_too_small_rings", small_rings, |o| {
            assert_eq!(o.received, [0, 0, 0]);
            assert_eq!(o.rx_dropped, 5, "1000-byte frames, 100-byte buffers");
        }),
        ("pairs_and_filters", pairs_and_filters, |o| {
            assert_eq!(o.received, [0, 7, 3, 3]);
            assert_eq!((o.filtered, o.rx_dropped), (1, 1));
        }),
        ("host_frames_resolved_and_short", host_frames, |o| {
            assert_eq!(o.received, [2, 4 + 1]);
            assert_eq!((o.resolved, o.segments), (2, 4));
            assert_eq!((o.host_forwarded, o.host_dropped), (4, 2));
        }),
        ("host_broadcast_flooded_and_learned", host_flood, |o| {
            assert_eq!(o.received, [2, 2 + 1, 2 + 1]);
            assert_eq!((o.host_forwarded, o.host_dropped), (2, 0));
        }),
        ("pairs_changed_by_the_driver", pairs_change, |o| {
            assert_eq!(o.by_pair, [vec![1, 3], vec![0, 0]]);
            assert_eq!(o.pairs_refused, 3);
        }),
    ]
}

fn unchecked_guest() -> PortSetup {
    let mut g = guest(0);
    g.unchecked = true;
    g.learn_limit = 3;
    g
}

#[test]
fn switch_forward_seeds_are_written_and_the_corpus_replays() {
    let mut files = Vec::new();
    for (name, input, check) in seeds() {
        let bytes = input.to_bytes();
        let decoded: SwitchInput = crate::decode(&bytes).expect("seed decodes");
        assert_eq!(decoded, input, "{name}: the encoding does not round-trip");
        check(&sf::run(&input));
        files.push((name, bytes));
    }
    write_corpus("switch_forward", &files);
    replay("switch_forward", |b| {
        if let Some(i) = crate::decode::<SwitchInput>(b) {
            sf::run(&i);
        }
    });
}

/// Found by this target's first seeds (corpus/switch_forward/regression-runt): a 13-byte
/// frame, its addresses but not its ethertype, was switched as a frame (delivered to guest 1,
/// learned from), where the model, as a TAP, has nothing to switch on. Fixed in
/// `switch::flow::frame`.
#[test]
fn regression_a_frame_without_its_ethertype_is_not_forwarded() {
    let runt = TxFrame {
        hdr: Hdr::Plain,
        frame: FrameSpec::Raw([&[0xff; 6][..], &[2, 0, 0, 0, 0, mac(0)], &[8]].concat()),
        cuts: Vec::new(),
    };
    let input = SwitchInput {
        uplink: None,
        ports: vec![guest(0), guest(0)],
        steps: vec![send(0, vec![runt])],
    };
    let file = super::corpus_dir("switch_forward").join("regression-runt");
    let bytes = std::fs::read(file).unwrap();
    assert_eq!(crate::decode::<SwitchInput>(&bytes), Some(input.clone()));
    let o = sf::run(&input);
    assert_eq!((o.received, o.not_forwarded), (vec![0, 0], 1));
}
