//! Large write data received straight into its command's buffer (the
//! session's `landing`): multi-PDU 1 MiB writes with immediate data,
//! unsolicited Data-Out and R2Ts, header and data digests on, segments
//! arriving in pieces, land correctly; bad offsets and bad digests are
//! still refused.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::*;
use iscsi_wire::digest::{crc32c_parts, pad_len};
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits, RawPdu};
use iscsi_wire::pdu::*;

const MIB: usize = 1 << 20;
const SEG: usize = 256 * 1024;

const LIM: FrameLimits = FrameLimits {
    header_digest: true,
    data_digest: true,
    max_data_segment: 1 << 24,
};

/// Sends a PDU with digests; `pieces` > 0 writes it in pieces of that many
/// bytes with pauses, so that the target sees segments arrive in parts.
fn send(c: &mut Client, bhs: Bhs, data: &[u8], pieces: usize, bad_digest: bool) {
    let mut v = bhs.to_vec();
    v.extend_from_slice(&crc32c_parts(&[&bhs]).to_le_bytes());
    if !data.is_empty() {
        v.extend_from_slice(data);
        v.resize(v.len() + pad_len(data.len()), 0);
        let mut dd = crc32c_parts(&[&v[52..]]);
        if bad_digest {
            dd ^= 1;
        }
        v.extend_from_slice(&dd.to_le_bytes());
    }
    if pieces == 0 {
        let _ = c.s.write_all(&v);
        return;
    }
    for p in v.chunks(pieces) {
        if c.s.write_all(p).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn recv(c: &mut Client) -> Option<RawPdu> {
    loop {
        if let Some(n) = frame_len(&c.buf, &LIM).unwrap() {
            let p = split_pdu(&mut c.buf, n, &LIM).unwrap();
            assert!(p.data_digest_ok, "data digest from the target");
            return Some(p);
        }
        let mut tmp = [0u8; 65536];
        match c.s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(n) => c.buf.extend_from_slice(&tmp[..n]),
        }
    }
}

fn login(c: &mut Client, tag: u8, extra: &[(&str, &str)]) {
    let mut keys = vec![
        ("HeaderDigest", "CRC32C"),
        ("DataDigest", "CRC32C"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("MaxBurstLength", "1048576"),
        ("FirstBurstLength", "262144"),
    ];
    keys.extend_from_slice(extra);
    c.login_normal([0x80, 0, 0, 0, 0x4c, tag], &keys);
}

fn command(
    c: &mut Client,
    cdb: &[u8],
    edtl: u32,
    read: bool,
    write: bool,
    f: bool,
    imm: &[u8],
) -> Itt {
    let mut cb = [0u8; 16];
    cb[..cdb.len()].copy_from_slice(cdb);
    let itt = Itt(c.itt);
    c.itt += 1;
    let cmd = ScsiCommand {
        immediate: false,
        final_: f,
        read,
        write,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(c.lun),
        itt,
        edtl,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.stat_sn,
        cdb: cb,
    };
    c.cmd_sn = c.cmd_sn.next();
    send(c, cmd.encode(imm.len()), imm, 0, false);
    itt
}

#[allow(clippy::too_many_arguments)]
fn data_out(
    c: &mut Client,
    itt: Itt,
    ttt: u32,
    sn: u32,
    off: usize,
    f: bool,
    data: &[u8],
    pieces: usize,
    bad_digest: bool,
) {
    let d = DataOut {
        final_: f,
        lun: Lun::from_index(c.lun),
        itt,
        ttt,
        exp_stat_sn: c.stat_sn,
        data_sn: sn,
        buffer_offset: off as u32,
    };
    send(c, d.encode(data.len()), data, pieces, bad_digest);
}

/// Answers R2Ts with Data-Out of at most [`SEG`] bytes until the status
/// of `itt` comes: (status, Rejects seen).
fn finish(c: &mut Client, itt: Itt, data: &[u8], pieces: usize) -> (u8, usize) {
    let mut rejects = 0;
    loop {
        let r = recv(c).expect("response");
        match Pdu::parse(&r.bhs) {
            Pdu::R2t(t) => {
                assert_eq!(t.itt, itt);
                let mut off = t.buffer_offset as usize;
                let end = off + t.desired_len as usize;
                let mut sn = 0;
                while off < end {
                    let n = (end - off).min(SEG);
                    let d = &data[off..off + n];
                    data_out(c, itt, t.ttt, sn, off, off + n == end, d, pieces, false);
                    sn += 1;
                    off += n;
                }
            }
            Pdu::ScsiResponse(s) if s.itt == itt => {
                c.stat_sn = s.sn.stat_sn.next();
                return (s.status, rejects);
            }
            Pdu::Reject(_) => rejects += 1,
            p => panic!("unexpected {p:?}"),
        }
    }
}

fn read_back(c: &mut Client, lba: u32, len: usize) -> Vec<u8> {
    let itt = command(
        c,
        &rw10(0x28, lba, (len / 512) as u16),
        len as u32,
        true,
        false,
        true,
        &[],
    );
    let mut v = Vec::new();
    loop {
        let r = recv(c).expect("data-in");
        match Pdu::parse(&r.bhs) {
            Pdu::DataIn(d) => {
                assert_eq!(d.itt, itt);
                assert_eq!(d.buffer_offset as usize, v.len());
                v.extend_from_slice(&r.data);
                if let Some(st) = d.status {
                    assert_eq!(st, 0);
                    c.stat_sn = d.sn.stat_sn.next();
                    return v;
                }
            }
            p => panic!("unexpected {p:?}"),
        }
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

#[test]
fn large_writes_land_in_place_with_digests() {
    let (a, _s) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"8M\"",
        "",
    ));
    let mut c = Client::connect(a[0]);
    login(&mut c, 1, &[("ImmediateData", "Yes"), ("InitialR2T", "No")]);
    let blocks = (MIB / 512) as u16;

    // Chunk-aligned 1 MiB: 256 KiB immediate, then R2T'd Data-Out, each
    // segment arriving in pieces.
    let d1 = pattern(1, MIB);
    let itt = command(
        &mut c,
        &rw10(0x2a, 2048, blocks),
        MIB as u32,
        false,
        true,
        true,
        &d1[..SEG],
    );
    assert_eq!(finish(&mut c, itt, &d1, 40_000), (0, 0));
    assert!(read_back(&mut c, 2048, MIB) == d1, "aligned write");

    // Unaligned 1 MiB over two chunks, no immediate data: an unsolicited
    // Data-Out burst (F=0 on the command), then R2Ts.
    let d2 = pattern(2, MIB);
    let itt = command(
        &mut c,
        &rw10(0x2a, 4096 + 8, blocks),
        MIB as u32,
        false,
        true,
        false,
        &[],
    );
    data_out(&mut c, itt, RESERVED_TAG, 0, 0, true, &d2[..SEG], 0, false);
    assert_eq!(finish(&mut c, itt, &d2, 0), (0, 0));
    let back = read_back(&mut c, 4096, 2 * MIB);
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert!(back[4096..4096 + MIB] == d2[..], "unaligned write");
    assert!(back[4096 + MIB..].iter().all(|&b| b == 0));

    // Small immediate data, then large Data-Out into the same buffer; a
    // read holding the chunk meanwhile keeps what it read.
    let d3 = pattern(3, MIB);
    let itt = command(
        &mut c,
        &rw10(0x2a, 2048, blocks),
        MIB as u32,
        false,
        true,
        true,
        &d3[..8192],
    );
    assert_eq!(finish(&mut c, itt, &d3, 100_000), (0, 0));
    assert!(read_back(&mut c, 2048, MIB) == d3, "small immediate data");

    // A large Data-Out at the wrong offset: CHECK CONDITION, nothing of it
    // written, the session goes on.
    let itt = command(
        &mut c,
        &rw10(0x2a, 2048, blocks),
        MIB as u32,
        false,
        true,
        true,
        &[],
    );
    let r = recv(&mut c).expect("R2T");
    let Pdu::R2t(t) = Pdu::parse(&r.bhs) else {
        panic!("expected R2T")
    };
    let junk = vec![0xeeu8; SEG];
    data_out(&mut c, itt, t.ttt, 0, SEG, false, &junk, 0, false);
    let (st, rejects) = finish(&mut c, itt, &junk, 0);
    assert_eq!((st, rejects), (2, 1), "gapped offset");
    assert!(
        read_back(&mut c, 2048, MIB) == d3,
        "refused data not written"
    );

    // A bad data digest on a landed segment: Reject, then the connection
    // closes; another session still works.
    let itt = command(
        &mut c,
        &rw10(0x2a, 2048, blocks),
        MIB as u32,
        false,
        true,
        true,
        &d1[..SEG],
    );
    let r = recv(&mut c).expect("R2T");
    let Pdu::R2t(t) = Pdu::parse(&r.bhs) else {
        panic!("expected R2T")
    };
    data_out(
        &mut c,
        itt,
        t.ttt,
        0,
        SEG,
        false,
        &d1[SEG..2 * SEG],
        0,
        true,
    );
    let r = recv(&mut c).expect("reject");
    assert_eq!(opcode(&r.bhs), Opcode::Reject);
    assert_eq!(Reject::decode(&r.bhs).reason, RejectReason::DataDigestError);
    assert!(c.closed_within(Duration::from_secs(3)));
    let mut c = Client::connect(a[1]);
    login(&mut c, 2, &[]);
    assert!(
        read_back(&mut c, 2048, MIB) == d3,
        "digest error wrote nothing"
    );
}
