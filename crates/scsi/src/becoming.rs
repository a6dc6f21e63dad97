//! A logical unit that is becoming ready: its identity is known but its
//! medium is not open yet (a Ceph cluster that does not answer at start).
//!
//! Initiators see the unit they will use (the same peripheral device type,
//! vendor, product, serial number and device identifiers, so a host names
//! it and groups its paths at once) and are told to wait: every command but
//! INQUIRY (SPC-4 §6.6: standard data and VPD pages 00h, 80h and 83h) and
//! REQUEST SENSE (SPC-4 §6.39, which returns the reason as its data)
//! completes with CHECK CONDITION, NOT READY, LOGICAL UNIT IS IN PROCESS OF
//! BECOMING READY (04/01h, SPC-4 §4.5.6): Linux's sd waits for that (and
//! retries START STOP UNIT meanwhile), ESXi and Windows retry the
//! command. REPORT LUNS lists the unit (the target answers it). Once the
//! medium opens, the target serves a full [`crate::LogicalUnit`] with the
//! same identity in its place.

use crate::alua::tpgs;
use crate::lu::{data_in, Command, Outcome};
use crate::sense::{Asc, Sense, SenseKey};
use crate::vpd::{identification_of, page_with, standard_inquiry, STD_INQUIRY_LEN};
use crate::PortGroups;

/// VPD pages a unit becoming ready serves: the ones that identify it.
const PAGES: [u8; 3] = [0x00, 0x80, 0x83];

/// The reason every other command gets.
const NOT_YET: Sense = Sense::new(SenseKey::NotReady, Asc::BECOMING_READY);

/// A unit becoming ready; see the module docs.
#[derive(Debug)]
pub struct BecomingReady {
    identity: volume::Identity,
    std_inquiry: [u8; STD_INQUIRY_LEN],
}

impl BecomingReady {
    /// The unit identified by `identity` (checked as a
    /// [`crate::LogicalUnit`]'s is) in the target port groups `pg`.
    pub fn new(
        identity: volume::Identity,
        pg: &PortGroups,
    ) -> Result<BecomingReady, volume::IdentityError> {
        identity.check()?;
        let mut std_inquiry = standard_inquiry(&identity);
        std_inquiry[5] = (std_inquiry[5] & !0x30) | (tpgs(pg) << 4);
        Ok(BecomingReady {
            identity,
            std_inquiry,
        })
    }

    /// Who the unit is.
    pub fn identity(&self) -> &volume::Identity {
        &self.identity
    }

    /// Answers `cmd`.
    pub fn execute(&self, cmd: &Command<'_>) -> Outcome {
        let cdb = cmd.cdb;
        match cdb.first() {
            Some(0x12) if cdb.len() >= 6 => self.inquiry(cmd),
            Some(0x03) if cdb.len() >= 6 => {
                let bytes = if cdb[1] & 0x01 != 0 {
                    NOT_YET.to_descriptor_bytes()
                } else {
                    NOT_YET.to_bytes()
                };
                data_in(bytes, usize::from(cdb[4]))
            }
            _ => Outcome::check(NOT_YET),
        }
    }

    fn inquiry(&self, cmd: &Command<'_>) -> Outcome {
        let cdb = cmd.cdb;
        let alloc = usize::from(u16::from_be_bytes([cdb[3], cdb[4]]));
        if cdb[1] & 0x02 != 0 {
            return Outcome::check(Sense::invalid_cdb(1, Some(1))); // CMDDT
        }
        let page = cdb[2];
        if cdb[1] & 0x01 == 0 {
            if page != 0 {
                return Outcome::check(Sense::invalid_cdb(2, None));
            }
            return data_in(self.std_inquiry.to_vec(), alloc);
        }
        let data = match page {
            0x00 => page_with(0x00, &PAGES),
            0x80 => page_with(0x80, self.identity.serial.as_bytes()),
            0x83 => identification_of(&self.identity, cmd),
            _ => return Outcome::check(Sense::invalid_cdb(2, None)),
        };
        data_in(data, alloc)
    }
}

#[cfg(test)]
mod tests {
    use bufpool::WriteData;

    use super::*;
    use crate::{status, AccessState, GroupSpec, NexusId};

    fn unit(explicit: bool) -> BecomingReady {
        let pg = PortGroups::new(
            vec![GroupSpec::new(1, &[1], AccessState::ActiveOptimized)],
            explicit,
        )
        .unwrap();
        BecomingReady::new(
            volume::Identity {
                naa: [0x60; 16],
                serial: "s123".into(),
                vendor: "IRONSAN".into(),
                product: "RBD DISK".into(),
                revision: "0001".into(),
            },
            &pg,
        )
        .unwrap()
    }

    fn run(u: &BecomingReady, cdb: &[u8]) -> Outcome {
        u.execute(&Command {
            cdb,
            data_out: &WriteData::None,
            nexus: NexusId(1),
            relative_port: 3,
            tpg: 1,
            target_port_name: "iqn.x:t,t,0x0001",
            initiator_port_name: "iqn.y,i,0x1",
            expected_data_out: Some(0),
            lus: None,
        })
    }

    fn sense_of(o: &Outcome) -> (SenseKey, Asc) {
        let s = o.sense.as_ref().expect("sense");
        (s.key, s.code)
    }

    #[test]
    fn identifies_itself_and_says_not_yet_to_the_rest() {
        let u = unit(true);
        let std = run(&u, &[0x12, 0, 0, 0, 96, 0]);
        assert_eq!(std.status, status::GOOD);
        assert_eq!(std.data[0], 0x00, "a connected direct-access device");
        assert_eq!(&std.data[16..24], b"RBD DISK");
        assert_eq!(
            (std.data[5] >> 4) & 3,
            0b11,
            "explicit ALUA as the full unit"
        );
        assert_eq!(
            (run(&unit(false), &[0x12, 0, 0, 0, 96, 0]).data[5] >> 4) & 3,
            0b01
        );

        assert_eq!(&run(&u, &[0x12, 1, 0, 0, 64, 0]).data[4..], &PAGES);
        assert_eq!(&run(&u, &[0x12, 1, 0x80, 0, 64, 0]).data[4..], b"s123");
        let ids = run(&u, &[0x12, 1, 0x83, 1, 0, 0]);
        assert_eq!(ids.status, status::GOOD);
        assert_eq!(&ids.data[8..24], &[0x60; 16], "the NAA designator first");
        for bad in [
            [0x12, 1, 0xB0, 0, 64, 0],
            [0x12, 0, 0x80, 0, 64, 0],
            [0x12, 2, 0, 0, 64, 0],
        ] {
            assert_eq!(
                sense_of(&run(&u, &bad)),
                (SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB)
            );
        }

        // TEST UNIT READY, READ CAPACITY(10), READ(10), START STOP UNIT,
        // REPORT TARGET PORT GROUPS: not yet.
        for cdb in [
            &[0x00u8, 0, 0, 0, 0, 0][..],
            &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            &[0x1b, 0, 0, 0, 1, 0],
            &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        ] {
            let o = run(&u, cdb);
            assert_eq!(o.status, status::CHECK_CONDITION, "{cdb:02x?}");
            assert_eq!(sense_of(&o), (SenseKey::NotReady, Asc::BECOMING_READY));
        }
        let rs = run(&u, &[0x03, 0, 0, 0, 252, 0]);
        assert_eq!(rs.status, status::GOOD);
        assert_eq!(
            (rs.data[2] & 0x0f, rs.data[12], rs.data[13]),
            (0x02, 0x04, 0x01)
        );
        assert_eq!(run(&u, &[0x03, 0, 0, 0, 8, 0]).data.len(), 8);
    }
}
