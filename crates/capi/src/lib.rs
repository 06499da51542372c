//! C ABI (being written).
