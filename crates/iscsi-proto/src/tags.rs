//! Maps keyed by task tags (ITT/TTT): the tags are already well spread
//! 32-bit numbers, so a multiply is all the hashing they need (SipHash
//! would cost more than the rest of a lookup on the per-I/O path).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes one `u32` tag by a multiplicative (Fibonacci) mix.
#[derive(Default)]
pub(crate) struct TagHasher(u64);

impl Hasher for TagHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by task tag.
pub(crate) type TagMap<V> = HashMap<u32, V, BuildHasherDefault<TagHasher>>;
