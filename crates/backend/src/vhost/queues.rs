//! Starting and stopping a connection's queues on the device's workers: a queue runs once it
//! has everything it needs (a kick, ring addresses the memory table holds, and is enabled),
//! stops at GET_VRING_BASE (keeping where it stood), and every running queue is quiesced and
//! restarted around a change of memory table or dirty log.

use vhost::vhost_user::{Error as VuError, Result as VuResult};
use virtnet_sys::PeerEventFd;
use vnet::feature;
use vring::{DeviceQueue, Features, GuestAddress, QueueConfig, RingAddresses};

use super::{invalid, Connection};
use crate::error::Error;
use crate::queue::{QueueId, QueueRuntime};

impl Connection {
    /// Whether virtqueue `index` exists under the negotiated features (VIRTIO 1.2 5.1.2):
    /// without MQ, one pair and the control queue at 2; with it, every pair and the control
    /// queue after them; the control queue only with CTRL_VQ.
    pub(super) fn vring_allowed(&self, index: usize) -> bool {
        let pairs = if self.acked_features.contains(feature::MQ) {
            self.device.pairs() as usize
        } else {
            1
        };
        index < 2 * pairs || (index == 2 * pairs && self.acked_features.contains(feature::CTRL_VQ))
    }

    /// Starts queue `index` if everything it needs is there.
    pub(super) fn try_start(&mut self, index: usize) -> VuResult<()> {
        let (Some(mem), Some(v)) = (self.mem.clone(), self.vrings.get(index)) else {
            return Ok(());
        };
        if v.running || !v.enabled || v.kick.is_none() {
            return Ok(());
        }
        if !self.vring_allowed(index) {
            tracing::warn!(
                queue = index,
                "no such virtqueue under the negotiated features"
            );
            return Err(invalid("virtqueue not covered by the negotiated features"));
        }
        let Some((desc, avail, used)) = v.addrs else {
            return Ok(());
        };
        let tr = |user: u64| mem.user_to_guest(user).ok_or(VuError::InvalidParam);
        let rings = RingAddresses {
            desc: tr(desc)?,
            avail: tr(avail)?,
            used: tr(used)?,
        };
        let features = Features(self.acked_features.0);
        let refuse = |e: Error| {
            tracing::warn!(queue = index, error = %e, "queue not started");
            VuError::InvalidParam
        };
        let config = QueueConfig::new(v.num, rings, features)
            .map_err(Error::protocol("queue configuration"))
            .map_err(refuse)?;
        let mut queue = DeviceQueue::activate(&config, mem, v.base)
            .map_err(Error::protocol("queue configuration"))
            .map_err(refuse)?;
        queue.set_used_batch(self.device.shared().config().used_batch);
        if let Some(log) = self.dirty_log() {
            // The used ring is logged where the frontend said, else at its own address.
            let used_log = v.log_addr.map_or(rings.used, GuestAddress);
            queue.set_dirty_log(Some(log), used_log);
        }
        let v = &mut self.vrings[index];
        // The worker gets descriptors of its own; failing to make one (EMFILE) refuses the
        // start rather than running the queue without its call or err fd.
        let dup = |f: &Option<PeerEventFd>| {
            f.as_ref()
                .map(PeerEventFd::try_clone)
                .transpose()
                .map_err(Error::host("duplicating a notification fd"))
                .map_err(refuse)
        };
        let kick = dup(&v.kick)?.ok_or(VuError::InvalidParam)?;
        let call = dup(&v.call)?;
        let err = dup(&v.err)?;
        let id = self.queue_id(index).ok_or(VuError::InvalidParam)?;
        let shared = self.device.shared();
        let counters = shared.queue_counters(id).clone();
        let tunables = shared.queue_tunables(id).clone();
        let v = &mut self.vrings[index];
        v.running = true;
        let rt = QueueRuntime::new(id, queue, kick, call, err, counters, tunables);
        self.device.worker(id).start(rt);
        tracing::debug!(queue = index, size = v.num, "queue started");
        Ok(())
    }

    /// The device queue behind the frontend's virtqueue `index` (VIRTIO 1.2 5.1.2). Without
    /// MQ the control queue is virtqueue 2, which on a multi-pair device is our last queue.
    pub(super) fn queue_id(&self, index: usize) -> Option<QueueId> {
        let mq = self.acked_features.contains(feature::MQ);
        if !mq && index == 2 && self.acked_features.contains(feature::CTRL_VQ) {
            Some(QueueId::Ctrl)
        } else {
            QueueId::from_index(index, self.device.pairs())
        }
    }

    /// Stops queue `index` if it runs, keeping its next avail index as the new base. A worker
    /// that does not answer leaves the base unknown: the connection must close rather than
    /// carry on from a stale one.
    pub(super) fn stop(&mut self, index: usize) -> VuResult<()> {
        let Some(id) = self.queue_id(index) else {
            return Ok(());
        };
        let Some(v) = self.vrings.get_mut(index) else {
            return Ok(());
        };
        if v.running {
            v.running = false;
            match self.device.worker(id).stop(id) {
                Ok(Some(next)) => v.base = next,
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "closing the connection");
                    self.must_disconnect = true;
                    return Err(invalid("a queue's worker did not stop"));
                }
            }
        }
        Ok(())
    }

    /// Applies `change` with every running queue stopped (each one's batch published and
    /// its posted buffers returned, as for GET_VRING_BASE, so no worker touches the memory or
    /// the log meanwhile), then starts every queue that can run, the stopped ones from where
    /// they stopped. Memory tables and dirty logs are swapped this way: a worker never sees
    /// one change under it, only a queue started anew.
    pub(super) fn requeue(&mut self, change: impl FnOnce(&mut Self)) -> VuResult<()> {
        let running: Vec<usize> = (0..self.vrings.len())
            .filter(|&i| self.vrings[i].running)
            .collect();
        for &i in &running {
            self.stop(i)?;
        }
        change(self);
        for i in 0..self.vrings.len() {
            if let Err(e) = self.try_start(i) {
                tracing::warn!(queue = i, error = %e, "queue not started");
            }
        }
        Ok(())
    }

    /// Stops every queue: the frontend went away or reset the device.
    pub fn stop_all(&mut self) {
        for i in 0..self.vrings.len() {
            // A hung worker is logged by `stop`; the other queues are stopped all the same.
            let _ = self.stop(i);
        }
        // The next frontend starts from every TAP queue attached, as the device did.
        self.rx_rings_enabled(None, true);
    }
}
