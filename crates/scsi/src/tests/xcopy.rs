//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS: descriptor parsing,
//! every refusal, data movement and held copy status.

// Descriptor lists are built from owned copies for readability.
#![allow(clippy::cloned_ref_to_slice_refs)]

use std::sync::Arc;

use storage::MemBackend;

use super::*;
use crate::{FieldPointer, Sense, TargetLus, MAX_SEGMENT_DESCRIPTORS};

#[derive(Debug)]
struct Lus(Vec<Arc<LogicalUnit>>);

impl TargetLus for Lus {
    fn by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        self.0.iter().find(|l| l.config().naa[..] == *naa).cloned()
    }
    fn for_each_lu(&self, f: &mut dyn FnMut(&LogicalUnit)) {
        self.0.iter().for_each(|l| f(l));
    }
}

fn naa(lu: &LogicalUnit) -> [u8; 16] {
    lu.config().naa
}

/// An Identification Descriptor CSCD descriptor naming `naa`.
fn cscd(naa: &[u8; 16], block_size: u32) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0xE4;
    d[4] = 0x01; // binary
    d[5] = 0x03; // association LU, NAA
    d[7] = 16;
    d[8..24].copy_from_slice(naa);
    d[29..32].copy_from_slice(&block_size.to_be_bytes()[1..]);
    d
}

/// A block-to-block segment descriptor.
fn seg(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut d = vec![0u8; 28];
    d[0] = 0x02;
    d[2..4].copy_from_slice(&0x18u16.to_be_bytes());
    d[4..6].copy_from_slice(&src.to_be_bytes());
    d[6..8].copy_from_slice(&dst.to_be_bytes());
    d[10..12].copy_from_slice(&blocks.to_be_bytes());
    d[12..20].copy_from_slice(&src_lba.to_be_bytes());
    d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    d
}

/// A parameter list with LIST IDENTIFIER `id` and LIST ID USAGE `usage`.
fn params(id: u8, usage: u8, cscds: &[Vec<u8>], segs: &[Vec<u8>]) -> Vec<u8> {
    let t: Vec<u8> = cscds.concat();
    let s: Vec<u8> = segs.concat();
    let mut p = vec![0u8; 16];
    p[0] = id;
    p[1] = usage << 3;
    p[2..4].copy_from_slice(&(t.len() as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
    p.extend_from_slice(&t);
    p.extend_from_slice(&s);
    p
}

fn xcopy_cdb(len: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::EXTENDED_COPY;
    c[10..14].copy_from_slice(&len.to_be_bytes());
    c
}

fn xcopy(lu: &LogicalUnit, p: &[u8]) -> Outcome {
    run(lu, &xcopy_cdb(p.len() as u32), p)
}

fn rcr(sa: u8, list_id: u8, alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::RECEIVE_COPY_RESULTS;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

fn read(lu: &LogicalUnit, lba: u32, blocks: u16) -> Vec<u8> {
    let o = run(lu, &read10(lba, blocks), &[]);
    good(&o);
    let mut v = o.data.to_vec();
    o.more.iter().for_each(|s| v.extend_from_slice(s));
    v
}

#[track_caller]
fn param_error(o: &Outcome, key: SenseKey, code: Asc, byte: u16) {
    sense(o, key, code);
    assert_eq!(
        o.sense.unwrap().field,
        Some(FieldPointer {
            in_cdb: false,
            byte,
            bit: None
        })
    );
}

#[track_caller]
fn length_error(o: &Outcome) {
    sense(
        o,
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
}

#[test]
fn copies_within_one_unit() {
    let lu = mem_lu();
    let data = pattern(8 * 512, 3);
    good(&run(&lu, &write10(0, 8), &data));
    let me = naa(&lu);
    good(&xcopy(
        &lu,
        &params(1, 0, &[cscd(&me, 512)], &[seg(0, 0, 8, 0, 100)]),
    ));
    assert_eq!(read(&lu, 100, 8), data);
}

#[test]
fn copies_between_units_of_the_target() {
    let a = Arc::new(mem_lu());
    let mut c = cfg();
    c.naa[15] ^= 0xFF;
    let b = Arc::new(LogicalUnit::new(Arc::new(MemBackend::new(BLOCKS * 512)), c).unwrap());
    let lus = Lus(vec![a.clone(), b.clone()]);
    let data = pattern(4 * 512, 9);
    good(&run(&a, &write10(10, 4), &data));
    // Issued to b, copying from a to b: the copy manager may be addressed
    // through either.
    let p = params(
        0,
        0b11,
        &[cscd(&naa(&a), 512), cscd(&naa(&b), 512)],
        &[seg(0, 1, 4, 10, 20)],
    );
    let cdb = xcopy_cdb(p.len() as u32);
    let p = wd(&p);
    let c = Command {
        lus: Some(&lus),
        ..cmd(&cdb, &p, N1)
    };
    good(&b.execute(&c));
    assert_eq!(read(&b, 20, 4), data);
    assert_eq!(read(&a, 20, 4), vec![0; 4 * 512]);
    // A unit the target does not list is not reachable, even this one.
    let lonely = Lus(vec![b.clone()]);
    let c = Command {
        lus: Some(&lonely),
        ..cmd(&cdb, &p, N1)
    };
    param_error(
        &b.execute(&c),
        SenseKey::CopyAborted,
        Asc::COPY_TARGET_NOT_REACHABLE,
        16 + 4,
    );
}

#[test]
fn overlapping_ranges_copy_like_memmove() {
    let lu = mem_lu();
    let data = pattern(2048 * 512, 5);
    good(&run(&lu, &write10(0, 2048), &data));
    let me = naa(&lu);
    good(&xcopy(
        &lu,
        &params(0, 0b11, &[cscd(&me, 512)], &[seg(0, 0, 2048, 0, 1)]),
    ));
    assert_eq!(read(&lu, 1, 2048), data, "forward overlap");
    good(&xcopy(
        &lu,
        &params(0, 0b11, &[cscd(&me, 512)], &[seg(0, 0, 2048, 1, 0)]),
    ));
    assert_eq!(read(&lu, 0, 2048), data, "backward overlap");
}

#[test]
fn zero_length_list_copies_nothing() {
    let lu = mem_lu();
    good(&run(&lu, &xcopy_cdb(0), &[]));
}

#[test]
fn parameter_list_lengths() {
    let lu = mem_lu();
    let me = naa(&lu);
    let p = params(1, 0, &[cscd(&me, 512)], &[seg(0, 0, 1, 0, 1)]);
    // Shorter than the header.
    length_error(&run(&lu, &xcopy_cdb(15), &p[..15]));
    // Cutting the CSCD descriptor or the segment descriptor.
    length_error(&run(&lu, &xcopy_cdb(47), &p[..47]));
    length_error(&run(&lu, &xcopy_cdb(75), &p[..75]));
    // The CDB promises more than was received.
    length_error(&run(&lu, &xcopy_cdb(76), &p[..70]));
    // Longer than the copy manager takes.
    length_error(&run(&lu, &xcopy_cdb(crate::xcopy::MAX_PARAM_LIST + 1), &[]));
    // A descriptor list length that does not cover whole descriptors.
    let mut bad = p.clone();
    bad[3] = 31;
    length_error(&xcopy(&lu, &bad));
    let mut bad = p.clone();
    bad[11] = 27;
    length_error(&xcopy(&lu, &bad));
    // The plan asks for the list only when it can be accepted.
    assert_eq!(lu.plan(&xcopy_cdb(76)).data_out, 76);
    assert_eq!(
        lu.plan(&xcopy_cdb(crate::xcopy::MAX_PARAM_LIST + 1))
            .data_out,
        0
    );
    good(&xcopy(&lu, &p));
}

#[test]
fn header_fields() {
    let lu = mem_lu();
    let me = naa(&lu);
    let list = |id, usage| params(id, usage, &[cscd(&me, 512)], &[seg(0, 0, 1, 0, 1)]);
    // LIST ID USAGE 01b is reserved.
    assert_eq!(
        xcopy(&lu, &list(1, 0b01)).sense.unwrap(),
        Sense::invalid_param(1, Some(4))
    );
    // 11b: no list identifier.
    assert_eq!(
        xcopy(&lu, &list(7, 0b11)).sense.unwrap(),
        Sense::invalid_param(0, None)
    );
    // Inline data is not supported.
    let mut p = list(1, 0);
    p[15] = 4;
    p.extend_from_slice(&[0; 4]);
    assert_eq!(
        xcopy(&lu, &p).sense.unwrap(),
        Sense::invalid_param(12, None)
    );
}

#[test]
fn descriptor_limits_and_types() {
    let lu = mem_lu();
    let me = naa(&lu);
    let c = cscd(&me, 512);
    let s = seg(0, 0, 1, 0, 1);
    // Nine CSCD descriptors.
    let p = params(1, 0, &vec![c.clone(); 9], &[s.clone()]);
    param_error(
        &xcopy(&lu, &p),
        SenseKey::IllegalRequest,
        Asc::TOO_MANY_TARGET_DESCRIPTORS,
        16 + 8 * 32,
    );
    // Seventeen segment descriptors.
    let n = usize::from(MAX_SEGMENT_DESCRIPTORS) + 1;
    let p = params(1, 0, &[c.clone()], &vec![s.clone(); n]);
    param_error(
        &xcopy(&lu, &p),
        SenseKey::IllegalRequest,
        Asc::TOO_MANY_SEGMENT_DESCRIPTORS,
        16 + 32 + 16 * 28,
    );
    // Over the descriptor list limit, whatever the counts.
    let p = params(1, 0, &vec![c.clone(); 9], &vec![s.clone(); 30]);
    length_error(&xcopy(&lu, &p));
    // Fibre Channel N_Port_Name CSCD (E0h).
    let mut fc = c.clone();
    fc[0] = 0xE0;
    param_error(
        &xcopy(&lu, &params(1, 0, &[fc], &[s.clone()])),
        SenseKey::IllegalRequest,
        Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE,
        16,
    );
    // Stream-to-stream segment (03h).
    let mut st = s.clone();
    st[0] = 0x03;
    param_error(
        &xcopy(&lu, &params(1, 0, &[c.clone()], &[st])),
        SenseKey::IllegalRequest,
        Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE,
        48,
    );
    // A block-to-block descriptor with the wrong DESCRIPTOR LENGTH.
    let mut short = s.clone();
    short[3] = 0x14;
    param_error(
        &xcopy(&lu, &params(1, 0, &[c.clone()], &[short])),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        50,
    );
    // A CSCD for a tape (peripheral device type 01h).
    let mut tape = c.clone();
    tape[1] = 0x01;
    param_error(
        &xcopy(&lu, &params(1, 0, &[tape], &[s.clone()])),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        17,
    );
    // LU ID TYPE is ignored (SPC-4), as libiscsi checks.
    let mut luid = c.clone();
    luid[1] = 0x80;
    good(&xcopy(&lu, &params(1, 0, &[luid], &[s])));
}

#[test]
fn segment_refusals() {
    let lu = mem_lu();
    let me = naa(&lu);
    let c = cscd(&me, 512);
    let one = |s: Vec<u8>| xcopy(&lu, &params(1, 0, &[c.clone()], &[s]));
    // Destination index past the CSCD list.
    param_error(
        &one(seg(0, 1, 1, 0, 1)),
        SenseKey::CopyAborted,
        Asc::COPY_TARGET_NOT_REACHABLE,
        48 + 6,
    );
    // Past the end of the destination, of the source, and an LBA far out.
    param_error(
        &one(seg(0, 0, 2048, 0, BLOCKS - 1)),
        SenseKey::CopyAborted,
        Asc::NO_ADDITIONAL_SENSE,
        48 + 20,
    );
    param_error(
        &one(seg(0, 0, 2, BLOCKS - 1, 0)),
        SenseKey::CopyAborted,
        Asc::NO_ADDITIONAL_SENSE,
        48 + 12,
    );
    param_error(
        &one(seg(0, 0, 0, 0, u64::MAX)),
        SenseKey::CopyAborted,
        Asc::NO_ADDITIONAL_SENSE,
        48 + 20,
    );
    // More than MAXIMUM SEGMENT LENGTH.
    param_error(
        &one(seg(0, 0, 0xFFFF, 0, 0)),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        48 + 10,
    );
    // A designator that names nothing.
    let other = cscd(&[0x6A; 16], 512);
    param_error(
        &xcopy(&lu, &params(1, 0, &[other], &[seg(0, 0, 1, 0, 1)])),
        SenseKey::CopyAborted,
        Asc::COPY_TARGET_NOT_REACHABLE,
        16 + 4,
    );
    // A disk block length that is not the unit's.
    param_error(
        &xcopy(
            &lu,
            &params(1, 0, &[cscd(&me, 4096)], &[seg(0, 0, 1, 0, 1)]),
        ),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        16 + 29,
    );
}

#[test]
fn read_only_destination_and_backend_failures() {
    let mut c = cfg();
    c.read_only = true;
    let ro = LogicalUnit::new(Arc::new(MemBackend::new(BLOCKS * 512)), c).unwrap();
    let me = naa(&ro);
    let o = xcopy(&ro, &params(1, 0, &[cscd(&me, 512)], &[seg(0, 0, 1, 0, 1)]));
    param_error(&o, SenseKey::CopyAborted, Asc::WRITE_PROTECTED, 48 + 6);

    let (lu, b) = test_lu(cfg());
    let me = naa(&lu);
    let p = params(
        4,
        0,
        &[cscd(&me, 512)],
        &[seg(0, 0, 1, 0, 1), seg(0, 0, 1, 0, 2)],
    );
    TestBackend::set(&b.fail_write, true);
    let o = xcopy(&lu, &p);
    sense(&o, SenseKey::CopyAborted, Asc::WRITE_ERROR);
    assert_eq!(o.sense.unwrap().field.unwrap().byte, 48, "first segment");
    TestBackend::set(&b.fail_write, false);
    // The failure is held for COPY STATUS: completed with errors.
    let o = run(&lu, &rcr(0, 4, 64), &[]);
    good(&o);
    assert_eq!(&o.data[4..8], &[0x02, 0, 0, 0]);
}

#[test]
fn copy_status_is_held_per_nexus_and_list_id() {
    let lu = mem_lu();
    let me = naa(&lu);
    // Nothing with list id 1 yet.
    invalid_cdb(&run(&lu, &rcr(0, 1, 1024), &[]), 2, None);
    good(&xcopy(
        &lu,
        &params(1, 0, &[cscd(&me, 512)], &[seg(0, 0, 16, 0, 100)]),
    ));
    // Another nexus sees nothing.
    invalid_cdb(
        &lu.execute(&cmd(&rcr(0, 1, 1024), &WriteData::None, N2)),
        2,
        None,
    );
    let o = run(&lu, &rcr(0, 1, 1024), &[]);
    good(&o);
    assert_eq!(
        &o.data[..],
        &[0, 0, 0, 8, 0x01, 0, 1, 0x00, 0, 0, 0x20, 0x00],
        "completed, 1 segment, 8192 bytes"
    );
    // Read once: released.
    invalid_cdb(&run(&lu, &rcr(0, 1, 1024), &[]), 2, None);
    // LIST ID USAGE 10b and 11b hold nothing.
    good(&xcopy(
        &lu,
        &params(2, 0b10, &[cscd(&me, 512)], &[seg(0, 0, 1, 0, 1)]),
    ));
    invalid_cdb(&run(&lu, &rcr(0, 2, 1024), &[]), 2, None);
    // The nexus going away drops its results.
    good(&xcopy(
        &lu,
        &params(3, 0, &[cscd(&me, 512)], &[seg(0, 0, 1, 0, 1)]),
    ));
    lu.nexus_lost(N1);
    invalid_cdb(&run(&lu, &rcr(0, 3, 1024), &[]), 2, None);
    // Held results are bounded.
    for id in 0..40u8 {
        good(&xcopy(&lu, &params(id, 0, &[cscd(&me, 512)], &[])));
    }
    invalid_cdb(&run(&lu, &rcr(0, 0, 1024), &[]), 2, None);
    good(&run(&lu, &rcr(0, 39, 1024), &[]));
}

#[test]
fn operating_parameters() {
    let lu = mem_lu();
    let o = run(&lu, &rcr(3, 0, 1024), &[]);
    good(&o);
    let d = &o.data;
    assert_eq!(d.len(), 46);
    assert_eq!(&d[..4], &42u32.to_be_bytes());
    assert_eq!(d[4], 0x01, "SNLID");
    assert_eq!(&d[8..10], &8u16.to_be_bytes());
    assert_eq!(&d[10..12], &16u16.to_be_bytes());
    assert_eq!(&d[12..16], &1024u32.to_be_bytes());
    assert_eq!(&d[16..20], &(16u32 << 20).to_be_bytes());
    assert_eq!(&d[20..24], &[0; 4], "no inline data");
    assert_eq!(d[37], 9, "data segment granularity: 512 bytes");
    assert_eq!(&d[43..], &[2, 0x02, 0xE4]);
    // Allocation length.
    assert_eq!(run(&lu, &rcr(3, 0, 10), &[]).data.len(), 10);
}

#[test]
fn unsupported_service_actions() {
    let lu = mem_lu();
    // RECEIVE DATA, FAILED SEGMENT DETAILS, LID4 ones.
    for sa in [1u8, 4, 5, 7] {
        invalid_cdb(&run(&lu, &rcr(sa, 0, 64), &[]), 1, Some(4));
    }
    // EXTENDED COPY(LID4).
    let mut c = xcopy_cdb(0);
    c[1] = 0x01;
    invalid_cdb(&run(&lu, &c, &[]), 1, Some(4));
}

#[test]
fn listed_by_report_supported_operation_codes() {
    let lu = mem_lu();
    let ask = |opcode: u8, sa: u16| {
        let mut c = [0u8; 12];
        c[0] = op::MAINTENANCE_IN;
        c[1] = 0x0C;
        c[2] = 0x02;
        c[3] = opcode;
        c[4..6].copy_from_slice(&sa.to_be_bytes());
        c[9] = 64;
        run(&lu, &c, &[])
    };
    for (o, sa) in [
        (op::EXTENDED_COPY, 0),
        (op::RECEIVE_COPY_RESULTS, 0),
        (op::RECEIVE_COPY_RESULTS, 3),
        (op::MAINTENANCE_IN, 0x0A),
    ] {
        let r = ask(o, sa);
        good(&r);
        assert_eq!(r.data[1] & 0x07, 0x03, "{o:#x}/{sa:#x}");
    }
    assert_eq!(ask(op::RECEIVE_COPY_RESULTS, 1).data[1] & 0x07, 0x01);
}
