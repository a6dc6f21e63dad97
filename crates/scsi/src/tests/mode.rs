//! MODE SENSE and MODE SELECT.

use super::*;
use storage::NullBackend;

fn sense6(dbd: bool, pc: u8, page: u8, subpage: u8, alloc: u8) -> [u8; 6] {
    [
        op::MODE_SENSE_6,
        if dbd { 0x08 } else { 0 },
        (pc << 6) | page,
        subpage,
        alloc,
        0,
    ]
}

fn sense10(llbaa: bool, dbd: bool, pc: u8, page: u8, alloc: u16) -> [u8; 10] {
    let [hi, lo] = alloc.to_be_bytes();
    let b1 = if llbaa { 0x10 } else { 0 } | if dbd { 0x08 } else { 0 };
    [
        op::MODE_SENSE_10,
        b1,
        (pc << 6) | page,
        0,
        0,
        0,
        0,
        hi,
        lo,
        0,
    ]
}

/// Parsed MODE SENSE data, the way libiscsi's unmarshaller reads it.
#[derive(Debug)]
struct Parsed {
    mode_data_length: usize,
    device_specific: u8,
    block_descriptor: Vec<u8>,
    pages: Vec<Vec<u8>>,
}

fn parse(d: &[u8], ten: bool) -> Parsed {
    let (hdr, mdl, dsp, bdl) = if ten {
        (
            8,
            usize::from(u16::from_be_bytes([d[0], d[1]])),
            d[3],
            usize::from(u16::from_be_bytes([d[6], d[7]])),
        )
    } else {
        (4, usize::from(d[0]), d[2], usize::from(d[3]))
    };
    assert_eq!(
        mdl + if ten { 2 } else { 1 },
        d.len(),
        "mode data length matches"
    );
    let mut pages = Vec::new();
    let mut p = hdr + bdl;
    while p < d.len() {
        assert_eq!(d[p] & 0xC0, 0, "PS and SPF clear");
        let n = usize::from(d[p + 1]) + 2;
        pages.push(d[p..p + n].to_vec());
        p += n;
    }
    assert_eq!(p, d.len());
    Parsed {
        mode_data_length: mdl,
        device_specific: dsp,
        block_descriptor: d[hdr..hdr + bdl].to_vec(),
        pages,
    }
}

#[test]
fn all_pages_current() {
    let lu = mem_lu();
    let o = run(&lu, &sense6(false, 0, 0x3F, 0, 255), &[]);
    good(&o);
    let m = parse(&o.data, false);
    assert!(m.mode_data_length >= 3);
    assert_eq!(m.device_specific, 0x10, "DPOFUA, not WP");
    // Short block descriptor: number of blocks, block length.
    assert_eq!(m.block_descriptor, [0, 0, 0x10, 0, 0, 0, 0x02, 0x00]);
    assert_eq!(m.pages.len(), 2);
    let caching = &m.pages[0];
    assert_eq!((caching[0], caching[1]), (0x08, 0x12));
    assert_eq!(caching[2] & 0x04, 0x04, "RAM: write-back");
    let control = &m.pages[1];
    assert_eq!((control[0], control[1]), (0x0A, 0x0A));
    assert_eq!(control[2] & 0xE4, 0, "TST 0, D_SENSE 0");
    assert_eq!(control[3], 0x10, "QAM 1, QERR 0");
    assert_eq!(control[4] & 0x08, 0, "SWP 0");
    // Page 3Fh with subpage FFh: the same pages.
    let o2 = run(&lu, &sense6(false, 0, 0x3F, 0xFF, 255), &[]);
    assert_eq!(o2.data, o.data);
    // The control page on its own is identical.
    let o3 = run(&lu, &sense6(true, 0, 0x0A, 0, 255), &[]);
    let m3 = parse(&o3.data, false);
    assert!(m3.block_descriptor.is_empty());
    assert_eq!(m3.pages, vec![control.clone()]);
}

#[test]
fn allocation_length_truncates_without_changing_lengths() {
    let lu = mem_lu();
    let full = run(&lu, &sense6(false, 0, 0x3F, 0, 255), &[]).data;
    assert!(full.len() < 255);
    for alloc in [0u8, 1, 4, 12, 30] {
        let o = run(&lu, &sense6(false, 0, 0x3F, 0, alloc), &[]);
        good(&o);
        assert_eq!(&o.data[..], &full[..usize::from(alloc)]);
    }
    assert_eq!(lu.plan(&sense6(false, 0, 0x3F, 0, 4)).data_in, 4);
}

#[test]
fn page_control() {
    let (lu, b) = test_lu(cfg());
    // Current: write-through. Changeable: WCE (non-volatile backend).
    let cur = parse(&run(&lu, &sense6(true, 0, 0x08, 0, 255), &[]).data, false);
    assert_eq!(cur.pages[0][2] & 0x04, 0);
    let chg = parse(&run(&lu, &sense6(true, 1, 0x3F, 0, 255), &[]).data, false);
    assert_eq!(
        chg.pages[0][2..],
        [0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert!(
        chg.pages[1][2..].iter().all(|&x| x == 0),
        "control: nothing changeable"
    );
    // Default is the policy at creation, even after a change.
    TestBackend::set(&b.write_back, true);
    let def = parse(&run(&lu, &sense6(true, 2, 0x08, 0, 255), &[]).data, false);
    assert_eq!(def.pages[0][2] & 0x04, 0);
    let cur = parse(&run(&lu, &sense6(true, 0, 0x08, 0, 255), &[]).data, false);
    assert_eq!(cur.pages[0][2] & 0x04, 0x04);
    // Saved values are not implemented.
    sense(
        &run(&lu, &sense6(false, 3, 0x3F, 0, 255), &[]),
        SenseKey::IllegalRequest,
        Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
    );
    // A volatile backend's WCE cannot change.
    let mem = mem_lu();
    let chg = parse(&run(&mem, &sense6(true, 1, 0x08, 0, 255), &[]).data, false);
    assert_eq!(chg.pages[0][2], 0);
}

#[test]
fn unsupported_pages_and_subpages() {
    let lu = mem_lu();
    for page in [0x00, 0x01, 0x1C, 0x19, 0x3E] {
        invalid_cdb(&run(&lu, &sense6(false, 0, page, 0, 255), &[]), 2, Some(5));
    }
    invalid_cdb(&run(&lu, &sense6(false, 0, 0x08, 0x01, 255), &[]), 3, None);
    invalid_cdb(&run(&lu, &sense6(false, 0, 0x3F, 0x10, 255), &[]), 3, None);
}

#[test]
fn write_protect_bit() {
    let mut c = cfg();
    c.read_only = true;
    let (lu, _) = test_lu(c);
    let m = parse(&run(&lu, &sense6(false, 0, 0x3F, 0, 255), &[]).data, false);
    assert_eq!(m.device_specific, 0x90);
}

#[test]
fn mode_sense_10_and_long_lba_descriptors() {
    let lu = mem_lu();
    let o = run(&lu, &sense10(false, false, 0, 0x3F, 1024), &[]);
    let m = parse(&o.data, true);
    assert_eq!(o.data[4] & 1, 0);
    assert_eq!(m.block_descriptor.len(), 8);
    assert_eq!(m.pages.len(), 2);
    let o = run(&lu, &sense10(true, false, 0, 0x08, 1024), &[]);
    let m = parse(&o.data, true);
    assert_eq!(o.data[4] & 1, 1, "LONGLBA");
    let mut want = BLOCKS.to_be_bytes().to_vec();
    want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x02, 0x00]);
    assert_eq!(m.block_descriptor, want);
    let o = run(&lu, &sense10(true, true, 0, 0x08, 1024), &[]);
    assert_eq!(o.data[4] & 1, 0, "no descriptor, no LONGLBA");
    assert_eq!(lu.plan(&sense10(false, false, 0, 0x3F, 300)).data_in, 300);
}

#[test]
fn huge_capacity_block_descriptor_saturates() {
    let lu = LogicalUnit::new(Arc::new(NullBackend::new(1 << 45)), cfg()).unwrap();
    let m = parse(&run(&lu, &sense6(false, 0, 0x08, 0, 255), &[]).data, false);
    assert_eq!(m.block_descriptor[..4], [0xFF; 4]);
}

fn select6(pf: bool, sp: bool, list: &[u8]) -> [u8; 6] {
    [
        op::MODE_SELECT_6,
        u8::from(pf) << 4 | u8::from(sp),
        0,
        0,
        list.len() as u8,
        0,
    ]
}

/// A MODE SELECT(6) parameter list with the current Caching page (WCE as given).
fn caching_list(lu: &LogicalUnit, wce: bool) -> Vec<u8> {
    let d = run(lu, &sense6(true, 0, 0x08, 0, 255), &[]).data;
    let mut list = vec![0u8, 0, 0, 0];
    list.extend_from_slice(&d[4..]);
    list[4 + 2] = (list[4 + 2] & !0x04) | if wce { 0x04 } else { 0 };
    list
}

#[test]
fn mode_select_changes_wce_and_tells_other_nexuses() {
    let (lu, b) = test_lu(cfg());
    good(&lu.execute(&cmd(
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        &WriteData::None,
        N2,
    )));
    let list = caching_list(&lu, true);
    good(&run(&lu, &select6(true, false, &list), &list));
    assert!(b.write_back.load(std::sync::atomic::Ordering::SeqCst));
    // N2 is told, N1 (which made the change) is not.
    assert_eq!(lu.pending_unit_attentions(N1), 0);
    let o = lu.execute(&cmd(
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        &WriteData::None,
        N2,
    ));
    sense(&o, SenseKey::UnitAttention, Asc::MODE_PARAMETERS_CHANGED);
    good(&lu.execute(&cmd(
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        &WriteData::None,
        N2,
    )));
    // Setting the same value again changes nothing and tells nobody.
    good(&run(&lu, &select6(true, false, &list), &list));
    assert_eq!(lu.pending_unit_attentions(N2), 0);
    // MODE SELECT(10) back to write-through.
    let six = caching_list(&lu, false);
    let mut ten = vec![0u8; 8];
    ten.extend_from_slice(&six[4..]);
    let [hi, lo] = (ten.len() as u16).to_be_bytes();
    let cdb = [op::MODE_SELECT_10, 0x10, 0, 0, 0, 0, 0, hi, lo, 0];
    good(&run(&lu, &cdb, &ten));
    assert!(!b.write_back.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn mode_select_accepts_unchanged_control_page_and_block_descriptor() {
    let lu = mem_lu();
    let d = run(&lu, &sense6(false, 0, 0x3F, 0, 255), &[]).data;
    let mut list = d.to_vec();
    list[0] = 0; // MODE DATA LENGTH is reserved in MODE SELECT
    list[2] = 0;
    good(&run(&lu, &select6(true, false, &list), &list));
    // Zero blocks in the descriptor keeps the capacity.
    list[4..8].copy_from_slice(&[0, 0, 0, 0]);
    good(&run(&lu, &select6(true, false, &list), &list));
}

#[test]
fn mode_select_rejections() {
    let (lu, b) = test_lu(cfg());
    let list = caching_list(&lu, true);
    let param = |o: &Outcome, byte: u16, bit: Option<u8>| {
        sense(
            o,
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        );
        let f = o.sense.unwrap().field.unwrap();
        assert!(!f.in_cdb);
        assert_eq!((f.byte, f.bit), (byte, bit));
    };
    // CDB: PF = 0, SP = 1.
    invalid_cdb(&run(&lu, &select6(false, false, &list), &list), 1, Some(4));
    invalid_cdb(&run(&lu, &select6(true, true, &list), &list), 1, Some(0));
    // An empty list is not an error, PF or not.
    good(&run(&lu, &select6(false, false, &[]), &[]));
    // Non-changeable bit (RCD, byte 2 bit 0 of the caching page at offset 4).
    let mut bad = list.clone();
    bad[6] |= 0x01;
    param(&run(&lu, &select6(true, false, &bad), &bad), 6, Some(0));
    // Control page: QAM is not changeable.
    let ctl = run(&lu, &sense6(true, 0, 0x0A, 0, 255), &[]).data;
    let mut bad = vec![0u8; 4];
    bad.extend_from_slice(&ctl[4..]);
    bad[7] = 0x00;
    param(&run(&lu, &select6(true, false, &bad), &bad), 7, Some(4));
    // Wrong page length, unknown page, subpage format.
    let mut bad = list.clone();
    bad[5] = 0x0A;
    param(&run(&lu, &select6(true, false, &bad), &bad), 5, None);
    let mut bad = list.clone();
    bad[4] = 0x1C;
    param(&run(&lu, &select6(true, false, &bad), &bad), 4, Some(5));
    let mut bad = list.clone();
    bad[4] |= 0x40;
    param(&run(&lu, &select6(true, false, &bad), &bad), 4, Some(6));
    // Medium type must be 0.
    let mut bad = list.clone();
    bad[1] = 1;
    param(&run(&lu, &select6(true, false, &bad), &bad), 1, None);
    // Block descriptor with another block size or capacity.
    let mut bad = vec![0, 0, 0, 8, 0, 0, 0x10, 0, 0, 0, 0x10, 0];
    bad.extend_from_slice(&list[4..]);
    param(&run(&lu, &select6(true, false, &bad), &bad), 9, None);
    bad[8..12].copy_from_slice(&[0, 0, 2, 0]);
    bad[6] = 0x20;
    param(&run(&lu, &select6(true, false, &bad), &bad), 4, None);
    // A list that ends inside a page, or inside the header.
    let short = &list[..list.len() - 1];
    sense(
        &run(&lu, &select6(true, false, short), short),
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    sense(
        &run(&lu, &select6(true, false, &list), &list[..3]),
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    // Nothing changed through all that.
    assert!(!b.write_back.load(std::sync::atomic::Ordering::SeqCst));
    // A backend that says yes but does not switch is not believed.
    TestBackend::set(&b.stuck_cache, true);
    param(&run(&lu, &select6(true, false, &list), &list), 6, Some(2));
    // A volatile backend: WCE is not changeable.
    let mem = mem_lu();
    let off = caching_list(&mem, false);
    param(&run(&mem, &select6(true, false, &off), &off), 6, Some(2));
}
