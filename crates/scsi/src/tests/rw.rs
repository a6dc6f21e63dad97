//! READ, WRITE, VERIFY, WRITE AND VERIFY, PRE-FETCH, SYNCHRONIZE CACHE.

use super::*;
use crate::Sense;

#[test]
fn write_then_read_all_cdb_sizes() {
    let lu = mem_lu();
    let data = pattern(4 * BS as usize, 7);
    good(&run(&lu, &write10(10, 4), &data));
    let o = run(&lu, &read10(10, 4), &[]);
    good(&o);
    assert_eq!(&o.data[..], &data[..]);

    let data12 = pattern(2 * BS as usize, 9);
    good(&run(&lu, &cdb12(op::WRITE_12, 0, 100, 2), &data12));
    let o = run(&lu, &cdb12(op::READ_12, 0, 100, 2), &[]);
    assert_eq!(&o.data[..], &data12[..]);

    let data16 = pattern(3 * BS as usize, 11);
    let last = BLOCKS - 3;
    good(&run(&lu, &cdb16(op::WRITE_16, 0, last, 3), &data16));
    let o = run(&lu, &cdb16(op::READ_16, 0, last, 3), &[]);
    assert_eq!(&o.data[..], &data16[..]);

    // WRITE(6)/READ(6): 21-bit LBA, length byte 4.
    let data6 = pattern(BS as usize, 13);
    good(&run(&lu, &[op::WRITE_6, 0x00, 0x01, 0x00, 1, 0], &data6));
    let o = run(&lu, &[op::READ_6, 0x00, 0x01, 0x00, 1, 0], &[]);
    assert_eq!(&o.data[..], &data6[..]);
    assert_eq!(&run(&lu, &read10(256, 1), &[]).data[..], &data6[..]);
}

#[test]
fn read6_length_zero_means_256_blocks() {
    let lu = mem_lu();
    let o = run(&lu, &[op::READ_6, 0, 0, 0, 0, 0], &[]);
    good(&o);
    assert_eq!(o.data.len(), 256 * BS as usize);
    assert_eq!(lu.plan(&[op::READ_6, 0, 0, 0, 0, 0]).data_in, 256 * BS);
}

#[test]
fn zero_length_transfers_are_good_and_move_nothing() {
    let (lu, b) = test_lu(cfg());
    for c in [
        read10(0, 0).to_vec(),
        write10(0, 0).to_vec(),
        cdb12(op::READ_12, 0, 5, 0).to_vec(),
        cdb16(op::WRITE_16, 0, BLOCKS - 1, 0).to_vec(),
        cdb10(op::VERIFY_10, 0x02, 0, 0).to_vec(),
        cdb10(op::WRITE_AND_VERIFY_10, 0, 0, 0).to_vec(),
        cdb10(op::PRE_FETCH_10, 0, 0, 0).to_vec(),
    ] {
        let o = run(&lu, &c, &[]);
        good(&o);
        assert!(o.data.is_empty());
    }
    assert_eq!(TestBackend::count(&b.writes), 0);
}

#[test]
fn beyond_end_of_lun_is_lba_out_of_range() {
    let lu = mem_lu();
    let nb = BLOCKS as u32;
    // One block past the end, for 1..=256 blocks.
    for i in 1..=256u16 {
        lba_oob(&run(&lu, &read10(nb + 1 - u32::from(i), i), &[]));
    }
    // 32-bit wrap-around: 0xFFFFFFFF + n.
    lba_oob(&run(&lu, &read10(u32::MAX, 256), &[]));
    lba_oob(&run(&lu, &read10(0x8000_0000, 1), &[]));
    for i in 2..=256u16 {
        lba_oob(&run(&lu, &read10(nb - 1, i), &[]));
    }
    // 64-bit LBAs that overflow when multiplied by the block size or added to.
    for lba in [u64::MAX, 1 << 63, 1 << (64 - 9), 1 << (63 - 9), BLOCKS] {
        lba_oob(&run(&lu, &cdb16(op::READ_16, 0, lba, 1), &[]));
        lba_oob(&run(&lu, &cdb16(op::READ_16, 0, lba, 0), &[]));
    }
    // Length 0 is range checked too.
    lba_oob(&run(&lu, &read10(nb + 1, 0), &[]));
    lba_oob(&run(&lu, &read10(nb, 0), &[]));
    lba_oob(&run(&lu, &read10(u32::MAX, 0), &[]));
    good(&run(&lu, &read10(nb - 1, 0), &[]));
    // READ(6) at the top of its 21-bit range.
    lba_oob(&run(&lu, &[op::READ_6, 0x1F, 0xFF, 0xFF, 1, 0], &[]));
    // Writes, verifies, prefetches: same rule.
    let d = vec![0xA6; 2 * BS as usize];
    lba_oob(&run(&lu, &write10(nb - 1, 2), &d));
    lba_oob(&run(&lu, &cdb16(op::WRITE_16, 0, 1 << 63, 1), &d));
    lba_oob(&run(&lu, &cdb10(op::VERIFY_10, 0x02, nb - 1, 2), &d));
    lba_oob(&run(&lu, &cdb10(op::VERIFY_10, 0x02, nb + 1, 0), &[]));
    lba_oob(&run(
        &lu,
        &cdb12(op::WRITE_AND_VERIFY_12, 0x02, u32::MAX, 1),
        &d,
    ));
    lba_oob(&run(&lu, &cdb10(op::PRE_FETCH_10, 0, nb + 1 - 5, 5), &[]));
    lba_oob(&run(&lu, &cdb16(op::PRE_FETCH_16, 0, u64::MAX, 0), &[]));
    lba_oob(&run(&lu, &cdb10(op::SYNCHRONIZE_CACHE_10, 0, nb, 0), &[]));
    lba_oob(&run(
        &lu,
        &cdb16(op::SYNCHRONIZE_CACHE_16, 0, 0, nb + 1),
        &[],
    ));
}

#[test]
fn protection_fields_are_invalid() {
    let lu = mem_lu();
    let d = vec![0u8; BS as usize];
    for p in 1..8u8 {
        let flags = p << 5;
        invalid_cdb(&run(&lu, &cdb10(op::READ_10, flags, 0, 1), &[]), 1, Some(7));
        invalid_cdb(&run(&lu, &cdb12(op::READ_12, flags, 0, 1), &[]), 1, Some(7));
        invalid_cdb(&run(&lu, &cdb16(op::READ_16, flags, 0, 1), &[]), 1, Some(7));
        invalid_cdb(&run(&lu, &cdb10(op::WRITE_10, flags, 0, 1), &d), 1, Some(7));
        invalid_cdb(&run(&lu, &cdb16(op::WRITE_16, flags, 0, 1), &d), 1, Some(7));
        invalid_cdb(
            &run(&lu, &cdb10(op::VERIFY_10, flags | 2, 0, 1), &d),
            1,
            Some(7),
        );
        invalid_cdb(
            &run(&lu, &cdb16(op::WRITE_AND_VERIFY_16, flags, 0, 1), &d),
            1,
            Some(7),
        );
    }
    // READ(6) byte 1 holds LBA bits, not protection.
    good(&run(&lu, &[op::READ_6, 0x00, 0, 0, 1, 0], &[]));
}

#[test]
fn dpo_and_fua_are_accepted() {
    let (lu, b) = test_lu(cfg());
    let d = pattern(BS as usize, 1);
    for flags in [0x10, 0x08, 0x18] {
        good(&run(&lu, &cdb10(op::WRITE_10, flags, 0, 1), &d));
        good(&run(&lu, &cdb16(op::READ_16, flags, 0, 1), &[]));
        good(&run(&lu, &cdb12(op::VERIFY_12, flags & 0x10, 0, 1), &[]));
    }
    assert_eq!(TestBackend::count(&b.fua_writes), 2);
    // FUA reads flush a write-back cache first; write-through needs nothing.
    assert_eq!(TestBackend::count(&b.flushes), 0);
    TestBackend::set(&b.write_back, true);
    good(&run(&lu, &cdb10(op::READ_10, 0x08, 0, 1), &[]));
    assert_eq!(TestBackend::count(&b.flushes), 1);
}

#[test]
fn transfer_length_over_the_block_limits_maximum() {
    let lu = mem_lu();
    let max = lu.max_transfer_blocks();
    assert_eq!(max, crate::MAX_TRANSFER_BYTES / BS);
    let o = run(&lu, &cdb12(op::READ_12, 0, 0, max + 1), &[]);
    invalid_cdb(&o, 6, None);
    invalid_cdb(
        &run(&lu, &cdb16(op::READ_16, 0, 0, u32::MAX), &[]),
        10,
        None,
    );
    invalid_cdb(
        &run(&lu, &cdb16(op::WRITE_16, 0, 0, max + 1), &[]),
        10,
        None,
    );
    invalid_cdb(&run(&lu, &cdb10(op::VERIFY_10, 0, 0, 0xFFFF), &[]), 7, None);
    assert_eq!(lu.plan(&cdb16(op::WRITE_16, 0, 0, max + 1)).data_out, 0);
    assert_eq!(lu.plan(&cdb16(op::WRITE_16, 0, 0, max)).data_out, max * BS);
}

#[test]
fn short_data_out_writes_whole_blocks_received() {
    let lu = mem_lu();
    good(&run(&lu, &write10(0, 2), &vec![b'a'; 2 * BS as usize]));
    // Two blocks described, one sent: write one, GOOD.
    good(&run(&lu, &write10(0, 2), &vec![b'b'; BS as usize]));
    let o = run(&lu, &read10(0, 2), &[]);
    assert!(o.data[..BS as usize].iter().all(|&x| x == b'b'));
    assert!(o.data[BS as usize..].iter().all(|&x| x == b'a'));
    // Part of a block: nothing written, INVALID FIELD IN INFORMATION UNIT.
    let o = run(&lu, &write10(0, 1), &[b'c'; 200]);
    sense(
        &o,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
    );
    assert_eq!(run(&lu, &read10(0, 1), &[]).data[0], b'b');
    // Nothing sent: GOOD, nothing written.
    good(&run(&lu, &write10(0, 1), &[]));
    assert_eq!(run(&lu, &read10(0, 1), &[]).data[0], b'b');
    // More than described: the rest is ignored.
    good(&run(&lu, &write10(0, 1), &vec![b'd'; 10000]));
    let o = run(&lu, &read10(0, 2), &[]);
    assert_eq!((o.data[0], o.data[BS as usize]), (b'd', b'a'));
}

#[test]
fn write_protected_unit() {
    let mut c = cfg();
    c.read_only = true;
    let (lu, b) = test_lu(c);
    let d = vec![0u8; BS as usize];
    let wp = |o: &Outcome| sense(o, SenseKey::DataProtect, Asc::WRITE_PROTECTED);
    wp(&run(&lu, &write10(0, 1), &d));
    wp(&run(&lu, &write10(0, 0), &[]));
    wp(&run(&lu, &[op::WRITE_6, 0, 0, 0, 1, 0], &d));
    wp(&run(&lu, &cdb12(op::WRITE_12, 0, 0, 1), &d));
    wp(&run(&lu, &cdb16(op::WRITE_16, 0, 0, 1), &d));
    wp(&run(&lu, &cdb10(op::WRITE_AND_VERIFY_10, 0x02, 0, 1), &d));
    assert_eq!(TestBackend::count(&b.writes), 0);
    good(&run(&lu, &read10(0, 1), &[]));
    good(&run(&lu, &cdb10(op::VERIFY_10, 0x02, 0, 1), &d));
    good(&run(&lu, &cdb10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), &[]));
}

#[test]
fn verify_bytchk_modes() {
    let lu = mem_lu();
    let data = pattern(8 * BS as usize, 3);
    good(&run(&lu, &write10(40, 8), &data));
    // BYTCHK 0: read check only; data-out is not needed.
    good(&run(&lu, &cdb10(op::VERIFY_10, 0x00, 40, 8), &[]));
    // BYTCHK 1: equal data.
    good(&run(&lu, &cdb10(op::VERIFY_10, 0x02, 40, 8), &data));
    good(&run(&lu, &cdb12(op::VERIFY_12, 0x02, 40, 8), &data));
    good(&run(&lu, &cdb16(op::VERIFY_16, 0x12, 40, 8), &data));
    // One byte flipped: MISCOMPARE with its offset.
    for off in [0usize, 1, 511, 512, 4095] {
        let mut bad = data.clone();
        bad[off] ^= b'X';
        let o = run(&lu, &cdb10(op::VERIFY_10, 0x02, 40, 8), &bad);
        sense(&o, SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
        assert_eq!(o.sense.unwrap().information, Some(off as u64));
        // BYTCHK 0 does not compare.
        good(&run(&lu, &cdb10(op::VERIFY_10, 0x00, 40, 8), &bad));
    }
    // BYTCHK 10b is reserved.
    invalid_cdb(
        &run(&lu, &cdb10(op::VERIFY_10, 0x04, 40, 1), &data),
        1,
        Some(2),
    );
    // BYTCHK 11b: one block compared with each block.
    let same = vec![0x5A; 4 * BS as usize];
    good(&run(&lu, &write10(60, 4), &same));
    good(&run(
        &lu,
        &cdb10(op::VERIFY_10, 0x06, 60, 4),
        &same[..BS as usize],
    ));
    let o = run(
        &lu,
        &cdb10(op::VERIFY_10, 0x06, 59, 4),
        &same[..BS as usize],
    );
    sense(&o, SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
    assert_eq!(o.sense.unwrap().information, Some(0));
    let o = run(&lu, &cdb10(op::VERIFY_10, 0x06, 60, 4), &same[..100]);
    sense(
        &o,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
    );
}

#[test]
fn verify_spanning_several_read_chunks() {
    let lu = mem_lu();
    let blocks = 2560u16; // 1.25 MiB: more than one verification chunk
    let data = pattern(usize::from(blocks) * BS as usize, 5);
    good(&run(&lu, &write10(0, blocks), &data));
    good(&run(&lu, &cdb10(op::VERIFY_10, 0x02, 0, blocks), &data));
    let mut bad = data.clone();
    let off = (1 << 20) + 77;
    bad[off] ^= 1;
    let o = run(&lu, &cdb10(op::VERIFY_10, 0x02, 0, blocks), &bad);
    assert_eq!(o.sense.unwrap().information, Some(off as u64));
}

#[test]
fn write_and_verify() {
    let (lu, b) = test_lu(cfg());
    let data = pattern(3 * BS as usize, 21);
    for c in [
        cdb10(op::WRITE_AND_VERIFY_10, 0x02, 7, 3).to_vec(),
        cdb12(op::WRITE_AND_VERIFY_12, 0x00, 7, 3).to_vec(),
        cdb16(op::WRITE_AND_VERIFY_16, 0x12, 7, 3).to_vec(),
    ] {
        good(&run(&lu, &c, &data));
    }
    assert_eq!(
        TestBackend::count(&b.fua_writes),
        3,
        "written to stable storage"
    );
    assert_eq!(&run(&lu, &read10(7, 3), &[]).data[..], &data[..]);
    invalid_cdb(
        &run(&lu, &cdb10(op::WRITE_AND_VERIFY_10, 0x04, 7, 3), &data),
        1,
        Some(2),
    );
    invalid_cdb(
        &run(&lu, &cdb10(op::WRITE_AND_VERIFY_10, 0x06, 7, 3), &data),
        1,
        Some(2),
    );
    // A read-back failure is reported, not hidden.
    TestBackend::set(&b.fail_read, true);
    let o = run(&lu, &cdb10(op::WRITE_AND_VERIFY_10, 0x02, 7, 3), &data);
    sense(&o, SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR);
}

#[test]
fn pre_fetch_is_good_not_condition_met() {
    let lu = mem_lu();
    for i in 1..=256u16 {
        good(&run(&lu, &cdb10(op::PRE_FETCH_10, 0, 0, i), &[]));
        good(&run(
            &lu,
            &cdb16(op::PRE_FETCH_16, 0, BLOCKS - u64::from(i), u32::from(i)),
            &[],
        ));
    }
    // IMMED and GROUP NUMBER.
    let mut c = cdb10(op::PRE_FETCH_10, 0x02, 0, 1);
    c[6] = 3;
    good(&run(&lu, &c, &[]));
    let mut c = cdb16(op::PRE_FETCH_16, 0x02, 0, 1);
    c[14] = 3;
    good(&run(&lu, &c, &[]));
}

#[test]
fn synchronize_cache_flushes() {
    let (lu, b) = test_lu(cfg());
    good(&run(&lu, &cdb10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), &[]));
    good(&run(
        &lu,
        &cdb16(op::SYNCHRONIZE_CACHE_16, 0x02, 5, 10),
        &[],
    ));
    assert_eq!(TestBackend::count(&b.flushes), 2);
    TestBackend::set(&b.fail_flush, true);
    let o = run(&lu, &cdb10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), &[]);
    sense(&o, SenseKey::MediumError, Asc::WRITE_ERROR);
}

#[test]
fn backend_errors_become_medium_errors() {
    let (lu, b) = test_lu(cfg());
    let d = vec![1u8; BS as usize];
    TestBackend::set(&b.fail_read, true);
    sense(
        &run(&lu, &read10(0, 1), &[]),
        SenseKey::MediumError,
        Asc::UNRECOVERED_READ_ERROR,
    );
    sense(
        &run(&lu, &cdb10(op::VERIFY_10, 0, 0, 1), &[]),
        SenseKey::MediumError,
        Asc::UNRECOVERED_READ_ERROR,
    );
    TestBackend::set(&b.fail_read, false);
    TestBackend::set(&b.fail_write, true);
    sense(
        &run(&lu, &write10(0, 1), &d),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
    // A FUA read whose flush fails.
    TestBackend::set(&b.write_back, true);
    TestBackend::set(&b.fail_flush, true);
    sense(
        &run(&lu, &cdb10(op::READ_10, 0x08, 0, 1), &[]),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
    // An out-of-range error from the backend is reported as such.
    let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "range");
    assert_eq!(
        crate::lu::backend_error(&e, Asc::WRITE_ERROR),
        Sense::lba_out_of_range()
    );
}

/// Storage that did not answer in time is NOT READY, BECOMING READY
/// (retried on the same path), not standby and not MEDIUM ERROR; another
/// gateway owning the storage is standby; each is counted by kind.
#[test]
fn storage_faults_are_told_apart_and_counted() {
    use crate::faults::{storage_faults, FaultKind};
    let count = |k: FaultKind| storage_faults()[k as usize].1;
    let (slow, away, medium) = (
        count(FaultKind::Unresponsive),
        count(FaultKind::NotAccessible),
        count(FaultKind::Medium),
    );
    let e = storage::Unresponsive::error("rbd p/i: write: the cluster did not answer in time");
    let s = crate::lu::backend_error(&e, Asc::WRITE_ERROR);
    assert_eq!((s.key, s.code), (SenseKey::NotReady, Asc::BECOMING_READY));
    let e = storage::NotAccessible::fenced("rbd p/i: write: fenced");
    let s = crate::lu::backend_error(&e, Asc::WRITE_ERROR);
    assert_eq!(
        (s.key, s.code),
        (SenseKey::NotReady, Asc::NOT_ACCESSIBLE_STANDBY)
    );
    let e = std::io::Error::other("EIO");
    let s = crate::lu::backend_error(&e, Asc::WRITE_ERROR);
    assert_eq!((s.key, s.code), (SenseKey::MediumError, Asc::WRITE_ERROR));
    // Other tests run at once and may count too: at least one each.
    assert!(count(FaultKind::Unresponsive) > slow);
    assert!(count(FaultKind::NotAccessible) > away);
    assert!(count(FaultKind::Medium) > medium);
}

#[test]
fn four_kib_blocks() {
    let mut c = cfg();
    c.block_size = 4096;
    let (lu, _) = test_lu(c);
    assert_eq!(lu.block_size(), 4096);
    let d = pattern(2 * 4096, 2);
    good(&run(&lu, &write10(1, 2), &d));
    assert_eq!(&run(&lu, &read10(1, 2), &[]).data[..], &d[..]);
    lba_oob(&run(&lu, &read10(BLOCKS as u32, 1), &[]));
    assert_eq!(lu.plan(&read10(0, 3)).data_in, 3 * 4096);
}

#[test]
fn segmented_data_out_writes_like_one_buffer() {
    let lu = mem_lu();
    let bs = BS as usize;
    let data = pattern(6 * bs, 3);
    // Cut inside blocks: 1.5 blocks, 3 blocks, 1.5 blocks.
    let (a, rest) = data.split_at(bs + bs / 2);
    let segs = |n: usize| {
        let mut c = bufpool::Chain::new();
        c.push(bytes::Bytes::copy_from_slice(a));
        c.push(bytes::Bytes::copy_from_slice(&rest[..3 * bs]));
        if n == 3 {
            c.push(bytes::Bytes::copy_from_slice(&rest[3 * bs..]));
        }
        WriteData::from(c)
    };
    let c = write10(20, 6);
    good(&lu.execute(&cmd(&c, &segs(3), N1)));
    let o = run(&lu, &read10(20, 6), &[]);
    assert_eq!(&o.data[..], &data[..]);

    // Fewer whole blocks than the CDB asks: those are written.
    let c = write10(40, 8);
    good(&lu.execute(&cmd(&c, &segs(3), N1)));
    assert_eq!(&run(&lu, &read10(40, 6), &[]).data[..], &data[..]);
    // A partial block is refused and nothing is written.
    let c = write10(60, 8);
    let o = lu.execute(&cmd(&c, &segs(2), N1));
    sense(
        &o,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
    );
    assert!(run(&lu, &read10(60, 4), &[]).data.iter().all(|&b| b == 0));

    // Other commands see the segments joined: COMPARE AND WRITE of one
    // block (compare + write data) cut in two.
    let caw = [
        op::COMPARE_AND_WRITE,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        20,
        0,
        0,
        0,
        1,
        0,
        0,
    ];
    let mut both = data[..bs].to_vec();
    both.extend_from_slice(&pattern(bs, 77));
    let mut parts = bufpool::Chain::new();
    parts.push(bytes::Bytes::copy_from_slice(&both[..100]));
    parts.push(bytes::Bytes::copy_from_slice(&both[100..]));
    good(&lu.execute(&cmd(&caw, &WriteData::from(parts), N1)));
    assert_eq!(
        &run(&lu, &read10(20, 1), &[]).data[..],
        &pattern(bs, 77)[..]
    );
}
