//! The recovery check of an in-process `virtnet switch`: its workers, its MAC table's aging
//! thread, and each port's control-queue worker and serving thread alive and idle; two of its
//! ports, named by the test, exchanging frames on fresh connections within a second.

use std::path::PathBuf;
use std::time::Instant;

use virtnet_backend::switch::{PortSpec, Switch};
use virtnet_backend::QueueId;
use virtnet_driver::{Frames, PollMode};
use vnet::NetHdr;

use super::{comm, thread_exists, Served, FRESH_FRAMES, FRESH_WITHIN};
use crate::inproc::{connect_socket, frame, thread_seccomp, Pair, WANTED};

/// The switch's MAC table ages entries from this thread (`switch/service.rs`).
const AGING_THREAD: &str = "virtnet-fdb-age";
/// Each port's control queue has a worker of this name (`device.rs`).
const CTRL_THREAD: &str = "virtnet-ctrlq";

/// A switch, and the two of its ports whose fresh connections must exchange frames: ports
/// that the hostile case left alone, or whose connections it has closed by the check. Both
/// must listen (not `client`).
#[derive(Debug)]
pub struct SwitchPorts<'a> {
    switch: &'a Switch,
    ports: [String; 2],
}

impl<'a> SwitchPorts<'a> {
    pub fn new(switch: &'a Switch, a: &str, b: &str) -> SwitchPorts<'a> {
        SwitchPorts {
            switch,
            ports: [a.to_string(), b.to_string()],
        }
    }

    fn specs(&self) -> Vec<PortSpec> {
        self.switch.reports().into_iter().map(|r| r.spec).collect()
    }

    fn spec(&self, name: &str) -> PortSpec {
        let spec = self.specs().into_iter().find(|s| s.name == name);
        let spec = spec.unwrap_or_else(|| panic!("the switch has no port {name}"));
        assert!(
            !spec.client,
            "port {name} connects to its frontend: no fresh connection"
        );
        spec
    }

    fn serving_thread(port: &str) -> String {
        comm(&format!("virtnet-port-{port}"))
    }
}

impl Served for SwitchPorts<'_> {
    fn assert_alive(&self) {
        let s = self.switch;
        let workers: Vec<String> = s.workers().map(|w| w.name().to_string()).collect();
        for w in s.workers() {
            assert!(
                !w.is_finished(),
                "the switch's worker {} has ended",
                w.name()
            );
        }
        for (name, device) in s.devices() {
            assert_eq!(
                s.is_serving(&name),
                Some(true),
                "port {name}'s serving thread has ended"
            );
            assert!(
                !device.worker(QueueId::Ctrl).is_finished(),
                "port {name}'s control queue worker has ended"
            );
        }
        // The names `assert_idle` reads are these threads'.
        for name in self.threads() {
            assert!(thread_exists(&name), "no thread {name}");
        }
        // The case ran under the workers' seccomp filter, as the switch runs in production.
        if s.config().device.seccomp {
            for name in workers.iter().map(String::as_str).chain([CTRL_THREAD]) {
                let modes = thread_seccomp(&comm(name));
                assert!(
                    modes.iter().all(|&m| m == 2),
                    "{name}: seccomp modes {modes:?}"
                );
            }
        }
    }

    fn threads(&self) -> Vec<String> {
        let s = self.switch;
        let mut names: Vec<String> = s.workers().map(|w| comm(w.name())).collect();
        names.push(AGING_THREAD.into());
        for (name, _) in s.devices() {
            names.push(CTRL_THREAD.into());
            names.push(Self::serving_thread(&name));
        }
        names
    }

    fn sockets(&self) -> Vec<PathBuf> {
        self.specs()
            .into_iter()
            .filter(|s| !s.client)
            .map(|s| s.socket)
            .collect()
    }

    /// Our driver on each of the two ports sends [`FRESH_FRAMES`] to the other, which
    /// receives them byte for byte, all within [`FRESH_WITHIN`] of starting to connect.
    fn assert_fresh_connection_moves_frames(&self) {
        let specs = self.ports.clone().map(|p| self.spec(&p));
        let start = Instant::now();
        let mut pairs = specs
            .each_ref()
            .map(|s| connect_socket(&s.socket, WANTED, 2048));
        // From each port's MAC to the other's: known unicast, delivered to that port only.
        let sent: [Vec<Vec<u8>>; 2] = [0, 1].map(|k| {
            let (src, dst) = (specs[k].mac, specs[1 - k].mac);
            (0..FRESH_FRAMES)
                .map(|i| {
                    let mut f = frame(i, 64);
                    f[..6].copy_from_slice(&dst);
                    f[6..12].copy_from_slice(&src);
                    f
                })
                .collect()
        });
        for (p, frames) in pairs.iter_mut().zip(&sent) {
            for f in frames {
                assert!(p.tx.send(f, NetHdr::default()).unwrap(), "no room in tx");
            }
            p.tx.flush();
        }
        let mut got: [Vec<Vec<u8>>; 2] = Default::default();
        let deadline = start + FRESH_WITHIN;
        while got.iter().any(|g| g.len() < FRESH_FRAMES as usize) && Instant::now() < deadline {
            for (p, g) in pairs.iter_mut().zip(&mut got) {
                poll(p, g);
            }
        }
        let took = start.elapsed();
        for k in 0..2 {
            let (from, to) = (&specs[k].name, &specs[1 - k].name);
            let n = got[1 - k].len();
            assert!(
                got[1 - k] == sent[k],
                "{to} received {n} of {FRESH_FRAMES} frames from {from} in {took:?}, or not as sent"
            );
        }
        assert!(took <= FRESH_WITHIN, "fresh connections took {took:?}");
    }
}

/// What `p` has received now, after waiting up to a millisecond for it.
fn poll(p: &mut Pair, got: &mut Vec<Vec<u8>>) {
    p.rx.poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
        .unwrap();
    p.rx.wait(1);
}
