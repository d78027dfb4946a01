//! Event-index notification suppression (VIRTIO_F_EVENT_IDX, spec 2.7.10).
//!
//! Each side publishes the index at which it wants to be told next (`used_event` in the avail
//! ring, `avail_event` in the used ring). The other side, having moved its index from `old` to
//! `new`, notifies only if that event index lies in `[old, new)`, all modulo 2^16.

/// Whether moving an index from `old` to `new` passed `event`: `event` lies in `[old, new)`
/// modulo 2^16. `vring_need_event` of the spec and of Linux.
#[inline(always)]
pub const fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The model: walk from `old` towards `new` one step at a time and see if we meet `event`.
    fn model(event: u32, new: u32, old: u32, modulus: u32) -> bool {
        let mut i = old;
        while i != new {
            if i == event {
                return true;
            }
            i = (i + 1) % modulus;
        }
        false
    }

    /// The same formula over a small modulus, to check every triple exhaustively.
    fn need_event_mod(event: u32, new: u32, old: u32, modulus: u32) -> bool {
        let m = modulus;
        ((new + 2 * m - event - 1) % m) < ((new + m - old) % m)
    }

    #[test]
    fn formula_matches_the_interval_model_for_every_triple_mod_64() {
        let m = 64;
        for event in 0..m {
            for new in 0..m {
                for old in 0..m {
                    assert_eq!(
                        need_event_mod(event, new, old, m),
                        model(event, new, old, m),
                        "event {event} new {new} old {old}"
                    );
                }
            }
        }
    }

    #[test]
    fn u16_formula_matches_the_model_on_ten_million_random_triples() {
        // A fast inline generator (xorshift) keeps 10^7 cases under a second in debug builds;
        // the model is the closed form of the interval walk: (event - old) < (new - old).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (e, n, o) = (x as u16, (x >> 16) as u16, (x >> 32) as u16);
            let in_window = e.wrapping_sub(o) < n.wrapping_sub(o);
            assert_eq!(
                vring_need_event(e, n, o),
                in_window,
                "event {e} new {n} old {o}"
            );
        }
    }

    proptest! {
        #[test]
        fn u16_formula_matches_the_walking_model(e: u16, o: u16, step in 0u16..2000) {
            let n = o.wrapping_add(step);
            prop_assert_eq!(vring_need_event(e, n, o), model(e as u32, n as u32, o as u32, 1 << 16));
        }
    }
}
