//! INQUIRY: standard data and VPD pages.

use super::*;

fn inquiry(evpd: bool, page: u8, alloc: u16) -> [u8; 6] {
    let [hi, lo] = alloc.to_be_bytes();
    [op::INQUIRY, u8::from(evpd), page, hi, lo, 0]
}

#[test]
fn standard_data() {
    let lu = mem_lu();
    let o = run(&lu, &inquiry(false, 0, 260), &[]);
    good(&o);
    let d = &o.data;
    assert_eq!(d.len(), 96);
    assert_eq!(d[0], 0x00, "PQ 0, direct access");
    assert_eq!(d[1] & 0x80, 0, "not removable");
    assert_eq!(d[2], 0x06, "SPC-4");
    assert_eq!(d[3], 0x12, "RDF 2, HISUP, no NORMACA/AERC/TRMTSK");
    assert_eq!(usize::from(d[4]), d.len() - 5);
    assert_eq!(d[5] & 0x01, 0, "no PROTECT");
    assert_eq!(d[7] & 0x02, 0x02, "CMDQUE");
    assert_eq!(&d[8..16], b"IRONSAN ");
    assert_eq!(&d[16..32], b"ironsan-disk    ");
    assert_eq!(&d[32..36], b"0.1 ");
    let descriptors: Vec<u16> = (0..8)
        .map(|i| u16::from_be_bytes([d[58 + 2 * i], d[59 + 2 * i]]))
        .collect();
    assert_eq!(&descriptors[..4], &[0x00A0, 0x0960, 0x0460, 0x04C0]);
    assert!(descriptors[4..].iter().all(|&v| v == 0));
    assert!(d[74..].iter().all(|&b| b == 0));
}

#[test]
fn allocation_length_truncates() {
    let lu = mem_lu();
    let full = run(&lu, &inquiry(false, 0, 512), &[]).data;
    for alloc in 0..=300u16 {
        let o = run(&lu, &inquiry(false, 0, alloc), &[]);
        good(&o);
        let n = usize::from(alloc).min(full.len());
        assert_eq!(&o.data[..], &full[..n], "alloc {alloc}");
    }
    assert_eq!(run(&lu, &inquiry(false, 0, 511), &[]).data, full);
    let o = run(&lu, &inquiry(true, 0x83, 6), &[]);
    assert_eq!(o.data.len(), 6);
}

#[test]
fn invalid_combinations() {
    let lu = mem_lu();
    invalid_cdb(&run(&lu, &inquiry(false, 1, 256), &[]), 2, None);
    invalid_cdb(&run(&lu, &inquiry(false, 0x80, 256), &[]), 2, None);
    invalid_cdb(
        &run(&lu, &[op::INQUIRY, 0x02, 0, 0, 255, 0], &[]),
        1,
        Some(1),
    );
    invalid_cdb(
        &run(&lu, &[op::INQUIRY, 0x03, 0x80, 0, 255, 0], &[]),
        1,
        Some(1),
    );
    // Pages we do not serve.
    for page in [0x01, 0x81, 0x87, 0xB3, 0xFF] {
        invalid_cdb(&run(&lu, &inquiry(true, page, 255), &[]), 2, None);
    }
    // Logical Block Provisioning only on a thin unit.
    let full = LogicalUnit::new(
        Arc::new(MemBackend::new(BLOCKS * u64::from(BS))),
        LuConfig {
            thin: false,
            ..cfg()
        },
    )
    .unwrap();
    invalid_cdb(&run(&full, &inquiry(true, 0xB2, 255), &[]), 2, None);
}

#[test]
fn supported_pages_are_sorted_and_all_served() {
    let lu = mem_lu();
    let o = run(&lu, &inquiry(true, 0x00, 255), &[]);
    good(&o);
    let d = &o.data;
    assert_eq!(&d[..4], &[0x00, 0x00, 0x00, 7]);
    let pages = &d[4..];
    assert_eq!(pages, &[0x00, 0x80, 0x83, 0x86, 0xB0, 0xB1, 0xB2]);
    assert!(pages.windows(2).all(|w| w[0] < w[1]));
    for &p in pages {
        let o = run(&lu, &inquiry(true, p, 255), &[]);
        good(&o);
        assert_eq!(o.data[1], p);
        let len = usize::from(u16::from_be_bytes([o.data[2], o.data[3]]));
        assert_eq!(o.data.len(), len + 4, "page {p:#x} length");
    }
}

#[test]
fn unit_serial_number() {
    let lu = mem_lu();
    let o = run(&lu, &inquiry(true, 0x80, 255), &[]);
    assert_eq!(&o.data[..4], &[0, 0x80, 0, 12]);
    assert_eq!(&o.data[4..], b"SN0123456789");
}

/// (code set/protocol byte, PIV/association/type byte, value) of each
/// designator of page 83h.
fn designators(d: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
    let len = usize::from(u16::from_be_bytes([d[2], d[3]]));
    assert_eq!(d.len(), len + 4);
    let mut out = Vec::new();
    let mut p = 4;
    while p < d.len() {
        let n = usize::from(d[p + 3]);
        out.push((d[p], d[p + 1], d[p + 4..p + 4 + n].to_vec()));
        p += 4 + n;
    }
    assert_eq!(p, d.len());
    out
}

#[test]
fn device_identification() {
    let lu = mem_lu();
    let o = run(&lu, &inquiry(true, 0x83, 1024), &[]);
    good(&o);
    let ds = designators(&o.data);
    assert_eq!(ds.len(), 5);
    // NAA IEEE Registered Extended, binary, association LU.
    assert_eq!((ds[0].0, ds[0].1), (0x01, 0x03));
    assert_eq!(ds[0].2, cfg().naa);
    assert_eq!(ds[0].2[0] >> 4, 6);
    // T10 vendor ID, ASCII, association LU.
    assert_eq!((ds[1].0, ds[1].1), (0x02, 0x01));
    assert_eq!(ds[1].2, b"IRONSAN SN0123456789");
    // Relative target port 3 and target port group 2: iSCSI, PIV, target port.
    assert_eq!(
        (ds[2].0, ds[2].1, ds[2].2.clone()),
        (0x51, 0x94, vec![0, 0, 0, 3])
    );
    assert_eq!(
        (ds[3].0, ds[3].1, ds[3].2.clone()),
        (0x51, 0x95, vec![0, 0, 0, 2])
    );
    // SCSI name string: UTF-8, null terminated, padded to four bytes.
    let (cs, ty, name) = &ds[4];
    assert_eq!((*cs, *ty), (0x53, 0x98));
    assert_eq!(name.len() % 4, 0);
    assert_eq!(&name[..PORT_NAME.len()], PORT_NAME.as_bytes());
    assert!(name[PORT_NAME.len()..].iter().all(|&b| b == 0));
    assert!(name.len() > PORT_NAME.len());

    // Another path: same LU designators, its own port designators.
    let mut c = cmd(&[op::INQUIRY, 1, 0x83, 1, 0, 0], &WriteData::None, N2);
    c.relative_port = 9;
    c.tpg = 7;
    c.target_port_name = "iqn.x:y,t,0x0002";
    let ds2 = designators(&lu.execute(&c).data);
    assert_eq!(ds2[..2], ds[..2]);
    assert_eq!(ds2[2].2, vec![0, 0, 0, 9]);
    assert_eq!(ds2[3].2, vec![0, 0, 0, 7]);
    assert_eq!(&ds2[4].2[..], b"iqn.x:y,t,0x0002\0\0\0\0");

    // A port name that does not fit (or is empty) is left out.
    let long = "i".repeat(300);
    for name in ["", long.as_str()] {
        c.target_port_name = name;
        assert_eq!(designators(&lu.execute(&c).data).len(), 4);
    }
}

#[test]
fn block_limits_and_characteristics() {
    let lu = mem_lu();
    let o = run(&lu, &inquiry(true, 0xB0, 255), &[]);
    let d = &o.data;
    assert_eq!(d.len(), 64);
    assert_eq!(&d[..4], &[0, 0xB0, 0, 0x3C]);
    assert_eq!(d[4], 0, "WSNZ = 0");
    assert_eq!(d[5], crate::MAX_COMPARE_AND_WRITE_BLOCKS);
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 8);
    let be32 = |i: usize| u32::from_be_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
    assert_eq!(be32(8), crate::MAX_TRANSFER_BYTES / BS);
    assert_eq!(be32(12), crate::OPTIMAL_TRANSFER_BYTES / BS);
    assert!(be32(8) >= 256, "libiscsi sends up to 256 blocks");
    assert_eq!(
        (be32(20), be32(24)),
        (crate::MAX_UNMAP_BLOCKS, crate::MAX_UNMAP_DESCRIPTORS)
    );
    assert_eq!(be32(28), (1 << 20) / BS, "MemBackend frees 1 MiB chunks");
    assert_eq!(be32(32), 0x8000_0000, "UGAVALID, alignment 0");
    let ws = u64::from(be32(36)) << 32 | u64::from(be32(40));
    assert_eq!(ws, crate::MAX_WRITE_SAME_BYTES / u64::from(BS));
    assert_eq!(be32(44), be32(8), "RAM: atomic up to the transfer limit");
    assert_eq!((be32(48), be32(52), be32(56), be32(60)), (0, 0, 0, 0));

    let o = run(&lu, &inquiry(true, 0xB1, 255), &[]);
    let d = &o.data;
    assert_eq!(&d[..6], &[0, 0xB1, 0, 0x3C, 0, 1]);
    assert_eq!(d.len(), 64);
}

#[test]
fn inquiry_ignores_unit_attention() {
    let lu = mem_lu();
    good(&run(&lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &[]));
    lu.reset();
    good(&run(&lu, &inquiry(false, 0, 96), &[]));
    good(&run(&lu, &inquiry(true, 0x83, 255), &[]));
    assert_eq!(lu.pending_unit_attentions(N1), 1);
}

#[test]
fn extended_inquiry_data() {
    let (lu, b) = test_lu(cfg());
    let o = run(&lu, &inquiry(true, 0x86, 255), &[]);
    good(&o);
    assert_eq!(o.data.len(), 64);
    assert_eq!(&o.data[..8], &[0, 0x86, 0, 0x3C, 0, 0x01, 0x00, 0]);
    TestBackend::set(&b.write_back, true);
    let o = run(&lu, &inquiry(true, 0x86, 255), &[]);
    assert_eq!(o.data[6], 0x01, "V_SUP with the write cache on");
}
