//! The data both sides write: deterministic, non-zero, aligned.

/// A buffer of `len` bytes of non-zero, thread-specific content (so no
/// layer can short-cut zero blocks), aligned for O_DIRECT.
pub fn pattern_buf(len: usize, seed: u64) -> jbdev_device::AlignedBuf {
    let mut b = jbdev_device::AlignedBuf::zeroed(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in b.chunks_mut(8) {
        // xorshift64: cheap, deterministic, never zero.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        for (d, s) in chunk.iter_mut().zip(bytes) {
            *d = s;
        }
    }
    b
}
