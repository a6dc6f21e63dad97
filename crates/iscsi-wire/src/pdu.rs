//! Typed basic header segments (RFC 7143 §11). Each PDU type reads its
//! fields at fixed byte offsets of the 48-byte BHS and writes them back; the
//! data segment travels beside the header (see [`crate::frame::RawPdu`]).
//! Opcodes we do not know decode to [`Opcode::Unknown`] and are answered
//! with a Reject by the protocol layer, never a panic.

mod codes;

pub use codes::{
    AsyncEvent, IscsiResponse, LoginStatus, LogoutReason, LogoutResponse, RejectReason, TaskAttr,
    TmfResponse,
};

use crate::frame::BHS_LEN;
use crate::serial::Sn;

/// A basic header segment.
pub type Bhs = [u8; BHS_LEN];

/// The reserved tag value (0xffffffff) used where no ITT/TTT applies.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Initiator task tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Itt(pub u32);

/// A logical unit number field (SAM-5 §4.7), kept as its eight wire bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Lun(pub [u8; 8]);

impl Lun {
    /// The wire form of LUN `n` (peripheral device addressing below 256,
    /// flat space addressing up to 16383), as SAM-5 §4.7 gives it.
    pub fn from_index(n: u16) -> Lun {
        let mut b = [0u8; 8];
        if n < 256 {
            b[1] = n as u8;
        } else {
            b[0] = 0x40 | ((n >> 8) as u8 & 0x3f);
            b[1] = n as u8;
        }
        Lun(b)
    }

    /// The LUN index for single-level peripheral or flat addressing; `None`
    /// for other address methods or multi-level LUNs.
    pub fn index(&self) -> Option<u16> {
        let b = self.0;
        if b[2..].iter().any(|&x| x != 0) {
            return None;
        }
        match b[0] >> 6 {
            0 if b[0] == 0 => Some(u16::from(b[1])),
            1 => Some(u16::from(b[0] & 0x3f) << 8 | u16::from(b[1])),
            _ => None,
        }
    }
}

/// PDU opcodes (RFC 7143 §11.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    NopOut,
    ScsiCommand,
    TaskMgmtReq,
    LoginReq,
    TextReq,
    DataOut,
    LogoutReq,
    SnackReq,
    NopIn,
    ScsiResponse,
    TaskMgmtResp,
    LoginResp,
    TextResp,
    DataIn,
    LogoutResp,
    R2t,
    AsyncMsg,
    Reject,
    Unknown(u8),
}

impl Opcode {
    /// Decodes the low six bits of BHS byte 0.
    pub fn from_byte(b: u8) -> Opcode {
        match b & 0x3f {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskMgmtReq,
            0x03 => Opcode::LoginReq,
            0x04 => Opcode::TextReq,
            0x05 => Opcode::DataOut,
            0x06 => Opcode::LogoutReq,
            0x10 => Opcode::SnackReq,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskMgmtResp,
            0x23 => Opcode::LoginResp,
            0x24 => Opcode::TextResp,
            0x25 => Opcode::DataIn,
            0x26 => Opcode::LogoutResp,
            0x31 => Opcode::R2t,
            0x32 => Opcode::AsyncMsg,
            0x3f => Opcode::Reject,
            x => Opcode::Unknown(x),
        }
    }

    /// The six-bit wire value.
    pub fn to_byte(self) -> u8 {
        match self {
            Opcode::NopOut => 0x00,
            Opcode::ScsiCommand => 0x01,
            Opcode::TaskMgmtReq => 0x02,
            Opcode::LoginReq => 0x03,
            Opcode::TextReq => 0x04,
            Opcode::DataOut => 0x05,
            Opcode::LogoutReq => 0x06,
            Opcode::SnackReq => 0x10,
            Opcode::NopIn => 0x20,
            Opcode::ScsiResponse => 0x21,
            Opcode::TaskMgmtResp => 0x22,
            Opcode::LoginResp => 0x23,
            Opcode::TextResp => 0x24,
            Opcode::DataIn => 0x25,
            Opcode::LogoutResp => 0x26,
            Opcode::R2t => 0x31,
            Opcode::AsyncMsg => 0x32,
            Opcode::Reject => 0x3f,
            Opcode::Unknown(x) => x & 0x3f,
        }
    }
}

fn u16_at(b: &Bhs, o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &Bhs, o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn put16(b: &mut Bhs, o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut Bhs, o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
fn lun_at(b: &Bhs) -> Lun {
    let mut l = [0u8; 8];
    l.copy_from_slice(&b[8..16]);
    Lun(l)
}

/// A fresh BHS with opcode, flags byte and data segment length set.
fn new_bhs(op: Opcode, immediate: bool, flags: u8, data_len: usize) -> Bhs {
    let mut b = [0u8; BHS_LEN];
    b[0] = op.to_byte() | if immediate { 0x40 } else { 0 };
    b[1] = flags;
    debug_assert!(data_len < 1 << 24, "data segment length overflows 24 bits");
    let l = (data_len as u32).to_be_bytes();
    b[5..8].copy_from_slice(&l[1..]);
    b
}

/// Opcode of a raw BHS.
pub fn opcode(b: &Bhs) -> Opcode {
    Opcode::from_byte(b[0])
}

/// The immediate-delivery bit of a raw BHS.
pub fn is_immediate(b: &Bhs) -> bool {
    b[0] & 0x40 != 0
}

/// The ITT field (bytes 16..20) of any PDU.
pub fn itt(b: &Bhs) -> Itt {
    Itt(u32_at(b, 16))
}

// ---------------------------------------------------------------- requests

/// SCSI Command (§11.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScsiCommand {
    pub immediate: bool,
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    /// Task attribute (§11.3.1).
    pub attr: TaskAttr,
    pub lun: Lun,
    pub itt: Itt,
    pub edtl: u32,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    pub cdb: [u8; 16],
}

impl ScsiCommand {
    pub fn decode(b: &Bhs) -> Self {
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&b[32..48]);
        ScsiCommand {
            immediate: is_immediate(b),
            final_: b[1] & 0x80 != 0,
            read: b[1] & 0x40 != 0,
            write: b[1] & 0x20 != 0,
            attr: TaskAttr::from(b[1] & 0x07),
            lun: lun_at(b),
            itt: itt(b),
            edtl: u32_at(b, 20),
            cmd_sn: Sn(u32_at(b, 24)),
            exp_stat_sn: Sn(u32_at(b, 28)),
            cdb,
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let flags = (u8::from(self.final_) << 7)
            | (u8::from(self.read) << 6)
            | (u8::from(self.write) << 5)
            | (u8::from(self.attr) & 7);
        let mut b = new_bhs(Opcode::ScsiCommand, self.immediate, flags, data_len);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.edtl);
        put32(&mut b, 24, self.cmd_sn.0);
        put32(&mut b, 28, self.exp_stat_sn.0);
        b[32..48].copy_from_slice(&self.cdb);
        b
    }
}

/// SCSI Data-Out (§11.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataOut {
    pub final_: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    pub exp_stat_sn: Sn,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

impl DataOut {
    pub fn decode(b: &Bhs) -> Self {
        DataOut {
            final_: b[1] & 0x80 != 0,
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            exp_stat_sn: Sn(u32_at(b, 28)),
            data_sn: u32_at(b, 36),
            buffer_offset: u32_at(b, 40),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let mut b = new_bhs(Opcode::DataOut, false, u8::from(self.final_) << 7, data_len);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        put32(&mut b, 28, self.exp_stat_sn.0);
        put32(&mut b, 36, self.data_sn);
        put32(&mut b, 40, self.buffer_offset);
        b
    }
}

/// NOP-Out (§11.18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

impl NopOut {
    pub fn decode(b: &Bhs) -> Self {
        NopOut {
            immediate: is_immediate(b),
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            cmd_sn: Sn(u32_at(b, 24)),
            exp_stat_sn: Sn(u32_at(b, 28)),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let mut b = new_bhs(Opcode::NopOut, self.immediate, 0x80, data_len);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        put32(&mut b, 24, self.cmd_sn.0);
        put32(&mut b, 28, self.exp_stat_sn.0);
        b
    }
}

/// Task management functions (§11.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmfFunction {
    AbortTask,
    AbortTaskSet,
    ClearAca,
    ClearTaskSet,
    LogicalUnitReset,
    TargetWarmReset,
    TargetColdReset,
    TaskReassign,
    Unknown(u8),
}

impl TmfFunction {
    pub fn from_byte(b: u8) -> Self {
        match b & 0x7f {
            1 => Self::AbortTask,
            2 => Self::AbortTaskSet,
            3 => Self::ClearAca,
            4 => Self::ClearTaskSet,
            5 => Self::LogicalUnitReset,
            6 => Self::TargetWarmReset,
            7 => Self::TargetColdReset,
            8 => Self::TaskReassign,
            x => Self::Unknown(x),
        }
    }

    pub fn to_byte(self) -> u8 {
        match self {
            Self::AbortTask => 1,
            Self::AbortTaskSet => 2,
            Self::ClearAca => 3,
            Self::ClearTaskSet => 4,
            Self::LogicalUnitReset => 5,
            Self::TargetWarmReset => 6,
            Self::TargetColdReset => 7,
            Self::TaskReassign => 8,
            Self::Unknown(x) => x & 0x7f,
        }
    }
}

/// Task Management Function Request (§11.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskMgmtReq {
    pub immediate: bool,
    pub function: TmfFunction,
    pub lun: Lun,
    pub itt: Itt,
    pub ref_task_tag: Itt,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    pub ref_cmd_sn: Sn,
    pub exp_data_sn: u32,
}

impl TaskMgmtReq {
    pub fn decode(b: &Bhs) -> Self {
        TaskMgmtReq {
            immediate: is_immediate(b),
            function: TmfFunction::from_byte(b[1]),
            lun: lun_at(b),
            itt: itt(b),
            ref_task_tag: Itt(u32_at(b, 20)),
            cmd_sn: Sn(u32_at(b, 24)),
            exp_stat_sn: Sn(u32_at(b, 28)),
            ref_cmd_sn: Sn(u32_at(b, 32)),
            exp_data_sn: u32_at(b, 36),
        }
    }

    pub fn encode(&self) -> Bhs {
        let mut b = new_bhs(
            Opcode::TaskMgmtReq,
            self.immediate,
            0x80 | self.function.to_byte(),
            0,
        );
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ref_task_tag.0);
        put32(&mut b, 24, self.cmd_sn.0);
        put32(&mut b, 28, self.exp_stat_sn.0);
        put32(&mut b, 32, self.ref_cmd_sn.0);
        put32(&mut b, 36, self.exp_data_sn);
        b
    }
}

/// Login stages (§11.12.3).
pub mod stage {
    pub const SECURITY: u8 = 0;
    pub const OPERATIONAL: u8 = 1;
    pub const FULL_FEATURE: u8 = 3;
}

/// Login Request (§11.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginReq {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: Itt,
    pub cid: u16,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

impl LoginReq {
    pub fn decode(b: &Bhs) -> Self {
        let mut isid = [0u8; 6];
        isid.copy_from_slice(&b[8..14]);
        LoginReq {
            transit: b[1] & 0x80 != 0,
            cont: b[1] & 0x40 != 0,
            csg: (b[1] >> 2) & 3,
            nsg: b[1] & 3,
            version_max: b[2],
            version_min: b[3],
            isid,
            tsih: u16_at(b, 14),
            itt: itt(b),
            cid: u16_at(b, 20),
            cmd_sn: Sn(u32_at(b, 24)),
            exp_stat_sn: Sn(u32_at(b, 28)),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let flags = (u8::from(self.transit) << 7)
            | (u8::from(self.cont) << 6)
            | ((self.csg & 3) << 2)
            | (self.nsg & 3);
        let mut b = new_bhs(Opcode::LoginReq, true, flags, data_len);
        b[2] = self.version_max;
        b[3] = self.version_min;
        b[8..14].copy_from_slice(&self.isid);
        put16(&mut b, 14, self.tsih);
        put32(&mut b, 16, self.itt.0);
        put16(&mut b, 20, self.cid);
        put32(&mut b, 24, self.cmd_sn.0);
        put32(&mut b, 28, self.exp_stat_sn.0);
        b
    }
}

/// Text Request (§11.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextReq {
    pub immediate: bool,
    pub final_: bool,
    pub cont: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

impl TextReq {
    pub fn decode(b: &Bhs) -> Self {
        TextReq {
            immediate: is_immediate(b),
            final_: b[1] & 0x80 != 0,
            cont: b[1] & 0x40 != 0,
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            cmd_sn: Sn(u32_at(b, 24)),
            exp_stat_sn: Sn(u32_at(b, 28)),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let flags = (u8::from(self.final_) << 7) | (u8::from(self.cont) << 6);
        let mut b = new_bhs(Opcode::TextReq, self.immediate, flags, data_len);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        put32(&mut b, 24, self.cmd_sn.0);
        put32(&mut b, 28, self.exp_stat_sn.0);
        b
    }
}

/// Logout Request (§11.14).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogoutReq {
    pub immediate: bool,
    pub reason: LogoutReason,
    pub itt: Itt,
    pub cid: u16,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

impl LogoutReq {
    pub fn decode(b: &Bhs) -> Self {
        LogoutReq {
            immediate: is_immediate(b),
            reason: LogoutReason::from(b[1] & 0x7f),
            itt: itt(b),
            cid: u16_at(b, 20),
            cmd_sn: Sn(u32_at(b, 24)),
            exp_stat_sn: Sn(u32_at(b, 28)),
        }
    }

    pub fn encode(&self) -> Bhs {
        let mut b = new_bhs(
            Opcode::LogoutReq,
            self.immediate,
            0x80 | (u8::from(self.reason) & 0x7f),
            0,
        );
        put32(&mut b, 16, self.itt.0);
        put16(&mut b, 20, self.cid);
        put32(&mut b, 24, self.cmd_sn.0);
        put32(&mut b, 28, self.exp_stat_sn.0);
        b
    }
}

// --------------------------------------------------------------- responses

/// Fields every target-to-initiator PDU carries: StatSN, ExpCmdSN, MaxCmdSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SnTriple {
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
}

impl SnTriple {
    fn put(&self, b: &mut Bhs) {
        put32(b, 24, self.stat_sn.0);
        put32(b, 28, self.exp_cmd_sn.0);
        put32(b, 32, self.max_cmd_sn.0);
    }

    fn get(b: &Bhs) -> Self {
        SnTriple {
            stat_sn: Sn(u32_at(b, 24)),
            exp_cmd_sn: Sn(u32_at(b, 28)),
            max_cmd_sn: Sn(u32_at(b, 32)),
        }
    }
}

/// Residual flags and count shared by SCSI Response and Data-In (§11.4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Residual {
    pub overflow: bool,
    pub underflow: bool,
    pub count: u32,
}

impl Residual {
    /// The residual of a transfer of `done` bytes against an expected
    /// `expected` bytes.
    pub fn of(expected: u32, wanted: u32) -> Residual {
        use std::cmp::Ordering::*;
        match wanted.cmp(&expected) {
            Equal => Residual::default(),
            Less => Residual {
                overflow: false,
                underflow: true,
                count: expected - wanted,
            },
            Greater => Residual {
                overflow: true,
                underflow: false,
                count: wanted - expected,
            },
        }
    }

    fn flags(&self) -> u8 {
        (u8::from(self.overflow) << 2) | (u8::from(self.underflow) << 1)
    }
}

/// SCSI Response (§11.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScsiResponse {
    pub response: IscsiResponse,
    pub status: u8,
    pub itt: Itt,
    pub sn: SnTriple,
    pub exp_data_sn: u32,
    pub residual: Residual,
}

impl ScsiResponse {
    pub fn decode(b: &Bhs) -> Self {
        ScsiResponse {
            response: IscsiResponse::from(b[2]),
            status: b[3],
            itt: itt(b),
            sn: SnTriple::get(b),
            exp_data_sn: u32_at(b, 36),
            residual: Residual {
                overflow: b[1] & 0x04 != 0,
                underflow: b[1] & 0x02 != 0,
                count: u32_at(b, 44),
            },
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let mut b = new_bhs(
            Opcode::ScsiResponse,
            false,
            0x80 | self.residual.flags(),
            data_len,
        );
        b[2] = self.response.into();
        b[3] = self.status;
        put32(&mut b, 16, self.itt.0);
        self.sn.put(&mut b);
        put32(&mut b, 36, self.exp_data_sn);
        put32(&mut b, 44, self.residual.count);
        b
    }
}

/// SCSI Data-In (§11.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataIn {
    pub final_: bool,
    pub ack: bool,
    /// Status is carried in this PDU (the S bit); then `final_` is set too.
    pub status: Option<u8>,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    /// StatSN is meaningful only with `status`.
    pub sn: SnTriple,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual: Residual,
}

impl DataIn {
    pub fn decode(b: &Bhs) -> Self {
        let s = b[1] & 0x01 != 0;
        DataIn {
            final_: b[1] & 0x80 != 0,
            ack: b[1] & 0x40 != 0,
            status: s.then_some(b[3]),
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            sn: SnTriple::get(b),
            data_sn: u32_at(b, 36),
            buffer_offset: u32_at(b, 40),
            residual: if s {
                Residual {
                    overflow: b[1] & 0x04 != 0,
                    underflow: b[1] & 0x02 != 0,
                    count: u32_at(b, 44),
                }
            } else {
                Residual::default()
            },
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let mut flags = (u8::from(self.final_) << 7) | (u8::from(self.ack) << 6);
        if self.status.is_some() {
            flags |= 0x01 | self.residual.flags();
        }
        let mut b = new_bhs(Opcode::DataIn, false, flags, data_len);
        b[3] = self.status.unwrap_or(0);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        self.sn.put(&mut b);
        if self.status.is_none() {
            put32(&mut b, 24, 0);
        }
        put32(&mut b, 36, self.data_sn);
        put32(&mut b, 40, self.buffer_offset);
        if self.status.is_some() {
            put32(&mut b, 44, self.residual.count);
        }
        b
    }
}

/// Ready To Transfer (§11.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2t {
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    pub sn: SnTriple,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_len: u32,
}

impl R2t {
    pub fn decode(b: &Bhs) -> Self {
        R2t {
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            sn: SnTriple::get(b),
            r2t_sn: u32_at(b, 36),
            buffer_offset: u32_at(b, 40),
            desired_len: u32_at(b, 44),
        }
    }

    pub fn encode(&self) -> Bhs {
        let mut b = new_bhs(Opcode::R2t, false, 0x80, 0);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        self.sn.put(&mut b);
        put32(&mut b, 36, self.r2t_sn);
        put32(&mut b, 40, self.buffer_offset);
        put32(&mut b, 44, self.desired_len);
        b
    }
}

/// NOP-In (§11.19).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NopIn {
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    pub sn: SnTriple,
}

impl NopIn {
    pub fn decode(b: &Bhs) -> Self {
        NopIn {
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            sn: SnTriple::get(b),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let mut b = new_bhs(Opcode::NopIn, false, 0x80, data_len);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        self.sn.put(&mut b);
        b
    }
}

/// Task Management Function Response (§11.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskMgmtResp {
    pub response: TmfResponse,
    pub itt: Itt,
    pub sn: SnTriple,
}

impl TaskMgmtResp {
    pub fn decode(b: &Bhs) -> Self {
        TaskMgmtResp {
            response: TmfResponse::from(b[2]),
            itt: itt(b),
            sn: SnTriple::get(b),
        }
    }

    pub fn encode(&self) -> Bhs {
        let mut b = new_bhs(Opcode::TaskMgmtResp, false, 0x80, 0);
        b[2] = self.response.into();
        put32(&mut b, 16, self.itt.0);
        self.sn.put(&mut b);
        b
    }
}

/// Login Response (§11.13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginResp {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: Itt,
    pub sn: SnTriple,
    pub status: LoginStatus,
}

impl LoginResp {
    pub fn decode(b: &Bhs) -> Self {
        let mut isid = [0u8; 6];
        isid.copy_from_slice(&b[8..14]);
        LoginResp {
            transit: b[1] & 0x80 != 0,
            cont: b[1] & 0x40 != 0,
            csg: (b[1] >> 2) & 3,
            nsg: b[1] & 3,
            version_max: b[2],
            version_active: b[3],
            isid,
            tsih: u16_at(b, 14),
            itt: itt(b),
            sn: SnTriple::get(b),
            status: LoginStatus::new(b[36], b[37]),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let flags = (u8::from(self.transit) << 7)
            | (u8::from(self.cont) << 6)
            | ((self.csg & 3) << 2)
            | (self.nsg & 3);
        let mut b = new_bhs(Opcode::LoginResp, false, flags, data_len);
        b[2] = self.version_max;
        b[3] = self.version_active;
        b[8..14].copy_from_slice(&self.isid);
        put16(&mut b, 14, self.tsih);
        put32(&mut b, 16, self.itt.0);
        self.sn.put(&mut b);
        b[36] = self.status.class;
        b[37] = self.status.detail;
        b
    }
}

/// Text Response (§11.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextResp {
    pub final_: bool,
    pub cont: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    pub sn: SnTriple,
}

impl TextResp {
    pub fn decode(b: &Bhs) -> Self {
        TextResp {
            final_: b[1] & 0x80 != 0,
            cont: b[1] & 0x40 != 0,
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            sn: SnTriple::get(b),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let flags = (u8::from(self.final_) << 7) | (u8::from(self.cont) << 6);
        let mut b = new_bhs(Opcode::TextResp, false, flags, data_len);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        self.sn.put(&mut b);
        b
    }
}

/// Logout Response (§11.15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogoutResp {
    pub response: LogoutResponse,
    pub itt: Itt,
    pub sn: SnTriple,
    pub time2wait: u16,
    pub time2retain: u16,
}

impl LogoutResp {
    pub fn decode(b: &Bhs) -> Self {
        LogoutResp {
            response: LogoutResponse::from(b[2]),
            itt: itt(b),
            sn: SnTriple::get(b),
            time2wait: u16_at(b, 40),
            time2retain: u16_at(b, 42),
        }
    }

    pub fn encode(&self) -> Bhs {
        let mut b = new_bhs(Opcode::LogoutResp, false, 0x80, 0);
        b[2] = self.response.into();
        put32(&mut b, 16, self.itt.0);
        self.sn.put(&mut b);
        put16(&mut b, 40, self.time2wait);
        put16(&mut b, 42, self.time2retain);
        b
    }
}

/// Reject (§11.17); its data segment is the rejected PDU's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reject {
    pub reason: RejectReason,
    pub sn: SnTriple,
    pub data_sn: u32,
}

impl Reject {
    pub fn decode(b: &Bhs) -> Self {
        Reject {
            reason: RejectReason::from(b[2]),
            sn: SnTriple::get(b),
            data_sn: u32_at(b, 36),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let mut b = new_bhs(Opcode::Reject, false, 0x80, data_len);
        b[2] = self.reason.into();
        put32(&mut b, 16, RESERVED_TAG);
        self.sn.put(&mut b);
        put32(&mut b, 36, self.data_sn);
        b
    }
}

/// Asynchronous Message (§11.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncMsg {
    pub lun: Lun,
    pub sn: SnTriple,
    pub event: AsyncEvent,
    pub vcode: u8,
    pub param1: u16,
    pub param2: u16,
    pub param3: u16,
}

impl AsyncMsg {
    pub fn decode(b: &Bhs) -> Self {
        AsyncMsg {
            lun: lun_at(b),
            sn: SnTriple::get(b),
            event: AsyncEvent::from(b[36]),
            vcode: b[37],
            param1: u16_at(b, 38),
            param2: u16_at(b, 40),
            param3: u16_at(b, 42),
        }
    }

    pub fn encode(&self, data_len: usize) -> Bhs {
        let mut b = new_bhs(Opcode::AsyncMsg, false, 0x80, data_len);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, RESERVED_TAG);
        self.sn.put(&mut b);
        b[36] = self.event.into();
        b[37] = self.vcode;
        put16(&mut b, 38, self.param1);
        put16(&mut b, 40, self.param2);
        put16(&mut b, 42, self.param3);
        b
    }
}

/// SNACK Request (§11.16); rejected at ErrorRecoveryLevel 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnackReq {
    pub kind: u8,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: u32,
    pub exp_stat_sn: Sn,
    pub beg_run: u32,
    pub run_length: u32,
}

impl SnackReq {
    pub fn decode(b: &Bhs) -> Self {
        SnackReq {
            kind: b[1] & 0x0f,
            lun: lun_at(b),
            itt: itt(b),
            ttt: u32_at(b, 20),
            exp_stat_sn: Sn(u32_at(b, 28)),
            beg_run: u32_at(b, 40),
            run_length: u32_at(b, 44),
        }
    }

    pub fn encode(&self) -> Bhs {
        let mut b = new_bhs(Opcode::SnackReq, false, 0x80 | (self.kind & 0x0f), 0);
        b[8..16].copy_from_slice(&self.lun.0);
        put32(&mut b, 16, self.itt.0);
        put32(&mut b, 20, self.ttt);
        put32(&mut b, 28, self.exp_stat_sn.0);
        put32(&mut b, 40, self.beg_run);
        put32(&mut b, 44, self.run_length);
        b
    }
}

/// Any PDU header, decoded by opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pdu {
    ScsiCommand(ScsiCommand),
    DataOut(DataOut),
    NopOut(NopOut),
    TaskMgmtReq(TaskMgmtReq),
    LoginReq(LoginReq),
    TextReq(TextReq),
    LogoutReq(LogoutReq),
    SnackReq(SnackReq),
    ScsiResponse(ScsiResponse),
    DataIn(DataIn),
    R2t(R2t),
    NopIn(NopIn),
    TaskMgmtResp(TaskMgmtResp),
    LoginResp(LoginResp),
    TextResp(TextResp),
    LogoutResp(LogoutResp),
    Reject(Reject),
    AsyncMsg(AsyncMsg),
    /// An opcode RFC 7143 does not define.
    Unknown(u8),
}

impl Pdu {
    /// Decodes a BHS by its opcode. Never fails: every field is read at a
    /// fixed offset of the 48 bytes, and an unknown opcode is a variant.
    pub fn parse(b: &Bhs) -> Pdu {
        match opcode(b) {
            Opcode::ScsiCommand => Pdu::ScsiCommand(ScsiCommand::decode(b)),
            Opcode::DataOut => Pdu::DataOut(DataOut::decode(b)),
            Opcode::NopOut => Pdu::NopOut(NopOut::decode(b)),
            Opcode::TaskMgmtReq => Pdu::TaskMgmtReq(TaskMgmtReq::decode(b)),
            Opcode::LoginReq => Pdu::LoginReq(LoginReq::decode(b)),
            Opcode::TextReq => Pdu::TextReq(TextReq::decode(b)),
            Opcode::LogoutReq => Pdu::LogoutReq(LogoutReq::decode(b)),
            Opcode::SnackReq => Pdu::SnackReq(SnackReq::decode(b)),
            Opcode::ScsiResponse => Pdu::ScsiResponse(ScsiResponse::decode(b)),
            Opcode::DataIn => Pdu::DataIn(DataIn::decode(b)),
            Opcode::R2t => Pdu::R2t(R2t::decode(b)),
            Opcode::NopIn => Pdu::NopIn(NopIn::decode(b)),
            Opcode::TaskMgmtResp => Pdu::TaskMgmtResp(TaskMgmtResp::decode(b)),
            Opcode::LoginResp => Pdu::LoginResp(LoginResp::decode(b)),
            Opcode::TextResp => Pdu::TextResp(TextResp::decode(b)),
            Opcode::LogoutResp => Pdu::LogoutResp(LogoutResp::decode(b)),
            Opcode::Reject => Pdu::Reject(Reject::decode(b)),
            Opcode::AsyncMsg => Pdu::AsyncMsg(AsyncMsg::decode(b)),
            Opcode::Unknown(x) => Pdu::Unknown(x),
        }
    }
}

#[cfg(test)]
mod tests;
