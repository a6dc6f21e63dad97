//! COMPARE AND WRITE, ORWRITE(16), WRITE ATOMIC(16) and their atomicity.

use super::*;
use crate::Sense;

fn caw(lba: u64, blocks: u8, flags: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::COMPARE_AND_WRITE;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

fn with_edtl<'a>(c: &'a [u8], d: &'a WriteData, edtl: u32) -> Command<'a> {
    Command {
        expected_data_out: Some(edtl),
        ..cmd(c, d, N1)
    }
}

#[track_caller]
fn miscompare_at(o: &Outcome, offset: u64) {
    sense(o, SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
    assert_eq!(o.sense.unwrap().information, Some(offset));
}

#[test]
fn compare_and_write_matches_then_writes() {
    let (lu, b) = test_lu(cfg());
    let bs = BS as usize;
    let old = pattern(2 * bs, 1);
    good(&run(&lu, &write10(7, 2), &old));
    let new = pattern(2 * bs, 2);
    let data = [old.clone(), new.clone()].concat();
    assert_eq!(lu.plan(&caw(7, 2, 0)).data_out, 4 * BS);
    good(&lu.execute(&with_edtl(&caw(7, 2, 0), &wd(&data), 4 * BS)));
    assert_eq!(&run(&lu, &read10(7, 2), &[]).data[..], &new[..]);
    // FUA: the write is FUA; a write-back cache is flushed before the read.
    TestBackend::set(&b.write_back, true);
    let data = [new.clone(), old.clone()].concat();
    let fua_before = TestBackend::count(&b.fua_writes);
    good(&run(&lu, &caw(7, 2, 0x08), &data));
    assert_eq!(TestBackend::count(&b.fua_writes), fua_before + 1);
    assert!(TestBackend::count(&b.flushes) >= 1);
    assert_eq!(&run(&lu, &read10(7, 2), &[]).data[..], &old[..]);
    // DPO is accepted.
    let data = [old.clone(), old.clone()].concat();
    good(&run(&lu, &caw(7, 2, 0x10), &data));
}

#[test]
fn compare_and_write_miscompare_reports_offset_and_writes_nothing() {
    let (lu, b) = test_lu(cfg());
    let bs = BS as usize;
    let old = vec![b'A'; 3 * bs];
    good(&run(&lu, &write10(0, 3), &old));
    let writes = TestBackend::count(&b.writes);
    let mut verify = old.clone();
    verify[3 * bs - 27] = b'C';
    let data = [verify, vec![b'B'; 3 * bs]].concat();
    miscompare_at(&run(&lu, &caw(0, 3, 0), &data), (3 * bs - 27) as u64);
    assert_eq!(TestBackend::count(&b.writes), writes, "nothing written");
    assert_eq!(&run(&lu, &read10(0, 3), &[]).data[..], &old[..]);
    // First byte differing.
    let data = [vec![0u8; bs], vec![1u8; bs]].concat();
    miscompare_at(&run(&lu, &caw(0, 1, 0), &data), 0);
    // The fixed-format sense carries it with VALID.
    let s = run(&lu, &caw(0, 1, 0), &data).sense.unwrap().to_bytes();
    assert_eq!((s[0], s[2], s[12], s[13]), (0xF0, 0x0E, 0x1D, 0x00));
}

#[test]
fn compare_and_write_field_checks() {
    let lu = mem_lu();
    let max = crate::MAX_COMPARE_AND_WRITE_BLOCKS;
    let big = vec![0u8; 2 * (usize::from(max) + 1) * BS as usize];
    invalid_cdb(&run(&lu, &caw(0, max + 1, 0), &big), 13, None);
    assert_eq!(lu.plan(&caw(0, max + 1, 0)).data_out, 0);
    good(&run(&lu, &caw(0, max, 0), &big));
    for p in 1..8u8 {
        invalid_cdb(&run(&lu, &caw(0, 1, p << 5), &big), 1, Some(7));
    }
    // Zero blocks: nothing happens, but still range checked.
    good(&lu.execute(&with_edtl(&caw(5, 0, 0), &WriteData::None, 0)));
    lba_oob(&run(&lu, &caw(BLOCKS, 0, 0), &[]));
    lba_oob(&run(&lu, &caw(BLOCKS - 1, 2, 0), &big));
    lba_oob(&run(&lu, &caw(u64::MAX, 1, 0), &big));
    // Data-out that does not match 2 × blocks × block size.
    let two = vec![0u8; 2 * BS as usize];
    invalid_cdb(
        &lu.execute(&with_edtl(&caw(0, 1, 0), &wd(&two), 4 * BS)),
        13,
        None,
    );
    invalid_cdb(
        &lu.execute(&with_edtl(
            &caw(0, 3, 0),
            &wd(&big[..4 * BS as usize]),
            4 * BS,
        )),
        13,
        None,
    );
    invalid_cdb(
        &lu.execute(&with_edtl(&caw(0, 0, 0), &wd(&big), 2 * BS)),
        13,
        None,
    );
    invalid_cdb(&run(&lu, &caw(0, 1, 0), &two[..BS as usize]), 13, None);
    // Read-only.
    let ro = LogicalUnit::new(
        Arc::new(MemBackend::new(BLOCKS * u64::from(BS))),
        LuConfig {
            read_only: true,
            ..cfg()
        },
    )
    .unwrap();
    sense(
        &run(&ro, &caw(0, 1, 0), &two),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
}

#[test]
fn compare_and_write_backend_errors() {
    let (lu, b) = test_lu(cfg());
    let two = vec![0u8; 2 * BS as usize];
    TestBackend::set(&b.fail_read, true);
    sense(
        &run(&lu, &caw(0, 1, 0), &two),
        SenseKey::MediumError,
        Asc::UNRECOVERED_READ_ERROR,
    );
    TestBackend::set(&b.fail_read, false);
    TestBackend::set(&b.fail_write, true);
    sense(
        &run(&lu, &caw(0, 1, 0), &two),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
}

/// Two "sessions" race compare-and-writes that each expect the other's
/// last value (libiscsi's MultipathIO.CompareAndWriteAsync): with atomic
/// compare+write every success moves the block to a value the next
/// success in the chain expects, so successes and contents stay
/// consistent; plain writes racing on other blocks of the same stripe
/// never corrupt it.
#[test]
fn compare_and_write_is_atomic_across_threads() {
    let lu = Arc::new(mem_lu());
    let bs = BS as usize;
    good(&run(&lu, &write10(0, 1), &vec![0u8; bs]));
    let rounds = 2000;
    let threads: Vec<_> = (0..2u8)
        .map(|t| {
            let lu = lu.clone();
            std::thread::spawn(move || {
                let data = [vec![t; bs], vec![t ^ 1; bs]].concat();
                let c = caw(0, 1, 0);
                let n = if t == 0 { NexusId(1) } else { NexusId(2) };
                let mut ok = 0usize;
                for _ in 0..rounds {
                    let o = lu.execute(&cmd(&c, &wd(&data), n));
                    if o.is_good() {
                        ok += 1;
                    } else {
                        assert_eq!(o.sense.unwrap().key, SenseKey::Miscompare);
                    }
                    // Writes to a neighbouring block share the stripe.
                    let w = write10(1, 1);
                    good(&lu.execute(&cmd(&w, &wd(&data[..bs]), n)));
                }
                ok
            })
        })
        .collect();
    let oks: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Successes alternate 0→1 (thread 0) and 1→0 (thread 1).
    assert!(oks[0] == oks[1] || oks[0] == oks[1] + 1, "{oks:?}");
    let last = run(&lu, &read10(0, 1), &[]).data[0];
    assert_eq!(last, u8::from(oks[0] != oks[1]));
}

fn orw(lba: u64, len: u32, flags: u8) -> [u8; 16] {
    cdb16(op::ORWRITE_16, flags, lba, len)
}

#[test]
fn orwrite_ors_into_the_medium() {
    let (lu, b) = test_lu(cfg());
    let bs = BS as usize;
    good(&run(&lu, &write10(3, 2), &vec![0x0F; 2 * bs]));
    assert_eq!(lu.plan(&orw(3, 2, 0)).data_out, 2 * BS);
    good(&run(&lu, &orw(3, 2, 0), &vec![0xA0; 2 * bs]));
    assert!(run(&lu, &read10(3, 2), &[]).data.iter().all(|&x| x == 0xAF));
    let fua = TestBackend::count(&b.fua_writes);
    good(&run(&lu, &orw(3, 1, 0x18), &vec![0x50; bs]));
    assert_eq!(TestBackend::count(&b.fua_writes), fua + 1);
    assert!(run(&lu, &read10(3, 1), &[]).data.iter().all(|&x| x == 0xFF));
    good(&run(&lu, &orw(0, 0, 0), &[]));
    lba_oob(&run(&lu, &orw(BLOCKS + 1, 0, 0), &[]));
    lba_oob(&run(&lu, &orw(BLOCKS - 1, 2, 0), &vec![0; 2 * bs]));
    lba_oob(&run(&lu, &orw(u64::MAX, 1, 0), &vec![0; bs]));
    for p in 1..8u8 {
        invalid_cdb(&run(&lu, &orw(0, 1, p << 5), &vec![0; bs]), 1, Some(7));
    }
    let max = lu.max_transfer_blocks();
    invalid_cdb(&run(&lu, &orw(0, max + 1, 0), &[]), 10, None);
    sense(
        &run(&lu, &orw(0, 1, 0), &[0; 100]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
    );
    TestBackend::set(&b.fail_read, true);
    sense(
        &run(&lu, &orw(0, 1, 0), &vec![0; bs]),
        SenseKey::MediumError,
        Asc::UNRECOVERED_READ_ERROR,
    );
}

fn wa(lba: u64, boundary: u16, len: u16, flags: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::WRITE_ATOMIC_16;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..12].copy_from_slice(&boundary.to_be_bytes());
    c[12..14].copy_from_slice(&len.to_be_bytes());
    c
}

#[test]
fn write_atomic() {
    let lu = mem_lu();
    let bs = BS as usize;
    let d = pattern(4 * bs, 5);
    assert_eq!(lu.plan(&wa(0, 0, 4, 0)).data_out, 4 * BS);
    good(&run(&lu, &wa(8, 0, 4, 0x18), &d));
    assert_eq!(&run(&lu, &read10(8, 4), &[]).data[..], &d[..]);
    good(&run(&lu, &wa(0, 0, 0, 0), &[]));
    lba_oob(&run(&lu, &wa(BLOCKS + 1, 0, 0, 0), &[]));
    lba_oob(&run(&lu, &wa(BLOCKS - 1, 0, 2, 0), &d));
    lba_oob(&run(&lu, &wa(1 << 63, 0, 1, 0), &d));
    invalid_cdb(&run(&lu, &wa(0, 1, 1, 0), &d), 10, None);
    for p in 1..8u8 {
        invalid_cdb(&run(&lu, &wa(0, 0, 1, p << 5), &d), 1, Some(7));
    }
    // A short transfer writes nothing.
    sense(
        &run(&lu, &wa(100, 0, 4, 0), &d[..3 * bs]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
    );
    assert!(run(&lu, &read10(100, 4), &[]).data.iter().all(|&x| x == 0));
}

#[test]
fn write_atomic_limit_follows_the_backend() {
    // RAM: up to the maximum transfer length.
    let lu = mem_lu();
    let max = lu.max_transfer_blocks() as u16;
    let big = vec![1u8; (usize::from(max) + 1) * BS as usize];
    let o = run(&lu, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(&o.data[44..48], &u32::from(max).to_be_bytes());
    good(&run(&lu, &wa(0, 0, BLOCKS as u16, 0), &big));
    // One block more than the maximum is also past this small unit's end:
    // the range is checked first.
    assert!(u64::from(max) + 1 > BLOCKS);
    lba_oob(&run(&lu, &wa(0, 0, max + 1, 0), &big));
    // A backend with no crash-atomicity promise: one block.
    let (lu, _) = test_lu(cfg());
    good(&run(&lu, &wa(0, 0, 1, 0), &big));
    invalid_cdb(&run(&lu, &wa(0, 0, 2, 0), &big), 12, None);
    // Past the end and over the limit: the range is checked first (5/21,
    // not 5/24).
    lba_oob(&run(&lu, &wa(BLOCKS - 1, 0, 2, 0), &big));
    lba_oob(&run(&lu, &wa(BLOCKS - 1, 1, 2, 0), &big));
    let o = run(&lu, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(&o.data[44..48], &1u32.to_be_bytes());
}

#[test]
fn read_defect_data() {
    let lu = mem_lu();
    let o = run(
        &lu,
        &[op::READ_DEFECT_DATA_10, 0, 0, 0, 0, 0, 0, 0, 32, 0],
        &[],
    );
    good(&o);
    assert_eq!(&o.data[..], &[0, 0, 0, 0]);
    // Both lists asked for, long block format: valid and empty.
    let o = run(
        &lu,
        &[op::READ_DEFECT_DATA_10, 0, 0x1B, 0, 0, 0, 0, 0, 32, 0],
        &[],
    );
    assert_eq!(&o.data[..], &[0, 0x1B, 0, 0]);
    let o = run(
        &lu,
        &[op::READ_DEFECT_DATA_10, 0, 0x18, 0, 0, 0, 0, 0, 2, 0],
        &[],
    );
    assert_eq!(&o.data[..], &[0, 0x18]);
    invalid_cdb(
        &run(
            &lu,
            &[op::READ_DEFECT_DATA_10, 0, 0x07, 0, 0, 0, 0, 0, 32, 0],
            &[],
        ),
        2,
        Some(2),
    );
    let c12 = cdb12(op::READ_DEFECT_DATA_12, 0x10, 0, 32);
    let o = run(&lu, &c12, &[]);
    good(&o);
    assert_eq!(&o.data[..], &[0, 0x10, 0, 0, 0, 0, 0, 0]);
    assert_eq!(lu.plan(&c12).data_in, 32);
    invalid_cdb(
        &run(&lu, &cdb12(op::READ_DEFECT_DATA_12, 0x0F, 0, 32), &[]),
        1,
        Some(2),
    );
}

#[test]
fn sanitize_stays_refused() {
    let lu = mem_lu();
    let o = run(&lu, &[0x48, 0x01, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(o.sense, Some(Sense::invalid_opcode()));
}

/// RAM with RBD-like atomicity: whole 4 KiB units on 4 KiB boundaries.
struct Aligned(storage::MemBackend);

impl storage::BlockBackend for Aligned {
    fn caps(&self) -> storage::Caps {
        storage::Caps {
            max_atomic_write: 4096,
            atomic_alignment: 4096,
            ..storage::Caps::new("aligned", storage::WriteCache::WriteThrough)
        }
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> std::io::Result<()> {
        self.0.write_at(buf, offset, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn set_write_cache(&self, _: storage::WriteCache) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn write_atomic_alignment_follows_the_backend() {
    let b = std::sync::Arc::new(Aligned(storage::MemBackend::new(BLOCKS * u64::from(BS))));
    let lu = LogicalUnit::new(b, cfg()).unwrap();
    let o = run(&lu, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(&o.data[44..48], &8u32.to_be_bytes(), "max atomic: 8 blocks");
    assert_eq!(
        &o.data[48..52],
        &8u32.to_be_bytes(),
        "atomic alignment: 8 blocks"
    );
    let d = vec![7u8; 8 * BS as usize];
    good(&run(&lu, &wa(16, 0, 8, 0), &d));
    good(&run(&lu, &wa(16, 0, 3, 0), &d));
    invalid_cdb(&run(&lu, &wa(17, 0, 1, 0), &d), 2, None);
    invalid_cdb(&run(&lu, &wa(16, 0, 9, 0), &d), 12, None);
    // Out of range wins over misalignment (libiscsi WriteAtomic16.BeyondEol).
    lba_oob(&run(&lu, &wa(BLOCKS - 1, 0, 2, 0), &d));
}
