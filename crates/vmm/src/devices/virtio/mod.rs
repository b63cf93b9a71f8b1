//! virtio devices and the virtio-mmio transport.
