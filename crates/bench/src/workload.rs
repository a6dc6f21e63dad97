//! Which I/O comes next: offsets (sequential or uniformly random, aligned to
//! the block size) and the read/write mix, from a seeded generator so runs
//! repeat exactly.

use crate::engine::Op;
use crate::spec::Rw;

/// xorshift64*: small, fast, good enough for offsets.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator; a zero seed is replaced by a fixed constant.
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// The I/O stream of one job.
#[derive(Clone, Debug)]
pub struct Workload {
    random: bool,
    trim: bool,
    read_pct: u8,
    bs: u64,
    start: u64,
    blocks: u64,
    pos: u64,
    rng: Rng,
}

impl Workload {
    #[allow(clippy::too_many_arguments)]
    /// Job `job` of `jobs` over `region_len` bytes from `start`. Sequential
    /// jobs each start at their own share of the region and wrap around.
    pub fn new(
        rw: Rw,
        rwmixread: u8,
        bs: u32,
        start: u64,
        region_len: u64,
        seed: u64,
        job: u32,
        jobs: u32,
    ) -> Self {
        let blocks = (region_len / u64::from(bs)).max(1);
        let pos = blocks / u64::from(jobs.max(1)) * u64::from(job);
        Workload {
            random: rw.random(),
            trim: rw.trim(),
            read_pct: rw.read_percent(rwmixread),
            bs: u64::from(bs),
            start,
            blocks,
            pos,
            rng: Rng::new(seed ^ (u64::from(job) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        }
    }

    /// The next I/O: (what it does, byte offset).
    pub fn next_io(&mut self) -> (Op, u64) {
        let op = match self.read_pct {
            _ if self.trim => Op::Trim,
            100 => Op::Read,
            0 => Op::Write,
            p if self.rng.below(100) >= u64::from(p) => Op::Write,
            _ => Op::Read,
        };
        let block = if self.random {
            self.rng.below(self.blocks)
        } else {
            let b = self.pos;
            self.pos = (self.pos + 1) % self.blocks;
            b
        };
        (op, self.start + block * self.bs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_stay_in_region_and_aligned() {
        let mut w = Workload::new(Rw::RandRw, 70, 4096, 1 << 20, 64 << 20, 7, 0, 1);
        let mut writes = 0;
        for _ in 0..10_000 {
            let (wr, off) = w.next_io();
            assert!(off >= 1 << 20 && off + 4096 <= (1 << 20) + (64 << 20));
            assert_eq!(off % 4096, 0);
            writes += usize::from(wr == Op::Write);
        }
        assert!(
            (2500..3500).contains(&writes),
            "{writes} writes of 10000 at 70% reads"
        );
        let mut s = Workload::new(Rw::Read, 0, 1 << 20, 0, 4 << 20, 1, 1, 2);
        let offs: Vec<u64> = (0..3).map(|_| s.next_io().1).collect();
        assert_eq!(offs, vec![2 << 20, 3 << 20, 0]);
        // Same seed, same stream.
        let a: Vec<_> = (0..5)
            .map({
                let mut w = Workload::new(Rw::RandRead, 0, 512, 0, 1 << 30, 3, 0, 1);
                move |_| w.next_io()
            })
            .collect();
        let b: Vec<_> = (0..5)
            .map({
                let mut w = Workload::new(Rw::RandRead, 0, 512, 0, 1 << 30, 3, 0, 1);
                move |_| w.next_io()
            })
            .collect();
        assert_eq!(a, b);
    }

    #[test]
    fn trim_modes_only_trim() {
        for rw in [Rw::Trim, Rw::RandTrim] {
            let mut w = Workload::new(rw, 50, 4096, 0, 1 << 20, 5, 0, 1);
            assert!((0..1000).all(|_| w.next_io().0 == Op::Trim), "{rw:?}");
        }
        let mut w = Workload::new(Rw::Trim, 0, 4096, 0, 16384, 5, 0, 1);
        let offs: Vec<u64> = (0..5).map(|_| w.next_io().1).collect();
        assert_eq!(offs, vec![0, 4096, 8192, 12288, 0]);
    }
}
