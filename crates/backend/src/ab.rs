//! A paired A/B inside one process, for comparing two versions of the data path where the
//! machine's level moves more between runs than a change does (a shared 2-vCPU host whose
//! placement moves a guest-to-guest rate by 2x within seconds; see docs/PERFORMANCE.md).
//!
//! Built with the `ab` cargo feature only (`scripts/ab-pair.sh` builds and runs it). The code
//! under test reads [`b`] where the two versions part (`if ab::b() { new } else { old }`),
//! and the workers report the frames of each turn to [`count`]. A thread flips the variant
//! every `VIRTNET_AB_MS` milliseconds (100 by default) and prints, for each period, `AB
//! <variant> <Mpps>` to stderr: neighbouring periods of the two variants see the same level
//! of the machine, and the ratio of each pair of them is the change's, paired. With
//! `VIRTNET_AB_START=1` the first period is B's (with a period longer than the run, B alone:
//! `scripts/ab/forwarder.sh` runs so). Without the
//! feature, [`b`] is a constant false and [`count`] does nothing: the shipped build pays
//! nothing for the hooks.

#[cfg(feature = "ab")]
mod on {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Once;
    use std::time::{Duration, Instant};

    static VARIANT: AtomicBool = AtomicBool::new(false);
    static FRAMES: AtomicU64 = AtomicU64::new(0);
    static START: Once = Once::new();

    #[inline]
    pub fn b() -> bool {
        VARIANT.load(Relaxed)
    }

    pub fn count(frames: usize) {
        if frames == 0 {
            return;
        }
        START.call_once(|| {
            if std::env::var("VIRTNET_AB_START").is_ok_and(|v| v == "1") {
                VARIANT.store(true, Relaxed);
            }
            std::thread::spawn(flip);
        });
        FRAMES.fetch_add(frames as u64, Relaxed);
    }

    fn flip() {
        let ms = std::env::var("VIRTNET_AB_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100);
        loop {
            let (from, t) = (FRAMES.load(Relaxed), Instant::now());
            std::thread::sleep(Duration::from_millis(ms));
            let (to, took) = (FRAMES.load(Relaxed), t.elapsed());
            let v = VARIANT.load(Relaxed);
            let mpps = (to - from) as f64 / took.as_secs_f64() / 1e6;
            eprintln!("AB {} {mpps:.4}", u8::from(v));
            VARIANT.store(!v, Relaxed);
            // The frames of the switch-over belong to neither period.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[cfg(feature = "ab")]
pub use on::{b, count};

/// Whether variant B runs now (always false without the `ab` feature).
#[cfg(not(feature = "ab"))]
#[inline(always)]
pub fn b() -> bool {
    false
}

/// Counts a turn's frames toward the current period (nothing without the `ab` feature).
#[cfg(not(feature = "ab"))]
#[inline(always)]
pub fn count(_frames: usize) {}
