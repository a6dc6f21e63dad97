//! Sense data (SPC-4 §4.5): sense keys, additional sense codes and the two
//! wire formats.
//!
//! Every CHECK CONDITION this crate returns carries a [`Sense`]. It is
//! rendered in *fixed* format (response code 70h, SPC-4 §4.5.3) by
//! [`Sense::to_bytes`], which is what iSCSI sends after a CHECK CONDITION
//! (the Control mode page reports D_SENSE = 0 and does not let it change).
//! REQUEST SENSE with DESC = 1 gets the *descriptor* format (response code
//! 72h, SPC-4 §4.5.2) from [`Sense::to_descriptor_bytes`].
//!
//! Field pointers (the sense-key-specific field with SKSV = 1, SPC-4
//! §4.5.2.4.2) are set for INVALID FIELD IN CDB and INVALID FIELD IN
//! PARAMETER LIST so that an initiator can tell which byte and bit it got
//! wrong.
//!
//! This is the one place sense bytes are built: the SCSI personality's
//! command failures and the iSCSI session's own (a bidirectional command, a
//! transfer past the session's limit, a data phase error) alike.

/// SCSI status codes (SAM-5 §5.3).
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const CONDITION_MET: u8 = 0x04;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const ACA_ACTIVE: u8 = 0x30;
    pub const TASK_ABORTED: u8 = 0x40;
}

/// A sense key (SPC-4 §4.5.6, table 45).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SenseKey {
    /// No specific sense key information to report.
    NoSense = 0x0,
    /// The command completed after some recovery action.
    RecoveredError = 0x1,
    /// The logical unit is not accessible.
    NotReady = 0x2,
    /// A non-recovered error in the medium or the data.
    MediumError = 0x3,
    /// A non-recoverable hardware failure.
    HardwareError = 0x4,
    /// The command or its parameters were not acceptable.
    IllegalRequest = 0x5,
    /// A unit attention condition was reported.
    UnitAttention = 0x6,
    /// A write was attempted on a write-protected medium.
    DataProtect = 0x7,
    /// Blank or formatted-only medium encountered.
    BlankCheck = 0x8,
    /// Vendor specific.
    VendorSpecific = 0x9,
    /// A copy command was aborted.
    CopyAborted = 0xA,
    /// The device server aborted the command.
    AbortedCommand = 0xB,
    /// The end of a partition was reached with data left over.
    VolumeOverflow = 0xD,
    /// Source data did not match the data read from the medium.
    Miscompare = 0xE,
}

/// An additional sense code and qualifier (SPC-4 §4.5.6, table 46).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Asc {
    /// ADDITIONAL SENSE CODE.
    pub asc: u8,
    /// ADDITIONAL SENSE CODE QUALIFIER.
    pub ascq: u8,
}

/// Defines the named [`Asc`] constants once, with their T10 names.
macro_rules! asc_table {
    ($($(#[$doc:meta])* $name:ident = ($asc:literal, $ascq:literal), $text:literal;)*) => {
        impl Asc {
            $($(#[$doc])* pub const $name: Asc = Asc { asc: $asc, ascq: $ascq };)*

            /// The T10 name of this code, when it is one this crate uses.
            pub fn name(self) -> Option<&'static str> {
                match (self.asc, self.ascq) {
                    $(($asc, $ascq) => Some($text),)*
                    _ => None,
                }
            }
        }
    };
}

asc_table! {
    /// 00/00: nothing to report.
    NO_ADDITIONAL_SENSE = (0x00, 0x00), "NO ADDITIONAL SENSE INFORMATION";
    /// 00/16: a command with the same identifier is still being processed.
    OPERATION_IN_PROGRESS = (0x00, 0x16), "OPERATION IN PROGRESS";
    /// 04/01: the unit cannot serve now but will (storage slow to answer);
    /// initiators retry the command on the same path.
    BECOMING_READY = (0x04, 0x01), "LOGICAL UNIT IS IN PROCESS OF BECOMING READY";
    /// 04/02: the unit needs a START STOP UNIT (START = 1).
    NOT_READY_INIT_REQUIRED = (0x04, 0x02), "LOGICAL UNIT NOT READY, INITIALIZING COMMAND REQUIRED";
    /// 04/0A: the target port group is changing its access state.
    NOT_ACCESSIBLE_TRANSITIONING = (0x04, 0x0A), "LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION";
    /// 04/0B: the command came through a target port in the standby state.
    NOT_ACCESSIBLE_STANDBY = (0x04, 0x0B), "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE";
    /// 04/0C: the command came through a target port in the unavailable state.
    NOT_ACCESSIBLE_UNAVAILABLE = (0x04, 0x0C), "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE";
    /// 0C/00: a write (or the flush of cached writes) failed.
    WRITE_ERROR = (0x0C, 0x00), "WRITE ERROR";
    /// 0D/02: a copy source or destination cannot be reached by the copy manager.
    COPY_TARGET_NOT_REACHABLE = (0x0D, 0x02), "COPY TARGET DEVICE NOT REACHABLE";
    /// 0E/03: the data-out does not match the command (iSCSI EDTL short of a block).
    INVALID_FIELD_IN_INFORMATION_UNIT = (0x0E, 0x03), "INVALID FIELD IN COMMAND INFORMATION UNIT";
    /// 11/00: a read failed.
    UNRECOVERED_READ_ERROR = (0x11, 0x00), "UNRECOVERED READ ERROR";
    /// 1A/00: a parameter list ends inside a structure.
    PARAMETER_LIST_LENGTH_ERROR = (0x1A, 0x00), "PARAMETER LIST LENGTH ERROR";
    /// 1D/00: VERIFY / WRITE AND VERIFY byte comparison failed.
    MISCOMPARE_DURING_VERIFY = (0x1D, 0x00), "MISCOMPARE DURING VERIFY OPERATION";
    /// 20/00: the opcode (or service action) is not implemented.
    INVALID_COMMAND_OPERATION_CODE = (0x20, 0x00), "INVALID COMMAND OPERATION CODE";
    /// 21/00: the LBA range lies (partly) past the last logical block.
    LBA_OUT_OF_RANGE = (0x21, 0x00), "LOGICAL BLOCK ADDRESS OUT OF RANGE";
    /// 24/00: a CDB field holds a value we do not accept.
    INVALID_FIELD_IN_CDB = (0x24, 0x00), "INVALID FIELD IN CDB";
    /// 25/00: no such logical unit.
    LOGICAL_UNIT_NOT_SUPPORTED = (0x25, 0x00), "LOGICAL UNIT NOT SUPPORTED";
    /// 26/00: a parameter list field holds a value we do not accept.
    INVALID_FIELD_IN_PARAMETER_LIST = (0x26, 0x00), "INVALID FIELD IN PARAMETER LIST";
    /// 26/04: PERSISTENT RESERVE OUT RELEASE with the wrong scope or type.
    INVALID_RELEASE_OF_PERSISTENT_RESERVATION = (0x26, 0x04), "INVALID RELEASE OF PERSISTENT RESERVATION";
    /// 26/06: more CSCD descriptors than the copy manager supports.
    TOO_MANY_TARGET_DESCRIPTORS = (0x26, 0x06), "TOO MANY TARGET DESCRIPTORS";
    /// 26/07: a CSCD descriptor type the copy manager does not support.
    UNSUPPORTED_TARGET_DESCRIPTOR_TYPE = (0x26, 0x07), "UNSUPPORTED TARGET DESCRIPTOR TYPE CODE";
    /// 26/08: more segment descriptors than the copy manager supports.
    TOO_MANY_SEGMENT_DESCRIPTORS = (0x26, 0x08), "TOO MANY SEGMENT DESCRIPTORS";
    /// 26/09: a segment descriptor type the copy manager does not support.
    UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE = (0x26, 0x09), "UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE";
    /// 27/00: the logical unit is write protected.
    WRITE_PROTECTED = (0x27, 0x00), "WRITE PROTECTED";
    SPACE_ALLOCATION_FAILED_WRITE_PROTECT = (0x27, 0x07), "SPACE ALLOCATION FAILED WRITE PROTECT";
    /// 29/00: power on, reset or bus device reset.
    POWER_ON_RESET = (0x29, 0x00), "POWER ON, RESET, OR BUS DEVICE RESET OCCURRED";
    /// 29/01: power on.
    POWER_ON_OCCURRED = (0x29, 0x01), "POWER ON OCCURRED";
    /// 29/03: a LOGICAL UNIT RESET task management function ran.
    BUS_DEVICE_RESET = (0x29, 0x03), "BUS DEVICE RESET FUNCTION OCCURRED";
    /// 29/07: the I_T nexus was lost.
    I_T_NEXUS_LOSS = (0x29, 0x07), "I_T NEXUS LOSS OCCURRED";
    /// 2A/01: another I_T nexus changed mode parameters.
    MODE_PARAMETERS_CHANGED = (0x2A, 0x01), "MODE PARAMETERS CHANGED";
    /// 2A/03: another I_T nexus preempted or cleared the reservation.
    RESERVATIONS_PREEMPTED = (0x2A, 0x03), "RESERVATIONS PREEMPTED";
    /// 2A/04: a registrants-only or all-registrants reservation was released.
    RESERVATIONS_RELEASED = (0x2A, 0x04), "RESERVATIONS RELEASED";
    /// 2A/05: another I_T nexus removed this nexus's registration.
    REGISTRATIONS_PREEMPTED = (0x2A, 0x05), "REGISTRATIONS PREEMPTED";
    /// 2A/06: a target port group changed its asymmetric access state.
    ASYMMETRIC_ACCESS_STATE_CHANGED = (0x2A, 0x06), "ASYMMETRIC ACCESS STATE CHANGED";
    /// 2A/09: the capacity changed.
    CAPACITY_DATA_CHANGED = (0x2A, 0x09), "CAPACITY DATA HAS CHANGED";
    /// 39/00: saved mode pages are not implemented.
    SAVING_PARAMETERS_NOT_SUPPORTED = (0x39, 0x00), "SAVING PARAMETERS NOT SUPPORTED";
    /// 3A/00: no medium.
    MEDIUM_NOT_PRESENT = (0x3A, 0x00), "MEDIUM NOT PRESENT";
    /// 3F/0E: LUNs were added or removed (REPORT LUNS data changed).
    REPORTED_LUNS_DATA_CHANGED = (0x3F, 0x0E), "REPORTED LUNS DATA HAS CHANGED";
    /// 3F/03: the INQUIRY data changed.
    INQUIRY_DATA_CHANGED = (0x3F, 0x03), "INQUIRY DATA HAS CHANGED";
    /// 44/00: an internal failure of the target.
    INTERNAL_TARGET_FAILURE = (0x44, 0x00), "INTERNAL TARGET FAILURE";
    /// 4B/00: the transport's data phase went wrong (data out of order or past the
    /// expected length, which iSCSI at ERL 0 cannot recover).
    DATA_PHASE_ERROR = (0x4B, 0x00), "DATA PHASE ERROR";
    /// 55/03: the copy manager has no resources for another copy now.
    INSUFFICIENT_RESOURCES = (0x55, 0x03), "INSUFFICIENT RESOURCES";
    /// 55/04: no room for another persistent reservation registration.
    INSUFFICIENT_REGISTRATION_RESOURCES = (0x55, 0x04), "INSUFFICIENT REGISTRATION RESOURCES";
}

/// Which byte (and bit) of the CDB or parameter list was wrong: the
/// sense-key-specific FIELD POINTER of SPC-4 §4.5.2.4.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldPointer {
    /// C/D: true for a CDB field, false for a parameter-list field.
    pub in_cdb: bool,
    /// Byte offset of the field.
    pub byte: u16,
    /// The most significant bit of the field, when it is not a whole byte.
    pub bit: Option<u8>,
}

/// One sense data record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sense {
    /// The sense key.
    pub key: SenseKey,
    /// Additional sense code and qualifier.
    pub code: Asc,
    /// The INFORMATION field (e.g. the miscompare offset), with VALID set.
    pub information: Option<u64>,
    /// The field pointer, with SKSV set.
    pub field: Option<FieldPointer>,
}

/// Length of fixed-format sense data as we build it (no extra bytes).
pub const FIXED_SENSE_LEN: usize = 18;

impl Sense {
    /// Sense data with no INFORMATION and no field pointer.
    pub const fn new(key: SenseKey, code: Asc) -> Self {
        Sense {
            key,
            code,
            information: None,
            field: None,
        }
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN CDB pointing at `byte` (and `bit`,
    /// the most significant bit of the field).
    pub const fn invalid_cdb(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            key: SenseKey::IllegalRequest,
            code: Asc::INVALID_FIELD_IN_CDB,
            information: None,
            field: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit,
            }),
        }
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST pointing at
    /// `byte` (and `bit`) of the parameter list.
    pub const fn invalid_param(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            key: SenseKey::IllegalRequest,
            code: Asc::INVALID_FIELD_IN_PARAMETER_LIST,
            information: None,
            field: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit,
            }),
        }
    }

    /// ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE.
    pub const fn invalid_opcode() -> Self {
        Sense::new(
            SenseKey::IllegalRequest,
            Asc::INVALID_COMMAND_OPERATION_CODE,
        )
    }

    /// ILLEGAL REQUEST / LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const fn lba_out_of_range() -> Self {
        Sense::new(SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE)
    }

    /// The same sense with the INFORMATION field set.
    pub const fn with_information(mut self, info: u64) -> Self {
        self.information = Some(info);
        self
    }

    /// The three bytes of the sense-key-specific field (SKSV in the top bit).
    fn sks(&self) -> Option<[u8; 3]> {
        let f = self.field?;
        let mut b0 = 0x80; // SKSV
        if f.in_cdb {
            b0 |= 0x40; // C/D
        }
        if let Some(bit) = f.bit {
            b0 |= 0x08 | (bit & 0x07); // BPV, BIT POINTER
        }
        let [hi, lo] = f.byte.to_be_bytes();
        Some([b0, hi, lo])
    }

    /// Fixed-format sense data (response code 70h, SPC-4 §4.5.3), 18 bytes.
    ///
    /// The INFORMATION field is four bytes in this format; a value that does
    /// not fit is left out (VALID = 0), as SPC-4 requires.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; FIXED_SENSE_LEN];
        b[0] = 0x70;
        b[2] = self.key as u8;
        if let Some(info) = self.information.and_then(|i| u32::try_from(i).ok()) {
            b[0] |= 0x80; // VALID
            b[3..7].copy_from_slice(&info.to_be_bytes());
        }
        b[7] = (FIXED_SENSE_LEN - 8) as u8; // ADDITIONAL SENSE LENGTH
        b[12] = self.code.asc;
        b[13] = self.code.ascq;
        if let Some(sks) = self.sks() {
            b[15..18].copy_from_slice(&sks);
        }
        b
    }

    /// Descriptor-format sense data (response code 72h, SPC-4 §4.5.2) with
    /// an Information descriptor and a sense-key-specific descriptor when
    /// those fields are set.
    pub fn to_descriptor_bytes(&self) -> Vec<u8> {
        let mut b = vec![
            0x72,
            self.key as u8,
            self.code.asc,
            self.code.ascq,
            0,
            0,
            0,
            0,
        ];
        if let Some(info) = self.information {
            // Information descriptor (SPC-4 §4.5.2.2): type 00h, length 0Ah.
            b.extend_from_slice(&[0x00, 0x0A, 0x80, 0x00]);
            b.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(sks) = self.sks() {
            // Sense key specific descriptor (SPC-4 §4.5.2.4): type 02h, length 06h.
            b.extend_from_slice(&[0x02, 0x06, 0x00, 0x00, sks[0], sks[1], sks[2], 0x00]);
        }
        b[7] = (b.len() - 8) as u8;
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_invalid_field_in_cdb_with_bit_pointer() {
        let s = Sense::invalid_cdb(1, Some(7));
        assert_eq!(
            s.to_bytes(),
            [
                0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0x00, 0, //
                0xCF, 0x00, 0x01
            ]
        );
    }

    #[test]
    fn fixed_format_parameter_list_pointer_has_cd_clear() {
        let s = Sense::invalid_param(0x0104, None);
        let b = s.to_bytes();
        assert_eq!(&b[12..14], &[0x26, 0x00]);
        assert_eq!(&b[15..18], &[0x80, 0x01, 0x04]);
    }

    #[test]
    fn fixed_format_information_and_valid() {
        let s =
            Sense::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY).with_information(513);
        let b = s.to_bytes();
        assert_eq!(b[0], 0xF0);
        assert_eq!(b[2], 0x0E);
        assert_eq!(&b[3..7], &[0, 0, 2, 1]);
        assert_eq!(&b[12..14], &[0x1D, 0x00]);
        assert_eq!(&b[15..18], &[0, 0, 0]);
        // Too large for four bytes: VALID stays clear.
        let big = s.with_information(1 << 40).to_bytes();
        assert_eq!(big[0], 0x70);
        assert_eq!(&big[3..7], &[0, 0, 0, 0]);
    }

    #[test]
    fn descriptor_format() {
        let plain = Sense::new(SenseKey::UnitAttention, Asc::BUS_DEVICE_RESET);
        assert_eq!(
            plain.to_descriptor_bytes(),
            [0x72, 0x06, 0x29, 0x03, 0, 0, 0, 0]
        );
        let s = Sense::invalid_cdb(2, None).with_information(7);
        let b = s.to_descriptor_bytes();
        assert_eq!(b.len(), 8 + 12 + 8);
        assert_eq!(b[7], 20);
        assert_eq!(&b[8..12], &[0x00, 0x0A, 0x80, 0x00]);
        assert_eq!(&b[12..20], &7u64.to_be_bytes());
        assert_eq!(&b[20..28], &[0x02, 0x06, 0, 0, 0xC0, 0x00, 0x02, 0]);
    }

    #[test]
    fn names() {
        assert_eq!(
            Asc::LBA_OUT_OF_RANGE.name(),
            Some("LOGICAL BLOCK ADDRESS OUT OF RANGE")
        );
        assert_eq!(
            Asc {
                asc: 0x7F,
                ascq: 0x7F
            }
            .name(),
            None
        );
    }
}
