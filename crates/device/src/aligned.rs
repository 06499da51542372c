//! Heap buffers aligned for `O_DIRECT`.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::MAX_ALIGN;

/// A zero-initialised heap buffer whose address is aligned to [`MAX_ALIGN`],
/// so it can be handed to `O_DIRECT` I/O on any device.
///
/// It owns its allocation, or one piece of an allocation shared with
/// other buffers ([`AlignedBuf::carve`]), which is freed with the last of
/// its pieces.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation this buffer is a piece of; `None` if it owns its own.
    chunk: Option<Arc<Chunk>>,
}

/// One allocation carved into several [`AlignedBuf`]s.
struct Chunk {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the chunk is only freed (in Drop, by its last owner); its bytes
// are reached only through the pieces, each of which owns a disjoint range.
unsafe impl Send for Chunk {}
// SAFETY: as above: `Chunk` itself hands out no access to its bytes.
unsafe impl Sync for Chunk {}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `AlignedBuf::carve` with this layout; the last
        // piece is gone.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
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
                chunk: None,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self {
            ptr,
            len,
            chunk: None,
        }
    }

    /// `count` zeroed buffers of `len` bytes each, carved from one
    /// allocation, every one aligned to [`MAX_ALIGN`] (`len` must be a
    /// multiple of it). The allocation is freed when the last of them is
    /// dropped.
    ///
    /// Why: the C allocator puts a header right before each allocation, so
    /// a 4 KiB buffer aligned to 4 KiB costs two pages when allocated on
    /// its own (the next aligned address is a page further on). Carved, 16
    /// of them cost 17 pages (ARCHITECTURE 12b).
    pub fn carve(len: usize, count: usize) -> Vec<Self> {
        assert!(
            len > 0 && len.is_multiple_of(MAX_ALIGN) && count > 0,
            "carve: {count} pieces of {len} bytes"
        );
        let total = len.checked_mul(count).expect("carve: size overflows");
        let layout = Self::layout(total);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        let chunk = Arc::new(Chunk { ptr: base, layout });
        (0..count)
            .map(|i| {
                // SAFETY: `i * len + len <= total`: the piece lies inside
                // the allocation, and no two pieces overlap.
                let ptr = unsafe { base.add(i * len) };
                Self {
                    ptr,
                    len,
                    chunk: Some(chunk.clone()),
                }
            })
            .collect()
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
            chunk: None,
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
        // A piece leaves the allocation to its chunk (dropped with the field).
        // While other pieces keep the chunk, this one's pages go back to the
        // system now: nothing reads them again (a buffer pool drops pieces
        // it cannot keep while their neighbours go round it).
        if let Some(chunk) = &self.chunk {
            if Arc::strong_count(chunk) > 1 {
                release_pages(self.ptr, self.len);
            }
            return;
        }
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` or `from_slice` with this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

/// Gives the pages of `len` bytes at `ptr` back to the system
/// (`MADV_DONTNEED`: read again, they would be zeroes), when the range is
/// whole pages; otherwise does nothing.
fn release_pages(ptr: NonNull<u8>, len: usize) {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let page = *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).unwrap_or(0)
    });
    if page == 0 || !(ptr.as_ptr() as usize).is_multiple_of(page) || !len.is_multiple_of(page) {
        return;
    }
    // SAFETY: the range is whole pages inside a live allocation that only
    // this (departing) piece uses; the allocator's own bookkeeping lies
    // outside every piece (before the chunk's first, page-aligned, byte).
    unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_DONTNEED) };
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

    #[test]
    fn carved_pieces_are_aligned_disjoint_and_outlive_each_other() {
        let mut pieces = AlignedBuf::carve(MAX_ALIGN, 16);
        assert_eq!(pieces.len(), 16);
        for (i, p) in pieces.iter_mut().enumerate() {
            assert_eq!(p.len(), MAX_ALIGN);
            assert!(AlignedBuf::is_aligned(p.as_ptr(), MAX_ALIGN));
            assert!(p.iter().all(|&x| x == 0));
            p.fill(i as u8);
        }
        for (i, p) in pieces.iter().enumerate() {
            assert!(p.iter().all(|&x| x == i as u8), "piece {i} was overwritten");
        }
        let bases: Vec<usize> = pieces.iter().map(|p| p.as_ptr() as usize).collect();
        assert!(bases.windows(2).all(|w| w[1] == w[0] + MAX_ALIGN));
        // Drop all but one, in an odd order: the last keeps the memory.
        let last = pieces.remove(7);
        pieces.reverse();
        drop(pieces);
        assert!(last.iter().all(|&x| x == 7));
        let copy = last.clone();
        drop(last);
        assert!(copy.iter().all(|&x| x == 7));
    }
}
