//! How long a stopped transmit queue lets the device work before it asks for the completion
//! interrupt: seed 002's delayed callback, with its delay adapted to the wake-up.
//!
//! Linux's virtio_net asks for the interrupt once 3/4 of what is in flight has completed
//! (`virtqueue_enable_cb_delayed`), so that a stopped queue takes one interrupt per many
//! completions. The quarter left in flight is what keeps the device busy while the driver
//! wakes up. When the wake-up takes longer than the device needs for that quarter, the device
//! runs dry and waits for the driver: on a machine where a blocking wake-up costs 36 us, a
//! 1,024-entry ring at 30 Mpps leaves 8.5 us of work at 3/4, and transmit ran at 64% of a
//! polling driver (docs/PERFORMANCE-HISTORY.md, 2026-12-05 20:43 UTC, Intel Xeon family 6
//! model 167: the driver against DPDK virtio-user).
//!
//! The rule, per interrupt taken while stopped (the delay in eighths of what was in flight
//! when the interrupt was asked for):
//! - **the device ran dry** (nothing left in flight when the driver had woken): ask one
//!   eighth sooner, down to one eighth;
//! - **dry at one eighth, [`CallbackDelay::HOPELESS`] times in a row**: the ring cannot hold
//!   a wake-up's worth of work at this rate, and asking sooner only adds interrupts. Go back
//!   to 3/4, the fewest interrupts, and do not ask sooner for the next
//!   [`CallbackDelay::HOLD`] interrupts;
//! - **half or more still in flight**: the wake-up was short against the device's pace (a
//!   slow device, or a fast wake-up): ask one eighth later, up to 3/4, so that a slow device is
//!   not interrupted more than seed 002 would;
//! - otherwise keep the delay.
//!
//! A delay that keeps the device busy costs few extra interrupts: the driver sleeps once per
//! cycle whatever the delay, and the cycle is set by the wake-up.

/// The delay of a stopped transmit queue's completion interrupt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackDelay {
    /// Eighths of what is in flight to wait for: 1 ..= [`CallbackDelay::SEED`].
    eighths: u8,
    /// Interrupts in a row that found the device dry at one eighth.
    dry_at_floor: u8,
    /// Interrupts left before the delay may shrink again.
    hold: u16,
}

impl Default for CallbackDelay {
    fn default() -> Self {
        Self::new()
    }
}

impl CallbackDelay {
    /// Seed 002's delay, 3/4, in eighths: where it starts, and its longest.
    pub const SEED: u8 = 6;
    /// Dry interrupts in a row at one eighth before going back to [`CallbackDelay::SEED`].
    pub const HOPELESS: u8 = 4;
    /// Interrupts after that before the delay may shrink again.
    pub const HOLD: u16 = 256;

    pub const fn new() -> Self {
        Self {
            eighths: Self::SEED,
            dry_at_floor: 0,
            hold: 0,
        }
    }

    /// Completions to wait for, of `in_flight` chains, before the interrupt.
    pub fn wait_for(&self, in_flight: u16) -> u16 {
        (in_flight as u32 * self.eighths as u32 / 8) as u16
    }

    /// After an interrupt taken while stopped: `asked_at` chains were in flight when it was
    /// asked for, and `left` still were once the driver had woken and reclaimed.
    pub fn woke(&mut self, asked_at: u16, left: u16) {
        self.hold = self.hold.saturating_sub(1);
        if left == 0 {
            if self.eighths > 1 {
                if self.hold == 0 {
                    self.eighths -= 1;
                }
                return;
            }
            self.dry_at_floor += 1;
            if self.dry_at_floor >= Self::HOPELESS {
                *self = Self {
                    hold: Self::HOLD,
                    ..Self::new()
                };
            }
            return;
        }
        self.dry_at_floor = 0;
        if left as u32 * 2 >= asked_at as u32 && self.eighths < Self::SEED {
            self.eighths += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The delay after each of `wakes`, `(asked_at, left)`, from the start.
    fn after(wakes: &[(u16, u16)]) -> Vec<u8> {
        let mut d = CallbackDelay::new();
        wakes
            .iter()
            .map(|&(a, l)| {
                d.woke(a, l);
                d.eighths
            })
            .collect()
    }

    #[test]
    fn it_starts_at_the_seeds_three_quarters() {
        let d = CallbackDelay::new();
        assert_eq!(d.eighths, 6);
        assert_eq!(d.wait_for(1024), 768);
        assert_eq!(d.wait_for(3), 2);
    }

    #[test]
    fn a_device_that_runs_dry_is_asked_sooner_until_it_does_not() {
        // A long ring: dry at 6, 5, 4, then the device keeps some work at 3/8.
        assert_eq!(
            after(&[(1024, 0), (1024, 0), (1024, 0), (1024, 100), (1024, 120)]),
            [5, 4, 3, 3, 3]
        );
    }

    #[test]
    fn a_ring_too_short_for_the_wake_up_goes_back_to_the_seed_and_holds() {
        let dry = [(256, 0); 9];
        // 6 -> 1 in five steps, then four dry at the floor.
        assert_eq!(after(&dry), [5, 4, 3, 2, 1, 1, 1, 1, 6]);
        let mut d = CallbackDelay::new();
        for &(a, l) in &dry {
            d.woke(a, l);
        }
        for _ in 0..CallbackDelay::HOLD - 1 {
            d.woke(256, 0);
            assert_eq!(d.eighths, 6, "held");
        }
        d.woke(256, 0);
        assert_eq!(d.eighths, 5, "then it tries again");
    }

    #[test]
    fn a_dry_wake_at_the_floor_now_and_then_is_not_hopeless() {
        let mut wakes = vec![(1024, 0); 5];
        for _ in 0..10 {
            wakes.extend([(1024, 0), (1024, 0), (1024, 300)]);
        }
        assert!(after(&wakes).iter().skip(5).all(|&e| e == 1));
    }

    #[test]
    fn much_left_in_flight_asks_later_up_to_the_seed() {
        let mut wakes = vec![(1024, 0); 5];
        wakes.extend([(1024, 600); 7]);
        assert_eq!(after(&wakes)[5..], [2, 3, 4, 5, 6, 6, 6]);
    }
}
