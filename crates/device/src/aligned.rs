//! Heap buffers aligned for `O_DIRECT`.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::MAX_ALIGN;

/// A zero-initialised heap buffer whose address is aligned to [`MAX_ALIGN`],
/// so it can be handed to `O_DIRECT` I/O on any device.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes. `len` may be 0.
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: NonNull::<[u8; MAX_ALIGN]>::dangling().cast(),
                len: 0,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self { ptr, len }
    }

    /// An aligned copy of `data` (allocated without zero-filling first: this
    /// is on the write path of every journaled write).
    pub fn from_slice(data: &[u8]) -> Self {
        if data.is_empty() {
            return Self::zeroed(0);
        }
        let layout = Self::layout(data.len());
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        // SAFETY: `ptr` is valid for `data.len()` bytes and does not overlap
        // `data`; after the copy every byte is initialised.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len()) };
        Self {
            ptr,
            len: data.len(),
        }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, MAX_ALIGN).expect("buffer length overflows a Layout")
    }

    /// True if `p` is aligned for direct I/O with logical block size `align`.
    pub fn is_aligned(p: *const u8, align: usize) -> bool {
        (p as usize).is_multiple_of(align)
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0), initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with this same layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0usize, 1, 512, 4096, 3 * 4096 + 7] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            if len > 0 {
                assert!(AlignedBuf::is_aligned(b.as_ptr(), MAX_ALIGN));
            }
        }
        let c = AlignedBuf::from_slice(b"hello");
        assert_eq!(&c[..], b"hello");
        assert_eq!(&c.clone()[..], b"hello");
    }
}
