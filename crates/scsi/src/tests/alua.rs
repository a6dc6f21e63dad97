//! ALUA: INQUIRY TPGS, REPORT / SET TARGET PORT GROUPS, access-state
//! filtering and the unit attentions of state changes.

use std::sync::Arc;

use storage::MemBackend;

use super::*;
use crate::{AccessState, GroupSpec, PortGroups, Sense, TargetLus};

/// Two groups: 1 = ports 1 and 3 (active/optimized, preferred),
/// 2 = port 2 (active/non-optimized).
fn groups(explicit: bool) -> Arc<PortGroups> {
    Arc::new(
        PortGroups::new(
            vec![
                GroupSpec {
                    id: 1,
                    ports: vec![1, 3],
                    state: AccessState::ActiveOptimized,
                    preferred: true,
                },
                GroupSpec {
                    id: 2,
                    ports: vec![2],
                    state: AccessState::ActiveNonOptimized,
                    preferred: false,
                },
            ],
            explicit,
        )
        .unwrap(),
    )
}

fn alua_lu(pg: &Arc<PortGroups>) -> LogicalUnit {
    mem_lu().with_port_groups(pg.clone())
}

/// A command through relative port `port` of group `tpg`.
fn via<'a>(cdb: &'a [u8], data: &'a WriteData, n: NexusId, port: u16, tpg: u16) -> Command<'a> {
    Command {
        relative_port: port,
        tpg,
        ..cmd(cdb, data, n)
    }
}

fn rtpg(format: u8, alloc: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = op::MAINTENANCE_IN;
    c[1] = (format << 5) | 0x0A;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

fn stpg(len: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = op::MAINTENANCE_OUT;
    c[1] = 0x0A;
    c[6..10].copy_from_slice(&len.to_be_bytes());
    c
}

fn stpg_list(entries: &[(u8, u16)]) -> Vec<u8> {
    let mut d = vec![0u8; 4];
    for &(state, id) in entries {
        d.extend_from_slice(&[state, 0]);
        d.extend_from_slice(&id.to_be_bytes());
    }
    d
}

#[test]
fn standard_inquiry_tpgs_and_3pc() {
    let inq = [op::INQUIRY, 0, 0, 0, 96, 0];
    let o = run(&mem_lu(), &inq, &[]);
    assert_eq!(o.data[5], 0x18, "TPGS 01b and 3PC");
    let o = run(&alua_lu(&groups(false)), &inq, &[]);
    assert_eq!(o.data[5] & 0x30, 0x10, "implicit");
    let o = run(&alua_lu(&groups(true)), &inq, &[]);
    assert_eq!(o.data[5] & 0x30, 0x30, "implicit and explicit");
    assert_eq!(o.data[5] & 0x08, 0x08, "3PC");
}

/// MULTIP follows the ports the unit is reachable through (SPC-4
/// §6.6.2), as they are added and removed; HISUP is always set.
#[test]
fn standard_inquiry_multip_follows_the_ports_and_hisup() {
    let inq = [op::INQUIRY, 0, 0, 0, 96, 0];
    let o = run(&mem_lu(), &inq, &[]);
    assert_eq!(o.data[6] & 0x10, 0, "one port: MULTIP 0");
    assert_eq!(o.data[3] & 0x10, 0x10, "HISUP");
    let pg = groups(false);
    let lu = alua_lu(&pg);
    assert_eq!(
        run(&lu, &inq, &[]).data[6] & 0x10,
        0x10,
        "3 ports: MULTIP 1"
    );
    pg.remove_port(1);
    pg.remove_port(2);
    assert_eq!(run(&lu, &inq, &[]).data[6] & 0x10, 0, "1 port left");
    assert!(pg.add_port(2, 2));
    assert_eq!(run(&lu, &inq, &[]).data[6] & 0x10, 0x10, "a port added");
}

#[test]
fn report_target_port_groups_length_format() {
    let pg = groups(false);
    let lu = alua_lu(&pg);
    let o = lu.execute(&via(&rtpg(0, 1024), &WriteData::None, N1, 2, 2));
    good(&o);
    #[rustfmt::skip]
    let want = [
        0, 0, 0, 28,                  // RETURN DATA LENGTH
        0x80, 0x0F, 0, 1, 0, 0, 0, 2, // PREF, AO; supported; group 1; 2 ports
        0, 0, 0, 1, 0, 0, 0, 3,
        0x01, 0x0F, 0, 2, 0, 0, 0, 1, // AN; group 2; 1 port
        0, 0, 0, 2,
    ];
    assert_eq!(&o.data[..], &want);
    // Allocation length cuts the data, RETURN DATA LENGTH does not change.
    let o = lu.execute(&via(&rtpg(0, 6), &WriteData::None, N1, 2, 2));
    assert_eq!(&o.data[..], &want[..6]);
}

#[test]
fn report_target_port_groups_extended_format() {
    let lu = alua_lu(&groups(true));
    let o = run(&lu, &rtpg(1, 1024), &[]);
    good(&o);
    assert_eq!(&o.data[..8], &[0, 0, 0, 32, 0x10, 0, 0, 0]);
    assert_eq!(&o.data[8..12], &[0x80, 0x0F, 0, 1]);
    assert_eq!(o.data.len(), 36);
    invalid_cdb(&run(&lu, &rtpg(2, 1024), &[]), 1, Some(7));
}

#[test]
fn report_target_port_groups_without_configuration() {
    // A unit with no groups reports the path's own group, active/optimized.
    let o = run(&mem_lu(), &rtpg(0, 1024), &[]);
    good(&o);
    assert_eq!(
        &o.data[..],
        &[0, 0, 0, 12, 0x00, 0x0F, 0, 2, 0, 0, 0, 1, 0, 0, 0, 3]
    );
}

#[test]
fn set_target_port_groups_needs_explicit_alua() {
    let lu = alua_lu(&groups(false));
    let list = stpg_list(&[(2, 2)]);
    let o = run(&lu, &stpg(list.len() as u32), &list);
    sense(
        &o,
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    assert_eq!(lu.port_groups().state(2), AccessState::ActiveNonOptimized);
    // REPORT SUPPORTED OPERATION CODES agrees: MAINTENANCE OUT unsupported.
    let mut one = [0u8; 12];
    one[0] = op::MAINTENANCE_IN;
    one[1] = 0x0C;
    one[2] = 0x02;
    one[3] = op::MAINTENANCE_OUT;
    one[5] = 0x0A;
    one[9] = 64;
    assert_eq!(run(&lu, &one, &[]).data[1] & 0x07, 0x01, "not supported");
    let lu = alua_lu(&groups(true));
    assert_eq!(run(&lu, &one, &[]).data[1] & 0x07, 0x03, "supported");
    one[3] = op::MAINTENANCE_IN;
    assert_eq!(run(&lu, &one, &[]).data[1] & 0x07, 0x03, "RTPG supported");
}

#[test]
fn set_target_port_groups_changes_states_and_raises_unit_attentions() {
    let pg = groups(true);
    let lu = alua_lu(&pg);
    // Both nexuses known to the unit.
    good(&lu.execute(&via(&[0; 6], &WriteData::None, N1, 1, 1)));
    good(&lu.execute(&via(&[0; 6], &WriteData::None, N2, 2, 2)));
    let list = stpg_list(&[(2, 2), (0, 1)]);
    good(&lu.execute(&via(&stpg(list.len() as u32), &wd(&list), N1, 1, 1)));
    assert_eq!(
        pg.states(),
        vec![(1, AccessState::ActiveOptimized), (2, AccessState::Standby)]
    );
    // The sender has no unit attention; the other nexus does.
    good(&lu.execute(&via(&[0; 6], &WriteData::None, N1, 1, 1)));
    sense(
        &lu.execute(&via(&[0; 6], &WriteData::None, N2, 2, 2)),
        SenseKey::UnitAttention,
        Asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    // Group 2 is now standby: TEST UNIT READY and READ are refused.
    sense(
        &lu.execute(&via(&[0; 6], &WriteData::None, N2, 2, 2)),
        SenseKey::NotReady,
        Asc::NOT_ACCESSIBLE_STANDBY,
    );
    sense(
        &lu.execute(&via(&read10(0, 1), &WriteData::None, N2, 2, 2)),
        SenseKey::NotReady,
        Asc::NOT_ACCESSIBLE_STANDBY,
    );
    // RTPG reports the change and who made it (status 01h) for both groups.
    let o = lu.execute(&via(&rtpg(0, 1024), &WriteData::None, N2, 2, 2));
    good(&o);
    assert_eq!((o.data[4] & 0x0F, o.data[9]), (0, 0x01));
    assert_eq!((o.data[20] & 0x0F, o.data[25]), (2, 0x01));
    // Setting the same states again changes nothing: no new attention.
    good(&lu.execute(&via(&stpg(list.len() as u32), &wd(&list), N1, 1, 1)));
    assert_eq!(lu.pending_unit_attentions(N2), 0);
}

#[test]
fn state_change_reaches_the_other_units_of_the_target() {
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
    let pg = groups(true);
    let a = Arc::new(alua_lu(&pg));
    let b = Arc::new(alua_lu(&pg));
    let lus = Lus(vec![a.clone(), b.clone()]);
    for lu in [&a, &b] {
        good(&lu.execute(&via(&[0; 6], &WriteData::None, N1, 1, 1)));
    }
    let list = stpg_list(&[(3, 2)]);
    let cdb = stpg(list.len() as u32);
    let list = wd(&list);
    let c = Command {
        lus: Some(&lus),
        ..via(&cdb, &list, N1, 1, 1)
    };
    good(&a.execute(&c));
    assert_eq!(
        a.pending_unit_attentions(N1),
        0,
        "the sender, on the unit addressed"
    );
    assert_eq!(
        b.pending_unit_attentions(N1),
        1,
        "the sender, on the other unit"
    );
}

#[test]
fn set_target_port_groups_errors_change_nothing() {
    let pg = groups(true);
    let lu = alua_lu(&pg);
    let try_list = |list: &[u8]| run(&lu, &stpg(list.len() as u32), list);
    // Unknown group: the pointer names its TARGET PORT GROUP field.
    let o = try_list(&stpg_list(&[(2, 1), (2, 9)]));
    assert_eq!(
        o.sense.unwrap(),
        Sense::invalid_param(10, None),
        "second descriptor's group"
    );
    // Offline (Eh) and transitioning (Fh) cannot be requested.
    assert_eq!(
        try_list(&stpg_list(&[(0x0E, 1)])).sense.unwrap(),
        Sense::invalid_param(4, Some(3))
    );
    // A group twice.
    assert_eq!(
        try_list(&stpg_list(&[(2, 1), (3, 1)])).sense.unwrap(),
        Sense::invalid_param(10, None)
    );
    assert_eq!(pg.state(1), AccessState::ActiveOptimized);
    // Lengths.
    let list = stpg_list(&[(2, 1)]);
    sense(
        &run(&lu, &stpg(6), &list[..6]),
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    sense(
        &run(&lu, &stpg(8), &list[..5]),
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    invalid_cdb(
        &run(&lu, &stpg(crate::alua::MAX_STPG_LIST + 4), &[]),
        6,
        None,
    );
    good(&run(&lu, &stpg(0), &[]));
    good(&run(&lu, &stpg(4), &[0; 4]));
    assert_eq!(pg.state(1), AccessState::ActiveOptimized);
}

#[test]
fn standby_and_unavailable_command_filtering() {
    let pg = groups(true);
    let lu = alua_lu(&pg);
    let list = stpg_list(&[(3, 2)]);
    good(&run(&lu, &stpg(list.len() as u32), &list));
    let through2 = |c: &[u8]| lu.execute(&via(c, &WriteData::None, N1, 2, 2));
    let nr = Asc::NOT_ACCESSIBLE_UNAVAILABLE;
    sense(&through2(&[0; 6]), SenseKey::NotReady, nr);
    sense(
        &through2(&[op::MODE_SENSE_6, 0, 0x3F, 0, 255, 0]),
        SenseKey::NotReady,
        nr,
    );
    good(&through2(&[op::INQUIRY, 0, 0, 0, 96, 0]));
    good(&through2(&rtpg(0, 256)));
    // REQUEST SENSE says why the path is unusable.
    let o = through2(&[op::REQUEST_SENSE, 0, 0, 0, 18, 0]);
    good(&o);
    assert_eq!((o.data[2], o.data[12], o.data[13]), (0x02, 0x04, 0x0C));
    // Port 1 is still fine.
    good(&lu.execute(&via(&read10(0, 1), &WriteData::None, N1, 1, 1)));
    // Standby allows MODE SENSE.
    let list = stpg_list(&[(2, 2)]);
    good(&run(&lu, &stpg(list.len() as u32), &list));
    good(&through2(&[op::MODE_SENSE_6, 0, 0x3F, 0, 255, 0]));
    sense(
        &through2(&write10(0, 1)),
        SenseKey::NotReady,
        Asc::NOT_ACCESSIBLE_STANDBY,
    );
    // A standby port can bring itself back.
    let list = stpg_list(&[(0, 2)]);
    good(&lu.execute(&via(&stpg(list.len() as u32), &wd(&list), N1, 2, 2)));
    good(&through2(&[0; 6]));
}

#[test]
fn device_identification_names_port_and_group() {
    let lu = alua_lu(&groups(false));
    let o = lu.execute(&via(
        &[op::INQUIRY, 1, 0x83, 1, 0, 0],
        &WriteData::None,
        N1,
        3,
        1,
    ));
    good(&o);
    let d = &o.data[4..];
    let mut i = 0;
    let (mut rel, mut tpg) = (None, None);
    while i + 4 <= d.len() {
        let len = usize::from(d[i + 3]);
        let v = &d[i + 4..i + 4 + len];
        match d[i + 1] & 0x3F {
            0x14 => rel = Some(u16::from_be_bytes([v[2], v[3]])),
            0x15 => tpg = Some(u16::from_be_bytes([v[2], v[3]])),
            _ => {}
        }
        i += 4 + len;
    }
    assert_eq!((rel, tpg), (Some(3), Some(1)));
}

#[test]
fn session_reinstatement_reports_nexus_loss() {
    let lu = LogicalUnit::new(Arc::new(MemBackend::new(1 << 20)), cfg()).unwrap();
    lu.nexus_reinstated(N2);
    sense(
        &lu.execute(&cmd(&[0; 6], &WriteData::None, N2)),
        SenseKey::UnitAttention,
        Asc::I_T_NEXUS_LOSS,
    );
    good(&lu.execute(&cmd(&[0; 6], &WriteData::None, N2)));
}
