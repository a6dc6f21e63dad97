//! NVMe/TCP transport PDUs: the codec of the NVM Express TCP Transport
//! Specification, revision 1.0 (chapter 3, "NVMe/TCP Transport": the PDU
//! common header, the PDU-specific headers of the nine PDU types, header
//! and data digests, PDU data alignment). No I/O: bytes in, typed headers
//! and data ranges out; typed headers in, bytes out.
//!
//! Every PDU starts with an 8-byte common header (CH): PDU-Type, FLAGS,
//! HLEN (the length of CH and the PDU-specific header, PSH), PDO (where
//! the data starts, counted from the start of the PDU; 0 without data) and
//! PLEN (the whole PDU, digests and padding included), little-endian. A
//! header digest (HDGST, CRC32C of CH and PSH) follows the PSH when the
//! connection negotiated it and FLAGS says so; the data starts at PDO, after
//! padding up to the receiver's alignment; a data digest (DDGST, CRC32C of
//! the data) ends the PDU.
//!
//! | type | PDU | direction | HLEN |
//! |---|---|---|---|
//! | 00h | ICReq | host to controller | 128 |
//! | 01h | ICResp | controller to host | 128 |
//! | 02h | H2CTermReq | host to controller | 24 |
//! | 03h | C2HTermReq | controller to host | 24 |
//! | 04h | CapsuleCmd (64-byte SQE, in-capsule data) | host to controller | 72 |
//! | 05h | CapsuleResp (16-byte CQE) | controller to host | 24 |
//! | 06h | H2CData | host to controller | 24 |
//! | 07h | C2HData | controller to host | 24 |
//! | 09h | R2T | controller to host | 24 |
//!
//! [`frame`] checks a received PDU before anything is allocated for it:
//! a known type with its fixed HLEN, PLEN within the limit the receiver
//! set, PDO and the digests where the flags put them; a header that fails
//! becomes a [`Fatal`] error, the fatal error status and information a
//! TermReq carries back (and the connection then ends).
//!
//! [`capsule`] decodes what the capsules carry: submission and completion
//! queue entries, SGL descriptors, the Connect command's data.

pub mod capsule;

use iscsi_wire::digest::crc32c;

/// Length of the common header.
pub const CH_LEN: usize = 8;
/// Length of a digest.
pub const DIGEST_LEN: usize = 4;
/// Length of the header of H2CData, C2HData and R2T (common header and
/// PSH), before any header digest.
pub const DATA_HEADER_LEN: usize = 24;
/// Length of ICReq and ICResp (no data, no digests).
pub const IC_LEN: usize = 128;
/// The smallest MAXH2CDATA a controller may announce.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// Longest TermReq: its header and the first 128 bytes of the PDU header
/// in error.
pub const MAX_TERM_LEN: usize = 152;

/// FLAGS: a header digest follows the PSH.
pub const HDGSTF: u8 = 0x01;
/// FLAGS: a data digest follows the data.
pub const DDGSTF: u8 = 0x02;
/// FLAGS (H2CData, C2HData): the last data PDU of the command's transfer.
pub const LAST_PDU: u8 = 0x04;
/// FLAGS (C2HData with LAST_PDU): the command succeeded, no CapsuleResp
/// follows.
pub const SUCCESS: u8 = 0x08;

/// The PDU types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2cTermReq = 0x02,
    C2hTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2cData = 0x06,
    C2hData = 0x07,
    R2t = 0x09,
}

impl PduType {
    /// The type of code `b`, if it is one.
    pub fn from_code(b: u8) -> Option<PduType> {
        Some(match b {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2cTermReq,
            0x03 => PduType::C2hTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2cData,
            0x07 => PduType::C2hData,
            0x09 => PduType::R2t,
            _ => return None,
        })
    }

    /// The fixed HLEN of the type.
    pub fn hlen(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_LEN,
            PduType::CapsuleCmd => CH_LEN + 64,
            _ => 24,
        }
    }

    /// Whether PDUs of this type may carry data.
    pub fn has_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd
                | PduType::H2cData
                | PduType::C2hData
                | PduType::H2cTermReq
                | PduType::C2hTermReq
        )
    }

    /// Whether PDUs of this type may carry digests (all but the
    /// connection's first two and the TermReqs).
    pub fn has_digests(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq
        )
    }
}

/// The common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: PduType,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

/// Fatal error status of a TermReq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fes {
    /// A header field is wrong; the information is its byte offset.
    InvalidHeaderField = 0x01,
    /// A PDU came where it may not.
    SequenceError = 0x02,
    /// The header digest did not match.
    HeaderDigest = 0x03,
    /// Data outside the command's buffer.
    DataOutOfRange = 0x04,
    /// More data than MAXH2CDATA, or more R2Ts than allowed.
    DataLimitExceeded = 0x05,
    /// A parameter (PFV, digests, alignment) not supported; the
    /// information is the field's byte offset.
    UnsupportedParameter = 0x06,
}

/// Why a received PDU cannot be taken: what a TermReq says back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NVMe/TCP fatal error {fes:?} (information {fei:#x})")]
pub struct Fatal {
    pub fes: Fes,
    /// Fatal error information: the offset of the field in error, for
    /// the header field and parameter errors; else 0.
    pub fei: u32,
}

impl Fatal {
    pub fn field(offset: u32) -> Fatal {
        Fatal {
            fes: Fes::InvalidHeaderField,
            fei: offset,
        }
    }
}

/// What the receiver negotiated, for framing what it receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Negotiated {
    /// Header digests on (PDUs must carry HDGSTF).
    pub header_digest: bool,
    /// Data digests on (PDUs with data must carry DDGSTF).
    pub data_digest: bool,
    /// The receiver's alignment of data, in bytes (4 × (PDA + 1)).
    pub alignment: u32,
    /// The most data one PDU may carry.
    pub max_data: u32,
}

/// A whole PDU found at the start of a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub ch: CommonHeader,
    /// Where the data is in the buffer (empty without data).
    pub data: std::ops::Range<usize>,
    /// The PDU's length: where the next one starts.
    pub len: usize,
}

/// Decodes the common header in `b` (at least [`CH_LEN`] bytes).
pub fn common_header(b: &[u8]) -> Result<CommonHeader, Fatal> {
    let pdu_type = PduType::from_code(b[0]).ok_or(Fatal::field(0))?;
    Ok(CommonHeader {
        pdu_type,
        flags: b[1],
        hlen: b[2],
        pdo: b[3],
        plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    })
}

/// The PDU at the start of `buf`, checked against `n`: `Ok(None)` until
/// the whole of it has arrived (its common header tells how long it is,
/// bounded before anything waits for it).
pub fn frame(buf: &[u8], n: &Negotiated) -> Result<Option<Frame>, Fatal> {
    if buf.len() < CH_LEN {
        return Ok(None);
    }
    let ch = common_header(buf)?;
    let t = ch.pdu_type;
    let hlen = usize::from(ch.hlen);
    if hlen != t.hlen() {
        return Err(Fatal::field(2));
    }
    let hd = t.has_digests() && n.header_digest;
    let dd = t.has_digests() && n.data_digest;
    if t.has_digests() && ((ch.flags & HDGSTF != 0) != hd) {
        return Err(Fatal::field(1));
    }
    let header_end = hlen + if hd { DIGEST_LEN } else { 0 };
    let plen = ch.plen as usize;
    let max = match t {
        PduType::IcReq | PduType::IcResp => IC_LEN,
        PduType::H2cTermReq | PduType::C2hTermReq => MAX_TERM_LEN,
        // PDO is one byte: the data starts within the first 255.
        _ => 255 + n.max_data as usize + DIGEST_LEN,
    };
    if plen < header_end || plen > max {
        return Err(Fatal::field(4));
    }
    let pdo = usize::from(ch.pdo);
    let data = if plen == header_end {
        if pdo != 0 {
            return Err(Fatal::field(3));
        }
        header_end..header_end
    } else {
        if !t.has_data() {
            return Err(Fatal::field(4));
        }
        // TermReqs carry the header in error right after theirs.
        let start = if t.has_digests() { pdo } else { hlen };
        if t.has_digests() {
            let align = n.alignment.max(4) as usize;
            if pdo < header_end || pdo % align != 0 {
                return Err(Fatal::field(3));
            }
        }
        let digest = if dd && ch.flags & DDGSTF != 0 {
            DIGEST_LEN
        } else {
            0
        };
        if dd != (ch.flags & DDGSTF != 0) {
            return Err(Fatal::field(1));
        }
        if start + digest > plen {
            return Err(Fatal::field(3));
        }
        let len = plen - start - digest;
        if t.has_digests() && len > n.max_data as usize {
            return Err(Fatal {
                fes: Fes::DataLimitExceeded,
                fei: 0,
            });
        }
        start..start + len
    };
    if buf.len() < plen {
        return Ok(None);
    }
    if hd {
        let want = u32::from_le_bytes(buf[hlen..hlen + 4].try_into().expect("4 bytes"));
        if crc32c(&buf[..hlen]) != want {
            return Err(Fatal {
                fes: Fes::HeaderDigest,
                fei: 0,
            });
        }
    }
    Ok(Some(Frame {
        ch,
        data,
        len: plen,
    }))
}

/// Whether the data digest of `f` in `buf` matches (true when it has
/// none). A mismatch is not fatal: the command fails with a transient
/// transport error and the connection goes on.
pub fn data_digest_ok(buf: &[u8], f: &Frame) -> bool {
    if f.ch.flags & DDGSTF == 0 || f.data.is_empty() {
        return true;
    }
    let d = &buf[f.data.end..f.data.end + DIGEST_LEN];
    crc32c(&buf[f.data.clone()]) == u32::from_le_bytes(d.try_into().expect("4 bytes"))
}

/// ICReq (the host's) and ICResp (the controller's) fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Ic {
    /// PDU format version: 0.
    pub pfv: u16,
    /// HPDA (ICReq) or CPDA (ICResp): the sender's required data
    /// alignment, 0's based dwords (0..=31).
    pub pda: u8,
    pub header_digest: bool,
    pub data_digest: bool,
    /// MAXR2T (ICReq, 0's based) or MAXH2CDATA (ICResp, bytes).
    pub max: u32,
}

impl Ic {
    /// Decodes the PSH of an ICReq or ICResp (`b` is the whole PDU).
    pub fn decode(b: &[u8; IC_LEN]) -> Ic {
        Ic {
            pfv: u16::from_le_bytes([b[8], b[9]]),
            pda: b[10],
            header_digest: b[11] & 0x01 != 0,
            data_digest: b[11] & 0x02 != 0,
            max: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        }
    }

    /// Encodes an ICReq (`resp` false) or ICResp.
    pub fn encode(&self, resp: bool) -> [u8; IC_LEN] {
        let mut b = [0u8; IC_LEN];
        let t = if resp {
            PduType::IcResp
        } else {
            PduType::IcReq
        };
        put_ch(&mut b, t, 0, 0, IC_LEN as u32);
        b[8..10].copy_from_slice(&self.pfv.to_le_bytes());
        b[10] = self.pda;
        b[11] = u8::from(self.header_digest) | (u8::from(self.data_digest) << 1);
        b[12..16].copy_from_slice(&self.max.to_le_bytes());
        b
    }
}

/// The PSH of H2CData, C2HData and R2T: the command (CCCID), the
/// transfer tag (H2CData, R2T), the offset and length in the command's
/// data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DataHeader {
    pub cccid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub length: u32,
}

impl DataHeader {
    /// Decodes the PSH from a 24-byte header.
    pub fn decode(b: &[u8]) -> DataHeader {
        DataHeader {
            cccid: u16::from_le_bytes([b[8], b[9]]),
            ttag: u16::from_le_bytes([b[10], b[11]]),
            offset: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
            length: u32::from_le_bytes([b[16], b[17], b[18], b[19]]),
        }
    }

    fn put(&self, b: &mut [u8]) {
        b[8..10].copy_from_slice(&self.cccid.to_le_bytes());
        b[10..12].copy_from_slice(&self.ttag.to_le_bytes());
        b[12..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.length.to_le_bytes());
    }
}

/// The longest header [`Layout::header`] makes: a 72-byte CapsuleCmd
/// header and its digest, padded to an alignment of at most 128 bytes.
pub const HEADER_MAX: usize = 256;

/// A PDU header laid out on the stack ([`Layout::header`]).
#[derive(Clone, Copy)]
pub struct HeaderBuf {
    b: [u8; HEADER_MAX],
    len: usize,
}

impl std::ops::Deref for HeaderBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.b[..self.len]
    }
}

impl std::ops::DerefMut for HeaderBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.b[..self.len]
    }
}

impl std::fmt::Debug for HeaderBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("HeaderBuf").field(&&self[..]).finish()
    }
}

/// How the sender lays out the PDUs it encodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Layout {
    pub header_digest: bool,
    pub data_digest: bool,
    /// The receiver's data alignment in bytes (4 × (its PDA + 1)).
    pub alignment: u32,
}

impl Layout {
    /// The header (CH, PSH, digest, padding up to PDO) of a PDU of type
    /// `t` with PSH bytes `psh` and `data_len` bytes of data; the data and
    /// then [`Layout::data_digest_of`] follow it on the wire. Built on the
    /// stack: nothing is allocated per PDU.
    pub fn header(&self, t: PduType, flags: u8, psh: &[u8], data_len: usize) -> HeaderBuf {
        let hlen = CH_LEN + psh.len();
        let hd = self.header_digest && t.has_digests();
        let dd = self.data_digest && t.has_digests() && data_len > 0;
        let header_end = hlen + if hd { DIGEST_LEN } else { 0 };
        let pdo = if data_len > 0 {
            header_end.next_multiple_of(self.alignment.clamp(4, 128) as usize)
        } else {
            0
        };
        let plen = if data_len > 0 {
            pdo + data_len + if dd { DIGEST_LEN } else { 0 }
        } else {
            header_end
        };
        let mut h = HeaderBuf {
            b: [0u8; HEADER_MAX],
            len: if data_len > 0 { pdo } else { header_end },
        };
        let b = &mut h.b;
        let flags = flags | if hd { HDGSTF } else { 0 } | if dd { DDGSTF } else { 0 };
        put_ch(b, t, flags, pdo as u8, plen as u32);
        b[CH_LEN..hlen].copy_from_slice(psh);
        if hd {
            let c = crc32c(&b[..hlen]);
            b[hlen..hlen + DIGEST_LEN].copy_from_slice(&c.to_le_bytes());
        }
        h
    }

    /// The data digest to send after `data`, if digests are on.
    pub fn data_digest_of(&self, data: &[u8]) -> Option<[u8; 4]> {
        (self.data_digest && !data.is_empty()).then(|| crc32c(data).to_le_bytes())
    }

    /// A CapsuleResp carrying `cqe`.
    pub fn capsule_resp(&self, cqe: &[u8; 16]) -> HeaderBuf {
        self.header(PduType::CapsuleResp, 0, cqe, 0)
    }

    /// The header of a C2HData PDU of `h.length` bytes; `last` and
    /// `success` set LAST_PDU and SUCCESS.
    pub fn c2h_data(&self, h: &DataHeader, last: bool, success: bool) -> HeaderBuf {
        let mut psh = [0u8; 24];
        h.put(&mut psh);
        let flags = if last { LAST_PDU } else { 0 } | if success { SUCCESS } else { 0 };
        self.header(PduType::C2hData, flags, &psh[8..], h.length as usize)
    }

    /// The header of an H2CData PDU of `h.length` bytes; `last` sets
    /// LAST_PDU.
    pub fn h2c_data(&self, h: &DataHeader, last: bool) -> HeaderBuf {
        let mut psh = [0u8; 24];
        h.put(&mut psh);
        let flags = if last { LAST_PDU } else { 0 };
        self.header(PduType::H2cData, flags, &psh[8..], h.length as usize)
    }

    /// An R2T for `h.length` bytes at `h.offset`.
    pub fn r2t(&self, h: &DataHeader) -> HeaderBuf {
        let mut psh = [0u8; 24];
        h.put(&mut psh);
        self.header(PduType::R2t, 0, &psh[8..], 0)
    }
}

/// A C2HTermReq: fatal error `f`, and (up to 128 bytes of) the header in
/// error.
pub fn c2h_term_req(f: Fatal, bad_header: &[u8]) -> Vec<u8> {
    let hdr = &bad_header[..bad_header.len().min(MAX_TERM_LEN - 24)];
    let mut b = vec![0u8; 24 + hdr.len()];
    let plen = b.len() as u32;
    put_ch(&mut b, PduType::C2hTermReq, 0, 0, plen);
    b[8..10].copy_from_slice(&(f.fes as u16).to_le_bytes());
    b[10..14].copy_from_slice(&f.fei.to_le_bytes());
    b[24..].copy_from_slice(hdr);
    b
}

fn put_ch(b: &mut [u8], t: PduType, flags: u8, pdo: u8, plen: u32) {
    b[0] = t as u8;
    b[1] = flags;
    b[2] = t.hlen() as u8;
    b[3] = pdo;
    b[4..8].copy_from_slice(&plen.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn neg(hd: bool, dd: bool) -> Negotiated {
        Negotiated {
            header_digest: hd,
            data_digest: dd,
            alignment: 4,
            max_data: 128 << 10,
        }
    }

    #[test]
    fn icreq_and_icresp_round_trip() {
        let ic = Ic {
            pfv: 0,
            pda: 0,
            header_digest: true,
            data_digest: false,
            max: 0,
        };
        let b = ic.encode(false);
        assert_eq!((b[0], b[2], b[3]), (0x00, 128, 0));
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 128);
        let f = frame(&b, &Negotiated::default()).unwrap().unwrap();
        assert_eq!(
            (f.ch.pdu_type, f.len, f.data.len()),
            (PduType::IcReq, 128, 0)
        );
        assert_eq!(Ic::decode(&b), ic);
        let resp = Ic { max: 131072, ..ic }.encode(true);
        assert_eq!(resp[0], 0x01);
        assert_eq!(Ic::decode(&resp).max, 131072);
    }

    #[test]
    fn data_pdus_with_digests_and_alignment_round_trip() {
        for (hd, dd, align) in [
            (false, false, 4),
            (true, false, 4),
            (true, true, 4),
            (true, true, 32),
        ] {
            let l = Layout {
                header_digest: hd,
                data_digest: dd,
                alignment: align,
            };
            let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
            let h = DataHeader {
                cccid: 7,
                ttag: 0,
                offset: 4096,
                length: data.len() as u32,
            };
            let mut pdu = l.c2h_data(&h, true, true).to_vec();
            assert_eq!(pdu.len() % align as usize, 0, "data starts aligned");
            pdu.extend_from_slice(&data);
            if let Some(d) = l.data_digest_of(&data) {
                pdu.extend_from_slice(&d);
            }
            let n = Negotiated {
                alignment: align,
                ..neg(hd, dd)
            };
            // Not whole yet: wait.
            assert_eq!(frame(&pdu[..pdu.len() - 1], &n).unwrap(), None);
            let f = frame(&pdu, &n).unwrap().unwrap();
            assert_eq!(f.len, pdu.len());
            assert_eq!(&pdu[f.data.clone()], &data[..]);
            assert_eq!(f.ch.flags & (LAST_PDU | SUCCESS), LAST_PDU | SUCCESS);
            assert_eq!(DataHeader::decode(&pdu), h);
            assert!(data_digest_ok(&pdu, &f));
            if dd {
                let mut bad = pdu.clone();
                let k = f.data.start + 10;
                bad[k] ^= 1;
                assert!(!data_digest_ok(&bad, &f));
            }
            if hd {
                let mut bad = pdu.clone();
                bad[9] ^= 1;
                assert_eq!(frame(&bad, &n).unwrap_err().fes, Fes::HeaderDigest);
            }
        }
    }

    #[test]
    fn capsule_resp_and_r2t_have_no_data() {
        let l = Layout::default();
        let r = l.capsule_resp(&[0xab; 16]);
        assert_eq!(r.len(), 24);
        let f = frame(&r, &neg(false, false)).unwrap().unwrap();
        assert_eq!(
            (f.ch.pdu_type, f.ch.pdo, f.data.len()),
            (PduType::CapsuleResp, 0, 0)
        );
        let h = DataHeader {
            cccid: 3,
            ttag: 9,
            offset: 0,
            length: 65536,
        };
        let r2t = l.r2t(&h);
        assert_eq!(DataHeader::decode(&r2t), h);
        assert_eq!(frame(&r2t, &neg(false, false)).unwrap().unwrap().len, 24);
    }

    #[test]
    fn hostile_headers_are_fatal_before_anything_waits() {
        let n = neg(false, false);
        let mut b = Layout::default().capsule_resp(&[0; 16]);
        b[0] = 0x08; // no such type
        assert_eq!(frame(&b, &n).unwrap_err(), Fatal::field(0));
        let mut b = Layout::default().capsule_resp(&[0; 16]);
        b[2] = 25; // HLEN not the type's
        assert_eq!(frame(&b, &n).unwrap_err(), Fatal::field(2));
        // PLEN past the data limit: refused from the common header alone.
        let mut b = Layout::default()
            .header(PduType::H2cData, 0, &[0; 16], 0)
            .to_vec();
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(frame(&b[..8], &n).unwrap_err(), Fatal::field(4));
        // Data in a PDU that carries none.
        let mut b = Layout::default().capsule_resp(&[0; 16]);
        b[4..8].copy_from_slice(&64u32.to_le_bytes());
        assert_eq!(frame(&b, &n).unwrap_err(), Fatal::field(4));
        // A header digest flag the connection did not negotiate.
        let mut b = Layout::default().capsule_resp(&[0; 16]);
        b[1] |= HDGSTF;
        assert_eq!(frame(&b, &n).unwrap_err(), Fatal::field(1));
    }

    #[test]
    fn term_req_carries_the_header_in_error() {
        let bad = [0x55u8; 200];
        let t = c2h_term_req(Fatal::field(2), &bad);
        assert_eq!(t.len(), MAX_TERM_LEN);
        let f = frame(&t, &neg(true, true)).unwrap().unwrap();
        assert_eq!(f.ch.pdu_type, PduType::C2hTermReq);
        assert_eq!(f.data, 24..MAX_TERM_LEN);
        assert_eq!(
            u16::from_le_bytes([t[8], t[9]]),
            Fes::InvalidHeaderField as u16
        );
        assert_eq!(u32::from_le_bytes(t[10..14].try_into().unwrap()), 2);
    }

    proptest! {
        /// Any bytes: a frame, a wait, or a fatal error, never a panic,
        /// and a frame never points outside the buffer.
        #[test]
        fn any_bytes_frame_safely(b in proptest::collection::vec(any::<u8>(), 0..400),
                                  hd in any::<bool>(), dd in any::<bool>()) {
            let n = Negotiated { max_data: 256, ..neg(hd, dd) };
            if let Ok(Some(f)) = frame(&b, &n) {
                prop_assert!(f.len <= b.len());
                prop_assert!(f.data.end <= f.len);
                let _ = data_digest_ok(&b, &f);
            }
        }
    }
}
