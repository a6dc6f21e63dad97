//! Construction, dispatch, the small commands and unit attentions.

use super::*;
use crate::LuError;
use storage::NullBackend;

const TUR: [u8; 6] = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];

#[test]
fn construction_checks() {
    let mem = |size: u64| Arc::new(MemBackend::new(size)) as Arc<dyn BlockBackend>;
    let mut c = cfg();
    c.block_size = 1024;
    assert!(matches!(
        LogicalUnit::new(mem(1 << 20), c),
        Err(LuError::Geometry(GeometryError::BlockSize(1024)))
    ));
    assert!(matches!(
        LogicalUnit::new(mem(1000), cfg()),
        Err(LuError::Geometry(GeometryError::Unaligned {
            size: 1000,
            block_size: 512
        }))
    ));
    assert!(matches!(
        LogicalUnit::new(mem(0), cfg()),
        Err(LuError::Geometry(GeometryError::Empty))
    ));
    for (field, bad) in [
        ("vendor", "VENDOR_TOO_LONG"),
        ("product", "a product name too long"),
        ("revision", "1.2.3"),
        ("vendor", "caf\u{e9}"),
        ("serial", ""),
        ("serial", "   "),
        ("serial", "tab\there"),
    ] {
        let mut c = cfg();
        match field {
            "vendor" => c.vendor = bad.into(),
            "product" => c.product = bad.into(),
            "revision" => c.revision = bad.into(),
            _ => c.serial = bad.into(),
        }
        let e = LogicalUnit::new(mem(1 << 20), c).unwrap_err();
        assert!(
            matches!(e, LuError::Identifier(volume::IdentityError { field: f, .. }) if f == field),
            "{e}"
        );
    }
    let lu = mem_lu();
    assert_eq!((lu.block_size(), lu.num_blocks()), (BS, BLOCKS));
    assert!(!lu.may_block());
    let (tlu, _) = test_lu(cfg());
    assert!(tlu.may_block());
    assert_eq!(lu.config().serial, "SN0123456789");
}

#[test]
fn unknown_short_and_naca() {
    let lu = mem_lu();
    let bad_op = |o: &Outcome| {
        sense(
            o,
            SenseKey::IllegalRequest,
            Asc::INVALID_COMMAND_OPERATION_CODE,
        )
    };
    bad_op(&run(&lu, &[], &[]));
    // REPORT LUNS (the target's), SANITIZE, FORMAT UNIT, WRITE SAME(32),
    // vendor. (MAINTENANCE IN 0xA3 is implemented for REPORT SUPPORTED
    // OPERATION CODES.)
    for code in [0xA0, 0x48, 0x04, 0x7F, 0xC0, 0x3B] {
        bad_op(&run(&lu, &[code; 16], &[]));
    }
    // Shorter than the opcode's CDB: INVALID FIELD IN CDB.
    let o = run(&lu, &[op::READ_16, 0, 0, 0], &[]);
    sense(&o, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    // NACA in the CONTROL byte (not the last byte of a longer buffer).
    invalid_cdb(
        &run(&lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0x04], &[]),
        5,
        Some(2),
    );
    let mut c = read10(0, 1).to_vec();
    c[9] = 0x04;
    invalid_cdb(&run(&lu, &c, &[]), 9, Some(2));
    // Bytes past the CDB length are ignored.
    let mut long = read10(0, 1).to_vec();
    long.extend_from_slice(&[0xFF; 6]);
    good(&run(&lu, &long, &[]));
    // Other SERVICE ACTION IN(16) actions (e.g. REPORT REFERRALS).
    let mut c = cdb16(op::SERVICE_ACTION_IN_16, 0x13, 0, 24);
    invalid_cdb(&run(&lu, &c, &[]), 1, Some(4));
    c[1] = 0x10;
    good(&run(&lu, &c, &[]));
}

#[test]
fn test_unit_ready() {
    good(&run(&mem_lu(), &TUR, &[]));
}

#[test]
fn read_capacity() {
    let lu = mem_lu();
    let o = run(&lu, &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    good(&o);
    assert_eq!(&o.data[..], &[0, 0, 0x0F, 0xFF, 0, 0, 0x02, 0x00]);
    // PMI = 0 with an LBA is invalid; PMI = 1 returns the capacity.
    invalid_cdb(
        &run(&lu, &[op::READ_CAPACITY_10, 0, 0, 0, 0, 1, 0, 0, 0, 0], &[]),
        2,
        None,
    );
    good(&run(
        &lu,
        &[op::READ_CAPACITY_10, 0, 0, 0, 0, 1, 0, 0, 1, 0],
        &[],
    ));

    let mut rc16 = cdb16(op::SERVICE_ACTION_IN_16, 0x10, 0, 32);
    let o = run(&lu, &rc16, &[]);
    good(&o);
    let mut want = [0u8; 32];
    want[..8].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
    want[8..12].copy_from_slice(&BS.to_be_bytes());
    want[14] = 0xC0; // LBPME, LBPRZ: thin on a RAM backend
    assert_eq!(&o.data[..], &want[..]);
    for alloc in 0..=40u32 {
        rc16[10..14].copy_from_slice(&alloc.to_be_bytes());
        let o = run(&lu, &rc16, &[]);
        good(&o);
        assert_eq!(&o.data[..], &want[..(alloc as usize).min(32)]);
        assert_eq!(lu.plan(&rc16).data_in, alloc);
    }
}

#[test]
fn read_capacity_beyond_32_bits() {
    let lu = LogicalUnit::new(Arc::new(NullBackend::new(1 << 45)), cfg()).unwrap();
    let o = run(&lu, &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(&o.data[..4], &[0xFF; 4]);
    let o = run(&lu, &cdb16(op::SERVICE_ACTION_IN_16, 0x10, 0, 32), &[]);
    assert_eq!(&o.data[..8], &((1u64 << 36) - 1).to_be_bytes());
}

#[test]
fn request_sense() {
    let lu = mem_lu();
    let o = run(&lu, &[op::REQUEST_SENSE, 0, 0, 0, 252, 0], &[]);
    good(&o);
    assert_eq!(o.data.len(), 18);
    assert_eq!(
        (o.data[0], o.data[2], o.data[12], o.data[13]),
        (0x70, 0, 0, 0)
    );
    let o = run(&lu, &[op::REQUEST_SENSE, 1, 0, 0, 252, 0], &[]);
    assert_eq!(&o.data[..], &[0x72, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        run(&lu, &[op::REQUEST_SENSE, 0, 0, 0, 8, 0], &[])
            .data
            .len(),
        8
    );
    // A pending unit attention is returned (GOOD) and cleared.
    lu.reset();
    let o = run(&lu, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], &[]);
    good(&o);
    assert_eq!((o.data[2], o.data[12], o.data[13]), (0x06, 0x29, 0x03));
    good(&run(&lu, &TUR, &[]));
}

#[test]
fn start_stop_and_prevent_allow() {
    let lu = mem_lu();
    let ssu = |b1: u8, b4: u8| [op::START_STOP_UNIT, b1, 0, 0, b4, 0];
    good(&run(&lu, &ssu(0, 0x01), &[]));
    good(&run(&lu, &ssu(1, 0x05), &[]));
    invalid_cdb(&run(&lu, &ssu(1, 0x00), &[]), 4, Some(0));
    invalid_cdb(&run(&lu, &ssu(1, 0x03), &[]), 4, Some(1));
    invalid_cdb(&run(&lu, &ssu(1, 0x02), &[]), 4, Some(1));
    invalid_cdb(&run(&lu, &ssu(0, 0x31), &[]), 4, Some(7));
    let pa = |p: u8| [op::PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, p, 0];
    good(&run(&lu, &pa(0), &[]));
    good(&run(&lu, &pa(1), &[]));
    invalid_cdb(&run(&lu, &pa(2), &[]), 4, Some(1));
    invalid_cdb(&run(&lu, &pa(3), &[]), 4, Some(1));
}

#[test]
fn reset_reaches_every_nexus_once() {
    let lu = mem_lu();
    let n3 = NexusId(3);
    for n in [N1, N2, n3] {
        good(&lu.execute(&cmd(&TUR, &WriteData::None, n)));
    }
    lu.reset();
    // Every nexus, the one that asked for the reset included, sees it once.
    for n in [N1, N2, n3] {
        let o = lu.execute(&cmd(&read10(0, 1), &WriteData::None, n));
        sense(&o, SenseKey::UnitAttention, Asc::BUS_DEVICE_RESET);
        let o = lu.execute(&cmd(&read10(0, 1), &WriteData::None, n));
        good(&o);
        assert_eq!(o.data.len(), BS as usize);
    }
    // A nexus first seen after the reset has nothing to report.
    good(&lu.execute(&cmd(&TUR, &WriteData::None, NexusId(99))));
    // Two resets before the next command: reported once (identical conditions).
    lu.reset();
    lu.reset();
    sense(
        &run(&lu, &TUR, &[]),
        SenseKey::UnitAttention,
        Asc::BUS_DEVICE_RESET,
    );
    good(&run(&lu, &TUR, &[]));
    // Even unknown opcodes report the unit attention first.
    lu.reset();
    sense(
        &run(&lu, &[0xC0; 6], &[]),
        SenseKey::UnitAttention,
        Asc::BUS_DEVICE_RESET,
    );
    sense(
        &run(&lu, &[0xC0; 6], &[]),
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
}

#[test]
fn nexus_lost_drops_its_conditions() {
    let lu = mem_lu();
    good(&lu.execute(&cmd(&TUR, &WriteData::None, N2)));
    lu.reset();
    assert_eq!(lu.pending_unit_attentions(N2), 1);
    lu.nexus_lost(N2);
    assert_eq!(lu.pending_unit_attentions(N2), 0);
    good(&lu.execute(&cmd(&TUR, &WriteData::None, N2)));
}

#[test]
fn power_on_unit_attention_when_enabled() {
    let lu = mem_lu().with_power_on_unit_attention(true);
    // INQUIRY neither reports nor clears it.
    good(&run(&lu, &[op::INQUIRY, 0, 0, 0, 36, 0], &[]));
    sense(
        &run(&lu, &TUR, &[]),
        SenseKey::UnitAttention,
        Asc::POWER_ON_RESET,
    );
    good(&run(&lu, &TUR, &[]));
    sense(
        &lu.execute(&cmd(&read10(0, 1), &WriteData::None, N2)),
        SenseKey::UnitAttention,
        Asc::POWER_ON_RESET,
    );
    // Off by default.
    good(&run(&mem_lu(), &TUR, &[]));
}

#[test]
fn shared_between_threads() {
    let lu = Arc::new(mem_lu());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let lu = lu.clone();
            std::thread::spawn(move || {
                let n = NexusId(u64::from(t) + 10);
                let data = vec![t; BS as usize];
                for i in 0..200u32 {
                    let lba = u32::from(t) * 1000 + i;
                    good(&lu.execute(&cmd(&write10(lba, 1), &wd(&data), n)));
                    let o = lu.execute(&cmd(&read10(lba, 1), &WriteData::None, n));
                    assert!(o.data.iter().all(|&b| b == t));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn plans_through_the_api() {
    let lu = mem_lu();
    let p = lu.plan(&write10(0, 16));
    assert_eq!((p.data_out, p.data_in), (16 * BS, 0));
    let p = lu.plan(&read10(0, 16));
    assert_eq!((p.data_out, p.data_in), (0, 16 * BS));
    assert_eq!(lu.plan(&TUR), crate::TransferPlan::default());
    assert_eq!(lu.plan(&[op::INQUIRY, 1, 0x83, 0x01, 0x00, 0]).data_in, 256);
    assert_eq!(lu.plan(&[op::REQUEST_SENSE, 0, 0, 0, 18, 0]).data_in, 18);
    assert_eq!(lu.plan(&cdb10(op::VERIFY_10, 0x02, 0, 3)).data_out, 3 * BS);
    assert_eq!(lu.plan(&cdb10(op::VERIFY_10, 0x00, 0, 3)).data_out, 0);
    assert_eq!(
        lu.plan(&cdb16(op::WRITE_AND_VERIFY_16, 0, 0, 2)).data_out,
        2 * BS
    );
}

#[test]
fn capacity_follows_a_medium_resized_elsewhere() {
    let medium = Arc::new(TestBackend::new(BLOCKS * u64::from(BS)));
    let lu = Arc::new(LogicalUnit::new(medium.clone(), cfg()).unwrap());
    lu.follow_backend_size();
    for n in [N1, N2] {
        good(&lu.execute(&cmd(&TUR, &WriteData::None, n)));
    }
    let past_end = u32::try_from(BLOCKS).unwrap();
    lba_oob(&run(&lu, &read10(past_end, 1), &[]));
    // Grown by another gateway: every nexus hears it once, and the new
    // blocks can be read.
    medium.resize_elsewhere(2 * BLOCKS * u64::from(BS));
    assert_eq!(lu.num_blocks(), 2 * BLOCKS);
    for n in [N1, N2] {
        sense(
            &lu.execute(&cmd(&TUR, &WriteData::None, n)),
            SenseKey::UnitAttention,
            Asc::CAPACITY_DATA_CHANGED,
        );
        good(&lu.execute(&cmd(&read10(past_end, 1), &WriteData::None, n)));
    }
    // A notification that changes nothing raises nothing.
    medium.resize_elsewhere(2 * BLOCKS * u64::from(BS));
    good(&run(&lu, &TUR, &[]));
    // Shrunk: the blocks past the new end are out of range.
    medium.resize_elsewhere(BLOCKS * u64::from(BS) / 2);
    assert_eq!(lu.num_blocks(), BLOCKS / 2);
    sense(
        &run(&lu, &TUR, &[]),
        SenseKey::UnitAttention,
        Asc::CAPACITY_DATA_CHANGED,
    );
    lba_oob(&run(&lu, &read10(past_end / 2, 1), &[]));
    // The backend holds the unit weakly: once it is gone, a late
    // notification finds nothing to tell.
    drop(lu);
    medium.resize_elsewhere(BLOCKS * u64::from(BS));
}
