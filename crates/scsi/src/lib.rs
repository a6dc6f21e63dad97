//! The SCSI logical unit ironsan serves: a direct-access block device
//! (peripheral device type 0) as SPC-4 and SBC-3 define it.
//!
//! Transport-independent and free of I/O scheduling: the target driver hands
//! a [`Command`] (CDB, data-out bytes, the I_T nexus it came from) to
//! [`LogicalUnit::execute`] and sends back the [`Outcome`] (status, sense,
//! data-in). Whether `execute` runs on the event loop or on an I/O thread is
//! the driver's choice, guided by [`LogicalUnit::may_block`].
//!
//! Every CDB is decoded and checked before the backend is touched: an
//! opcode we do not implement answers CHECK CONDITION / ILLEGAL REQUEST /
//! INVALID COMMAND OPERATION CODE (SPC-4 §4.5.6), a bad field INVALID FIELD
//! IN CDB with the field pointer, an LBA range past the end LOGICAL BLOCK
//! ADDRESS OUT OF RANGE.
//!
//! | module   | commands                                                    |
//! |----------|-------------------------------------------------------------|
//! | `lu`     | dispatch, TEST UNIT READY, REQUEST SENSE, READ CAPACITY(10/16), START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL |
//! | `rw`     | READ, WRITE, VERIFY, WRITE AND VERIFY, PRE-FETCH, SYNCHRONIZE CACHE |
//! | `atomic` | COMPARE AND WRITE, ORWRITE(16), WRITE ATOMIC(16)            |
//! | `provisioning` | WRITE SAME(10/16), UNMAP, GET LBA STATUS (thin provisioning) |
//! | `defects`| READ DEFECT DATA(10/12)                                     |
//! | `locks`  | striped LBA range locks that make the read-modify-write commands atomic |
//! | `vpd`    | INQUIRY and VPD pages 00h, 80h, 83h, 86h, B0h, B1h, B2h (thin)   |
//! | `becoming` | a unit becoming ready: INQUIRY and REQUEST SENSE, NOT READY 04/01h to the rest |
//! | `alua`   | target port groups, REPORT / SET TARGET PORT GROUPS, access states |
//! | `xcopy`  | EXTENDED COPY (LID1), RECEIVE COPY RESULTS                  |
//! | `mode`   | MODE SENSE / MODE SELECT (Caching, Control pages)           |
//! | `ua`     | unit attention conditions per I_T nexus                     |
//! | [`pr`]   | RESERVE / RELEASE, PERSISTENT RESERVE IN / OUT (SPC-4 §5.9) |
//! | [`sense`]| (the `scsi-sense` crate) status codes, sense keys, ASC/ASCQ, fixed and descriptor formats |
//!
//! REPORT LUNS is answered by the target (it knows every LUN), not here.
//!
//! Unit attentions: a LOGICAL UNIT RESET ([`LogicalUnit::reset`]) and a
//! MODE SELECT that changes a parameter establish conditions for the other
//! nexuses. POWER ON OCCURRED for a nexus's first command is available
//! ([`LogicalUnit::with_power_on_unit_attention`]) but off by default.

/// Sense data: [`scsi_sense`], shared with the iSCSI session's own refusals.
pub use scsi_sense as sense;

mod alua;
mod atomic;
mod becoming;
mod cdb;
mod defects;
mod fast;
mod faults;
use volume::locks;
mod lu;
mod mode;
mod opcodes;
mod peers;
pub mod pr;
mod provisioning;
mod rw;
mod ua;
mod vpd;
mod xcopy;

pub use alua::{AccessRefusal, AccessState, AluaError, AluaOwner, GroupSpec, PortGroups};
pub use becoming::BecomingReady;
pub use fast::{FastIo, FastKind, ZERO_COPY_MIN};
pub use faults::{storage_faults, FaultKind};
pub use lu::{
    Command, LogicalUnit, LuConfig, LuError, NexusId, Outcome, TransferPlan,
    MAX_COMPARE_AND_WRITE_BLOCKS, MAX_LBPPB_EXPONENT, MAX_SERIAL_LEN, MAX_TRANSFER_BYTES,
    MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BYTES, OPTIMAL_TRANSFER_BYTES,
};
pub use peers::TargetLus;
pub use sense::{Asc, FieldPointer, Sense, SenseKey};
pub use volume::GeometryError;
pub use xcopy::{
    MAX_CSCD_DESCRIPTORS, MAX_DESCRIPTOR_LIST, MAX_SEGMENT_BYTES, MAX_SEGMENT_DESCRIPTORS,
};

pub use scsi_sense::status;

#[cfg(test)]
mod tests;
