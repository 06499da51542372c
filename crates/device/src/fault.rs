//! Fault-injecting in-memory device. (Being written: see the device-layer helper task.)
