//! The full feature phase of one connection, target side (RFC 7143 §4.2,
//! §11). One connection per session (MaxConnections=1), ErrorRecoveryLevel 0.
//!
//! [`Session::handle_pdu`] takes each received PDU and either answers it at
//! once into the [`Outbox`] (NOP, text, task management, logout, Reject,
//! R2T) or emits [`Event::Execute`] when a SCSI command has all its
//! data-out. The driver runs the command and calls [`Session::complete`],
//! which sends Data-In (status in the last PDU, §11.7.4) or a SCSI Response.
//!
//! # Command numbering (§4.2.2.1)
//! Non-immediate commands are delivered in CmdSN order. A command whose
//! CmdSN is ahead of ExpCmdSN but inside the window is held until the gap
//! is filled; one outside the window, or a duplicate, is silently dropped.
//! The window is the session's queue depth: `MaxCmdSN = ExpCmdSN + free
//! slots − 1`, where a slot is taken by every non-immediate SCSI command
//! until its status is sent, so MaxCmdSN advances as commands complete and
//! never moves backwards.
//!
//! # Write data (§4.2.4.2, §11.8)
//! Immediate data (ImmediateData=Yes) and unsolicited Data-Out
//! (InitialR2T=No) cover up to FirstBurstLength; the rest is requested by
//! R2Ts of at most MaxBurstLength, MaxOutstandingR2T at a time. Data must
//! arrive in order (DataPDUInOrder=Yes, DataSequenceInOrder=Yes), with
//! DataSN counting from 0 in each sequence.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bufpool::{Chain, LandBuf, WriteData};
use bytes::{BufMut, Bytes, BytesMut};
use filemap::Placed;
use iscsi_wire::outbox::Digests;
use iscsi_wire::pdu::*;
use iscsi_wire::text::{self, Continuation};
use iscsi_wire::{Outbox, RawPdu, Sn};
use scsi_sense::{status, Asc, Sense, SenseKey};

use crate::params::{Limits, SessionParams, SessionType};

/// A CDB: 16 bytes from the BHS, or longer with an extended-CDB AHS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cdb {
    Short([u8; 16]),
    Long(Box<[u8]>),
}

impl Default for Cdb {
    /// Sixteen zero bytes (TEST UNIT READY).
    fn default() -> Self {
        Cdb::Short([0; 16])
    }
}

impl Cdb {
    /// The CDB bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Cdb::Short(b) => b,
            Cdb::Long(b) => b,
        }
    }
}

/// A SCSI command ready to run: all its data-out has arrived.
#[derive(Debug, Default)]
pub struct ExecRequest {
    pub itt: Itt,
    pub lun: Lun,
    pub cdb: Cdb,
    /// The data-out received ([`WriteData::None`] for commands without
    /// one): large Data-Out segments as received, small ones gathered, one
    /// buffer of the command's own when its segments were received into it
    /// ([`Session::landing`]), or placed on the medium already
    /// ([`Host::place_write`]).
    pub data_out: WriteData,
    /// Expected data transfer length from the command PDU.
    pub edtl: u32,
    pub read: bool,
    pub write: bool,
    /// The data-out length the CDB itself calls for ([`Host::data_out_len`],
    /// asked once when the command arrived): the basis of write residuals.
    pub cdb_data_out: u32,
}

/// The result of a command, handed back to [`Session::complete`].
#[derive(Clone, Debug, Default)]
pub struct Completion {
    /// SCSI status.
    pub status: u8,
    /// Sense data (sent in the SCSI Response's data segment).
    pub sense: Option<Bytes>,
    /// Data-in, exactly what the command transfers per its CDB; the part
    /// beyond EDTL is not sent and reported as residual overflow. Several
    /// segments when a large read is served without copying.
    pub data_in: Chain,
    /// The data-out length the CDB called for, for residuals of writes.
    pub data_out_wanted: u32,
}

/// Task management the driver must carry out beyond this session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmfAction {
    /// LOGICAL UNIT RESET of this LUN.
    LunReset(Lun),
    /// TARGET WARM RESET, or COLD RESET (then connections are dropped).
    TargetReset { cold: bool },
}

/// Why the session asks for its connection to be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// A PDU failed its data digest: at ErrorRecoveryLevel 0 the
    /// connection must go (RFC 7143 §7.8), after a Reject says why.
    DataDigestError,
    /// TARGET COLD RESET: every connection is dropped (RFC 7143 §11.5.1).
    ColdReset,
    /// A NOP-In ping went unanswered past the keepalive timeout
    /// ([`Session::poll_keepalive`]).
    PingUnanswered,
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CloseReason::DataDigestError => "data digest error",
            CloseReason::ColdReset => "target cold reset",
            CloseReason::PingUnanswered => "NOP-In ping unanswered",
        })
    }
}

/// What the session asks of the driver.
#[derive(Debug)]
pub enum Event {
    /// Run this command, then call [`Session::complete`].
    Execute(ExecRequest),
    /// The initiator logged out: send what is queued, then close.
    Logout,
    /// Close the connection now.
    Close(CloseReason),
    /// A task management request arrived (for the log: a host that aborts
    /// or resets is timing commands out). `waiting`: commands it aborted
    /// that the driver still executes; its response goes out after them.
    TaskManagement {
        function: TmfFunction,
        lun: Lun,
        referenced: Itt,
        response: TmfResponse,
        waiting: usize,
    },
}

/// What the session needs to know of the rest of the target.
pub trait Host {
    /// The SendTargets answer for `value` (see [`crate::discovery`]).
    fn send_targets(&self, initiator: &str, value: &str, session_target: Option<&str>) -> Vec<u8>;
    /// Whether `lun` exists in this session's target.
    fn lun_exists(&self, lun: Lun) -> bool;
    /// The data-out length the CDB itself calls for (SBC's transfer length
    /// in bytes; 0 for commands without data-out or unknown LUNs). The
    /// session solicits at most min(EDTL, this) bytes (RFC 7143 §11.4.5.1).
    fn data_out_len(&self, lun: Lun, cdb: &[u8]) -> u32;
    /// The place on the medium a write of `cdb` to `lun`, `len` bytes of
    /// data-out, may be received straight into, holding what makes that
    /// safe until it is dropped (`scsi::LogicalUnit::place_write`); `None`
    /// (the default): receive it into a buffer. Only a CDB whose transfer
    /// length is exactly `len` may be placed. Asked only for commands the
    /// session will hand to the driver as they are, data digests off.
    fn place_write(&self, lun: Lun, cdb: &[u8], len: u32) -> Option<filemap::Placed> {
        let _ = (lun, cdb, len);
        None
    }
    /// Carries out a reset on behalf of task management.
    fn reset(&self, action: TmfAction);
}

use crate::tags::TagMap;

#[derive(Debug)]
struct R2tState {
    ttt: u32,
    offset: u32,
    len: u32,
    received: u32,
    next_data_sn: u32,
}

/// Data-out segments of at least this size are kept as slices of the
/// receive buffer instead of being copied; smaller ones are gathered into
/// one buffer, so that a trickle of tiny segments cannot pin many receive
/// buffers.
const HOLD_MIN: usize = 64 * 1024;

/// Write states a session keeps for reuse (docs/ARCHITECTURE.md: no allocation per
/// I/O): a write that waits for Data-Out takes one, with its R2T queue,
/// instead of allocating them; as many as were ever waiting at once, up
/// to this many.
const SPARE_WRITES_MAX: usize = 64;

/// Data segments at least this long are received straight into their
/// command's buffer ([`Session::landing`]).
pub const LAND_MIN: u32 = 64 * 1024;
/// Writes of at least [`LAND_MIN`] and at most this many bytes get one
/// buffer (from the per-thread pool) that all their data-out goes into.
const LAND_MAX: u32 = 1 << 20;

/// The data-out of one command as it arrives, in order: large segments
/// held as received, runs of small ones copied into a pooled buffer; or,
/// for writes of [`LAND_MIN`]..=[`LAND_MAX`] bytes, all of it in one
/// buffer (`whole`), large segments received straight into it.
#[derive(Debug, Default)]
struct Gather {
    held: Chain,
    small: Option<BytesMut>,
    /// Bytes still to come, for sizing the gather buffer.
    remaining: usize,
    /// All the data in one buffer, or in its place on the medium (out
    /// with the driver while it receives a segment into it).
    whole: Option<LandBuf>,
    contiguous: bool,
}

impl Gather {
    fn new(total: usize) -> Self {
        Gather {
            remaining: total,
            ..Gather::default()
        }
    }

    /// All the data into `buf`, which has room for all of it.
    fn contiguous(buf: LandBuf) -> Self {
        Gather {
            whole: Some(buf),
            contiguous: true,
            ..Gather::default()
        }
    }

    fn len(&self) -> usize {
        if self.contiguous {
            return self.whole.as_ref().map_or(0, LandBuf::len);
        }
        self.held.len() + self.small.as_ref().map_or(0, BytesMut::len)
    }

    fn push(&mut self, data: Bytes) {
        if self.contiguous {
            if let Some(w) = &mut self.whole {
                w.put_slice(&data);
            }
            return;
        }
        self.remaining = self.remaining.saturating_sub(data.len());
        if data.len() >= HOLD_MIN {
            self.seal();
            self.held.push(data);
        } else {
            let remaining = self.remaining;
            self.small
                .get_or_insert_with(|| bufpool::take(data.len() + remaining))
                .extend_from_slice(&data);
        }
    }

    fn seal(&mut self) {
        if let Some(b) = self.small.take() {
            self.held.push(b.freeze());
        }
    }

    /// The data as a chain, or (`Err`) the place it was received into.
    fn finish(mut self) -> Result<Chain, Placed> {
        if self.contiguous {
            return match self.whole {
                Some(LandBuf::Pooled(w)) => Ok(Chain::from(w.freeze())),
                Some(LandBuf::Placed(p)) => Err(p),
                None => Ok(Chain::default()),
            };
        }
        self.seal();
        Ok(self.held)
    }
}

#[derive(Debug)]
struct WriteState {
    req: ExecRequest,
    buf: Gather,
    /// Bytes the command will use: min(EDTL, the CDB's transfer length).
    wanted: u32,
    /// Bytes that will arrive: `wanted`, or the unsolicited burst if longer.
    total: u32,
    /// Bytes received so far, all contiguous from offset 0.
    received: u32,
    /// End of the unsolicited range.
    unsolicited_end: u32,
    unsolicited_data_sn: u32,
    /// Offset the next R2T will ask for.
    next_r2t_offset: u32,
    r2ts: VecDeque<R2tState>,
    r2t_sn: u32,
    /// The command holds a slot of the command window.
    counted: bool,
}

#[derive(Debug)]
enum Task {
    /// Waiting for Data-Out.
    Receiving(Box<WriteState>),
    /// Handed to the driver; `r2ts` R2Ts were sent for it.
    Running {
        lun: Lun,
        edtl: u32,
        read: bool,
        counted: bool,
        r2ts: u32,
    },
}

/// A command aborted while the driver executes it.
#[derive(Debug)]
struct Aborting {
    /// It holds a slot of the command window until it ends.
    counted: bool,
    /// Task management requests (by tag) whose response waits for it.
    waiters: Vec<u32>,
}

/// The full feature phase state of one connection (= session).
pub struct Session {
    params: SessionParams,
    limits: Limits,
    dg: Digests,
    exp_cmd_sn: Sn,
    stat_sn: Sn,
    depth: u32,
    in_flight: u32,
    held: BTreeMap<u32, RawPdu>,
    tasks: TagMap<Task>,
    /// Boxes, not values: the box a waiting write lives in
    /// (`Task::Receiving`) is the allocation being reused.
    #[allow(clippy::vec_box)]
    spare_writes: Vec<Box<WriteState>>,
    next_ttt: u32,
    text_in: Continuation,
    text_out: Option<(Itt, Vec<u8>, usize, u32)>,
    ping: Option<u32>,
    /// When the outstanding ping went out.
    ping_sent: Option<Instant>,
    /// When bytes last came from the initiator ([`Session::note_received`]).
    last_rx: Option<Instant>,
    closing: bool,
    rejects: u64,
    /// Commands aborted while the driver was executing them (ABORT TASK,
    /// ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET), by tag: their
    /// result is dropped when it comes, and the task management requests
    /// (by tag) waiting for them. A task is terminated only when nothing of
    /// it can still reach the medium (SAM-5 §7.2, RFC 7143 §4.2.3.3): the
    /// response is sent then, so a write aborted in the backend can never
    /// land after the initiator has sent it again, or sent a newer one.
    aborting: HashMap<u32, Aborting>,
    /// Task management responses not sent yet: (tag, response, commands
    /// still running).
    pending_tmf: Vec<(Itt, TmfResponse, usize)>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("initiator", &self.params.initiator_name)
            .field("exp_cmd_sn", &self.exp_cmd_sn)
            .field("stat_sn", &self.stat_sn)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

fn rej_data(bhs: &Bhs) -> &[u8] {
    bhs
}

impl Session {
    /// A session entering full feature phase with the negotiated `params`.
    pub fn new(params: SessionParams, limits: Limits, exp_cmd_sn: Sn, next_stat_sn: Sn) -> Self {
        let depth = limits.queue_depth.clamp(1, crate::params::MAX_QUEUE_DEPTH);
        Session {
            dg: Digests {
                header: params.header_digest,
                data: params.data_digest,
            },
            params,
            limits,
            exp_cmd_sn,
            stat_sn: next_stat_sn,
            depth,
            in_flight: 0,
            held: BTreeMap::new(),
            tasks: TagMap::default(),
            spare_writes: Vec::new(),
            next_ttt: 1,
            text_in: Continuation::default(),
            text_out: None,
            ping: None,
            ping_sent: None,
            last_rx: None,
            closing: false,
            rejects: 0,
            aborting: HashMap::new(),
            pending_tmf: Vec::new(),
        }
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Commands received and not yet answered.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Reject PDUs sent so far (statistics).
    pub fn rejects_sent(&self) -> u64 {
        self.rejects
    }

    /// Digest settings for outgoing PDUs.
    pub fn digests(&self) -> Digests {
        self.dg
    }

    fn max_cmd_sn(&self) -> Sn {
        let free = self.depth.saturating_sub(self.in_flight);
        self.exp_cmd_sn.plus(free).plus(u32::MAX)
    }

    /// StatSN/ExpCmdSN/MaxCmdSN for a PDU that carries status (StatSN then
    /// advances) or not.
    fn sn(&mut self, advance: bool) -> SnTriple {
        let t = SnTriple {
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
        };
        if advance {
            self.stat_sn = self.stat_sn.next();
        }
        t
    }

    fn fresh_ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        t
    }

    /// Sends a Reject of `bhs` with `reason`.
    pub fn reject(&mut self, bhs: &Bhs, reason: RejectReason, out: &mut Outbox) {
        self.rejects += 1;
        let r = Reject {
            reason,
            sn: self.sn(false),
            data_sn: 0,
        };
        out.push(&r.encode(BHS_LEN_USIZE), rej_data(bhs), self.dg);
    }

    /// Handles one received PDU.
    pub fn handle_pdu(
        &mut self,
        raw: RawPdu,
        host: &dyn Host,
        out: &mut Outbox,
        ev: &mut Vec<Event>,
    ) {
        if self.closing {
            return;
        }
        if !raw.data_digest_ok {
            // ERL 0: the PDU is discarded and the connection must go
            // (§7.8); tell the initiator why first.
            self.reject(&raw.bhs, RejectReason::DataDigestError, out);
            self.closing = true;
            ev.push(Event::Close(CloseReason::DataDigestError));
            return;
        }
        let op = opcode(&raw.bhs);
        // Data-Out and SNACK are not numbered; everything else an initiator
        // sends carries CmdSN.
        let numbered = matches!(
            op,
            Opcode::ScsiCommand
                | Opcode::TaskMgmtReq
                | Opcode::TextReq
                | Opcode::LogoutReq
                | Opcode::NopOut
        );
        if !numbered || is_immediate(&raw.bhs) {
            // Immediate commands do not consume a CmdSN (§3.2.2.1).
            return self.dispatch(raw, host, out, ev);
        }
        let cmd_sn = Sn(u32::from_be_bytes(
            raw.bhs[24..28].try_into().expect("4 bytes"),
        ));
        if cmd_sn == self.exp_cmd_sn {
            self.exp_cmd_sn = self.exp_cmd_sn.next();
            self.dispatch(raw, host, out, ev);
            while let Some(next) = self.held.remove(&self.exp_cmd_sn.0) {
                self.exp_cmd_sn = self.exp_cmd_sn.next();
                self.dispatch(next, host, out, ev);
                if self.closing {
                    break;
                }
            }
        } else if cmd_sn.gt(self.exp_cmd_sn) && !cmd_sn.gt(self.max_cmd_sn()) {
            self.held.insert(cmd_sn.0, raw);
        }
        // Otherwise outside the window or a duplicate: silently ignored.
    }

    /// Where the driver should receive the data segment of the PDU whose
    /// header segments are `bhs` (framing limits and header digest already
    /// checked), instead of into its receive buffer: a large segment of a
    /// write goes straight into the one buffer of its command's data-out,
    /// so that it is never copied again. `Some(buf)`: read exactly the
    /// segment's [`iscsi_wire::frame::data_segment_len`] bytes onto the end
    /// of `buf` (it has room for them without growing), then pass the PDU
    /// to [`Self::handle_pdu`] with `buf` as [`RawPdu::landed`] — before
    /// any other PDU. `None`: receive it as usual.
    ///
    /// Only a segment that would be accepted where it lands is given a
    /// place: a SCSI write command's immediate data, or a Data-Out at the
    /// next offset its command expects, within the command's length. The
    /// PDU is still checked in full by [`Self::handle_pdu`]; if it fails
    /// there, the command fails and the buffer is dropped.
    pub fn landing(&mut self, bhs: &Bhs, host: &dyn Host) -> Option<LandBuf> {
        if self.closing || self.params.session_type == SessionType::Discovery {
            return None;
        }
        let dlen = iscsi_wire::frame::data_segment_len(bhs);
        if dlen < LAND_MIN {
            return None;
        }
        match Pdu::parse(bhs) {
            Pdu::ScsiCommand(c)
                if c.write
                    && !c.read
                    && self.params.immediate_data
                    && dlen <= self.params.first_burst
                    && dlen <= c.edtl
                    && c.edtl <= LAND_MAX =>
            {
                Some(
                    self.place_here(&c, bhs, host)
                        .map(LandBuf::Placed)
                        .unwrap_or_else(|| LandBuf::Pooled(bufpool::take(c.edtl as usize))),
                )
            }
            Pdu::DataOut(d) => {
                let Some(Task::Receiving(w)) = self.tasks.get_mut(&d.itt.0) else {
                    return None;
                };
                let fits = d.buffer_offset == w.received
                    && w.received.checked_add(dlen).is_some_and(|e| e <= w.total);
                if !fits {
                    return None;
                }
                let b = w.buf.whole.take()?;
                if b.len() != w.received as usize || b.spare() < dlen as usize {
                    w.buf.whole = Some(b);
                    return None;
                }
                Some(b)
            }
            _ => None,
        }
    }

    /// The command `c`, whose header `bhs` has just arrived with immediate
    /// data, received straight into its place on the medium when the
    /// session will hand it to the driver as it is: in CmdSN order (not
    /// held for later), none of the checks of [`Self::scsi_command`] to
    /// fail, no data digest, all of its data-out for its CDB.
    fn place_here(&mut self, c: &ScsiCommand, bhs: &Bhs, host: &dyn Host) -> Option<Placed> {
        let in_order = !c.immediate && c.cmd_sn == self.exp_cmd_sn;
        let accepted = in_order
            && !self.tasks.contains_key(&c.itt.0)
            && iscsi_wire::frame::ahs_len(bhs) == 0
            && (c.final_ || !self.params.initial_r2t)
            && c.edtl <= self.limits.max_transfer;
        if !accepted {
            return None;
        }
        self.place(c.lun, &c.cdb, c.edtl, host)
    }

    /// [`Host::place_write`] for a write of `edtl` bytes, when data digests
    /// are off (the host places only a CDB that calls for exactly `edtl`).
    fn place(&self, lun: Lun, cdb: &[u8], edtl: u32, host: &dyn Host) -> Option<Placed> {
        if self.dg.data {
            return None;
        }
        host.place_write(lun, cdb, edtl)
    }

    fn dispatch(&mut self, raw: RawPdu, host: &dyn Host, out: &mut Outbox, ev: &mut Vec<Event>) {
        let discovery = self.params.session_type == SessionType::Discovery;
        match Pdu::parse(&raw.bhs) {
            Pdu::ScsiCommand(c) if !discovery => self.scsi_command(c, raw, host, out, ev),
            Pdu::DataOut(d) if !discovery => self.data_out(d, raw, out, ev),
            Pdu::TaskMgmtReq(t) if !discovery => self.task_mgmt(t, host, out, ev),
            Pdu::NopOut(n) => self.nop_out(n, raw, out),
            Pdu::TextReq(t) => self.text(t, raw, host, out),
            Pdu::LogoutReq(l) => self.logout(l, out, ev),
            Pdu::SnackReq(_) => self.reject(&raw.bhs, RejectReason::SnackReject, out),
            Pdu::ScsiCommand(_) | Pdu::DataOut(_) | Pdu::TaskMgmtReq(_) | Pdu::LoginReq(_) => {
                self.reject(&raw.bhs, RejectReason::ProtocolError, out)
            }
            _ => self.reject(&raw.bhs, RejectReason::CommandNotSupported, out),
        }
    }

    fn check(&mut self, itt: Itt, lun: Lun, sense: Sense, counted: bool, out: &mut Outbox) {
        if counted {
            self.in_flight += 1;
        }
        self.tasks.insert(
            itt.0,
            Task::Running {
                lun,
                edtl: 0,
                read: false,
                counted,
                r2ts: 0,
            },
        );
        let c = Completion {
            status: status::CHECK_CONDITION,
            sense: Some(Bytes::from(sense.to_bytes())),
            data_in: Chain::new(),
            data_out_wanted: 0,
        };
        self.complete(itt, c, out);
    }

    fn scsi_command(
        &mut self,
        c: ScsiCommand,
        mut raw: RawPdu,
        host: &dyn Host,
        out: &mut Outbox,
        ev: &mut Vec<Event>,
    ) {
        let counted = !c.immediate;
        if self.tasks.contains_key(&c.itt.0) {
            return self.reject(&raw.bhs, RejectReason::TaskInProgress, out);
        }
        let cdb = match extended_cdb(&c, &raw.ahs) {
            Ok(cdb) => cdb,
            Err(()) => return self.reject(&raw.bhs, RejectReason::InvalidPduField, out),
        };
        let imm = raw.data_len() as u32;
        let landed = raw.landed.take();
        if imm > 0
            && (!c.write
                || !self.params.immediate_data
                || imm > self.params.first_burst
                || imm > c.edtl)
        {
            return self.reject(&raw.bhs, RejectReason::ProtocolError, out);
        }
        if !c.final_ && (!c.write || self.params.initial_r2t) {
            return self.reject(&raw.bhs, RejectReason::ProtocolError, out);
        }
        if c.read && c.write {
            // Bidirectional commands are not supported: INVALID FIELD IN CDB.
            let sense = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
            return self.check(c.itt, c.lun, sense, counted, out);
        }
        if c.edtl > self.limits.max_transfer {
            let sense = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
            return self.check(c.itt, c.lun, sense, counted, out);
        }
        if counted {
            self.in_flight += 1;
        }
        let cdb_data_out = if c.write {
            host.data_out_len(c.lun, cdb.as_slice())
        } else {
            0
        };
        let req = ExecRequest {
            itt: c.itt,
            lun: c.lun,
            cdb,
            data_out: WriteData::None,
            edtl: c.edtl,
            read: c.read,
            write: c.write,
            cdb_data_out,
        };
        // Data the command takes: what the CDB calls for, within EDTL.
        // Immediate or unsolicited data beyond it is accepted and dropped.
        let wanted = c.edtl.min(cdb_data_out);
        let unsolicited_end = if c.final_ {
            imm
        } else {
            self.params.first_burst.min(c.edtl)
        };
        if imm >= wanted {
            self.tasks.insert(
                c.itt.0,
                Task::Running {
                    lun: c.lun,
                    edtl: c.edtl,
                    read: c.read,
                    counted,
                    r2ts: 0,
                },
            );
            let mut req = req;
            req.data_out = match landed {
                Some(LandBuf::Pooled(b)) => WriteData::Owned(b.freeze().slice(..wanted as usize)),
                // Placed only when the CDB wants all of EDTL (`place`).
                Some(LandBuf::Placed(p)) => WriteData::Placed(p),
                None => Chain::from(raw.data.slice(..wanted as usize)).into(),
            };
            ev.push(Event::Execute(req));
            // Unsolicited Data-Out still on its way for this task finds no
            // task and is dropped.
            return;
        }
        // Data arrives in order (DataPDUInOrder=Yes), so the buffer — from
        // the per-thread pool, not zeroed — is filled by appending.
        let total = wanted.max(unsolicited_end);
        let buf = match landed {
            // The landing buffer has room for EDTL bytes, total at most.
            Some(b) => Gather::contiguous(b),
            None if (LAND_MIN..=LAND_MAX).contains(&total) => {
                let place = (total == c.edtl)
                    .then(|| self.place(c.lun, req.cdb.as_slice(), c.edtl, host))
                    .flatten();
                let mut g = Gather::contiguous(match place {
                    Some(p) => LandBuf::Placed(p),
                    None => LandBuf::Pooled(bufpool::take(total as usize)),
                });
                g.push(raw.data);
                g
            }
            None => {
                let mut g = Gather::new(total as usize);
                g.push(raw.data);
                g
            }
        };
        let mut w = self.write_state(WriteState {
            req,
            buf,
            wanted,
            total,
            received: imm,
            unsolicited_end,
            unsolicited_data_sn: 0,
            next_r2t_offset: unsolicited_end,
            r2ts: VecDeque::new(),
            r2t_sn: 0,
            counted,
        });
        self.send_r2ts(&mut w, out);
        self.tasks.insert(c.itt.0, Task::Receiving(w));
    }

    /// `ws` in a box, a spare one when there is one (its R2T queue's room
    /// kept).
    fn write_state(&mut self, mut ws: WriteState) -> Box<WriteState> {
        match self.spare_writes.pop() {
            Some(mut b) => {
                let mut r2ts = std::mem::take(&mut b.r2ts);
                r2ts.clear();
                ws.r2ts = r2ts;
                *b = ws;
                b
            }
            None => Box::new(ws),
        }
    }

    fn send_r2ts(&mut self, w: &mut WriteState, out: &mut Outbox) {
        let end = w.wanted;
        while w.r2ts.len() < usize::from(self.params.max_outstanding_r2t) && w.next_r2t_offset < end
        {
            let len = (end - w.next_r2t_offset).min(self.params.max_burst);
            let ttt = self.fresh_ttt();
            let r = R2t {
                lun: w.req.lun,
                itt: w.req.itt,
                ttt,
                sn: self.sn(false),
                r2t_sn: w.r2t_sn,
                buffer_offset: w.next_r2t_offset,
                desired_len: len,
            };
            out.push(&r.encode(), &[], self.dg);
            w.r2ts.push_back(R2tState {
                ttt,
                offset: w.next_r2t_offset,
                len,
                received: 0,
                next_data_sn: 0,
            });
            w.r2t_sn += 1;
            w.next_r2t_offset += len;
        }
    }

    fn data_out(&mut self, d: DataOut, mut raw: RawPdu, out: &mut Outbox, ev: &mut Vec<Event>) {
        let w = match self.tasks.remove(&d.itt.0) {
            Some(Task::Receiving(w)) => w,
            Some(t) => {
                // Late unsolicited data for a task that already has all it
                // needs: dropped.
                self.tasks.insert(d.itt.0, t);
                return;
            }
            // A task that completed or was aborted: dropped (§11.7 and
            // libiscsi's handling of Rejects for unknown tasks).
            None => return,
        };
        let mut w = w;
        let len = raw.data_len() as u32;
        let landed = raw.landed.take();
        let was_landed = landed.is_some();
        if let Some(b) = landed {
            // Back from the driver with this segment at its end (checked
            // below like any other).
            w.buf.whole = Some(b);
        }
        let off = d.buffer_offset;
        // The buffer is only ever out with the driver while it receives
        // the segment of the PDU it then hands in: anything else between
        // is out of order.
        let placed = !w.buf.contiguous || w.buf.whole.is_some();
        let in_range =
            placed && off == w.received && off.checked_add(len).is_some_and(|e| e <= w.total);
        let ok = if d.ttt == RESERVED_TAG {
            let ok =
                in_range && off + len <= w.unsolicited_end && d.data_sn == w.unsolicited_data_sn;
            w.unsolicited_data_sn += 1;
            ok
        } else {
            match w.r2ts.iter_mut().find(|r| r.ttt == d.ttt) {
                Some(r) => {
                    let ok = in_range
                        && off >= r.offset
                        && off + len <= r.offset + r.len
                        && d.data_sn == r.next_data_sn;
                    r.next_data_sn += 1;
                    if ok {
                        r.received += len;
                    }
                    ok
                }
                None => false,
            }
        };
        if !ok {
            // Out of order, overlapping, past EDTL, or a wrong DataSN: at
            // ERL 0 the data cannot be recovered, so the command fails.
            self.reject(&raw.bhs, RejectReason::ProtocolError, out);
            let counted = w.counted;
            self.tasks.insert(
                d.itt.0,
                Task::Running {
                    lun: w.req.lun,
                    edtl: w.req.edtl,
                    read: false,
                    counted,
                    r2ts: w.r2t_sn,
                },
            );
            let c = Completion {
                status: status::CHECK_CONDITION,
                sense: Some(Bytes::from(
                    Sense::new(SenseKey::AbortedCommand, Asc::DATA_PHASE_ERROR).to_bytes(),
                )),
                ..Completion::default()
            };
            self.complete(d.itt, c, out);
            return;
        }
        let start = off as usize;
        if was_landed {
            debug_assert_eq!(start + len as usize, w.buf.len(), "landed at its offset");
        } else {
            debug_assert_eq!(start, w.buf.len(), "in-order data checked above");
            w.buf.push(raw.data);
        }
        w.received += len;
        if d.ttt != RESERVED_TAG && d.final_ {
            if let Some(pos) = w.r2ts.iter().position(|r| r.ttt == d.ttt) {
                w.r2ts.remove(pos);
            }
            self.send_r2ts(&mut w, out);
        }
        if w.received == w.total {
            let owned = w.buf.contiguous;
            let mut req = std::mem::take(&mut w.req);
            let buf = std::mem::take(&mut w.buf);
            let (r2t_sn, counted, wanted) = (w.r2t_sn, w.counted, w.wanted);
            if self.spare_writes.len() < SPARE_WRITES_MAX {
                self.spare_writes.push(w);
            }
            req.data_out = match buf.finish() {
                Ok(all) => {
                    let all = if all.len() == wanted as usize {
                        all
                    } else {
                        all.slice(0, wanted as usize)
                    };
                    match all.into_single() {
                        Ok(one) if owned => WriteData::Owned(one),
                        Ok(one) => Chain::from(one).into(),
                        Err(all) => all.into(),
                    }
                }
                // Placed only when all that arrives is what the CDB wants.
                Err(placed) => WriteData::Placed(placed),
            };
            self.tasks.insert(
                req.itt.0,
                Task::Running {
                    lun: req.lun,
                    edtl: req.edtl,
                    read: req.read,
                    counted,
                    r2ts: r2t_sn,
                },
            );
            ev.push(Event::Execute(req));
        } else {
            self.tasks.insert(d.itt.0, Task::Receiving(w));
        }
    }

    /// Sends the result of a command handed out by [`Event::Execute`].
    /// A command aborted meanwhile is dropped silently.
    pub fn complete(&mut self, itt: Itt, mut c: Completion, out: &mut Outbox) {
        let Some(Task::Running {
            lun,
            edtl,
            read,
            counted,
            r2ts,
        }) = self.tasks.remove(&itt.0)
        else {
            self.aborted_done(itt.0, out);
            return;
        };
        if counted {
            self.in_flight -= 1;
        }
        let good = c.status == 0 && c.sense.is_none();
        let want = if read {
            c.data_in.len() as u32
        } else {
            c.data_out_wanted
        };
        let residual = if edtl == 0 && want == 0 {
            Residual::default()
        } else {
            Residual::of(edtl, want)
        };
        let send = c.data_in.len().min(edtl as usize);
        let mut data_sn = 0u32;
        if read && send > 0 {
            let seg = self.params.send_max_data_segment as usize;
            let burst = self.params.max_burst as usize;
            let mut off = 0usize;
            while off < send {
                let n = seg.min(send - off).min(burst - off % burst);
                let last = off + n == send;
                let status_here = last && good;
                let d = DataIn {
                    final_: last || (off + n).is_multiple_of(burst),
                    ack: false,
                    status: status_here.then_some(c.status),
                    lun,
                    itt,
                    ttt: RESERVED_TAG,
                    sn: self.sn(status_here),
                    data_sn,
                    buffer_offset: off as u32,
                    residual: if status_here {
                        residual
                    } else {
                        Residual::default()
                    },
                };
                // The whole buffer moves into the send queue when one PDU
                // carries it (the common case); otherwise a shared slice.
                let piece = if off == 0 && n == c.data_in.len() {
                    std::mem::take(&mut c.data_in)
                } else {
                    c.data_in.slice(off, n)
                };
                out.push_chain(&d.encode(n), piece, self.dg);
                data_sn += 1;
                off += n;
            }
            if good {
                return;
            }
        }
        let sense = c.sense.unwrap_or_default();
        let mut data = Vec::with_capacity(if sense.is_empty() { 0 } else { 2 + sense.len() });
        if !sense.is_empty() {
            data.extend_from_slice(&(sense.len() as u16).to_be_bytes());
            data.extend_from_slice(&sense);
        }
        let r = ScsiResponse {
            response: IscsiResponse::Completed,
            status: c.status,
            itt,
            sn: self.sn(true),
            exp_data_sn: if read { data_sn } else { r2ts },
            residual,
        };
        out.push(&r.encode(data.len()), &data, self.dg);
    }

    fn nop_out(&mut self, n: NopOut, raw: RawPdu, out: &mut Outbox) {
        if n.ttt != RESERVED_TAG {
            if self.ping == Some(n.ttt) {
                self.ping = None;
            }
            return;
        }
        if n.itt.0 == RESERVED_TAG {
            return;
        }
        let r = NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
            sn: self.sn(true),
        };
        out.push_bytes(&r.encode(raw.data.len()), raw.data, self.dg);
    }

    /// Sends a NOP-In ping; the initiator must answer with a NOP-Out
    /// carrying the same TTT (checked by [`Session::ping_outstanding`]).
    pub fn ping(&mut self, out: &mut Outbox) {
        let ttt = self.fresh_ttt();
        self.ping = Some(ttt);
        let r = NopIn {
            lun: Lun::default(),
            itt: Itt(RESERVED_TAG),
            ttt,
            sn: self.sn(false),
        };
        out.push(&r.encode(0), &[], self.dg);
    }

    /// True while a ping is unanswered.
    pub fn ping_outstanding(&self) -> bool {
        self.ping.is_some()
    }

    /// Notes that bytes came from the initiator at `now` (the keepalive
    /// timer measures silence from there).
    pub fn note_received(&mut self, now: Instant) {
        self.last_rx = Some(now);
    }

    /// The keepalive timer (RFC 7143 §11.19, NOP-In as a ping), with the
    /// time passed in so that tests drive it: with no command in flight
    /// and nothing received for `interval` (never when it is zero), a
    /// NOP-In ping goes out; a ping unanswered for longer than `timeout`
    /// ends the connection. The driver calls it from its periodic tick;
    /// `interval` and `timeout` are read then, so a changed setting
    /// applies to running sessions.
    pub fn poll_keepalive(
        &mut self,
        now: Instant,
        interval: Duration,
        timeout: Duration,
        out: &mut Outbox,
    ) -> Result<(), CloseReason> {
        let since = |t: Option<Instant>| now.saturating_duration_since(t.unwrap_or(now));
        if self.ping_outstanding() {
            if since(self.ping_sent) > timeout {
                return Err(CloseReason::PingUnanswered);
            }
        } else if !interval.is_zero() && since(self.last_rx) > interval && self.in_flight() == 0 {
            self.ping(out);
            self.ping_sent = Some(now);
        }
        Ok(())
    }

    fn text(&mut self, t: TextReq, raw: RawPdu, host: &dyn Host, out: &mut Outbox) {
        // A continuation of a response we are still sending.
        if t.ttt != RESERVED_TAG {
            match self.text_out.take() {
                Some((itt, body, pos, ttt))
                    if itt == t.itt && ttt == t.ttt && raw.data.is_empty() =>
                {
                    return self.send_text_chunk(itt, body, pos, out);
                }
                _ => return self.reject(&raw.bhs, RejectReason::ProtocolError, out),
            }
        }
        self.text_out = None;
        let whole = match self.text_in.push(&raw.data, t.cont) {
            Ok(Some(w)) => w,
            Ok(None) => {
                let ttt = self.fresh_ttt();
                let r = TextResp {
                    final_: false,
                    cont: false,
                    lun: t.lun,
                    itt: t.itt,
                    ttt,
                    sn: self.sn(true),
                };
                out.push(&r.encode(0), &[], self.dg);
                return;
            }
            Err(_) => return self.reject(&raw.bhs, RejectReason::ProtocolError, out),
        };
        let pairs = match text::parse(&whole) {
            Ok(p) => p,
            Err(_) => return self.reject(&raw.bhs, RejectReason::ProtocolError, out),
        };
        let mut body = Vec::new();
        for (k, v) in &pairs {
            if k == "SendTargets" {
                let own = (!self.params.target_name.is_empty())
                    .then_some(self.params.target_name.as_str());
                body.extend(host.send_targets(&self.params.initiator_name, v, own));
            } else {
                text::push(&mut body, k, "NotUnderstood");
            }
        }
        self.send_text_chunk(t.itt, body, 0, out);
    }

    fn send_text_chunk(&mut self, itt: Itt, body: Vec<u8>, pos: usize, out: &mut Outbox) {
        let max = self.params.send_max_data_segment as usize;
        let end = (pos + max).min(body.len());
        let more = end < body.len();
        let ttt = if more { self.fresh_ttt() } else { RESERVED_TAG };
        let r = TextResp {
            final_: !more,
            cont: more,
            lun: Lun::default(),
            itt,
            ttt,
            sn: self.sn(true),
        };
        out.push(&r.encode(end - pos), &body[pos..end], self.dg);
        if more {
            self.text_out = Some((itt, body, end, ttt));
        }
    }

    fn task_mgmt(
        &mut self,
        t: TaskMgmtReq,
        host: &dyn Host,
        out: &mut Outbox,
        ev: &mut Vec<Event>,
    ) {
        use TmfResponse::{
            Complete as COMPLETE, FunctionUnsupported as UNSUPPORTED, NoSuchLun as NO_LUN,
            NoSuchTask as NO_TASK, ReassignUnsupported as REASSIGN_UNSUPPORTED,
            Rejected as REJECTED,
        };
        // Commands this request aborted that the driver is still executing:
        // the response waits for them (see `aborting`).
        let mut running = Vec::new();
        let response = match t.function {
            TmfFunction::AbortTask => {
                let found = matches!(self.tasks.get(&t.ref_task_tag.0), Some(task) if task_lun(task) == t.lun);
                if found {
                    running = self.abort(|itt, _| itt == t.ref_task_tag.0);
                    COMPLETE
                } else if self.aborting.contains_key(&t.ref_task_tag.0) {
                    // Aborted already and still running: this request too
                    // is answered when it ends.
                    running.push(t.ref_task_tag.0);
                    COMPLETE
                } else {
                    // Completed already, or never received (RFC 3720
                    // §10.6.1 c): "task does not exist".
                    NO_TASK
                }
            }
            TmfFunction::AbortTaskSet | TmfFunction::ClearTaskSet => {
                if !host.lun_exists(t.lun) {
                    NO_LUN
                } else {
                    running = self.abort(|_, task| task_lun(task) == t.lun);
                    COMPLETE
                }
            }
            TmfFunction::LogicalUnitReset => {
                if !host.lun_exists(t.lun) {
                    NO_LUN
                } else {
                    running = self.abort(|_, task| task_lun(task) == t.lun);
                    host.reset(TmfAction::LunReset(t.lun));
                    COMPLETE
                }
            }
            TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset => {
                let cold = t.function == TmfFunction::TargetColdReset;
                running = self.abort(|_, _| true);
                host.reset(TmfAction::TargetReset { cold });
                if cold {
                    self.closing = true;
                    ev.push(Event::Close(CloseReason::ColdReset));
                }
                COMPLETE
            }
            TmfFunction::ClearAca => UNSUPPORTED,
            TmfFunction::TaskReassign => REASSIGN_UNSUPPORTED,
            TmfFunction::Unknown(_) => REJECTED,
        };
        for itt in &running {
            if let Some(a) = self.aborting.get_mut(itt) {
                a.waiters.push(t.itt.0);
            }
        }
        let waiting = running.len();
        ev.push(Event::TaskManagement {
            function: t.function,
            lun: t.lun,
            referenced: t.ref_task_tag,
            response,
            waiting,
        });
        if waiting > 0 {
            self.pending_tmf.push((t.itt, response, waiting));
            return;
        }
        self.send_tmf_response(t.itt, response, out);
    }

    fn send_tmf_response(&mut self, itt: Itt, response: TmfResponse, out: &mut Outbox) {
        let r = TaskMgmtResp {
            response,
            itt,
            sn: self.sn(true),
        };
        out.push(&r.encode(), &[], self.dg);
    }

    /// The driver finished command `itt`, which was aborted while it ran:
    /// its slot in the command window is free, and a task management
    /// response that waited only for it goes out.
    fn aborted_done(&mut self, itt: u32, out: &mut Outbox) {
        let Some(a) = self.aborting.remove(&itt) else {
            return;
        };
        if a.counted {
            self.in_flight -= 1;
        }
        for w in a.waiters {
            let Some(i) = self.pending_tmf.iter().position(|p| p.0 .0 == w) else {
                continue;
            };
            self.pending_tmf[i].2 -= 1;
            if self.pending_tmf[i].2 == 0 {
                let (tag, response, _) = self.pending_tmf.remove(i);
                self.send_tmf_response(tag, response, out);
            }
        }
    }

    /// Task management responses still waiting for aborted commands.
    pub fn pending_task_management(&self) -> usize {
        self.pending_tmf.len()
    }

    /// Aborts this session's tasks for `lun` as ABORT TASK SET does, without
    /// sending anything for them (a completion that arrives later is
    /// dropped). The driver calls this when another I_T nexus's PERSISTENT
    /// RESERVE OUT PREEMPT AND ABORT removed this session's registration
    /// (SPC-4 §5.9.11.5). Returns how many tasks were aborted.
    pub fn abort_lun_tasks(&mut self, lun: Lun) -> usize {
        let before = self.tasks.len();
        self.abort(|_, task| task_lun(task) == lun);
        before - self.tasks.len()
    }

    /// Aborts every task `f` selects: no response will be sent for them.
    /// A command still waiting for its data is gone at once; one the
    /// driver is executing moves to `aborting` and keeps its slot in the
    /// command window until the driver finishes it. Returns the tags of
    /// those, for a task management response to wait for.
    fn abort(&mut self, f: impl Fn(u32, &Task) -> bool) -> Vec<u32> {
        let victims: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(k, t)| f(**k, t))
            .map(|(k, _)| *k)
            .collect();
        let mut running = Vec::new();
        for k in victims {
            match self.tasks.remove(&k) {
                Some(Task::Receiving(w)) if w.counted => self.in_flight -= 1,
                Some(Task::Running { counted, .. }) => {
                    self.aborting.insert(
                        k,
                        Aborting {
                            counted,
                            waiters: Vec::new(),
                        },
                    );
                    running.push(k);
                }
                Some(Task::Receiving(_)) | None => {}
            }
        }
        running
    }

    fn logout(&mut self, l: LogoutReq, out: &mut Outbox, ev: &mut Vec<Event>) {
        let response = match l.reason {
            LogoutReason::CloseSession | LogoutReason::CloseConnection => LogoutResponse::Closed,
            _ => LogoutResponse::RecoveryUnsupported,
        };
        let r = LogoutResp {
            response,
            itt: l.itt,
            sn: self.sn(true),
            time2wait: self.params.time2wait,
            time2retain: self.params.time2retain,
        };
        out.push(&r.encode(), &[], self.dg);
        if response == LogoutResponse::Closed {
            self.closing = true;
            ev.push(Event::Logout);
        }
    }
}

fn task_lun(t: &Task) -> Lun {
    match t {
        Task::Receiving(w) => w.req.lun,
        Task::Running { lun, .. } => *lun,
    }
}

const BHS_LEN_USIZE: usize = 48;

/// The CDB of a command, joined with its extended-CDB AHS (§11.3.5) if any.
fn extended_cdb(c: &ScsiCommand, ahs: &Bytes) -> Result<Cdb, ()> {
    if ahs.is_empty() {
        return Ok(Cdb::Short(c.cdb));
    }
    let mut rest = &ahs[..];
    while rest.len() >= 4 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let kind = rest[2];
        let total = (3 + len + 3) & !3;
        if 3 + len > rest.len() || len == 0 {
            return Err(());
        }
        if kind == 1 {
            let ext = &rest[4..3 + len];
            let mut v = Vec::with_capacity(16 + ext.len());
            v.extend_from_slice(&c.cdb);
            v.extend_from_slice(ext);
            return Ok(Cdb::Long(v.into_boxed_slice()));
        }
        rest = &rest[total.min(rest.len())..];
    }
    Ok(Cdb::Short(c.cdb))
}

#[cfg(test)]
mod tests;
