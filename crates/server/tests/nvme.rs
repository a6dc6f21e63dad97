//! NVMe/TCP end to end over loopback: the userspace host
//! (`initiator::nvme`) against the server's NVMe/TCP ports, on the same
//! LUNs the iSCSI portals serve.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use initiator::nvme::{host_nqn, sqe, Controller, NvmeQueue};
use nvme_tcp_wire::capsule::Status;

const NQN: &str = "nqn.2026-11.io.ironsan:e2e";

fn serve(luns: &str, extra: &str) -> (Vec<SocketAddr>, Vec<SocketAddr>, Stopper) {
    let cfg = config(
        luns,
        &format!("nvme_listen = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\n{extra}"),
    );
    start_both(cfg)
}

const TWO_LUNS: &str = "[[target.lun]]\nbackend = \"mem\"\nsize = \"64M\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"8M\"\nblock_size = 4096";

fn host() -> String {
    host_nqn(&[7; 16])
}

/// Waits until command `cid` of `q` completes; every completion so far.
fn until_done(q: &mut NvmeQueue, cid: u16) -> Vec<initiator::nvme::Completion> {
    let mut done = Vec::new();
    while !done
        .iter()
        .any(|d: &initiator::nvme::Completion| d.cid == cid)
    {
        q.wait(&mut done).unwrap();
    }
    done
}

/// An iSCSI session to the test target through `portal`.
fn iscsi_login(portal: SocketAddr) -> initiator::Connection {
    initiator::Connection::login(
        &portal.to_string(),
        initiator::LoginConfig::new(
            "iqn.2026-11.io.ironsan:i",
            Some(IQN),
            initiator::random_isid(),
        ),
    )
    .unwrap()
}

fn rw(op: u8, nsid: u32, lba: u64, blocks: u32) -> nvme_tcp_wire::capsule::Sqe {
    sqe(
        op,
        nsid,
        &[(10, lba as u32), (11, (lba >> 32) as u32), (12, blocks - 1)],
    )
}

#[test]
fn a_host_connects_identifies_and_reads_back_what_it_wrote() {
    for digests in [(false, false), (true, true)] {
        let (_, nvme, _stop) = serve(TWO_LUNS, "");
        let mut c = Controller::connect(nvme[0], NQN, &host(), digests, 4).unwrap();
        assert_eq!(c.io_queues, 4);
        let ns1 = c.namespace(1).unwrap();
        assert_eq!((ns1.blocks, ns1.block_size), (64 << 20 >> 9, 512));
        let ns2 = c.namespace(2).unwrap();
        assert_eq!((ns2.blocks, ns2.block_size), (8 << 20 >> 12, 4096));
        assert_ne!(ns1.nguid, ns2.nguid);
        // An inactive NSID: zeros, no geometry.
        assert!(c.namespace(3).is_err());
        let mut q = c.io_queue(1, 64).unwrap();
        // In-capsule (4 KiB), and R2T + H2CData (1 MiB, several PDUs).
        for (lba, len) in [(8u64, 4096usize), (4096, 1 << 20), (100_000, 512)] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + lba as usize) as u8).collect();
            let w = q
                .call(
                    rw(0x01, 1, lba, (len / 512) as u32),
                    Bytes::from(data.clone()),
                    0,
                )
                .unwrap();
            w.ok().unwrap();
            let r = q
                .call(
                    rw(0x02, 1, lba, (len / 512) as u32),
                    Bytes::new(),
                    len as u32,
                )
                .unwrap();
            r.ok().unwrap();
            assert_eq!(
                &r.data[..],
                &data[..],
                "lba {lba} len {len} digests {digests:?}"
            );
        }
        // Past the end.
        let r = q
            .call(rw(0x02, 1, ns1.blocks, 1), Bytes::new(), 512)
            .unwrap();
        assert_eq!(r.status, Status::LBA_OUT_OF_RANGE);
        // No such namespace; an unknown opcode.
        let r = q.call(rw(0x02, 9, 0, 1), Bytes::new(), 512).unwrap();
        assert_eq!(r.status, Status::INVALID_NAMESPACE);
        let r = q.call(sqe(0x7e, 1, &[]), Bytes::new(), 0).unwrap();
        assert_eq!(r.status, Status::INVALID_OPCODE);
        // Dataset Management, deallocate one range, sent as Linux does: NR
        // 0 with room for 256 ranges (4 KiB).
        let mut ranges = vec![0u8; 4096];
        ranges[4..8].copy_from_slice(&8u32.to_le_bytes());
        ranges[8..16].copy_from_slice(&8u64.to_le_bytes());
        q.call(sqe(0x09, 1, &[(10, 0), (11, 4)]), Bytes::from(ranges), 0)
            .unwrap()
            .ok()
            .unwrap();
        // Flush of all namespaces.
        q.call(sqe(0x00, 0xffff_ffff, &[]), Bytes::new(), 0)
            .unwrap()
            .ok()
            .unwrap();
    }
}

#[test]
fn pipelined_commands_on_several_queues_complete() {
    let (_, nvme, _stop) = serve(TWO_LUNS, "");
    let c = Controller::connect(nvme[1], NQN, &host(), (false, false), 2).unwrap();
    let mut qs = [c.io_queue(1, 128).unwrap(), c.io_queue(2, 128).unwrap()];
    for (i, q) in qs.iter_mut().enumerate() {
        for k in 0..100u64 {
            let lba = (i as u64 * 1000 + k) * 8;
            let data = Bytes::from(vec![(k as u8) ^ (i as u8); 4096]);
            q.submit(rw(0x01, 1, lba, 8), data, 0).unwrap();
        }
        let mut done = Vec::new();
        while done.len() < 100 {
            q.wait(&mut done).unwrap();
        }
        assert!(done.iter().all(|d| d.status.is_success()));
        for k in 0..100u64 {
            let lba = (i as u64 * 1000 + k) * 8;
            q.submit(rw(0x02, 1, lba, 8), Bytes::new(), 4096).unwrap();
        }
        let mut done = Vec::new();
        while done.len() < 100 {
            q.wait(&mut done).unwrap();
        }
        assert_eq!(done.len(), 100);
    }
    // A queue beyond those granted is refused.
    assert!(c.io_queue(3, 32).is_err());
}

/// Reads are held one command while the next one's data is prefetched
/// (`Driver::take`): commands sent in one batch still run in the order
/// they came, so each read sees the write sent just before it.
#[test]
fn commands_in_one_batch_run_in_order() {
    let (_, nvme, _stop) = serve(TWO_LUNS, "");
    // 512-byte and 4 KiB blocks: 4 KiB in 8 blocks, or in 1.
    for (lun, blocks) in [(1u32, 8u32), (2, 1)] {
        let c = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
        let mut q = c.io_queue(1, 128).unwrap();
        let mut reads = Vec::new();
        for k in 0..40u8 {
            let lba = 64;
            q.submit(rw(0x01, lun, lba, blocks), Bytes::from(vec![k; 4096]), 0)
                .unwrap();
            let cid = q.submit(rw(0x02, lun, lba, blocks), Bytes::new(), 4096);
            reads.push((cid.unwrap(), k));
        }
        q.flush().unwrap();
        let mut done = Vec::new();
        while done.len() < 80 {
            q.wait(&mut done).unwrap();
        }
        for (cid, k) in reads {
            let d = done.iter().find(|d| d.cid == cid).unwrap();
            assert!(d.status.is_success());
            assert!(
                d.data.iter().all(|&b| b == k),
                "read after write {k}, LUN {lun}"
            );
        }
    }
}

#[test]
fn nvme_and_iscsi_see_one_volume() {
    let (iscsi, nvme, _stop) = serve(TWO_LUNS, "");
    let mut c = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
    let ns = c.namespace(1).unwrap();
    let mut q = c.io_queue(1, 32).unwrap();
    let data = Bytes::from(vec![0x5au8; 4096]);
    q.call(rw(0x01, 1, 64, 8), data.clone(), 0)
        .unwrap()
        .ok()
        .unwrap();
    let mut conn = iscsi_login(iscsi[0]);
    let r = conn
        .execute(
            0,
            &initiator::scsi::rw16(false, 64, 8, false),
            initiator::DataDir::Read(4096),
        )
        .unwrap();
    assert_eq!(&r.data[..], &data[..]);
    // The NGUID is the NAA of VPD page 83h.
    let vpd = conn
        .execute(
            0,
            &initiator::scsi::inquiry(Some(0x83), 255),
            initiator::DataDir::Read(255),
        )
        .unwrap();
    let naa = vpd.data.windows(16).any(|w| w == ns.nguid);
    assert!(
        naa,
        "NGUID {:02x?} not in VPD 83h {:02x?}",
        ns.nguid,
        &vpd.data[..]
    );
}

#[test]
fn unknown_subsystems_and_hosts_not_allowed_are_refused() {
    let (_, nvme, _stop) = serve(TWO_LUNS, "");
    let e = Controller::connect(
        nvme[0],
        "nqn.2026-11.io.ironsan:nosuch",
        &host(),
        (false, false),
        1,
    );
    assert!(e.is_err());
    let (_, nvme, _stop2) = {
        let cfg = server::Config::from_toml(&format!(
            "listen = [\"127.0.0.1:0\"]\nnvme_listen = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\nnvme_allow = [\"nqn.2026-11.io.ironsan:only\"]\n{TWO_LUNS}"
        ))
        .unwrap();
        start_both(cfg)
    };
    let e = Controller::connect(nvme[0], NQN, &host(), (false, false), 1)
        .err()
        .unwrap();
    assert!(e.to_string().contains("0x84"), "{e}");
    Controller::connect(
        nvme[0],
        NQN,
        "nqn.2026-11.io.ironsan:only",
        (false, false),
        1,
    )
    .unwrap();
}

#[test]
fn a_target_with_chap_is_not_reachable_over_nvme() {
    let cfg = server::Config::from_toml(&format!(
        "listen = [\"127.0.0.1:0\"]\nnvme_listen = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\nchap = {{ user = \"u\", secret = \"0123456789abcdef\" }}\n{TWO_LUNS}"
    ))
    .unwrap();
    let (_, nvme, _stop) = start_both(cfg);
    assert!(Controller::connect(nvme[0], NQN, &host(), (false, false), 1).is_err());
}

#[test]
fn the_discovery_controller_lists_the_subsystem_at_every_port() {
    let (_, nvme, _stop) = serve(TWO_LUNS, "");
    // Number of Queues is not a discovery feature: an I/O controller's
    // bring-up stops there.
    assert!(Controller::connect(nvme[0], nvme::DISCOVERY_NQN, &host(), (false, false), 1).is_err());
    let mut q = NvmeQueue::open(nvme[0], false, false).unwrap();
    let d = nvme_tcp_wire::capsule::ConnectData {
        host_id: [1; 16],
        cntlid: 0xffff,
        subnqn: nvme::DISCOVERY_NQN.into(),
        hostnqn: host(),
    };
    q.connect(0, 32, &d, 0).unwrap();
    let mut cc = [0u8; 64];
    cc[0] = 0x7f;
    cc[4] = 0x00;
    cc[44..48].copy_from_slice(&0x14u32.to_le_bytes());
    cc[48..56].copy_from_slice(&1u64.to_le_bytes());
    q.call(nvme_tcp_wire::capsule::Sqe(cc), Bytes::new(), 0)
        .unwrap()
        .ok()
        .unwrap();
    let numd = 4096 / 4 - 1;
    let r = q
        .call(
            sqe(0x02, 0, &[(10, 0x70 | (numd << 16))]),
            Bytes::new(),
            4096,
        )
        .unwrap();
    r.ok().unwrap();
    let n = u64::from_le_bytes(r.data[8..16].try_into().unwrap());
    // The subsystem and the discovery subsystem, at both ports.
    assert_eq!(n, 4);
    let e = &r.data[1024..2048];
    assert_eq!(e[0], 3); // TCP
    assert_eq!(e[2], 2); // an NVM subsystem
    let nqn = std::str::from_utf8(&e[256..256 + NQN.len()]).unwrap();
    assert_eq!(nqn, NQN);
    let port = std::str::from_utf8(&e[32..64])
        .unwrap()
        .trim_end_matches(['\0', ' ']);
    assert_eq!(port, nvme[0].port().to_string());
}

#[test]
fn hostile_pdus_get_a_termreq_and_other_connections_go_on() {
    let (_, nvme, _stop) = serve(TWO_LUNS, "");
    let mut good = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
    let mut q = good.io_queue(1, 32).unwrap();
    let cases: Vec<Vec<u8>> = vec![
        // Not an ICReq first.
        {
            let mut b = vec![0u8; 72];
            b[0] = 0x04;
            b[2] = 72;
            b[4..8].copy_from_slice(&72u32.to_le_bytes());
            b
        },
        // An unknown PDU type.
        vec![0x55, 0, 8, 0, 8, 0, 0, 0],
        // A PLEN beyond any limit.
        {
            let mut b = vec![0u8; 8];
            b[0] = 0x00;
            b[2] = 128;
            b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            b
        },
    ];
    for bad in cases {
        let mut s = TcpStream::connect(nvme[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&bad).unwrap();
        let mut b = [0u8; 256];
        let n = s.read(&mut b).unwrap();
        assert!(n >= 24, "a TermReq for {bad:02x?}");
        assert_eq!(b[0], 0x03, "C2HTermReq for {bad:02x?}");
        // Then the controller closes.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    // The good controller's queues were not disturbed.
    let r = q.call(rw(0x02, 1, 0, 1), Bytes::new(), 512).unwrap();
    r.ok().unwrap();
    good.namespace(1).unwrap();
}

/// The ANA log page through `q` (an admin queue): (change count, state).
fn ana(c: &mut Controller) -> (u64, u8) {
    let numd = 4096 / 4 - 1;
    let r = c
        .admin
        .call(
            sqe(0x02, 0xffff_ffff, &[(10, 0x0c | (numd << 16))]),
            Bytes::new(),
            4096,
        )
        .unwrap();
    r.ok().unwrap();
    let d = &r.data;
    assert_eq!(u16::from_le_bytes([d[8], d[9]]), 1, "one ANA group");
    assert_eq!(u32::from_le_bytes(d[16..20].try_into().unwrap()), 1);
    (u64::from_le_bytes(d[0..8].try_into().unwrap()), d[32])
}

#[test]
fn ana_states_follow_the_alua_groups_of_the_ports() {
    let alua = "[alua]\n[[alua.group]]\nid = 1\nportals = [1]\n[[alua.group]]\nid = 2\nportals = [2]\nstate = \"standby\"\n";
    let (_, nvme, _stop) = serve(TWO_LUNS, alua);
    let mut a = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
    let mut b = Controller::connect(nvme[1], NQN, &host(), (false, false), 1).unwrap();
    // Identify Controller: ANA reporting; Identify Namespace: group 1.
    let id = a
        .admin
        .call(sqe(0x06, 0, &[(10, 1)]), Bytes::new(), 4096)
        .unwrap();
    assert_eq!(id.data[76] & 0x08, 0x08, "CMIC ANA reporting");
    let ns = a
        .admin
        .call(sqe(0x06, 1, &[(10, 0)]), Bytes::new(), 4096)
        .unwrap();
    assert_eq!(u32::from_le_bytes(ns.data[92..96].try_into().unwrap()), 1);
    assert_eq!(ana(&mut a).1, 0x01, "optimized through port 1");
    assert_eq!(ana(&mut b).1, 0x03, "inaccessible through port 2 (standby)");
    let mut qa = a.io_queue(1, 32).unwrap();
    let mut qb = b.io_queue(1, 32).unwrap();
    qa.call(rw(0x02, 1, 0, 1), Bytes::new(), 512)
        .unwrap()
        .ok()
        .unwrap();
    let r = qb.call(rw(0x02, 1, 0, 1), Bytes::new(), 512).unwrap();
    assert_eq!(r.status, Status::path(0x02), "ANA inaccessible");
}

/// A LUN added or removed at run time (the admin API's add-lun and
/// remove-lun) reaches a connected host as a Namespace Attribute Changed
/// notice; the Changed Namespace List names it and is cleared once read
/// (unless Retain Asynchronous Event); a notice the host did not enable is
/// not sent.
#[test]
fn namespaces_added_and_removed_are_notified() {
    let cfg = config(TWO_LUNS, "nvme_listen = [\"127.0.0.1:0\", \"127.0.0.1:0\"]");
    let (_, nvme, control, _stop) = start_controlled(cfg);
    let mut c = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
    let id = c
        .admin
        .call(sqe(0x06, 0, &[(10, 1)]), Bytes::new(), 4096)
        .unwrap();
    // A notice that never comes fails the test instead of hanging it.
    c.admin
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let oaes = u32::from_le_bytes(id.data[92..96].try_into().unwrap());
    assert_eq!(oaes & (1 << 8), 1 << 8, "OAES: Namespace Attribute notices");
    // Asynchronous Event Configuration: namespace notices on.
    c.admin
        .call(sqe(0x09, 0, &[(10, 0x0b), (11, 1 << 8)]), Bytes::new(), 0)
        .unwrap()
        .ok()
        .unwrap();
    let changed = |c: &mut Controller, rae: bool| -> Vec<u32> {
        let numd = 4096 / 4 - 1;
        let d10 = 0x04 | (numd << 16) | if rae { 1 << 15 } else { 0 };
        let r = c
            .admin
            .call(sqe(0x02, 0xffff_ffff, &[(10, d10)]), Bytes::new(), 4096)
            .unwrap();
        r.ok().unwrap();
        r.data
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .take_while(|&n| n != 0)
            .collect()
    };
    // Let the controller take its first look at the namespaces.
    std::thread::sleep(Duration::from_millis(300));
    assert!(changed(&mut c, false).is_empty(), "nothing changed yet");
    let aer = c.admin.submit(sqe(0x0c, 0, &[]), Bytes::new(), 0).unwrap();
    c.admin.flush().unwrap();
    let spec = server::config::LunConfig::from_spec("mem:4M").unwrap();
    let lu = control.build_lun(IQN, 5, &spec).unwrap();
    control.install_lun(IQN, 5, lu).unwrap();
    let done = until_done(&mut c.admin, aer);
    let d = done.iter().find(|d| d.cid == aer).unwrap();
    assert!(d.status.is_success());
    assert_eq!(
        d.result & 0xff_ffff,
        0x04_0002,
        "notice, attribute changed, log 04h"
    );
    assert_eq!(changed(&mut c, true), vec![6], "NSID 6 (LUN 5), retained");
    assert_eq!(changed(&mut c, false), vec![6], "still there after RAE");
    assert!(changed(&mut c, false).is_empty(), "cleared once read");
    // Removed, and LUN 0 resized: both listed, the next AER reports them.
    control.remove_lun(IQN, 5).unwrap();
    control.resize_lun(IQN, 0, 128 << 20, false).unwrap();
    let aer = c.admin.submit(sqe(0x0c, 0, &[]), Bytes::new(), 0).unwrap();
    c.admin.flush().unwrap();
    let done = until_done(&mut c.admin, aer);
    let d = done.iter().find(|d| d.cid == aer).unwrap();
    assert_eq!(d.result & 0xff_ffff, 0x04_0002);
    assert_eq!(changed(&mut c, false), vec![1, 6]);
    // Notices off: a change is listed but not notified.
    c.admin
        .call(sqe(0x09, 0, &[(10, 0x0b), (11, 0)]), Bytes::new(), 0)
        .unwrap()
        .ok()
        .unwrap();
    let aer = c.admin.submit(sqe(0x0c, 0, &[]), Bytes::new(), 0).unwrap();
    c.admin.flush().unwrap();
    let lu = control.build_lun(IQN, 7, &spec).unwrap();
    control.install_lun(IQN, 7, lu).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    // A Keep Alive completes; the AER stays held.
    let k = c.admin.submit(sqe(0x18, 0, &[]), Bytes::new(), 0).unwrap();
    c.admin.flush().unwrap();
    let done = until_done(&mut c.admin, k);
    assert!(
        !done.iter().any(|d| d.cid == aer),
        "a notice the host did not enable was sent"
    );
    assert_eq!(changed(&mut c, false), vec![8]);
}

/// The fused Compare and Write (VMware's ATS on NVMe): the Write happens
/// only when the Compare matches, both complete; a mismatch fails the
/// Compare (Compare Failure) and aborts the Write (Failed Fused Command);
/// a first command without its second, or a second alone, gets Missing
/// Fused Command and the commands around them run as usual.
#[test]
fn fused_compare_and_write() {
    let (iscsi, nvme, _stop) = serve(TWO_LUNS, "");
    let mut c = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
    let id = c
        .admin
        .call(sqe(0x06, 0, &[(10, 1)]), Bytes::new(), 4096)
        .unwrap();
    assert_eq!(id.data[522] & 1, 1, "FUSES: Compare and Write");
    let mut q = c.io_queue(1, 32).unwrap();
    q.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let block = |b: u8| Bytes::from(vec![b; 512]);
    let fused = |op: u8, fuse: u8| {
        let mut s = rw(op, 1, 40, 1);
        s.0[1] |= fuse;
        s
    };
    // Runs the commands together; their completions in submission order.
    let run = |q: &mut NvmeQueue, cmds: Vec<(nvme_tcp_wire::capsule::Sqe, Bytes, u32)>| {
        let cids: Vec<u16> = cmds
            .into_iter()
            .map(|(s, w, r)| q.submit(s, w, r).unwrap())
            .collect();
        let mut done = Vec::new();
        while cids.iter().any(|c| {
            !done
                .iter()
                .any(|d: &initiator::nvme::Completion| d.cid == *c)
        }) {
            q.wait(&mut done).unwrap();
        }
        cids.iter()
            .map(|c| done.iter().find(|d| d.cid == *c).unwrap().clone())
            .collect::<Vec<_>>()
    };
    let read40 = |q: &mut NvmeQueue| {
        let r = q.call(rw(0x02, 1, 40, 1), Bytes::new(), 512).unwrap();
        r.ok().unwrap();
        r.data[0]
    };
    q.call(rw(0x01, 1, 40, 1), block(0xaa), 0)
        .unwrap()
        .ok()
        .unwrap();
    // A Compare and Write of block 40: expected, new.
    let pair = |q: &mut NvmeQueue, expected: u8, new: u8| {
        run(
            q,
            vec![
                (fused(0x05, 1), block(expected), 0),
                (fused(0x01, 2), block(new), 0),
            ],
        )
    };
    // Matches: written.
    let r = pair(&mut q, 0xaa, 0xbb);
    assert!(
        r[0].status.is_success() && r[1].status.is_success(),
        "{r:?}"
    );
    assert_eq!(read40(&mut q), 0xbb);
    // Does not match: nothing written.
    let r = pair(&mut q, 0xaa, 0xcc);
    assert_eq!(r[0].status, Status::media(0x85, true), "Compare Failure");
    assert_eq!(r[1].status, Status::generic(0x09, false), "Failed Fused");
    assert_eq!(read40(&mut q), 0xbb);
    // A first followed by a plain Read, and a second alone.
    let r = run(
        &mut q,
        vec![
            (fused(0x05, 1), block(0xbb), 0),
            (rw(0x02, 1, 40, 1), Bytes::new(), 512),
            (fused(0x01, 2), block(0xdd), 0),
        ],
    );
    assert_eq!(r[0].status, Status::generic(0x0a, true), "Missing Fused");
    assert!(r[1].status.is_success());
    assert_eq!(r[1].data[0], 0xbb);
    assert_eq!(r[2].status, Status::generic(0x0a, true), "Missing Fused");
    assert_eq!(read40(&mut q), 0xbb, "nothing written by an unpaired Write");
    // A pair whose blocks differ is no pair.
    let mut other = rw(0x01, 1, 41, 1);
    other.0[1] |= 2;
    let r = run(
        &mut q,
        vec![(fused(0x05, 1), block(0xbb), 0), (other, block(0xee), 0)],
    );
    assert_eq!(r[0].status, Status::generic(0x0a, true));
    assert_eq!(r[1].status, Status::generic(0x0a, true));
    // One ATS view: SCSI's COMPARE AND WRITE over iSCSI sees what the
    // NVMe/TCP one wrote, and the other way round.
    let mut conn = iscsi_login(iscsi[0]);
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[2..10].copy_from_slice(&40u64.to_be_bytes());
    caw[13] = 1;
    let mut data = vec![0xbb; 512];
    data.extend_from_slice(&[0x11; 512]);
    let t = conn
        .execute(0, &caw, initiator::DataDir::Write(Bytes::from(data)))
        .unwrap();
    assert_eq!(
        t.status,
        Some(0),
        "iSCSI COMPARE AND WRITE: {:02x?}",
        t.sense
    );
    let r = pair(&mut q, 0x11, 0x22);
    assert!(
        r[0].status.is_success() && r[1].status.is_success(),
        "{r:?}"
    );
    let mut data = vec![0x11; 512];
    data.extend_from_slice(&[0x33; 512]);
    let t = conn
        .execute(0, &caw, initiator::DataDir::Write(Bytes::from(data)))
        .unwrap();
    assert_eq!(t.status, Some(2), "MISCOMPARE: the block is 0x22 now");
    assert_eq!(read40(&mut q), 0x22);
}

/// Reservations (NVMe Base 2.0 §8.19): Register, Acquire, Report and
/// Release from two NVMe hosts, with the conflict table applied to I/O,
/// and the same reservation seen and honoured by an iSCSI initiator.
#[test]
fn reservations_are_one_state_for_nvme_hosts_and_iscsi_initiators() {
    let (iscsi, nvme, _stop) = serve(TWO_LUNS, "");
    let mut c1 = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
    let c2 = Controller::connect(nvme[1], NQN, &host_nqn(&[8; 16]), (false, false), 1).unwrap();
    let id = c1
        .admin
        .call(sqe(0x06, 0, &[(10, 1)]), Bytes::new(), 4096)
        .unwrap();
    let oncs = u16::from_le_bytes([id.data[520], id.data[521]]);
    assert_ne!(oncs & 0x20, 0, "ONCS: reservations");
    let idns = c1
        .admin
        .call(sqe(0x06, 1, &[(10, 0)]), Bytes::new(), 4096)
        .unwrap();
    assert_eq!(idns.data[31] & 0x7e, 0x7e, "RESCAP: the six types");
    let (mut q1, mut q2) = (c1.io_queue(1, 32).unwrap(), c2.io_queue(1, 32).unwrap());
    let keys = |a: u64, b: u64| {
        let mut v = a.to_le_bytes().to_vec();
        v.extend_from_slice(&b.to_le_bytes());
        Bytes::from(v)
    };
    let resv = |q: &mut NvmeQueue, op: u8, dw10: u32, data: Bytes| {
        let len = data.len() as u32;
        let mut s = sqe(op, 1, &[(10, dw10)]);
        s.0[32..36].copy_from_slice(&len.to_le_bytes());
        q.call(s, data, 0).unwrap().status
    };
    let block = Bytes::from(vec![0x42u8; 512]);
    let write = |q: &mut NvmeQueue| q.call(rw(0x01, 1, 8, 1), block.clone(), 0).unwrap().status;
    let read = |q: &mut NvmeQueue| q.call(rw(0x02, 1, 8, 1), Bytes::new(), 512).unwrap().status;
    let conflict = Status::generic(0x83, true);
    // Register (CPTPL 00b: the test LU has no state file), then Acquire
    // Write Exclusive.
    assert!(resv(&mut q1, 0x0d, 0, keys(0, 0xa1)).is_success());
    assert_eq!(
        resv(&mut q2, 0x11, 1 << 8, keys(0xa1, 0)),
        conflict,
        "not registered"
    );
    assert!(resv(&mut q1, 0x11, 1 << 8, keys(0xa1, 0)).is_success());
    assert!(write(&mut q1).is_success() && read(&mut q1).is_success());
    assert_eq!(
        write(&mut q2),
        conflict,
        "Write Exclusive: host 2 may not write"
    );
    assert!(read(&mut q2).is_success(), "but may read");
    // The report, from the other host, extended data structure only.
    let mut rep = sqe(0x0e, 1, &[(10, 1023), (11, 1)]);
    rep.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
    let r = q2.call(rep, Bytes::new(), 4096).unwrap();
    r.ok().unwrap();
    let d = &r.data;
    assert_eq!((d[4], d[5], d[6]), (1, 1, 0), "RTYPE 1, one registrant");
    assert_eq!(d[64..66], [0xff, 0xff]);
    assert_eq!(d[66], 1, "holds the reservation");
    assert_eq!(d[72..80], 0xa1u64.to_le_bytes());
    assert_eq!(d[80..96], c1.connect.host_id);
    let mut no_eds = sqe(0x0e, 1, &[(10, 1023)]);
    no_eds.0[32..36].copy_from_slice(&4096u32.to_le_bytes());
    let r = q2.call(no_eds, Bytes::new(), 4096).unwrap();
    assert_eq!(r.status, Status::generic(0x22, true));
    // iSCSI: the NVMe host's reservation is the LU's.
    let mut conn = iscsi_login(iscsi[0]);
    let mut prin = [0u8; 10];
    prin[0] = 0x5e;
    prin[1] = 0x01; // READ RESERVATION
    prin[8] = 64;
    let t = conn
        .execute(0, &prin, initiator::DataDir::Read(64))
        .unwrap();
    assert_eq!(t.status, Some(0));
    assert_eq!(t.data[8..16], 0xa1u64.to_be_bytes());
    assert_eq!(t.data[21], 1, "Write Exclusive");
    let t = conn
        .execute(
            0,
            &initiator::scsi::rw16(true, 8, 1, false),
            initiator::DataDir::Write(block.clone()),
        )
        .unwrap();
    assert_eq!(t.status, Some(0x18), "RESERVATION CONFLICT over iSCSI");
    // Release with the wrong type, then the right one: all may write.
    assert_eq!(
        resv(&mut q1, 0x15, 2 << 8, keys(0xa1, 0)),
        Status::INVALID_FIELD
    );
    assert!(resv(&mut q1, 0x15, 1 << 8, keys(0xa1, 0)).is_success());
    assert!(write(&mut q2).is_success());
    // Unregister (RREGA 001b) with the wrong key conflicts.
    assert_eq!(resv(&mut q1, 0x0d, 1, keys(0xbad, 0)), conflict);
    assert!(resv(&mut q1, 0x0d, 1, keys(0xa1, 0)).is_success());
    let t = conn
        .execute(
            0,
            &initiator::scsi::rw16(true, 8, 1, false),
            initiator::DataDir::Write(block.clone()),
        )
        .unwrap();
    assert_eq!(t.status, Some(0));
}

/// DH-HMAC-CHAP (NVMe Base 2.0 §8.13): a target with `dhchap` answers
/// every Connect with "authentication required"; the host proves it
/// knows the secret on each queue (and, bidirectionally, the controller
/// proves it knows its own); a queue that has not serves nothing; a wrong
/// secret ends the association. The target also requires iSCSI CHAP,
/// which keeps it off NVMe/TCP only while it has no `dhchap`.
#[test]
fn dh_hmac_chap_authenticates_every_queue() {
    use initiator::nvme::Dhchap;
    use nvme_auth::{Hash, Secret};
    use std::sync::Arc;
    let host_secret = Secret::represent(&[0x11; 32], Some(Hash::Sha256));
    let ctrl_secret = Secret::represent(&[0x22; 48], Some(Hash::Sha384));
    let luns = format!(
        "chap = {{ user = \"u\", secret = \"0123456789abcdef\" }}\n\
         dhchap = {{ secret = \"{host_secret}\", ctrl_secret = \"{ctrl_secret}\" }}\n{TWO_LUNS}"
    );
    let (_iscsi, nvme, _stop) = serve(&luns, "");
    let listed = initiator::nvme::discover(nvme[0], &host()).unwrap();
    assert!(listed.iter().any(|e| e.subnqn == NQN), "{listed:?}");
    let keys = |s: &str, c: Option<&str>| {
        Some(Arc::new(Dhchap {
            secret: Secret::parse(s).unwrap(),
            ctrl_secret: c.map(|c| Secret::parse(c).unwrap()),
        }))
    };
    let connect = |auth| Controller::connect_auth(nvme[0], NQN, &host(), (false, false), 2, auth);
    let e = connect(None).err().unwrap().to_string();
    assert!(e.contains("requires DH-HMAC-CHAP"), "{e}");
    let wrong = Secret::represent(&[0x12; 32], Some(Hash::Sha256));
    let e = connect(keys(&wrong, None)).err().unwrap().to_string();
    assert!(e.contains("AUTH_Failure1"), "{e}");
    let e = connect(keys(&host_secret, Some(&wrong)))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("R2"),
        "the controller does not know that secret: {e}"
    );
    for auth in [
        keys(&host_secret, None),
        keys(&host_secret, Some(&ctrl_secret)),
    ] {
        let c = connect(auth).unwrap();
        let mut q = c.io_queue(1, 32).unwrap();
        let data = Bytes::from(vec![0x6bu8; 4096]);
        q.call(rw(0x01, 1, 0, 8), data.clone(), 0)
            .unwrap()
            .ok()
            .unwrap();
        let r = q.call(rw(0x02, 1, 0, 8), Bytes::new(), 4096).unwrap();
        r.ok().unwrap();
        assert_eq!(r.data, data);
    }
    // A queue that did not authenticate serves nothing.
    let mut q = NvmeQueue::open(nvme[0], false, false).unwrap();
    let d = nvme_tcp_wire::capsule::ConnectData {
        host_id: [3; 16],
        cntlid: 0xffff,
        subnqn: NQN.into(),
        hostnqn: host(),
    };
    assert!(q.connect(0, 32, &d, 0).is_err());
    let r = q
        .call(sqe(0x06, 0, &[(10, 1)]), Bytes::new(), 4096)
        .unwrap();
    assert_eq!(
        (r.status.sct, r.status.sc),
        nvme_auth::AUTH_REQUIRED,
        "Identify before authenticating"
    );
}

/// A LUN's `uuid` is listed among its namespace's identification
/// descriptors (NIDT 03h) beside the NGUID; a LUN without one lists none;
/// a malformed one is refused in the file and in a `--lun` spec.
#[test]
fn a_configured_uuid_is_a_namespace_descriptor() {
    const U: &str = "91fdba0d-f87b-4c25-b80f-db7be1418b9e";
    let luns = format!(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"8M\"\nuuid = \"{U}\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"8M\""
    );
    let (_, nvme, _stop) = serve(&luns, "");
    let mut c = Controller::connect(nvme[0], NQN, &host(), (false, false), 1).unwrap();
    // The descriptors, as (type, value).
    let descs = |c: &mut Controller, nsid: u32| -> Vec<(u8, Vec<u8>)> {
        let r = c
            .admin
            .call(sqe(0x06, nsid, &[(10, 3)]), Bytes::new(), 4096)
            .unwrap();
        r.ok().unwrap();
        let mut out = Vec::new();
        let mut at = 0;
        while at + 4 <= r.data.len() && r.data[at] != 0 {
            let len = usize::from(r.data[at + 1]);
            out.push((r.data[at], r.data[at + 4..at + 4 + len].to_vec()));
            at += 4 + len;
        }
        out
    };
    let want: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&U.replace('-', "")[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let d1 = descs(&mut c, 1);
    assert_eq!(d1.iter().map(|d| d.0).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(d1[1].1, want);
    let d2 = descs(&mut c, 2);
    assert_eq!(d2.iter().map(|d| d.0).collect::<Vec<_>>(), vec![2, 4]);
    for bad in [
        "mem:4M,uuid=zz",
        "mem:4M,uuid=00000000-0000-0000-0000-000000000000",
        "mem:4M,uuid=91fdba0d-f87b-4c25-b80f-db7be1418b9é",
    ] {
        assert!(server::config::LunConfig::from_spec(bad).is_err(), "{bad}");
    }
    let bad = format!(
        "listen = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"8M\"\nuuid = \"91fdba0d\""
    );
    let e = server::Config::from_toml(&bad).unwrap_err().to_string();
    assert!(e.contains("uuid"), "{e}");
}

/// The target `admin add-target` adds in these tests: a subsystem NQN in
/// the free form Linux nvmet accepts (blktests names its subsystems so),
/// a namespace UUID, one allowed host.
fn added_target(name: &str, nqn: &str) -> server::config::TargetConfig {
    let cfg = server::Config::from_toml(&format!(
        "listen = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{name}\"\nnqn = \"{nqn}\"\n\
         nvme_allow = [\"{}\"]\n[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"\n\
         uuid = \"91fdba0d-f87b-4c25-b80f-db7be1418b9e\"\n",
        host()
    ))
    .unwrap();
    cfg.target.into_iter().next().unwrap()
}

#[test]
fn targets_added_and_removed_while_serving() {
    let cfg = config(TWO_LUNS, "nvme_listen = [\"127.0.0.1:0\"]");
    let (iscsi, nvme, control, _stop) = start_controlled(cfg);
    const ADDED: &str = "iqn.2026-12.io.ironsan:added";
    let t = added_target(ADDED, "blktests-subsystem-1");
    let v = control.add_target(&t).unwrap();
    assert_eq!((v.nqn.as_str(), v.luns.len()), ("blktests-subsystem-1", 1));
    // Twice, or its NQN under another name: refused.
    assert!(matches!(
        control.add_target(&t),
        Err(server::control::ControlError::Conflict(_))
    ));
    let other = added_target("iqn.2026-12.io.ironsan:other", "blktests-subsystem-1");
    assert!(matches!(
        control.add_target(&other),
        Err(server::control::ControlError::Conflict(_))
    ));

    // Served at once over NVMe/TCP (to the allowed host only) and iSCSI.
    let e = Controller::connect(
        nvme[0],
        "blktests-subsystem-1",
        "nqn.2026-11.io.ironsan:someone-else",
        (false, false),
        1,
    );
    assert!(e.is_err(), "a host not allowed connects");
    let mut c =
        Controller::connect(nvme[0], "blktests-subsystem-1", &host(), (false, false), 1).unwrap();
    let ns = c.namespace(1).unwrap();
    assert_eq!(ns.blocks, 16 << 20 >> 9);
    let mut q = c.io_queue(1, 16).unwrap();
    q.call(rw(0x01, 1, 0, 1), Bytes::from(vec![0x5a; 512]), 0)
        .unwrap()
        .ok()
        .unwrap();
    let mut s = initiator::Connection::login(
        &iscsi[0].to_string(),
        initiator::LoginConfig::new(
            "iqn.2026-11.io.ironsan:i",
            Some(ADDED),
            initiator::random_isid(),
        ),
    )
    .unwrap();
    let r = s
        .execute(
            0,
            &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            initiator::DataDir::Read(512),
        )
        .unwrap();
    assert_eq!(&r.data[..], &[0x5a; 512][..], "iSCSI sees the NVMe write");

    // Removed: its controller and session end, and nobody gets in again.
    control.remove_target(ADDED).unwrap();
    q.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = q.call(rw(0x02, 1, 0, 1), Bytes::new(), 512);
    assert!(r.is_err(), "the I/O queue outlived its subsystem: {r:?}");
    let r = s.execute(
        0,
        &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        initiator::DataDir::Read(512),
    );
    assert!(r.is_err(), "the session outlived its target");
    assert!(
        Controller::connect(nvme[0], "blktests-subsystem-1", &host(), (false, false), 1).is_err()
    );
    assert!(initiator::Connection::login(
        &iscsi[0].to_string(),
        initiator::LoginConfig::new(
            "iqn.2026-11.io.ironsan:i",
            Some(ADDED),
            initiator::random_isid()
        ),
    )
    .is_err());
    assert!(matches!(
        control.remove_target(ADDED),
        Err(server::control::ControlError::NotFound(_))
    ));
    // The same name can come back; the last target cannot go.
    control.add_target(&t).unwrap();
    Controller::connect(nvme[0], "blktests-subsystem-1", &host(), (false, false), 1).unwrap();
    control.remove_target(IQN).unwrap();
    assert!(matches!(
        control.remove_target(ADDED),
        Err(server::control::ControlError::Conflict(_))
    ));
}
