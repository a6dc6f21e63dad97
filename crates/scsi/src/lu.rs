//! The logical unit: construction, command dispatch and the small
//! commands (TEST UNIT READY, REQUEST SENSE, READ CAPACITY, START STOP
//! UNIT, PREVENT ALLOW MEDIUM REMOVAL).
//!
//! [`LogicalUnit::execute`] is the only entry point for commands. It
//! checks for a pending unit attention (a lock-free probe of a per-nexus
//! flag on the common path, see [`crate::ua`]), then the CDB length and CONTROL byte (SAM-5
//! §5.2: NACA = 1 is refused, we do not implement ACA), then hands the CDB
//! to the command's module: [`crate::rw`] for the block commands,
//! [`crate::vpd`] for INQUIRY and [`crate::mode`] for MODE SENSE/SELECT.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use bufpool::WriteData;
use bytes::Bytes;
use parking_lot::Mutex;
use storage::BlockBackend;

use crate::alua::{self, PortGroups};
use crate::cdb::{self, be32, be64, op};
use crate::peers::TargetLus;
use crate::sense::{Asc, Sense, SenseKey};
use crate::ua::UnitAttentions;
use crate::xcopy::{self, CopyState};
use crate::{atomic, defects, mode, pr, provisioning, rw, status, vpd};
use volume::{GeometryError, Identity, IdentityError, Volume};
pub use volume::{MAX_LBPPB_EXPONENT, MAX_TRANSFER_BYTES};

/// Identifies one I_T nexus (an iSCSI session) for unit attentions, SPC-2
/// reservations and the delivery of persistent reservation events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NexusId(pub u64);

/// Configuration of one logical unit.
#[derive(Clone, Debug)]
pub struct LuConfig {
    /// Logical block size in bytes: 512 or 4096.
    pub block_size: u32,
    /// Physical block size in bytes: the logical block size times 2^n, n
    /// at most [`MAX_LBPPB_EXPONENT`] (4096 with 512-byte logical
    /// blocks is a "512e" disk); `None`: the block size (one logical block
    /// per physical block). Told in READ CAPACITY(16) (LOGICAL BLOCKS PER
    /// PHYSICAL BLOCK EXPONENT) and VPD B0h (granularities); UNMAP and
    /// WRITE SAME with UNMAP deallocate whole physical blocks only (see
    /// the `provisioning` module).
    pub physical_block_size: Option<u32>,
    /// The NAA IEEE Registered Extended (type 6) designator, 16 bytes,
    /// stable across restarts (VPD page 83h).
    pub naa: [u8; 16],
    /// Unit serial number (VPD page 80h): printable ASCII, 1 to
    /// [`MAX_SERIAL_LEN`] characters.
    pub serial: String,
    /// T10 vendor identification, at most 8 printable ASCII characters.
    pub vendor: String,
    /// Product identification, at most 16 printable ASCII characters.
    pub product: String,
    /// Product revision level, at most 4 printable ASCII characters.
    pub revision: String,
    /// Write protect: the mode header WP bit is set and every write
    /// command fails with DATA PROTECT / WRITE PROTECTED.
    pub read_only: bool,
    /// Thin provisioning (SBC-3 §4.7): present the unit as thin provisioned
    /// (READ CAPACITY(16) LBPME and LBPRZ, VPD B2h, UNMAP, WRITE SAME with
    /// UNMAP) when the backend can free space
    /// ([`storage::Caps::can_deallocate`]). With `false`, or a
    /// backend that cannot, the unit is fully provisioned.
    pub thin: bool,
    /// Where persistent reservation state is kept across restarts when an
    /// initiator asks for APTPL = 1 (one file per LU; see [`crate::pr`]).
    /// `None`: APTPL is not supported (PTPL_C = 0) and a registration with
    /// APTPL = 1 fails with INVALID FIELD IN PARAMETER LIST.
    pub pr_state: Option<PathBuf>,
}

pub use volume::MAX_SERIAL_LEN;

/// Why a logical unit could not be created.
#[derive(Debug, thiserror::Error)]
pub enum LuError {
    /// The block sizes or the backend's size do not make a volume
    /// ([`volume::GeometryError`]).
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// An identification string is too long, empty or not printable ASCII
    /// ([`volume::IdentityError`]).
    #[error(transparent)]
    Identifier(#[from] IdentityError),
    /// The persistent reservation state file cannot be read.
    #[error("persistent reservation state {0}")]
    PrState(String),
}

/// The data-out and data-in byte counts a CDB implies on its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferPlan {
    /// Bytes the command expects from the initiator.
    pub data_out: u32,
    /// Most bytes the command may return to the initiator.
    pub data_in: u32,
}

/// One SCSI command as the transport received it.
#[derive(Clone, Copy, Debug)]
pub struct Command<'a> {
    /// The CDB (16 bytes from the BHS, or more with an extended-CDB AHS);
    /// bytes past the opcode's CDB length are ignored.
    pub cdb: &'a [u8],
    /// The data-out received for this command (`bufpool::WriteData`):
    /// WRITE hands it to the backend as it is (segments written in order,
    /// an owned buffer that the backend may keep, or data placed on the
    /// medium already); every other command sees it joined into one
    /// segment ([`Self::data`]).
    pub data_out: &'a WriteData,
    /// The I_T nexus the command came from.
    pub nexus: NexusId,
    /// Relative target port identifier of the path (VPD 83h, REPORT
    /// TARGET PORT GROUPS).
    pub relative_port: u16,
    /// ALUA target port group of the path (VPD 83h): its access state
    /// ([`crate::PortGroups::state`]) decides which commands run.
    pub tpg: u16,
    /// SCSI name string of the target port, e.g.
    /// `iqn.2026-11.io.ironsan:t0,t,0x0001` (VPD 83h).
    pub target_port_name: &'a str,
    /// iSCSI initiator port name of the nexus (RFC 7143 §4.2.7.1 / SPC-4
    /// §7.6.4.6), `iqn.…,i,0x<ISID>`: the initiator's TransportID for
    /// persistent reservations.
    pub initiator_port_name: &'a str,
    /// The data-out length the transport was told to expect (iSCSI EDTL
    /// with the W bit; 0 without it), when known. Commands whose data-out
    /// must match the CDB exactly (COMPARE AND WRITE, WRITE SAME) fail
    /// with INVALID FIELD IN COMMAND INFORMATION UNIT when it differs.
    pub expected_data_out: Option<u32>,
    /// The logical units of the same target this nexus may reach: copy
    /// sources and destinations of EXTENDED COPY, and the units that see a
    /// SET TARGET PORT GROUPS change. `None`: only this unit.
    pub lus: Option<&'a dyn TargetLus>,
}

impl Command<'_> {
    /// The data-out in memory as one slice (its first segment: `execute`
    /// joins a segmented data-out for every command but WRITE).
    pub fn data(&self) -> &[u8] {
        self.data_out.first()
    }
}

/// The result of a command: status, sense data, data-in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// SCSI status, one of [`crate::status`].
    pub status: u8,
    /// Sense data, present with CHECK CONDITION.
    pub sense: Option<Sense>,
    /// Data-in: exactly the bytes the command transfers (already cut to
    /// the allocation length), or its first segment when [`Self::more`]
    /// is not empty.
    pub data: Bytes,
    /// Further segments of data-in after [`Self::data`], in order: a large
    /// read served from the backend's memory without copying
    /// ([`storage::FastPaths::read_chain`]). Empty otherwise.
    pub more: Vec<Bytes>,
    /// The block CRCs of the buffers [`Self::data`] and [`Self::more`]
    /// are slices of, where the backend keeps them (data digests use them).
    pub sums: bufpool::SegmentSums,
}

impl Outcome {
    /// GOOD without data.
    pub fn good() -> Self {
        Outcome {
            status: status::GOOD,
            sense: None,
            data: Bytes::new(),
            more: Vec::new(),
            sums: Default::default(),
        }
    }

    /// GOOD with data-in.
    pub fn with_data(data: impl Into<Bytes>) -> Self {
        Outcome {
            status: status::GOOD,
            sense: None,
            data: data.into(),
            more: Vec::new(),
            sums: Default::default(),
        }
    }

    /// CHECK CONDITION with `sense`.
    pub fn check(sense: Sense) -> Self {
        Outcome {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
            data: Bytes::new(),
            more: Vec::new(),
            sums: Default::default(),
        }
    }

    /// GOOD with data-in in segments.
    pub fn with_chain(data: bufpool::Chain) -> Self {
        let (data, more, sums) = data.into_summed_parts();
        Outcome {
            status: status::GOOD,
            sense: None,
            data,
            more,
            sums,
        }
    }

    /// Length of the data-in, all segments.
    pub fn data_len(&self) -> usize {
        self.data.len() + self.more.iter().map(Bytes::len).sum::<usize>()
    }

    /// True for GOOD.
    pub fn is_good(&self) -> bool {
        self.status == status::GOOD
    }
}

/// GOOD with `v` cut to the allocation length (SPC-4 §4.2.5.6).
pub(crate) fn data_in(mut v: Vec<u8>, alloc: usize) -> Outcome {
    v.truncate(alloc);
    Outcome::with_data(v)
}

/// Maps a backend error to sense data: an out-of-range access (which the
/// range checks make impossible unless the backend shrank) to LBA OUT OF
/// RANGE, a full device (ENOSPC, EDQUOT: a thin LUN out of space) to DATA
/// PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT (SBC-4 §4.7.3.7), a
/// backend this gateway may not use now ([`storage::NotAccessible`]) to
/// NOT READY, LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE,
/// storage that did not answer in time ([`storage::Unresponsive`]) to NOT
/// READY, LOGICAL UNIT IS IN PROCESS OF BECOMING READY (retried on the same
/// path: the path is right, the cluster is slow), anything else to MEDIUM
/// ERROR with `asc`.
pub(crate) fn backend_error(e: &io::Error, asc: Asc) -> Sense {
    use crate::faults::{record, FaultKind};
    // Linux errno values (io::ErrorKind::StorageFull is newer than the MSRV).
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    if e.kind() == io::ErrorKind::InvalidInput {
        Sense::lba_out_of_range()
    } else if storage::NotAccessible::is(e) {
        record(FaultKind::NotAccessible, e);
        Sense::new(SenseKey::NotReady, Asc::NOT_ACCESSIBLE_STANDBY)
    } else if storage::Unresponsive::is(e) {
        record(FaultKind::Unresponsive, e);
        Sense::new(SenseKey::NotReady, Asc::BECOMING_READY)
    } else if matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT)) {
        record(FaultKind::NoSpace, e);
        Sense::new(
            SenseKey::DataProtect,
            Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        )
    } else {
        record(FaultKind::Medium, e);
        Sense::new(SenseKey::MediumError, asc)
    }
}

/// The OPTIMAL TRANSFER LENGTH advertised in VPD B0h, in bytes.
pub const OPTIMAL_TRANSFER_BYTES: u32 = 1 << 20;
/// MAXIMUM COMPARE AND WRITE LENGTH (VPD B0h), in blocks.
pub const MAX_COMPARE_AND_WRITE_BLOCKS: u8 = 128;
/// MAXIMUM WRITE SAME LENGTH (VPD B0h) is this divided by the block size:
/// bounds the work of one WRITE SAME (32768 blocks of 512 bytes, under the
/// 65536 that libiscsi's WriteSame16.Unmap expects to be refused when the
/// limit is lower, since its unlimited branch writes more than the
/// MAXIMUM TRANSFER LENGTH in one WRITE(16)).
pub const MAX_WRITE_SAME_BYTES: u64 = 16 << 20;
/// MAXIMUM UNMAP LBA COUNT (VPD B0h), in blocks, per UNMAP command.
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
/// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT (VPD B0h).
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// A direct-access logical unit over a [`BlockBackend`]; `Send + Sync`,
/// shared by all sessions and paths.
pub struct LogicalUnit {
    /// What the unit is apart from SCSI: backend, geometry, capacity,
    /// limits (MAXIMUM TRANSFER LENGTH, MAXIMUM ATOMIC TRANSFER LENGTH and
    /// ATOMIC ALIGNMENT in VPD B0h), thin provisioning, and the range
    /// locks of the read-modify-write commands ([`volume::locks`]).
    pub(crate) vol: Arc<Volume>,
    pub(crate) cfg: LuConfig,
    pub(crate) ua: UnitAttentions,
    /// Serialises MODE SELECT so validation and application are atomic.
    pub(crate) mode_lock: Mutex<()>,
    pub(crate) std_inquiry: [u8; vpd::STD_INQUIRY_LEN],
    /// SPC-2 and persistent reservations.
    pub(crate) pr: pr::Reservations,
    /// Whether reservation commands are implemented for this unit
    /// ([`LogicalUnit::without_reservations`]).
    pub(crate) reservations: bool,
    /// The target port groups of the target, shared by its units.
    pub(crate) alua: Arc<PortGroups>,
    /// Copy manager state (EXTENDED COPY results).
    pub(crate) copies: CopyState,
}

impl std::fmt::Debug for LogicalUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogicalUnit")
            .field("backend", &self.vol.backend().caps().kind)
            .field("block_size", &self.cfg.block_size)
            .field("num_blocks", &self.num_blocks())
            .field("serial", &self.vol.identity().serial)
            .finish_non_exhaustive()
    }
}

impl LogicalUnit {
    /// A logical unit serving `backend` with `cfg`.
    pub fn new(backend: Arc<dyn BlockBackend>, cfg: LuConfig) -> Result<Self, LuError> {
        let vol = Volume::new(
            backend,
            cfg.block_size,
            cfg.physical_block_size,
            cfg.read_only,
            cfg.thin,
        )?
        .with_identity(Identity {
            naa: cfg.naa,
            serial: cfg.serial.clone(),
            vendor: cfg.vendor.clone(),
            product: cfg.product.clone(),
            revision: cfg.revision.clone(),
        })?;
        let std_inquiry = vpd::standard_inquiry(vol.identity());
        let pr = pr::Reservations::open(cfg.pr_state.clone()).map_err(LuError::PrState)?;
        Ok(LogicalUnit {
            pr,
            reservations: true,
            vol: Arc::new(vol),
            ua: UnitAttentions::new(false),
            mode_lock: Mutex::new(()),
            std_inquiry,
            alua: Arc::new(PortGroups::default()),
            copies: CopyState::default(),
            cfg,
        })
    }

    /// Uses the target port groups `pg` (shared by every unit of the
    /// target) for ALUA: access states, REPORT/SET TARGET PORT GROUPS and
    /// the INQUIRY TPGS field. Without it the unit has implicit ALUA with
    /// every port active/optimized.
    pub fn with_port_groups(mut self, pg: Arc<PortGroups>) -> Self {
        self.std_inquiry[5] = (self.std_inquiry[5] & !0x30) | (alua::tpgs(&pg) << 4);
        self.alua = pg;
        self
    }

    /// Does not implement reservations: PERSISTENT RESERVE IN/OUT and
    /// RESERVE/RELEASE(6/10) are answered INVALID COMMAND OPERATION CODE and
    /// left out of REPORT SUPPORTED OPERATION CODES. For a unit served by
    /// several gateways, whose reservation state this process alone cannot
    /// keep (docs/GATEWAYS.md): refusing is honest, pretending is not.
    pub fn without_reservations(mut self) -> Self {
        self.reservations = false;
        self
    }

    /// Whether reservation commands are implemented.
    pub fn has_reservations(&self) -> bool {
        self.reservations
    }

    /// The target port groups this unit reports.
    pub fn port_groups(&self) -> &Arc<PortGroups> {
        &self.alua
    }

    /// From now on, each nexus starts with POWER ON, RESET, OR BUS DEVICE
    /// RESET OCCURRED (29/00) on its first command: for a unit that takes
    /// the place of one that was becoming ready ([`crate::BecomingReady`]),
    /// so initiators that were told to wait learn that the device changed.
    pub fn announce_power_on(&self) {
        self.ua.set_power_on(true);
    }

    /// Establish POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29/00) for
    /// each nexus on its first command, as a freshly powered-on device
    /// does (SAM-5 §6.3.1). Off by default. libiscsi (and Linux) consume
    /// such conditions with TEST UNIT READY right after login, so turning
    /// it on is safe for them; initiators must then expect a UA first.
    pub fn with_power_on_unit_attention(mut self, on: bool) -> Self {
        self.ua = UnitAttentions::new(on);
        self
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.vol.block_size()
    }

    /// Physical block size in bytes ([`LuConfig::physical_block_size`]).
    pub fn physical_block_size(&self) -> u32 {
        self.vol.physical_block_size()
    }

    /// Capacity in logical blocks.
    #[inline]
    pub fn num_blocks(&self) -> u64 {
        self.vol.num_blocks()
    }

    /// The volume under the unit (the part of it a second command set
    /// would share).
    pub fn volume(&self) -> &Volume {
        &self.vol
    }

    /// The volume, shared: what another personality (NVMe) keeps of the
    /// unit to serve it as one volume with one set of locks and one write
    /// cache.
    pub fn shared_volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// Changes the capacity to `bytes` (a multiple of the block size) and
    /// tells every I_T nexus with CAPACITY DATA HAS CHANGED (2A/09).
    /// Whether shrinking is acceptable is the caller's decision (it cuts
    /// off data).
    pub fn resize(&self, bytes: u64) -> Result<(), String> {
        // Commands past a new, smaller end are refused (LBA OUT OF RANGE)
        // before the backend lets the space go (`Volume::resize`).
        self.vol.resize(bytes)?;
        self.ua.broadcast(Asc::CAPACITY_DATA_CHANGED, None);
        Ok(())
    }

    /// Makes the capacity follow the backend's medium when something else
    /// resizes it (another gateway, or `rbd resize`, on a shared RBD
    /// image: [`storage::Ownership::on_resized_elsewhere`]), as
    /// [`Self::resize`] does for a resize made here. The backend holds
    /// only a weak reference to the unit. Nothing for storage only this
    /// process uses.
    pub fn follow_backend_size(self: &Arc<Self>) {
        let Some(shared) = self.vol.backend().ownership() else {
            return;
        };
        let lu = Arc::downgrade(self);
        shared.on_resized_elsewhere(std::sync::Arc::new(move |bytes| {
            if let Some(lu) = lu.upgrade() {
                lu.medium_resized(bytes);
            }
        }));
    }

    /// The medium is now `bytes` long (cut down to whole blocks): the
    /// capacity follows, and when it changed every I_T nexus gets
    /// CAPACITY DATA HAS CHANGED (2A/09). After a shrink, commands past the
    /// new end are refused (LBA OUT OF RANGE).
    pub fn medium_resized(&self, bytes: u64) {
        if self.vol.medium_resized(bytes) {
            self.ua.broadcast(Asc::CAPACITY_DATA_CHANGED, None);
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        self.vol.backend()
    }

    /// The backend's kind (`mem`, `null`, `file`, `rbd`, `fault`).
    pub fn backend_kind(&self) -> &'static str {
        self.vol.backend().caps().kind
    }

    /// Establishes the unit attention `code` for every I_T nexus that
    /// knows this unit (the target's LUN inventory changed: 3F/0E).
    pub fn unit_attention_all(&self, code: Asc) {
        self.ua.broadcast(code, None);
    }

    /// Whether a command may wait on a device ([`storage::Caps::may_block`]).
    pub fn may_block(&self) -> bool {
        self.vol.backend().caps().may_block
    }

    /// Whether `cdb` may take long even on a backend that never blocks
    /// (EXTENDED COPY moves up to 256 MiB): the driver should run it off
    /// its event loop, as it does for [`Self::may_block`] units.
    pub fn is_long_running(&self, cdb: &[u8]) -> bool {
        cdb.first() == Some(&op::EXTENDED_COPY)
    }

    /// Whether the driver should run `cdb`, carrying `data_out` bytes, on
    /// an I/O thread rather than on its event loop: the backend may block,
    /// the command is long running, or the write is larger than the
    /// backend copies cheaply ([`storage::Caps::inline_write_max`]).
    pub fn runs_off_loop(&self, cdb: &[u8], data_out: usize) -> bool {
        let caps = self.vol.backend().caps();
        caps.may_block || self.is_long_running(cdb) || data_out > caps.inline_write_max
    }

    /// The configuration the unit was created with.
    pub fn config(&self) -> &LuConfig {
        &self.cfg
    }

    /// True when the unit is presented thin provisioned (LBPME = 1): the
    /// configuration asks for it and the backend can free space.
    pub fn thin(&self) -> bool {
        self.vol.thin()
    }

    /// The MAXIMUM TRANSFER LENGTH in blocks (VPD B0h); longer READ, WRITE,
    /// VERIFY and WRITE AND VERIFY commands fail with INVALID FIELD IN CDB.
    pub fn max_transfer_blocks(&self) -> u32 {
        self.vol.max_transfer_blocks()
    }

    /// The data-out / data-in byte counts the CDB alone implies: READ and
    /// WRITE length × block size, VERIFY with BYTCHK the compared bytes,
    /// INQUIRY / MODE SENSE / REQUEST SENSE / READ CAPACITY(16) the
    /// allocation length, MODE SELECT the parameter list length. 0/0 for
    /// other or unknown opcodes, CDBs shorter than their opcode's length,
    /// and block transfers over [`Self::max_transfer_blocks`] (which
    /// `execute` rejects without looking at data). Cheap; never panics.
    pub fn plan(&self, cdb: &[u8]) -> TransferPlan {
        let (data_out, data_in) =
            cdb::plan(cdb, self.cfg.block_size, self.vol.max_transfer_blocks());
        TransferPlan { data_out, data_in }
    }

    /// The checks every command passes once unit attentions are dealt
    /// with, before its own: a CDB long enough for its opcode, NACA clear,
    /// allowed in the path's ALUA access state, no reservation conflict.
    /// `Ok`: the CDB cut to its opcode's length; `Err`: the answer.
    pub(crate) fn admit<'c>(&self, opcode: u8, cmd: &Command<'c>) -> Result<&'c [u8], Outcome> {
        let cdb = cmd.cdb;
        let Some(len) = cdb::min_len(opcode) else {
            return Err(Outcome::check(Sense::invalid_opcode()));
        };
        if cdb.len() < len {
            return Err(Outcome::check(Sense::new(
                SenseKey::IllegalRequest,
                Asc::INVALID_FIELD_IN_CDB,
            )));
        }
        let cdb = &cdb[..len];
        if cdb[len - 1] & 0x04 != 0 {
            // CONTROL byte NACA bit: ACA is not supported (NORMACA = 0).
            return Err(Outcome::check(Sense::invalid_cdb(len as u16 - 1, Some(2))));
        }
        let access = self.alua.state(cmd.tpg);
        if !access.is_active() {
            if let Some(s) = alua::refusal(access, cdb) {
                let s = self
                    .alua
                    .owner_refusal(cmd.tpg, access)
                    .map_or(s, alua::refusal_sense);
                return Err(Outcome::check(s));
            }
        }
        if let Some(conflict) = self.pr.check(cmd, cdb) {
            return Err(conflict);
        }
        Ok(cdb)
    }

    /// Executes one command. Never panics, whatever the CDB and data.
    pub fn execute(&self, cmd: &Command<'_>) -> Outcome {
        if cmd.data_out.segment_count() > 1 && !cdb::is_plain_write(cmd.cdb) {
            // Only WRITE takes data-out in segments: join them for the rest.
            let joined = WriteData::Owned(Bytes::from(cmd.data_out.to_vec()));
            return self.execute(&Command {
                data_out: &joined,
                ..*cmd
            });
        }
        let cdb = cmd.cdb;
        let Some(&opcode) = cdb.first() else {
            return Outcome::check(Sense::invalid_opcode());
        };
        if !self.ua.is_quiet(cmd.nexus) {
            // A session's first command (or one with a condition pending):
            // reservations learn which I_T nexus the session is.
            self.pr.note(cmd);
            match opcode {
                // SPC-4 §5.8.7: INQUIRY neither reports nor clears a UA,
                // REQUEST SENSE reports it as its data (below).
                op::INQUIRY => self.ua.touch(cmd.nexus),
                op::REQUEST_SENSE => {}
                _ => {
                    if let Some(ua) = self.ua.take(cmd.nexus) {
                        return Outcome::check(ua);
                    }
                }
            }
        }
        let cdb = match self.admit(opcode, cmd) {
            Ok(cdb) => cdb,
            Err(refused) => return refused,
        };
        let block = match opcode {
            op::READ_10 | op::READ_16 | op::READ_12 | op::READ_6 => rw::read(self, cdb),
            op::WRITE_10 | op::WRITE_16 | op::WRITE_12 | op::WRITE_6 => rw::write(self, cdb, cmd),
            op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => rw::verify(self, cdb, cmd.data()),
            op::WRITE_AND_VERIFY_10 | op::WRITE_AND_VERIFY_12 | op::WRITE_AND_VERIFY_16 => {
                rw::write_and_verify(self, cdb, cmd.data())
            }
            op::PRE_FETCH_10 | op::PRE_FETCH_16 => rw::pre_fetch(self, cdb),
            op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16 => rw::synchronize_cache(self, cdb),
            op::COMPARE_AND_WRITE => atomic::compare_and_write(self, cdb, cmd),
            op::ORWRITE_16 => atomic::orwrite(self, cdb, cmd.data()),
            op::WRITE_ATOMIC_16 => atomic::write_atomic(self, cdb, cmd.data()),
            op::WRITE_SAME_10 | op::WRITE_SAME_16 => provisioning::write_same(self, cdb, cmd),
            op::UNMAP => provisioning::unmap(self, cdb, cmd.data()),
            op::READ_DEFECT_DATA_10 | op::READ_DEFECT_DATA_12 => defects::read_defect_data(cdb),
            _ => return self.execute_other(opcode, cdb, cmd),
        };
        block.unwrap_or_else(Outcome::check)
    }

    /// The commands other than the block commands.
    fn execute_other(&self, opcode: u8, cdb: &[u8], cmd: &Command<'_>) -> Outcome {
        match opcode {
            op::TEST_UNIT_READY => Outcome::good(),
            op::REQUEST_SENSE => self.request_sense(cdb, cmd),
            op::INQUIRY => vpd::inquiry(self, cmd, cdb),
            op::MODE_SENSE_6 | op::MODE_SENSE_10 => mode::sense(self, cdb),
            op::MODE_SELECT_6 | op::MODE_SELECT_10 => mode::select(self, cdb, cmd),
            op::READ_CAPACITY_10 => self.read_capacity_10(cdb),
            op::SERVICE_ACTION_IN_16 => match cdb[1] & 0x1F {
                cdb::SA_READ_CAPACITY_16 => self.read_capacity_16(cdb),
                cdb::SA_GET_LBA_STATUS => {
                    provisioning::get_lba_status(self, cdb).unwrap_or_else(Outcome::check)
                }
                // SPC-4 §4.5.6: an unsupported service action is an
                // invalid field (the SERVICE ACTION field, byte 1 bit 4).
                _ => Outcome::check(Sense::invalid_cdb(1, Some(4))),
            },
            op::MAINTENANCE_IN => match cdb[1] & 0x1F {
                cdb::SA_REPORT_SUPPORTED_OPCODES => {
                    let (explicit, thin) = (self.alua.is_explicit(), self.vol.thin());
                    let reservations = self.reservations;
                    crate::opcodes::report_with(cdb, |code, _| {
                        (explicit || code != op::MAINTENANCE_OUT)
                            && (thin || code != op::UNMAP)
                            && (reservations || !pr::is_reservation_opcode(code))
                    })
                }
                cdb::SA_REPORT_TARGET_PORT_GROUPS => alua::report(&self.alua, cmd, cdb),
                _ => Outcome::check(Sense::invalid_cdb(1, Some(4))),
            },
            op::MAINTENANCE_OUT => match cdb[1] & 0x1F {
                cdb::SA_SET_TARGET_PORT_GROUPS => alua::set(self, cmd, cdb),
                // No other MAINTENANCE OUT service action is implemented.
                _ => Outcome::check(Sense::invalid_opcode()),
            },
            op::EXTENDED_COPY => match cdb[1] & 0x1F {
                cdb::SA_EXTENDED_COPY_LID1 => xcopy::extended_copy(self, cmd, cdb),
                _ => Outcome::check(Sense::invalid_cdb(1, Some(4))),
            },
            op::RECEIVE_COPY_RESULTS => xcopy::receive_copy_results(self, cmd, cdb),
            op::START_STOP_UNIT => start_stop_unit(cdb),
            op::PREVENT_ALLOW_MEDIUM_REMOVAL => prevent_allow(cdb),
            o if pr::is_reservation_opcode(o) && !self.reservations => {
                Outcome::check(Sense::invalid_opcode())
            }
            op::PERSISTENT_RESERVE_IN => pr::persistent_reserve_in(self, cmd, cdb),
            op::PERSISTENT_RESERVE_OUT => pr::persistent_reserve_out(self, cmd, cdb),
            op::RESERVE_6 | op::RESERVE_10 => pr::reserve(self, cmd, cdb),
            op::RELEASE_6 | op::RELEASE_10 => pr::release(self, cmd, cdb),
            _ => Outcome::check(Sense::invalid_opcode()),
        }
    }

    /// A LOGICAL UNIT RESET (or a target reset) happened: every known
    /// nexus gets BUS DEVICE RESET FUNCTION OCCURRED (29/03), SAM-5 §6.3.
    ///
    /// Mode parameters are deliberately *not* returned to their defaults
    /// (which SAM-5 asks for): an initiator that turned the write cache off
    /// would otherwise be left writing into a volatile cache it believes
    /// disabled. The Caching page keeps telling the truth either way.
    ///
    /// An SPC-2 reservation is released; persistent reservations and
    /// registrations are not affected (SPC-4 §5.9.1).
    pub fn reset(&self) {
        self.pr.reset();
        self.ua.broadcast(Asc::BUS_DEVICE_RESET, None);
    }

    /// The nexus `n` is gone (its session ended or was reinstated): forget
    /// its unit attentions and release its SPC-2 reservation. Persistent
    /// registrations stay: they belong to the initiator port and target
    /// port, and apply again to the next session with the same ISID.
    pub fn nexus_lost(&self, n: NexusId) {
        self.pr.nexus_lost(n);
        self.ua.forget(n);
        self.copies.forget(n);
    }

    /// `n` replaces a session of the same I_T nexus that was lost (iSCSI
    /// session reinstatement, RFC 7143 §6.3.5): its first command reports
    /// I_T NEXUS LOSS OCCURRED (29/07), SAM-5 §6.3.4.
    pub fn nexus_reinstated(&self, n: NexusId) {
        self.ua.establish(n, Asc::I_T_NEXUS_LOSS);
    }

    /// Sets the function that PREEMPT AND ABORT calls with the sessions
    /// whose registrations it removed, so that the transport aborts their
    /// tasks for this logical unit (SPC-4 §5.9.11.5; as ABORT TASK SET,
    /// without status). Called before the PERSISTENT RESERVE OUT returns
    /// GOOD, from the thread executing it; it must not block. Can be set
    /// once; false if it already was.
    pub fn set_preempt_abort_hook(&self, hook: pr::PreemptAbortHook) -> bool {
        self.pr.set_abort_hook(hook)
    }

    /// Unit attention conditions queued for `n` (diagnostics).
    pub fn pending_unit_attentions(&self, n: NexusId) -> usize {
        self.ua.queued(n)
    }

    /// REQUEST SENSE (SPC-4 §6.39): the pending unit attention (cleared),
    /// else why the path cannot be used (standby or unavailable, SPC-4
    /// §5.15.2.4), else NO SENSE. DESC = 1 selects descriptor format.
    fn request_sense(&self, cdb: &[u8], cmd: &Command<'_>) -> Outcome {
        let n = cmd.nexus;
        let desc = cdb[1] & 0x01 != 0;
        let pending = if self.ua.is_quiet(n) {
            None
        } else {
            self.ua.take(n)
        };
        let sense = pending
            .or_else(|| alua::not_ready_sense(self.alua.state(cmd.tpg)))
            .unwrap_or(Sense::new(SenseKey::NoSense, Asc::NO_ADDITIONAL_SENSE));
        let bytes = if desc {
            sense.to_descriptor_bytes()
        } else {
            sense.to_bytes()
        };
        data_in(bytes, usize::from(cdb[4]))
    }

    /// The last LBA, and whether the PMI / LBA fields are consistent
    /// (SBC-3 §5.16: PMI = 0 with a nonzero LBA is an invalid field).
    fn capacity_check(&self, lba: u64, pmi: bool, lba_byte: u16) -> Result<u64, Sense> {
        if !pmi && lba != 0 {
            return Err(Sense::invalid_cdb(lba_byte, None));
        }
        Ok(self.num_blocks() - 1)
    }

    /// READ CAPACITY(10) (SBC-3 §5.16).
    fn read_capacity_10(&self, cdb: &[u8]) -> Outcome {
        let last = match self.capacity_check(u64::from(be32(cdb, 2)), cdb[8] & 1 != 0, 2) {
            Ok(l) => l,
            Err(s) => return Outcome::check(s),
        };
        let mut d = Vec::with_capacity(8);
        d.extend_from_slice(&u32::try_from(last).unwrap_or(u32::MAX).to_be_bytes());
        d.extend_from_slice(&self.cfg.block_size.to_be_bytes());
        Outcome::with_data(d)
    }

    /// READ CAPACITY(16) (SBC-3 §5.17): no protection information, the
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT of the configured
    /// physical block size, LOWEST ALIGNED LOGICAL BLOCK ADDRESS 0 (LBA 0
    /// starts a physical block); LBPME and LBPRZ set when thin provisioned
    /// (every backend reads deallocated blocks as zeros).
    fn read_capacity_16(&self, cdb: &[u8]) -> Outcome {
        let last = match self.capacity_check(be64(cdb, 2), cdb[14] & 1 != 0, 2) {
            Ok(l) => l,
            Err(s) => return Outcome::check(s),
        };
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&last.to_be_bytes());
        d[8..12].copy_from_slice(&self.cfg.block_size.to_be_bytes());
        d[13] = self.vol.lbppb_shift() as u8; // P_I_EXPONENT 0, LBPPBE
        if self.vol.thin() {
            d[14] = 0x80 | 0x40; // LBPME, LBPRZ
        }
        data_in(d, be32(cdb, 10) as usize)
    }
}

/// START STOP UNIT (SBC-3 §5.25) for a unit that is always started and has
/// no removable medium: START = 1 is accepted; stopping, LOEJ and power
/// conditions are refused with INVALID FIELD IN CDB rather than pretended.
fn start_stop_unit(cdb: &[u8]) -> Outcome {
    let b4 = cdb[4];
    if b4 & 0xF0 != 0 {
        return Outcome::check(Sense::invalid_cdb(4, Some(7))); // POWER CONDITION
    }
    if b4 & 0x02 != 0 {
        return Outcome::check(Sense::invalid_cdb(4, Some(1))); // LOEJ
    }
    if b4 & 0x01 == 0 {
        return Outcome::check(Sense::invalid_cdb(4, Some(0))); // START = 0
    }
    Outcome::good()
}

/// PREVENT ALLOW MEDIUM REMOVAL (SBC-3 §5.11): the medium cannot be
/// removed anyway, so allowing and preventing removal both hold; the
/// medium-changer values 10b/11b are invalid.
fn prevent_allow(cdb: &[u8]) -> Outcome {
    if cdb[4] & 0x02 != 0 {
        return Outcome::check(Sense::invalid_cdb(4, Some(1)));
    }
    Outcome::good()
}
