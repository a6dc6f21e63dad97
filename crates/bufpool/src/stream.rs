//! Copying a large buffer into memory that is not going to be read soon,
//! by non-temporal stores (docs/ARCHITECTURE.md: count the trips to memory).
//!
//! An ordinary copy into a destination that is not in the cache first
//! reads every line of it (read-for-ownership), only to overwrite it all:
//! three trips to memory per line (read source, read destination, write
//! destination back). Non-temporal stores (`movntdq`) write whole lines
//! through write-combining buffers without reading them in, and leave the
//! cache to the source, which the caller goes on to reuse. This is the
//! same store the file backend's guarded copy makes into its mapping
//! (`store.rs`), for plain memory that cannot fault.

use filemap::NT_STORE_MIN;

/// Copies `src` into `dst` (of the same length), by non-temporal stores
/// when it is at least [`NT_STORE_MIN`] bytes on x86-64 (the threshold of
/// the guarded store too: the destination of a smaller copy is likely to
/// be read again soon, and the stores' fence is not free), so `dst`'s lines
/// are neither read first nor left in the cache. The stores are fenced
/// before it returns: what it copied is visible to every thread that
/// later synchronises with this one, as after any copy.
///
/// # Panics
/// When the lengths differ, like [`slice::copy_from_slice`].
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= NT_STORE_MIN {
        x86::copy_nt(dst, src);
        return;
    }
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// Up to a 64-byte boundary of `dst` by an ordinary copy, whole lines
    /// by four 16-byte non-temporal stores each, the rest ordinarily.
    pub(super) fn copy_nt(dst: &mut [u8], src: &[u8]) {
        let len = dst.len();
        let head = dst.as_ptr().align_offset(64).min(len);
        let body = (len - head) & !63;
        dst[..head].copy_from_slice(&src[..head]);
        let (d, s) = (dst[head..].as_mut_ptr(), src[head..].as_ptr());
        for line in (0..body).step_by(64) {
            // SAFETY: `line + 64 <= body <= len - head`, so every access is
            // inside `dst[head..]` and `src[head..]`; the destination is
            // 16-byte aligned (64 from `head` on), as `_mm_stream_si128`
            // needs, and the loads are unaligned loads. SSE2 is part of
            // the x86-64 baseline.
            unsafe {
                let (d, s) = (d.add(line).cast::<__m128i>(), s.add(line).cast::<__m128i>());
                let a = _mm_loadu_si128(s);
                let b = _mm_loadu_si128(s.add(1));
                let c = _mm_loadu_si128(s.add(2));
                let e = _mm_loadu_si128(s.add(3));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
        }
        // SAFETY: SSE is part of the x86-64 baseline. The fence orders the
        // weakly-ordered streaming stores before whatever follows (the
        // caller's unlock), so readers see them.
        unsafe { _mm_sfence() };
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..NT_STORE_MIN + 300)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        for (off, len) in [
            (0, NT_STORE_MIN),
            (1, NT_STORE_MIN),
            (13, NT_STORE_MIN + 63),
            (64, NT_STORE_MIN + 1),
            (5, NT_STORE_MIN - 1),
            (0, 100),
            (3, 0),
        ] {
            let mut dst = vec![0xAAu8; off + len + 64];
            copy_streaming(&mut dst[off..off + len], &src[..len]);
            assert_eq!(&dst[off..off + len], &src[..len], "off {off} len {len}");
            assert!(dst[..off].iter().all(|&b| b == 0xAA), "before, off {off}");
            assert!(
                dst[off + len..].iter().all(|&b| b == 0xAA),
                "after, off {off} len {len}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn lengths_must_match() {
        copy_streaming(&mut [0u8; 4], &[0u8; 5]);
    }
}
