//! virtio-net over vhost-user: device and driver halves.
