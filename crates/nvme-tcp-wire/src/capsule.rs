//! What command and response capsules carry: the 64-byte submission queue
//! entry (NVM Express Base Specification 2.0, "Submission Queue Entry"),
//! its SGL descriptor (the same, "Scatter Gather List (SGL)": on NVMe/TCP
//! a Transport SGL Data Block for data the controller asks for with R2T,
//! or an Offset Data Block for in-capsule data), the 16-byte completion
//! queue entry ("Completion Queue Entry") and its status field, and the
//! Fabrics command set's Connect data (NVMe over Fabrics 1.1, "Connect
//! Command and Response"). Little-endian throughout.

/// The Fabrics command opcode (all Fabrics commands; FCTYPE says which).
pub const OPC_FABRICS: u8 = 0x7f;

/// Fabrics command types.
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// A submission queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sqe(pub [u8; 64]);

impl Sqe {
    /// Command dword `n` (0..=15).
    pub fn dw(&self, n: usize) -> u32 {
        u32::from_le_bytes(self.0[4 * n..4 * n + 4].try_into().expect("4 bytes"))
    }

    /// The opcode.
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// FUSE (bits 1:0 of byte 1): 0 normal, 1 first and 2 second of a
    /// fused pair (Compare and Write).
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x03
    }

    /// PSDT (bits 7:6 of byte 1): fabrics use SGLs (01b or 10b), never PRPs.
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    /// The command identifier.
    pub fn cid(&self) -> u16 {
        u16::from_le_bytes([self.0[2], self.0[3]])
    }

    /// The namespace.
    pub fn nsid(&self) -> u32 {
        self.dw(1)
    }

    /// The Fabrics command type (byte 4 of a Fabrics command).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// The data pointer as an SGL descriptor (bytes 24..40).
    pub fn sgl(&self) -> Sgl {
        Sgl::decode(self.0[24..40].try_into().expect("16 bytes"))
    }
}

/// An SGL descriptor, as NVMe/TCP uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sgl {
    /// Data Block, Offset subtype (01h): the data is in the capsule, at
    /// `offset` into its data.
    InCapsule { offset: u64, length: u32 },
    /// Transport SGL Data Block (type 5h), transport-specific subtype
    /// (Ah): the data moves in separate data PDUs.
    Transport { length: u32 },
    /// Any other type or subtype: not supported here.
    Other { id: u8 },
}

impl Sgl {
    /// Decodes a 16-byte descriptor.
    pub fn decode(b: &[u8; 16]) -> Sgl {
        let addr = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        let length = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        match b[15] {
            0x01 => Sgl::InCapsule {
                offset: addr,
                length,
            },
            0x5a => Sgl::Transport { length },
            id => Sgl::Other { id },
        }
    }

    /// Encodes it.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        match *self {
            Sgl::InCapsule { offset, length } => {
                b[0..8].copy_from_slice(&offset.to_le_bytes());
                b[8..12].copy_from_slice(&length.to_le_bytes());
                b[15] = 0x01;
            }
            Sgl::Transport { length } => {
                b[8..12].copy_from_slice(&length.to_le_bytes());
                b[15] = 0x5a;
            }
            Sgl::Other { id } => b[15] = id,
        }
        b
    }
}

/// A completion status: status code type and status code, DNR and More.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Status {
    /// Status code type: 0 generic, 1 command specific, 2 media and data
    /// integrity, 3 path related.
    pub sct: u8,
    pub sc: u8,
    /// Do not retry.
    pub dnr: bool,
}

impl Status {
    /// A generic command status (status code type 0).
    pub const fn generic(sc: u8, dnr: bool) -> Status {
        Status { sct: 0, sc, dnr }
    }

    /// A command specific status (status code type 1), do not retry.
    pub const fn specific(sc: u8) -> Status {
        Status {
            sct: 1,
            sc,
            dnr: true,
        }
    }

    /// A media and data integrity error (status code type 2).
    pub const fn media(sc: u8, dnr: bool) -> Status {
        Status { sct: 2, sc, dnr }
    }

    /// A path related status (status code type 3).
    pub const fn path(sc: u8) -> Status {
        Status {
            sct: 3,
            sc,
            dnr: false,
        }
    }

    /// Whether it is a success.
    pub const fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    pub const SUCCESS: Status = Status::generic(0x00, false);
    /// Invalid Command Opcode (what an unsupported command gets).
    pub const INVALID_OPCODE: Status = Status::generic(0x01, true);
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status::generic(0x02, true);
    /// Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(0x04, false);
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = Status::generic(0x0b, true);
    /// Transient Transport Error (a data digest that failed).
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status::generic(0x22, false);
    /// LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(0x80, true);

    /// The 15 status bits of the CQE's dword 3 (bits 31:17), without the
    /// phase tag (bit 16, unused on fabrics).
    pub fn field(&self) -> u16 {
        u16::from(self.sc) | (u16::from(self.sct & 0x7) << 8) | (u16::from(self.dnr) << 14)
    }

    /// The status of a 15-bit field.
    pub fn from_field(f: u16) -> Status {
        Status {
            sc: (f & 0xff) as u8,
            sct: ((f >> 8) & 0x7) as u8,
            dnr: f & (1 << 14) != 0,
        }
    }
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command specific result (dword 0; Connect: the controller ID).
    pub result: u64,
    /// Submission queue head pointer.
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    /// Encodes it (dwords 0-1 are the result, as Fabrics responses use
    /// both).
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&(self.status.field() << 1).to_le_bytes());
        b
    }

    /// Decodes it.
    pub fn decode(b: &[u8; 16]) -> Cqe {
        Cqe {
            result: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            sqhd: u16::from_le_bytes([b[8], b[9]]),
            sqid: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status: Status::from_field(u16::from_le_bytes([b[14], b[15]]) >> 1),
        }
    }
}

/// Length of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// The Connect command's data: who connects, to what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    pub host_id: [u8; 16],
    /// 0xFFFF: any controller (dynamic model); else the admin queue's
    /// controller, for an I/O queue.
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

/// Why Connect data is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectDataError {
    #[error("the Connect data is {0} bytes, not 1024")]
    Length(usize),
    #[error("an NQN is not NUL-terminated UTF-8 within its 256 bytes")]
    Nqn,
}

impl ConnectData {
    /// Decodes the 1024 bytes of data of a Connect command.
    pub fn decode(b: &[u8]) -> Result<ConnectData, ConnectDataError> {
        if b.len() != CONNECT_DATA_LEN {
            return Err(ConnectDataError::Length(b.len()));
        }
        let nqn = |f: &[u8]| {
            let end = f
                .iter()
                .position(|&c| c == 0)
                .ok_or(ConnectDataError::Nqn)?;
            std::str::from_utf8(&f[..end])
                .map(str::to_owned)
                .map_err(|_| ConnectDataError::Nqn)
        };
        Ok(ConnectData {
            host_id: b[0..16].try_into().expect("16 bytes"),
            cntlid: u16::from_le_bytes([b[16], b[17]]),
            subnqn: nqn(&b[256..512])?,
            hostnqn: nqn(&b[512..768])?,
        })
    }

    /// Encodes it (NQNs longer than 255 bytes are cut).
    pub fn encode(&self) -> [u8; CONNECT_DATA_LEN] {
        let mut b = [0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.host_id);
        b[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        for (at, s) in [(256, &self.subnqn), (512, &self.hostnqn)] {
            let n = s.len().min(255);
            b[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_fields_and_sgls() {
        let mut b = [0u8; 64];
        b[0] = 0x01; // Write
        b[1] = 0x40; // PSDT 01b
        b[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[24..40].copy_from_slice(
            &Sgl::InCapsule {
                offset: 0,
                length: 4096,
            }
            .encode(),
        );
        b[40..44].copy_from_slice(&77u32.to_le_bytes()); // CDW10: SLBA low
        let s = Sqe(b);
        assert_eq!(
            (s.opcode(), s.psdt(), s.fuse(), s.cid(), s.nsid()),
            (1, 1, 0, 0x1234, 1)
        );
        assert_eq!(s.dw(10), 77);
        assert_eq!(
            s.sgl(),
            Sgl::InCapsule {
                offset: 0,
                length: 4096
            }
        );
        let t = Sgl::Transport { length: 1 << 20 };
        assert_eq!(Sgl::decode(&t.encode()), t);
        assert_eq!(t.encode()[15], 0x5a);
        assert_eq!(Sgl::decode(&[0; 16]), Sgl::Other { id: 0 });
    }

    #[test]
    fn cqe_status_round_trips() {
        let c = Cqe {
            result: 0x0001,
            sqhd: 5,
            sqid: 1,
            cid: 9,
            status: Status::INVALID_OPCODE,
        };
        let b = c.encode();
        // Status field: SC 01h in bits 24:17, DNR bit 31.
        let dw3 = u32::from_le_bytes(b[12..16].try_into().unwrap());
        assert_eq!((dw3 >> 17) & 0xff, 0x01);
        assert_eq!(dw3 >> 31, 1);
        assert_eq!(Cqe::decode(&b), c);
        assert_eq!(
            Cqe::decode(&Cqe::default().encode()).status,
            Status::SUCCESS
        );
    }

    #[test]
    fn connect_data_round_trips_and_bad_nqns_are_refused() {
        let d = ConnectData {
            host_id: [7; 16],
            cntlid: 0xffff,
            subnqn: "nqn.2026-11.io.ironsan:disk0".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        };
        let b = d.encode();
        assert_eq!(ConnectData::decode(&b).unwrap(), d);
        assert_eq!(
            ConnectData::decode(&b[..100]),
            Err(ConnectDataError::Length(100))
        );
        let mut bad = b;
        bad[256..512].fill(b'a');
        assert_eq!(ConnectData::decode(&bad), Err(ConnectDataError::Nqn));
        bad[256..512].fill(0);
        bad[256] = 0xff;
        assert_eq!(ConnectData::decode(&bad), Err(ConnectDataError::Nqn));
    }
}
