//! WRITE SAME, UNMAP, GET LBA STATUS, and how thin provisioning is told.

use super::*;
use storage::NullBackend;

fn full_lu() -> LogicalUnit {
    LogicalUnit::new(
        Arc::new(MemBackend::new(BLOCKS * u64::from(BS))),
        LuConfig {
            thin: false,
            ..cfg()
        },
    )
    .unwrap()
}

fn ws10(lba: u32, n: u16, flags: u8) -> [u8; 10] {
    let mut c = cdb10(op::WRITE_SAME_10, flags, lba, n);
    c[6] = 0;
    c
}

fn ws16(lba: u64, n: u32, flags: u8) -> [u8; 16] {
    cdb16(op::WRITE_SAME_16, flags, lba, n)
}

fn unmap_list(descs: &[(u64, u32)]) -> Vec<u8> {
    let len = 8 + 16 * descs.len();
    let mut d = vec![0u8; len];
    d[0..2].copy_from_slice(&((len - 2) as u16).to_be_bytes());
    d[2..4].copy_from_slice(&((len - 8) as u16).to_be_bytes());
    for (i, (lba, n)) in descs.iter().enumerate() {
        d[8 + 16 * i..16 + 16 * i].copy_from_slice(&lba.to_be_bytes());
        d[16 + 16 * i..20 + 16 * i].copy_from_slice(&n.to_be_bytes());
    }
    d
}

fn unmap_cdb(len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op::UNMAP;
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

fn run_unmap(lu: &LogicalUnit, descs: &[(u64, u32)]) -> Outcome {
    let l = unmap_list(descs);
    run(lu, &unmap_cdb(l.len() as u16), &l)
}

fn gls(lba: u64, alloc: u32) -> [u8; 16] {
    cdb16(op::SERVICE_ACTION_IN_16, 0x12, lba, alloc)
}

/// (lba, blocks, provisioning status) of each descriptor.
fn descriptors(o: &Outcome) -> Vec<(u64, u32, u8)> {
    good(o);
    let d = &o.data;
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    assert_eq!((len - 4) % 16, 0);
    d[8..]
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

#[track_caller]
fn param_invalid(o: &Outcome, byte: u16) {
    sense(
        o,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    let f = o.sense.unwrap().field.expect("field pointer");
    assert!(!f.in_cdb);
    assert_eq!(f.byte, byte);
}

#[track_caller]
fn list_length_error(o: &Outcome) {
    sense(
        o,
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
}

#[test]
fn thin_is_told_truthfully() {
    let rc16 = cdb16(op::SERVICE_ACTION_IN_16, 0x10, 0, 32);
    let thin = mem_lu();
    assert!(thin.thin());
    assert_eq!(run(&thin, &rc16, &[]).data[14] & 0xC0, 0xC0, "LBPME, LBPRZ");
    let b2 = run(&thin, &[op::INQUIRY, 1, 0xB2, 0, 64, 0], &[]);
    good(&b2);
    assert_eq!(&b2.data[..], &[0, 0xB2, 0, 4, 0, 0xE4, 0x02, 0]);
    // Configured off, or a backend that cannot free space: fully provisioned.
    let null = LogicalUnit::new(Arc::new(NullBackend::new(1 << 20)), cfg()).unwrap();
    let (test, _) = test_lu(cfg());
    for lu in [full_lu(), null, test] {
        assert!(!lu.thin());
        assert_eq!(run(&lu, &rc16, &[]).data[14], 0);
        let o = run(&lu, &[op::INQUIRY, 1, 0, 0, 64, 0], &[]);
        assert!(!o.data[4..].contains(&0xB2));
        invalid_cdb(&run(&lu, &[op::INQUIRY, 1, 0xB2, 0, 64, 0], &[]), 2, None);
        let o = run(&lu, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], &[]);
        assert_eq!(&o.data[20..28], &[0; 8], "no UNMAP limits");
        sense(
            &run_unmap(&lu, &[(0, 1)]),
            SenseKey::IllegalRequest,
            Asc::INVALID_COMMAND_OPERATION_CODE,
        );
        invalid_cdb(&run(&lu, &ws16(0, 1, 0x08), &[0; 512]), 1, Some(3));
        invalid_cdb(&run(&lu, &ws10(0, 1, 0x08), &[0; 512]), 1, Some(3));
        // RSOC does not list UNMAP.
        let mut c = [0u8; 12];
        c[0] = op::MAINTENANCE_IN;
        c[1] = 0x0C;
        c[2] = 1;
        c[3] = op::UNMAP;
        c[6..10].copy_from_slice(&64u32.to_be_bytes());
        assert_eq!(&run(&lu, &c, &[]).data[..], &[0, 1, 0, 0]);
    }
}

#[test]
fn write_same_writes_every_block() {
    let lu = mem_lu();
    let block = pattern(BS as usize, 3);
    good(&run(&lu, &ws10(10, 5, 0), &block));
    let o = run(&lu, &read10(9, 7), &[]);
    let d = &o.data;
    assert!(d[..BS as usize].iter().all(|&x| x == 0));
    for i in 1..6 {
        assert_eq!(&d[i * BS as usize..(i + 1) * BS as usize], &block[..]);
    }
    assert!(d[6 * BS as usize..].iter().all(|&x| x == 0));
    // WRITE SAME(16), up to the end of the LUN, past the 1 MiB buffer.
    let n = 3000u32;
    good(&run(&lu, &ws16(BLOCKS - u64::from(n), n, 0), &block));
    let o = run(&lu, &cdb16(op::READ_16, 0, BLOCKS - u64::from(n), n), &[]);
    assert!(o.data.chunks(BS as usize).all(|c| c == &block[..]));
    assert_eq!(lu.plan(&ws10(0, 5, 0)).data_out, BS);
    assert_eq!(lu.plan(&ws16(0, 5, 0x01)).data_out, 0, "NDOB");
}

#[test]
fn write_same_zeroes_and_unmaps() {
    let lu = mem_lu();
    let bs = BS as usize;
    // 4096 blocks of 512 bytes: two 1 MiB chunks.
    let all = |lu: &LogicalUnit| descriptors(&run(lu, &gls(0, 8 + 16 * 8), &[]));
    assert_eq!(all(&lu), vec![(0, 4096, 1)]);
    good(&run(
        &lu,
        &cdb16(op::WRITE_16, 0, 0, 4096),
        &vec![0xFF; 4096 * bs],
    ));
    assert_eq!(all(&lu), vec![(0, 4096, 0)]);
    // UNMAP bit with zeros: the first chunk is freed, zeros read back.
    good(&run(&lu, &ws16(0, 2048, 0x08), &vec![0; bs]));
    assert_eq!(all(&lu), vec![(0, 2048, 1), (2048, 2048, 0)]);
    assert!(run(&lu, &read10(0, 2048), &[]).data.iter().all(|&x| x == 0));
    // NDOB + UNMAP, WRITE SAME(10) + UNMAP: the same.
    good(&run(&lu, &ws16(2048, 2048, 0x09), &[]));
    assert_eq!(all(&lu), vec![(0, 4096, 1)]);
    // Zeros without UNMAP: written and mapped.
    good(&run(&lu, &ws10(0, 0x800, 0), &vec![0; bs]));
    assert_eq!(all(&lu), vec![(0, 2048, 0), (2048, 2048, 1)]);
    good(&run(&lu, &ws10(0, 0x800, 0x08), &vec![0; bs]));
    assert_eq!(all(&lu), vec![(0, 4096, 1)]);
    // Partial chunk: zeroed, stays mapped.
    good(&run(&lu, &ws10(7, 2, 0), &vec![0xAB; bs]));
    good(&run(&lu, &ws10(7, 1, 0x08), &vec![0; bs]));
    let d = run(&lu, &read10(7, 2), &[]).data;
    assert!(d[..bs].iter().all(|&x| x == 0) && d[bs..].iter().all(|&x| x == 0xAB));
}

/// SBC-4 WRITE SAME, ANCHOR/UNMAP/ANC_SUP table: UNMAP = 1 is "Unmap"
/// whatever the data-out block holds; with LBPRZ = 1 zeros read back
/// (libiscsi WriteSame10.UnmapUntilEnd).
#[test]
fn write_same_unmap_ignores_the_data_out_block() {
    let lu = mem_lu();
    let bs = BS as usize;
    let all = |lu: &LogicalUnit| descriptors(&run(lu, &gls(0, 8 + 16 * 8), &[]));
    good(&run(
        &lu,
        &cdb16(op::WRITE_16, 0, 0, 4096),
        &vec![0xFF; 4096 * bs],
    ));
    // A whole chunk with a block of 0xFF: deallocated.
    good(&run(&lu, &ws16(0, 2048, 0x08), &vec![0xFF; bs]));
    assert_eq!(all(&lu), vec![(0, 2048, 1), (2048, 2048, 0)]);
    assert!(run(&lu, &read10(0, 2048), &[]).data.iter().all(|&x| x == 0));
    // 1..=256 blocks at the end, NUMBER OF LOGICAL BLOCKS 0 (to the end),
    // a block of 0xFF as the data-out: zeros read back every time.
    let nb = BLOCKS as u32;
    for i in 1..=256u32 {
        good(&run(
            &lu,
            &cdb10(op::WRITE_10, 0, nb - i, i as u16),
            &vec![0xFF; i as usize * bs],
        ));
        good(&run(&lu, &ws10(nb - i, 0, 0x08), &vec![0xFF; bs]));
        let d = run(&lu, &read10(nb - i, i as u16), &[]).data;
        assert!(d.iter().all(|&x| x == 0), "{i} blocks at the end");
    }
    // Without UNMAP the block is written.
    good(&run(&lu, &ws10(7, 2, 0), &vec![0xAB; bs]));
    assert!(run(&lu, &read10(7, 2), &[]).data.iter().all(|&x| x == 0xAB));
}

#[test]
fn write_same_checks() {
    let lu = mem_lu();
    let bs = BS as usize;
    let z = vec![0u8; bs];
    let nb = BLOCKS as u32;
    for p in 1..8u8 {
        invalid_cdb(&run(&lu, &ws10(0, 1, p << 5), &z), 1, Some(7));
        invalid_cdb(&run(&lu, &ws16(0, 1, p << 5), &z), 1, Some(7));
    }
    invalid_cdb(&run(&lu, &ws10(0, 1, 0x10), &z), 1, Some(4)); // ANCHOR
    invalid_cdb(&run(&lu, &ws16(0, 1, 0x18), &z), 1, Some(4));
    invalid_cdb(&run(&lu, &ws10(0, 1, 0x04), &z), 1, Some(2)); // PBDATA
    invalid_cdb(&run(&lu, &ws16(0, 1, 0x02), &z), 1, Some(1)); // LBDATA
    invalid_cdb(&run(&lu, &ws10(0, 1, 0x01), &z), 1, Some(0)); // reserved in (10)
                                                               // Beyond the end, overflow-safe.
    for i in 1..=16u32 {
        lba_oob(&run(&lu, &ws10(nb - i + 1, i as u16, 0), &z));
        lba_oob(&run(&lu, &ws16(u64::MAX, i, 0), &z));
        lba_oob(&run(&lu, &ws16(1 << 63, i, 0), &z));
    }
    lba_oob(&run(&lu, &ws10(nb + 1, 0, 0), &z));
    lba_oob(&run(&lu, &ws16(u64::MAX, 0, 0), &z));
    // 0 blocks: to the end.
    good(&run(&lu, &ws10(nb - 3, 0, 0), &vec![7u8; bs]));
    assert!(run(&lu, &read10(nb - 3, 3), &[])
        .data
        .iter()
        .all(|&x| x == 7));
    // The data-out must be exactly one block.
    let bad = |o: &Outcome| {
        sense(
            o,
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
        )
    };
    bad(&run(&lu, &ws10(0, 1, 0), &z[..bs / 2]));
    let two = wd(&vec![0u8; 2 * bs]);
    let c = ws16(0, 1, 0x08);
    bad(&lu.execute(&Command {
        expected_data_out: Some(2 * BS),
        ..cmd(&c, &two, N1)
    }));
    good(&lu.execute(&Command {
        expected_data_out: Some(BS),
        ..cmd(&c, &two, N1)
    }));
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
        &run(&ro, &ws10(0, 1, 0), &z),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
}

#[test]
fn write_same_length_limit() {
    // A LUN larger than MAXIMUM WRITE SAME LENGTH.
    let max = crate::MAX_WRITE_SAME_BYTES / u64::from(BS);
    let blocks = max + 100;
    let lu = LogicalUnit::new(Arc::new(MemBackend::new(blocks * u64::from(BS))), cfg()).unwrap();
    let z = vec![0u8; BS as usize];
    let o = run(&lu, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], &[]);
    assert_eq!(&o.data[36..44], &max.to_be_bytes());
    invalid_cdb(&run(&lu, &ws16(0, max as u32 + 1, 0), &z), 10, None);
    // 0 blocks = the rest of the LUN, over the limit.
    invalid_cdb(&run(&lu, &ws16(0, 0, 0), &z), 10, None);
    invalid_cdb(&run(&lu, &ws16(blocks - max - 1, 0, 0), &z), 10, None);
    good(&run(&lu, &ws16(blocks - max, 0, 0x08), &z));
    good(&run(&lu, &ws16(0, max as u32, 0x08), &z));
    // A huge count is refused before anything is allocated.
    invalid_cdb(&run(&lu, &ws16(0, u32::MAX, 0), &z), 10, None);
}

#[test]
fn write_same_backend_errors() {
    let (lu, b) = test_lu(cfg());
    TestBackend::set(&b.fail_write, true);
    sense(
        &run(&lu, &ws10(0, 4, 0), &[1u8; 512]),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
    sense(
        &run(&lu, &ws10(0, 4, 0), &[0u8; 512]),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
}

#[test]
fn unmap_deallocates_and_reads_zeros() {
    let lu = mem_lu();
    let bs = BS as usize;
    good(&run(
        &lu,
        &cdb16(op::WRITE_16, 0, 0, 4096),
        &vec![0x5A; 4096 * bs],
    ));
    good(&run_unmap(&lu, &[(2048, 2048), (10, 3), (100, 0)]));
    let d = descriptors(&run(&lu, &gls(0, 64), &[]));
    assert_eq!(d, vec![(0, 2048, 0), (2048, 2048, 1)]);
    let o = run(&lu, &read10(8, 6), &[]);
    let o = &o.data;
    assert!(o[..2 * bs].iter().all(|&x| x == 0x5A));
    assert!(o[2 * bs..5 * bs].iter().all(|&x| x == 0));
    assert!(o[5 * bs..].iter().all(|&x| x == 0x5A));
    // Zero-block descriptors, including at the capacity, and no descriptors.
    good(&run_unmap(&lu, &[(BLOCKS, 0)]));
    good(&run_unmap(&lu, &[]));
    good(&run(&lu, &unmap_cdb(0), &[]));
    assert_eq!(lu.plan(&unmap_cdb(24)).data_out, 24);
}

#[test]
fn unmap_parameter_list_validation() {
    let lu = mem_lu();
    // PARAMETER LIST LENGTH 1..7, or less data than the header.
    for n in 1..8u16 {
        list_length_error(&run(&lu, &unmap_cdb(n), &[0; 8]));
    }
    list_length_error(&run(&lu, &unmap_cdb(24), &[0, 22, 0, 16]));
    // Header lengths past the list.
    let mut l = unmap_list(&[(0, 1)]);
    l[1] = 30;
    list_length_error(&run(&lu, &unmap_cdb(24), &l));
    let mut l = unmap_list(&[(0, 1)]);
    l[3] = 32;
    list_length_error(&run(&lu, &unmap_cdb(24), &l));
    // Descriptor data past the UNMAP DATA LENGTH.
    let mut l = unmap_list(&[(0, 1)]);
    l[1] = 10;
    param_invalid(&run(&lu, &unmap_cdb(24), &l), 2);
    // An incomplete trailing descriptor is ignored.
    let mut l = unmap_list(&[(0, 1)]);
    l.extend_from_slice(&[0xFF; 8]);
    l[1] += 8;
    l[3] += 8;
    good(&run(&lu, &unmap_cdb(l.len() as u16), &l));
    // Too many descriptors, too many blocks.
    let many: Vec<(u64, u32)> = (0..=crate::MAX_UNMAP_DESCRIPTORS as u64)
        .map(|i| (i, 1))
        .collect();
    param_invalid(&run_unmap(&lu, &many), 2);
    let big = LogicalUnit::new(Arc::new(MemBackend::new(1 << 31)), cfg()).unwrap();
    let m = crate::MAX_UNMAP_BLOCKS;
    good(&run_unmap(&big, &[(0, m)]));
    param_invalid(&run_unmap(&big, &[(0, m), (m as u64, 1)]), 16 + 8 + 8);
    // Ranges past the end, overflow-safe; nothing is unmapped then.
    good(&run(&lu, &write10(0, 1), &[9u8; 512]));
    lba_oob(&run_unmap(&lu, &[(0, 1), (BLOCKS - 1, 2)]));
    lba_oob(&run_unmap(&lu, &[(u64::MAX, 2)]));
    lba_oob(&run_unmap(&lu, &[(BLOCKS + 1, 0)]));
    assert!(run(&lu, &read10(0, 1), &[]).data.iter().all(|&x| x == 9));
    // ANCHOR is not supported; write protect.
    let mut c = unmap_cdb(24);
    c[1] = 1;
    invalid_cdb(&run(&lu, &c, &unmap_list(&[(0, 1)])), 1, Some(0));
    let ro = LogicalUnit::new(
        Arc::new(MemBackend::new(BLOCKS * u64::from(BS))),
        LuConfig {
            read_only: true,
            ..cfg()
        },
    )
    .unwrap();
    sense(
        &run_unmap(&ro, &[(0, 1)]),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
}

#[test]
fn get_lba_status() {
    let lu = mem_lu();
    good(&run(&lu, &write10(2048 + 5, 1), &[1u8; 512]));
    // One descriptor fits 24 bytes; the first starts at the LBA asked for.
    let d = descriptors(&run(&lu, &gls(7, 24), &[]));
    assert_eq!(d, vec![(7, 2041, 1)]);
    let d = descriptors(&run(&lu, &gls(2050, 24), &[]));
    assert_eq!(d, vec![(2050, 2046, 0)]);
    let d = descriptors(&run(&lu, &gls(0, 1000), &[]));
    assert_eq!(d, vec![(0, 2048, 1), (2048, 2048, 0)]);
    let d = descriptors(&run(&lu, &gls(BLOCKS - 1, 24), &[]));
    assert_eq!(d, vec![(BLOCKS - 1, 1, 0)]);
    // Truncated to the allocation length, header still counts the list.
    let o = run(&lu, &gls(0, 4), &[]);
    assert_eq!(&o.data[..], &[0, 0, 0, 20]);
    lba_oob(&run(&lu, &gls(BLOCKS, 24), &[]));
    lba_oob(&run(&lu, &gls(u64::MAX, 24), &[]));
    lba_oob(&run(&lu, &gls(1 << 63, 24), &[]));
    let mut c = gls(0, 24);
    c[14] = 1;
    invalid_cdb(&run(&lu, &c, &[]), 14, Some(2));
    assert_eq!(lu.plan(&gls(0, 24)).data_in, 24);
    // Fully provisioned: all mapped.
    let d = descriptors(&run(&full_lu(), &gls(3, 24), &[]));
    assert_eq!(d, vec![(3, BLOCKS as u32 - 3, 0)]);
}

#[test]
fn file_backend_thin_end_to_end() {
    let dir = tempfile_dir();
    let p = dir.join("lu.img");
    let f = storage::FileBackend::open(&p, Some(BLOCKS * u64::from(BS)), WriteCache::WriteThrough)
        .unwrap();
    let lu = LogicalUnit::new(Arc::new(f), cfg()).unwrap();
    assert!(lu.thin());
    good(&run(&lu, &write10(64, 64), &vec![3u8; 64 * BS as usize]));
    let d = descriptors(&run(&lu, &gls(0, 1000), &[]));
    assert_eq!(
        d,
        vec![(0, 64, 1), (64, 64, 0), (128, BLOCKS as u32 - 128, 1)]
    );
    good(&run_unmap(&lu, &[(64, 64)]));
    let d = descriptors(&run(&lu, &gls(0, 1000), &[]));
    assert_eq!(d, vec![(0, BLOCKS as u32, 1)]);
    assert!(run(&lu, &read10(64, 64), &[]).data.iter().all(|&x| x == 0));
    let _ = std::fs::remove_dir_all(dir);
}

/// A fresh directory under the system temporary directory.
fn tempfile_dir() -> std::path::PathBuf {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "ironsan-scsi-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
