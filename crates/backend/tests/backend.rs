//! Our driver against our backend, in one process, over a real vhost-user unix socket.

use testkit::inproc;
use virtnet_driver::{Frames, PollMode};

use std::time::{Duration, Instant};

use inproc::*;
use virtnet_backend::{BackendConfig, IoMode};
use vnet::feature;
use vnet::NetHdr;
use vring::Features;

#[test]
fn echo_returns_every_frame_byte_for_byte_and_counters_agree() {
    let b = start_backend(
        "echo",
        BackendConfig {
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let mut p = connect(&b, WANTED);
    assert!(p
        .conn
        .features
        .contains(Features::RING_EVENT_IDX | feature::MRG_RXBUF));
    let n = 5000;
    let got = echo_round(&mut p, n, 100);
    assert_eq!(got.len(), n as usize);
    for (i, f) in got.iter().enumerate() {
        assert!(f == &frame(i as u32, 100), "frame {i} differs");
    }
    // A frame larger than one 1536-byte rx buffer is merged over several.
    let big = echo_round(&mut p, 1, 1514 + 1000);
    assert_eq!(big.len(), 1);
    assert!(
        big[0] == frame(0, 2514),
        "merged frame differs (len {})",
        big[0].len()
    );

    let r = b.device.reports();
    let (rx, tx) = (&r[0].counters, &r[1].counters);
    assert_eq!(tx.packets, n as u64 + 1);
    assert_eq!(rx.packets, n as u64 + 1);
    assert_eq!(p.tx.counters.packets, tx.packets);
    assert_eq!(p.rx.counters.packets, rx.packets);
    assert_eq!(tx.bytes, p.tx.counters.bytes);
    assert_eq!(rx.bytes, p.rx.counters.bytes);
    // Batching and event idx keep notifications well below one per frame.
    assert!(rx.batches_flushed < rx.packets, "{rx:?}");
    assert!(r.iter().all(|q| q.counters.broken.is_none()));
}

/// Receives `want` generated frames and checks each is the null generator's frame.
fn receive_null_frames(p: &mut Pair, size: usize, want: usize) {
    let mut got = 0usize;
    let mut bad = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < want && Instant::now() < deadline {
        got +=
            p.rx.poll(
                256,
                PollMode::Napi,
                Frames(|f: &[u8]| {
                    let ok = f.len() == size && f[..6] == [0xff; 6] && f[12..14] == [0x88, 0xb5];
                    if !ok && bad.is_none() {
                        bad = Some(f[..f.len().min(16)].to_vec());
                    }
                }),
            )
            .unwrap();
        if got < want {
            p.rx.wait(10);
        }
    }
    assert!(got >= want, "{got} of {want} frames of {size} B");
    assert_eq!(bad, None, "a {size} B frame differs");
}

#[test]
fn null_generates_rx_frames_and_drops_tx() {
    // 2500 B needs two 1536 B buffers, so the generator leaves its one-buffer bursts for the
    // merging path.
    for (name, size) in [("null-merge", 2500), ("null", 60)] {
        let b = start_backend(
            name,
            BackendConfig {
                io: IoMode::Null { size },
                ..Default::default()
            },
        );
        let mut p = connect(&b, WANTED);
        receive_null_frames(&mut p, size, 10_000);
        if size > 60 {
            continue;
        }
        for i in 0..100 {
            while !p.tx.send(&frame(i, 64), NetHdr::default()).unwrap() {
                p.tx.wait_wake(10).unwrap();
            }
        }
        p.tx.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.device.reports()[1].counters.packets < 100 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(b.device.reports()[1].counters.packets, 100);
        assert_eq!(b.device.reports()[1].counters.bytes, 6400);
    }
}

#[test]
fn flag_mode_without_event_idx_or_indirect_works_too() {
    let b = start_backend(
        "flags",
        BackendConfig {
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let mut p = connect(&b, Features::VERSION_1 | feature::MRG_RXBUF);
    assert!(!p.conn.features.contains(Features::RING_EVENT_IDX));
    let got = echo_round(&mut p, 2000, 64);
    assert_eq!(got.len(), 2000);
    assert!(got[1999] == frame(1999, 64));
}

#[test]
fn used_batch_one_publishes_every_entry_and_batching_publishes_fewer() {
    let mut stores = Vec::new();
    for batch in [1u16, 64] {
        let b = start_backend(
            &format!("batch{batch}"),
            BackendConfig {
                io: IoMode::Echo,
                used_batch: batch,
                ..Default::default()
            },
        );
        let mut p = connect(&b, WANTED);
        assert_eq!(echo_round(&mut p, 3000, 64).len(), 3000);
        let tx = b.device.reports()[1].counters.clone();
        stores.push((tx.batches_flushed, tx.packets));
    }
    let (one, sixty_four) = (stores[0], stores[1]);
    assert_eq!(one.0, one.1, "batch 1: one used.idx store per frame");
    assert!(sixty_four.0 < one.0, "batch 64 stores less: {stores:?}");
}
