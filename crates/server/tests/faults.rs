//! Faults over real sockets: ABORT TASK of a write waiting for Data-Out,
//! LUN RESET with commands in flight, a connection dropped mid-write and
//! the session reinstated. Nothing half-written is acknowledged, and the
//! target keeps serving.

mod common;

use std::time::Duration;

use common::*;
use iscsi_wire::pdu::*;

const LUN: &str = "[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"";

fn tmf(c: &mut Client, function: TmfFunction, ref_itt: Itt) -> u8 {
    let itt = Itt(c.itt);
    c.itt += 1;
    let t = TaskMgmtReq {
        immediate: true,
        function,
        lun: Lun::from_index(0),
        itt,
        ref_task_tag: ref_itt,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.stat_sn,
        ref_cmd_sn: c.cmd_sn,
        exp_data_sn: 0,
    };
    c.send(t.encode(), &[]);
    loop {
        let r = c.recv().expect("TMF response");
        if let Pdu::TaskMgmtResp(t) = Pdu::parse(&r.bhs) {
            assert_eq!(t.itt, itt);
            c.stat_sn = t.sn.stat_sn.next();
            return u8::from(t.response);
        }
    }
}

fn read_block(c: &mut Client, lba: u32) -> Vec<u8> {
    let (st, d, _) = c.command(&rw10(0x28, lba, 8), 4096, true, &[], 0);
    assert_eq!(st, 0);
    d
}

#[test]
fn abort_task_of_a_write_waiting_for_data_out() {
    let (a, _s) = start(config(LUN, ""));
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 0x60, 1], &[]);
    let before = read_block(&mut c, 64);
    // WRITE of 8 blocks, no data: the target sends an R2T and waits.
    let itt = c.cmd(&rw10(0x2a, 64, 8), 4096, false, true, true, &[]);
    let r = c.recv().expect("R2T");
    let Pdu::R2t(r2t) = Pdu::parse(&r.bhs) else {
        panic!("expected R2T")
    };
    assert_eq!(
        tmf(&mut c, TmfFunction::AbortTask, itt),
        0,
        "FUNCTION COMPLETE"
    );
    // Data for the aborted task is dropped; no status comes for it.
    c.data_out(itt, r2t.ttt, 0, 0, true, &[0xee; 4096]);
    let r = c.recv_within(Duration::from_millis(300));
    assert!(
        r.is_none(),
        "aborted task answered: {:?}",
        r.map(|r| Pdu::parse(&r.bhs))
    );
    assert!(read_block(&mut c, 64) == before, "aborted write landed");
    // The window still has room: the aborted task freed its slot.
    for _ in 0..200 {
        assert_eq!(c.command(&[0; 6], 0, false, &[], 0).0, 0);
    }
    sanity(a[1], 1);
}

#[test]
fn lun_reset_with_commands_in_flight() {
    let (a, _s) = start(config(LUN, ""));
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 0x60, 2], &[]);
    // Three writes waiting for data, then a LUN RESET.
    let mut tasks = Vec::new();
    for i in 0..3u32 {
        let itt = c.cmd(&rw10(0x2a, 128 + 8 * i, 8), 4096, false, true, true, &[]);
        let r = c.recv().expect("R2T");
        assert!(matches!(Pdu::parse(&r.bhs), Pdu::R2t(_)));
        tasks.push(itt);
    }
    assert_eq!(tmf(&mut c, TmfFunction::LogicalUnitReset, Itt(0)), 0);
    let r = c.recv_within(Duration::from_millis(300));
    assert!(r.is_none(), "reset tasks answered");
    // Another session on the LU sees the reset as a unit attention
    // (29/xx) once, then works.
    let mut o = Client::connect(a[1]);
    o.login_normal([0x80, 0, 0, 0, 0x60, 3], &[]);
    let (st, _, sense) = o.command(&[0; 6], 0, false, &[], 0);
    if st == 2 {
        assert_eq!(sense[2] & 0xf, 6, "UNIT ATTENTION");
    }
    sanity(a[1], 2);
    // The resetting session goes on.
    let (st, _, _) = c.command(&[0; 6], 0, false, &[], 0);
    assert!(st == 0 || st == 2);
    assert_eq!(c.command(&[0; 6], 0, false, &[], 0).0, 0);
}

#[test]
fn connection_dropped_mid_write_then_reinstated() {
    let (a, _s) = start(config(LUN, ""));
    let isid = [0x80, 0, 0, 0, 0x60, 4];
    let mut c = Client::connect(a[0]);
    c.login_normal(isid, &[]);
    let before = read_block(&mut c, 256);
    let itt = c.cmd(&rw10(0x2a, 256, 8), 4096, false, true, true, &[]);
    let r = c.recv().expect("R2T");
    let Pdu::R2t(r2t) = Pdu::parse(&r.bhs) else {
        panic!()
    };
    // Half the data, then the connection goes.
    c.data_out(itt, r2t.ttt, 0, 0, false, &[0xdd; 2048]);
    drop(c);
    // Reinstatement: same initiator name and ISID.
    let mut c = Client::connect(a[0]);
    c.login_normal(isid, &[]);
    let (st, _, sense) = c.command(&[0; 6], 0, false, &[], 0);
    if st == 2 {
        assert_eq!(sense[2] & 0xf, 6, "UNIT ATTENTION after the nexus loss");
    }
    assert!(read_block(&mut c, 256) == before, "half a write landed");
    sanity(a[1], 3);
}
