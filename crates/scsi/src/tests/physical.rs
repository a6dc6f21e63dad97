//! Physical blocks larger than the logical block (512e): how they are
//! told, and that UNMAP and WRITE SAME with UNMAP deallocate whole
//! physical blocks only.

use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use storage::Extent;

use super::*;
use crate::{LuError, MAX_LBPPB_EXPONENT};

/// 512-byte logical blocks in 4096-byte physical blocks.
fn cfg_512e() -> LuConfig {
    LuConfig {
        physical_block_size: Some(4096),
        ..cfg()
    }
}

/// A RAM backend that frees exactly the 512-byte sectors it is asked to
/// (allocation unit 512 bytes), so GET LBA STATUS shows which LBAs the
/// unit deallocated; counts its `discard` calls.
struct SectorMap {
    mem: MemBackend,
    allocated: Mutex<Vec<bool>>,
    discards: AtomicU64,
}

impl SectorMap {
    fn new(size: u64) -> Self {
        SectorMap {
            mem: MemBackend::new(size),
            allocated: Mutex::new(vec![false; (size / 512) as usize]),
            discards: AtomicU64::new(0),
        }
    }

    fn mark(&self, offset: u64, len: u64, v: bool) {
        let mut a = self.allocated.lock();
        let (s, e) = (
            (offset / 512) as usize,
            (offset + len).div_ceil(512) as usize,
        );
        a[s..e].fill(v);
    }
}

impl BlockBackend for SectorMap {
    fn caps(&self) -> storage::Caps {
        storage::Caps {
            can_deallocate: true,
            discard_granularity: 512,
            ..storage::Caps::new("sector-map", WriteCache::WriteThrough)
        }
    }
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.mem.write_at(buf, offset, fua)?;
        self.mark(offset, buf.len() as u64, true);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn set_write_cache(&self, _: WriteCache) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        assert!(offset.is_multiple_of(512) && len.is_multiple_of(512));
        self.discards.fetch_add(1, Ordering::SeqCst);
        self.mem.write_zeroes(offset, len)?;
        self.mark(offset, len, false);
        Ok(())
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        let a = self.allocated.lock();
        let s = (offset / 512) as usize;
        let e = ((offset + len) / 512) as usize;
        let n = a[s..e].iter().take_while(|&&x| x == a[s]).count();
        Ok(Extent {
            allocated: a[s],
            len: n as u64 * 512,
        })
    }
}

fn sector_lu(cfg: LuConfig) -> (LogicalUnit, Arc<SectorMap>) {
    let b = Arc::new(SectorMap::new(BLOCKS * u64::from(BS)));
    (LogicalUnit::new(b.clone(), cfg).unwrap(), b)
}

/// (lba, blocks, provisioning status) of the descriptors from LBA 0.
fn status(lu: &LogicalUnit) -> Vec<(u64, u32, u8)> {
    let o = run(lu, &cdb16(op::SERVICE_ACTION_IN_16, 0x12, 0, 1024), &[]);
    good(&o);
    o.data[8..]
        .chunks_exact(16)
        .map(|c| {
            (
                u64::from_be_bytes(c[0..8].try_into().unwrap()),
                u32::from_be_bytes(c[8..12].try_into().unwrap()),
                c[12] & 0x0F,
            )
        })
        .collect()
}

fn unmap(lu: &LogicalUnit, lba: u64, n: u32) -> Outcome {
    let mut l = vec![0u8; 24];
    l[0..2].copy_from_slice(&22u16.to_be_bytes());
    l[2..4].copy_from_slice(&16u16.to_be_bytes());
    l[8..16].copy_from_slice(&lba.to_be_bytes());
    l[16..20].copy_from_slice(&n.to_be_bytes());
    let mut c = [0u8; 10];
    c[0] = op::UNMAP;
    c[8] = 24;
    run(lu, &c, &l)
}

fn fill(lu: &LogicalUnit, byte: u8) {
    good(&run(
        lu,
        &cdb16(op::WRITE_16, 0, 0, BLOCKS as u32),
        &vec![byte; (BLOCKS * u64::from(BS)) as usize],
    ));
}

fn read(lu: &LogicalUnit, lba: u64, n: u32) -> Vec<u8> {
    let o = run(lu, &cdb16(op::READ_16, 0, lba, n), &[]);
    good(&o);
    o.data.to_vec()
}

#[test]
fn physical_block_size_is_validated() {
    let new = |pbs: u32, bs: u32| {
        LogicalUnit::new(
            Arc::new(MemBackend::new(1 << 20)),
            LuConfig {
                block_size: bs,
                physical_block_size: Some(pbs),
                ..cfg()
            },
        )
    };
    for (pbs, bs) in [
        (0, 512),
        (256, 512),
        (1536, 512),
        (3 * 4096, 4096),
        (2048, 4096),
        (512 << (MAX_LBPPB_EXPONENT + 1), 512),
    ] {
        let e = new(pbs, bs).unwrap_err();
        assert!(
            matches!(e, LuError::Geometry(GeometryError::PhysicalBlockSize { physical, block_size }) if physical == pbs && block_size == bs),
            "{pbs}/{bs}: {e}"
        );
        assert!(e.to_string().contains("power-of-two multiple"), "{e}");
    }
    for (pbs, bs) in [(512, 512), (4096, 512), (4096, 4096), (16384, 4096)] {
        assert_eq!(new(pbs, bs).unwrap().physical_block_size(), pbs);
    }
    assert!(new(512 << MAX_LBPPB_EXPONENT, 512).is_ok());
}

#[test]
fn physical_block_size_is_told() {
    let rc16 = cdb16(op::SERVICE_ACTION_IN_16, 0x10, 0, 32);
    let b0 = [op::INQUIRY, 1, 0xB0, 0, 64, 0];
    let u32_at = |d: &[u8], i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap());
    // One logical block per physical block: exponent 0.
    let lu = mem_lu();
    let d = run(&lu, &rc16, &[]).data;
    assert_eq!(d[13], 0);
    assert_eq!(
        u16::from_be_bytes([d[14] & 0x3F, d[15]]),
        0,
        "lowest aligned"
    );
    // 512e: 8 logical blocks per physical block, LBA 0 aligned; LBPME and
    // LBPRZ still set.
    let (lu, _) = sector_lu(cfg_512e());
    let d = run(&lu, &rc16, &[]).data;
    assert_eq!(d[13], 3);
    assert_eq!(d[14], 0xC0);
    assert_eq!(d[15], 0);
    let d = run(&lu, &b0, &[]).data;
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 8, "transfer granularity");
    assert_eq!(u32_at(&d, 28), 8, "OPTIMAL UNMAP GRANULARITY");
    assert_eq!(u32_at(&d, 32), 0x8000_0000, "UGAVALID, alignment 0");
    // 16 KiB physical blocks of 4 KiB: 4 per physical block, both
    // granularities follow the physical block.
    let lu = LogicalUnit::new(
        Arc::new(SectorMap::new(1 << 20)),
        LuConfig {
            block_size: 4096,
            physical_block_size: Some(16384),
            ..cfg()
        },
    )
    .unwrap();
    assert_eq!(run(&lu, &rc16, &[]).data[13], 2);
    let d = run(&lu, &b0, &[]).data;
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 4);
    assert_eq!(u32_at(&d, 28), 4);
    // A backend unit larger than the physical block wins (RAM: 1 MiB).
    let lu = LogicalUnit::new(Arc::new(MemBackend::new(1 << 22)), cfg_512e()).unwrap();
    assert_eq!(u32_at(&run(&lu, &b0, &[]).data, 28), 2048);
}

#[test]
fn unmap_deallocates_whole_physical_blocks_only() {
    let (lu, b) = sector_lu(cfg_512e());
    fill(&lu, 0x5A);
    assert_eq!(status(&lu), vec![(0, BLOCKS as u32, 0)]);
    // 3..29: physical blocks 8..16 and 16..24 whole, 3..8 and 24..29 not.
    good(&unmap(&lu, 3, 26));
    assert_eq!(
        status(&lu),
        vec![(0, 8, 0), (8, 16, 1), (24, BLOCKS as u32 - 24, 0)]
    );
    // Every LBA named reads as zeros (LBPRZ = 1); the others are intact.
    let d = read(&lu, 0, 32);
    let bs = BS as usize;
    assert!(d[..3 * bs].iter().all(|&x| x == 0x5A));
    assert!(d[3 * bs..29 * bs].iter().all(|&x| x == 0));
    assert!(d[29 * bs..].iter().all(|&x| x == 0x5A));
    // Within one physical block: nothing is deallocated.
    let before = b.discards.load(Ordering::SeqCst);
    for (lba, n) in [(33, 1), (40, 7), (49, 7)] {
        good(&unmap(&lu, lba, n));
        assert!(read(&lu, lba, n).iter().all(|&x| x == 0));
    }
    assert_eq!(b.discards.load(Ordering::SeqCst), before);
    assert_eq!(status(&lu)[2], (24, BLOCKS as u32 - 24, 0));
    // The last physical block counts as covered by a range to the end.
    good(&unmap(&lu, BLOCKS - 8, 8));
    assert_eq!(*status(&lu).last().unwrap(), (BLOCKS - 8, 8, 1));
}

#[test]
fn write_same_unmap_zero_fills_partial_physical_blocks() {
    let (lu, _) = sector_lu(cfg_512e());
    let bs = BS as usize;
    fill(&lu, 0xFF);
    // WRITE SAME(16) with UNMAP, LBAs 3..29, a block of 0xAB: 8..24 are
    // deallocated, 3..8 and 24..29 zero-filled and still mapped: the
    // whole range reads zeros, as after UNMAP.
    good(&run(
        &lu,
        &cdb16(op::WRITE_SAME_16, 0x08, 3, 26),
        &vec![0xAB; bs],
    ));
    assert_eq!(
        status(&lu),
        vec![(0, 8, 0), (8, 16, 1), (24, BLOCKS as u32 - 24, 0)]
    );
    let d = read(&lu, 0, 32);
    assert!(d[..3 * bs].iter().all(|&x| x == 0xFF));
    assert!(d[3 * bs..29 * bs].iter().all(|&x| x == 0));
    assert!(d[29 * bs..].iter().all(|&x| x == 0xFF));
    // libiscsi WriteSame10/16.UnmapUnaligned: LBA i, 8 - i blocks, GOOD;
    // nothing deallocated, the LBAs zero-filled whatever the block holds.
    for i in 1..8u32 {
        let mut c = [0u8; 10];
        c[0] = op::WRITE_SAME_10;
        c[1] = 0x08;
        c[2..6].copy_from_slice(&(64 + i).to_be_bytes());
        c[7..9].copy_from_slice(&(8 - i as u16).to_be_bytes());
        good(&run(&lu, &c, &vec![0xA6; bs]));
        assert!(read(&lu, u64::from(64 + i), 8 - i).iter().all(|&x| x == 0));
        good(&run(
            &lu,
            &cdb16(op::WRITE_SAME_16, 0x09, u64::from(72 + i), 8 - i),
            &[],
        ));
        assert!(read(&lu, u64::from(72 + i), 8 - i).iter().all(|&x| x == 0));
    }
    assert_eq!(status(&lu)[2], (24, BLOCKS as u32 - 24, 0));
    // To the end of the unit (NUMBER OF LOGICAL BLOCKS 0): the last
    // physical block is whole, the partial one before it zero-filled.
    good(&run(
        &lu,
        &cdb16(op::WRITE_SAME_16, 0x08, BLOCKS - 12, 0),
        &vec![0xAB; bs],
    ));
    assert_eq!(*status(&lu).last().unwrap(), (BLOCKS - 8, 8, 1));
    let d = read(&lu, BLOCKS - 13, 13);
    assert!(d[..bs].iter().all(|&x| x == 0xFF), "before the range");
    assert!(d[bs..].iter().all(|&x| x == 0));
}

#[test]
fn one_logical_block_per_physical_block_deallocates_every_lba() {
    let (lu, _) = sector_lu(cfg());
    fill(&lu, 0xFF);
    good(&unmap(&lu, 3, 2));
    good(&run(
        &lu,
        &cdb16(op::WRITE_SAME_16, 0x08, 9, 1),
        &[0xAB; 512],
    ));
    assert_eq!(
        status(&lu),
        vec![
            (0, 3, 0),
            (3, 2, 1),
            (5, 4, 0),
            (9, 1, 1),
            (10, BLOCKS as u32 - 10, 0)
        ]
    );
}
