//! One NVMe/TCP connection, controller side: the transport state machine of
//! a queue pair (NVMe/TCP Transport Specification 1.0, "Connection
//! Establishment and Connection Termination", "Data Transfers"), sans-IO.
//!
//! The driver frames received bytes with [`Queue::frame`] and hands each
//! PDU to [`Queue::receive`]; what the host wants executed comes back as a
//! [`Command`] (its submission queue entry and its data, in-capsule or
//! gathered from H2CData PDUs). The driver executes it and calls
//! [`Queue::complete`], which queues the C2HData PDU(s) and the response
//! capsule in [`Queue::out`], for the driver to write.
//!
//! - Connection establishment: the first PDU must be an ICReq (PFV 0, HPDA
//!   at most 31); the ICResp grants the digests the host asked for, CPDA 0
//!   (no data alignment asked of the host) and [`MAXH2CDATA`].
//! - Host to controller data: up to the in-capsule limit it comes in the
//!   command capsule (an Offset SGL, offset 0: ICDOFF is 0); beyond it the
//!   command carries a Transport SGL and the controller asks for the data
//!   with one R2T for the whole length; the host sends it in H2CData PDUs of
//!   at most MAXH2CDATA bytes, in order. Their slices of the receive
//!   buffer are kept, not copied (docs/ARCHITECTURE.md "No allocation or
//!   copy per I/O that can be avoided").
//! - Controller to host data: one C2HData PDU with LAST_PDU, followed by
//!   the response capsule; when the host disabled SQ flow control at
//!   Connect (CATTR bit 2), a successful command's completion is folded
//!   into the C2HData PDU with the SUCCESS flag instead.
//! - A fatal transport error (a bad header, data outside a command's
//!   buffer, a PDU out of sequence) is a C2HTermReq, after which the
//!   connection ends; a data digest that does not match fails only its
//!   command (Transient Transport Error).

use bufpool::Chain;
use bytes::{Buf, Bytes, BytesMut};
use iscsi_wire::outbox::Outbox;
use nvme_tcp_wire::capsule::{Cqe, Sgl, Sqe, Status, OPC_FABRICS};
use nvme_tcp_wire::{
    c2h_term_req, data_digest_ok, frame, DataHeader, Fatal, Fes, Frame, Ic, Layout, Negotiated,
    PduType, IC_LEN, LAST_PDU,
};

/// MAXH2CDATA granted: the most data one H2CData PDU may carry (SPDK and
/// nvmet grant 128 KiB too).
pub const MAXH2CDATA: u32 = 128 * 1024;

/// In-capsule data accepted on an I/O queue (IOCCSZ is 64 bytes more).
pub const IO_IN_CAPSULE: u32 = 16 * 1024;

/// In-capsule data the Linux host sends on the admin queue (8 KiB), with
/// room: admin commands may carry that much in the capsule.
pub const ADMIN_IN_CAPSULE: u32 = 8 * 1024;

/// Most commands with data outstanding (R2T sent, H2CData awaited) on one
/// queue: as many as the queue holds.
const MAX_WRITES: usize = 1024;

/// Writes of at least this many bytes sent with R2T are gathered into one
/// pooled buffer of their own, which the medium may keep (a RAM LUN adopts
/// whole chunks), rather than kept as slices of the receive buffer: the
/// receive buffer is then reused at once instead of reallocated while
/// they wait.
pub const OWN_BUFFER_MIN: u32 = 64 * 1024;

/// What a PDU asks the controller to do.
#[derive(Debug)]
pub struct Command {
    pub sqe: Sqe,
    /// Its data from the host (empty without).
    pub data: Chain,
    /// The data failed its digest: fail the command with a transient
    /// transport error.
    pub bad_digest: bool,
    /// `data` is one buffer of the command's own ([`OWN_BUFFER_MIN`]).
    pub owned: bool,
}

/// A large H2CData PDU whose data is being received straight into its
/// command's own buffer ([`Queue::try_land`]): the data read from the
/// socket goes to [`Queue::landing_room`], its digest (if any) then
/// through the receive buffer to [`Queue::finish_landing`].
#[derive(Debug, Clone, Copy)]
pub struct Landing {
    slot: usize,
    /// Where this PDU's data starts in the command's buffer.
    start: usize,
    len: usize,
    /// Data bytes still to come.
    pub left: usize,
    /// Digest bytes that follow the data.
    pub digest: usize,
    last: bool,
}

/// Smallest H2CData data received straight into its command's buffer.
pub const LAND_MIN: usize = 16 * 1024;

/// Why the connection ends.
#[derive(Debug)]
pub enum Stop {
    /// A fatal transport error: the C2HTermReq is queued in
    /// [`Queue::out`]; send it, then close.
    Fatal(Fatal),
    /// The host terminated the connection (H2CTermReq).
    HostTerminated { fes: u16 },
}

/// A command whose data is being received in H2CData PDUs.
#[derive(Debug)]
struct Gathering {
    sqe: Sqe,
    want: u32,
    /// Received so far, as slices (small writes)…
    data: Chain,
    /// …or copied into the command's own buffer (large ones).
    own: Option<bytes::BytesMut>,
    bad_digest: bool,
}

impl Gathering {
    fn received(&self) -> usize {
        self.own.as_ref().map_or(self.data.len(), |b| b.len())
    }
}

/// The transport state of one connection (module docs).
#[derive(Debug)]
pub struct Queue {
    /// Waiting for the ICReq.
    initialized: bool,
    /// How received PDUs are checked.
    rx: Negotiated,
    /// How sent PDUs are laid out.
    tx: Layout,
    /// The in-capsule data this queue accepts.
    in_capsule: u32,
    /// The most data one command may carry (MDTS).
    max_transfer: u32,
    /// Commands waiting for their data, by transfer tag.
    gathering: Vec<Option<Gathering>>,
    free_tags: Vec<u16>,
    /// Submission queue head, reported in every completion.
    sqhd: u16,
    /// Submission queue size (entries), set by Connect.
    sqsize: u16,
    /// SQ flow control disabled at Connect: completions may ride in the
    /// last C2HData PDU.
    sqflow_disabled: bool,
    /// The queue's ID (0: admin), set by Connect.
    pub qid: u16,
    /// What waits to be sent.
    pub out: Outbox,
}

impl Queue {
    /// A new connection's queue: `max_transfer` is the MDTS in bytes.
    pub fn new(max_transfer: u32) -> Queue {
        Queue {
            initialized: false,
            rx: Negotiated {
                header_digest: false,
                data_digest: false,
                alignment: 0,
                max_data: IO_IN_CAPSULE.max(MAXH2CDATA),
            },
            tx: Layout::default(),
            in_capsule: IO_IN_CAPSULE,
            max_transfer,
            gathering: Vec::new(),
            free_tags: Vec::new(),
            sqhd: 0,
            sqsize: 32,
            sqflow_disabled: false,
            qid: 0,
            out: Outbox::new(),
        }
    }

    /// Negotiated digests (header, data).
    pub fn digests(&self) -> (bool, bool) {
        (self.rx.header_digest, self.rx.data_digest)
    }

    /// Connect made this the queue `qid` of `sqsize` entries.
    pub fn connected(&mut self, qid: u16, sqsize: u16, sqflow_disabled: bool) {
        self.qid = qid;
        self.sqsize = sqsize.max(1);
        self.sqflow_disabled = sqflow_disabled;
        self.in_capsule = if qid == 0 {
            ADMIN_IN_CAPSULE
        } else {
            IO_IN_CAPSULE
        };
    }

    /// The complete PDU at the start of `buf`, if there is one (bounded and
    /// checked before it is waited for). A fatal error queues the TermReq.
    pub fn frame(&mut self, buf: &[u8]) -> Result<Option<Frame>, Stop> {
        let n = if self.initialized {
            self.rx
        } else {
            Negotiated {
                max_data: 0,
                ..self.rx
            }
        };
        frame(buf, &n).map_err(|f| self.fatal(f, buf))
    }

    /// Queues the TermReq for `f` about the header at the start of `buf`.
    fn fatal(&mut self, f: Fatal, buf: &[u8]) -> Stop {
        let hdr = &buf[..buf.len().min(128)];
        let t = c2h_term_req(f, hdr);
        self.out.push_raw(&t, Chain::new(), &[]);
        Stop::Fatal(f)
    }

    /// Takes the PDU `pdu` (framed as `f`). `Ok(Some)`: a command to run.
    pub fn receive(&mut self, pdu: Bytes, f: &Frame) -> Result<Option<Command>, Stop> {
        let t = f.ch.pdu_type;
        if !self.initialized {
            if t != PduType::IcReq {
                return Err(self.fatal(
                    Fatal {
                        fes: Fes::SequenceError,
                        fei: 0,
                    },
                    &pdu,
                ));
            }
            return self.ic_req(&pdu).map(|()| None);
        }
        match t {
            PduType::CapsuleCmd => self.capsule(&pdu, f, Some(&pdu)),
            PduType::H2cData => self.h2c_data(pdu, f),
            PduType::H2cTermReq => Err(Stop::HostTerminated {
                fes: u16::from_le_bytes([pdu[8], pdu[9]]),
            }),
            PduType::IcReq => Err(self.fatal(
                Fatal {
                    fes: Fes::SequenceError,
                    fei: 0,
                },
                &pdu,
            )),
            // Controller-to-host PDUs.
            _ => Err(self.fatal(Fatal::field(0), &pdu)),
        }
    }

    fn ic_req(&mut self, pdu: &[u8]) -> Result<(), Stop> {
        let b: &[u8; IC_LEN] = pdu[..IC_LEN].try_into().expect("framed: 128 bytes");
        let ic = Ic::decode(b);
        if ic.pfv != 0 {
            return Err(self.fatal(
                Fatal {
                    fes: Fes::UnsupportedParameter,
                    fei: 8,
                },
                pdu,
            ));
        }
        if ic.pda > 31 {
            return Err(self.fatal(
                Fatal {
                    fes: Fes::UnsupportedParameter,
                    fei: 10,
                },
                pdu,
            ));
        }
        self.rx.header_digest = ic.header_digest;
        self.rx.data_digest = ic.data_digest;
        self.tx = Layout {
            header_digest: ic.header_digest,
            data_digest: ic.data_digest,
            alignment: 4 * (u32::from(ic.pda) + 1),
        };
        let resp = Ic {
            pfv: 0,
            pda: 0,
            header_digest: ic.header_digest,
            data_digest: ic.data_digest,
            max: MAXH2CDATA,
        }
        .encode(true);
        self.out.push_raw(&resp, Chain::new(), &[]);
        self.initialized = true;
        Ok(())
    }

    /// [`Self::receive`] of the PDU `f` at the start of `buf`, which it
    /// consumes: a command capsule without data (a read, most admin
    /// commands) is taken from the buffer as it is, without making the
    /// PDU a `Bytes` of its own.
    pub fn receive_from(&mut self, buf: &mut BytesMut, f: &Frame) -> Result<Option<Command>, Stop> {
        if self.initialized && f.ch.pdu_type == PduType::CapsuleCmd && f.data.is_empty() {
            let r = self.capsule(&buf[..f.len], f, None);
            buf.advance(f.len);
            return r;
        }
        let pdu = buf.split_to(f.len).freeze();
        self.receive(pdu, f)
    }

    /// A command capsule (`pdu`, framed as `f`); `whole` is the PDU as
    /// `Bytes` when it carries data (the in-capsule data is a slice of it).
    fn capsule(
        &mut self,
        pdu: &[u8],
        f: &Frame,
        whole: Option<&Bytes>,
    ) -> Result<Option<Command>, Stop> {
        let sqe = Sqe(pdu[8..72].try_into().expect("framed: 72 bytes"));
        self.sqhd = (self.sqhd + 1) % self.sqsize;
        let bad_digest = !data_digest_ok(pdu, f);
        let in_capsule = f.data.len();
        let to_controller = direction(&sqe) & 1 != 0;
        match sqe.sgl() {
            Sgl::InCapsule { offset, length } => {
                if offset != 0 || length as usize != in_capsule {
                    return Ok(self.refuse(&sqe, Status::generic(0x0F, true)));
                }
                if length > self.in_capsule {
                    return Ok(self.refuse(&sqe, Status::generic(0x0F, true)));
                }
                Ok(Some(Command {
                    sqe,
                    data: match whole {
                        Some(w) if in_capsule > 0 => Chain::from(w.slice(f.data.clone())),
                        _ => Chain::new(),
                    },
                    bad_digest,
                    owned: false,
                }))
            }
            _ if in_capsule > 0 => Err(self.fatal(Fatal::field(3), pdu)),
            Sgl::Transport { length } if to_controller && length > 0 => {
                if length > self.max_transfer {
                    return Ok(self.refuse(&sqe, Status::generic(0x0F, true)));
                }
                let Some(tag) = self.take_tag() else {
                    return Err(self.fatal(
                        Fatal {
                            fes: Fes::DataLimitExceeded,
                            fei: 0,
                        },
                        pdu,
                    ));
                };
                let r2t = self.tx.r2t(&DataHeader {
                    cccid: sqe.cid(),
                    ttag: tag,
                    offset: 0,
                    length,
                });
                self.out.push_raw(&r2t, Chain::new(), &[]);
                self.gathering[usize::from(tag)] = Some(Gathering {
                    sqe,
                    want: length,
                    data: Chain::new(),
                    own: (length >= OWN_BUFFER_MIN).then(|| bufpool::take(length as usize)),
                    bad_digest,
                });
                Ok(None)
            }
            // Controller-to-host data or none: nothing to gather.
            Sgl::Transport { .. } => Ok(Some(Command {
                sqe,
                data: Chain::new(),
                bad_digest,
                owned: false,
            })),
            Sgl::Other { .. } if sqe.opcode() != OPC_FABRICS && sqe.psdt() == 0 => {
                // PRPs: not a fabrics data pointer.
                Ok(self.refuse(&sqe, Status::INVALID_FIELD))
            }
            Sgl::Other { .. } => Ok(self.refuse(&sqe, Status::generic(0x11, true))),
        }
    }

    /// Completes `sqe` with `status` without running it.
    fn refuse(&mut self, sqe: &Sqe, status: Status) -> Option<Command> {
        self.complete(sqe.cid(), status, 0, Chain::new());
        None
    }

    fn take_tag(&mut self) -> Option<u16> {
        if let Some(t) = self.free_tags.pop() {
            return Some(t);
        }
        if self.gathering.len() >= MAX_WRITES {
            return None;
        }
        self.gathering.push(None);
        Some((self.gathering.len() - 1) as u16)
    }

    /// Whether the PDU starting `buf` is an H2CData PDU whose data should be
    /// received straight into its command's own buffer: its whole header
    /// (up to PDO) is here and right, the PDU itself is not all here yet,
    /// and its data is large. Then `Some((header bytes to drop, landing))`.
    /// Anything amiss is left to the normal path ([`Self::frame`],
    /// [`Self::receive`]), which refuses it.
    pub fn try_land(&mut self, buf: &[u8]) -> Option<(usize, Landing)> {
        if !self.initialized || buf.len() < 24 || buf[0] != PduType::H2cData as u8 {
            return None;
        }
        // Fully here, or a header the framing refuses: the normal path.
        if !matches!(frame(buf, &self.rx), Ok(None)) {
            return None;
        }
        let ch = nvme_tcp_wire::common_header(buf).ok()?;
        let pdo = usize::from(ch.pdo);
        let hd = self.rx.header_digest;
        let hlen = usize::from(ch.hlen);
        if buf.len() < pdo || pdo < hlen + if hd { 4 } else { 0 } {
            return None;
        }
        if hd {
            let want = u32::from_le_bytes(buf[hlen..hlen + 4].try_into().ok()?);
            if iscsi_wire::digest::crc32c(&buf[..hlen]) != want {
                return None;
            }
        }
        let dd = if self.rx.data_digest { 4 } else { 0 };
        let len = (ch.plen as usize).checked_sub(pdo + dd)?;
        let h = DataHeader::decode(buf);
        let g = self.gathering.get(usize::from(h.ttag))?.as_ref()?;
        let received = g.received();
        if len < LAND_MIN
            || g.own.is_none()
            || g.sqe.cid() != h.cccid
            || h.offset as usize != received
            || h.length as usize != len
            || received + len > g.want as usize
        {
            return None;
        }
        Some((
            pdo,
            Landing {
                slot: usize::from(h.ttag),
                start: received,
                len,
                left: len,
                digest: dd,
                last: ch.flags & LAST_PDU != 0,
            },
        ))
    }

    /// The buffer the landing's data goes to (append at most `l.left`
    /// bytes, then lower `l.left` by as many).
    pub fn landing_room(&mut self, l: &Landing) -> &mut bytes::BytesMut {
        self.gathering[l.slot]
            .as_mut()
            .and_then(|g| g.own.as_mut())
            .expect("a landing's command waits for it")
    }

    /// The landing's data is all in and `digest` (its data digest, if the
    /// connection has them) followed: the command, once all its data is.
    pub fn finish_landing(&mut self, l: Landing, digest: &[u8]) -> Result<Option<Command>, Stop> {
        let g = self.gathering[l.slot]
            .as_mut()
            .expect("a landing's command");
        if l.digest == 4 {
            let b = g.own.as_ref().expect("landing into its own buffer");
            let have = iscsi_wire::digest::crc32c(&b[l.start..l.start + l.len]);
            g.bad_digest |= digest.len() != 4
                || have != u32::from_le_bytes(digest.try_into().unwrap_or([0; 4]));
        }
        if g.received() as u32 != g.want {
            if l.last {
                let f = Fatal {
                    fes: Fes::DataOutOfRange,
                    fei: 0,
                };
                return Err(self.fatal(f, &[]));
            }
            return Ok(None);
        }
        let g = self.gathering[l.slot].take().expect("checked");
        self.free_tags.push(l.slot as u16);
        Ok(Some(Command {
            sqe: g.sqe,
            data: Chain::from(g.own.expect("own buffer").freeze()),
            bad_digest: g.bad_digest,
            owned: true,
        }))
    }

    fn h2c_data(&mut self, pdu: Bytes, f: &Frame) -> Result<Option<Command>, Stop> {
        let h = DataHeader::decode(&pdu);
        let slot = usize::from(h.ttag);
        let ok = self
            .gathering
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(|g| g.sqe.cid() == h.cccid);
        if !ok {
            return Err(self.fatal(Fatal::field(10), &pdu));
        }
        let g = self.gathering[slot].as_mut().expect("checked");
        let len = f.data.len() as u32;
        if h.offset as usize != g.received()
            || h.length != len
            || u64::from(h.offset) + u64::from(len) > u64::from(g.want)
        {
            return Err(self.fatal(
                Fatal {
                    fes: Fes::DataOutOfRange,
                    fei: 0,
                },
                &pdu,
            ));
        }
        g.bad_digest |= !data_digest_ok(&pdu, f);
        match &mut g.own {
            Some(b) => b.extend_from_slice(&pdu[f.data.clone()]),
            None => g.data.push(pdu.slice(f.data.clone())),
        }
        let done = g.received() as u32 == g.want;
        if !done {
            if f.ch.flags & LAST_PDU != 0 {
                return Err(self.fatal(
                    Fatal {
                        fes: Fes::DataOutOfRange,
                        fei: 0,
                    },
                    &pdu,
                ));
            }
            return Ok(None);
        }
        let g = self.gathering[slot].take().expect("checked");
        self.free_tags.push(h.ttag);
        let owned = g.own.is_some();
        Ok(Some(Command {
            sqe: g.sqe,
            data: match g.own {
                Some(b) => Chain::from(b.freeze()),
                None => g.data,
            },
            bad_digest: g.bad_digest,
            owned,
        }))
    }

    /// Queues the completion of command `cid`: its data to the host (if
    /// any, and the command succeeded) and its response.
    pub fn complete(&mut self, cid: u16, status: Status, result: u64, data: Chain) {
        let ok = status.is_success();
        if ok && !data.is_empty() {
            let fold = self.sqflow_disabled && result == 0;
            let h = DataHeader {
                cccid: cid,
                ttag: 0,
                offset: 0,
                length: data.len() as u32,
            };
            let header = self.tx.c2h_data(&h, true, fold);
            let digest = if self.tx.data_digest {
                let mut c = iscsi_wire::digest::Crc32c::new();
                for s in data.segments() {
                    c.update(s);
                }
                Some(c.value().to_le_bytes())
            } else {
                None
            };
            self.out
                .push_raw(&header, data, digest.as_ref().map_or(&[][..], |d| &d[..]));
            if fold {
                return;
            }
        }
        let cqe = Cqe {
            result,
            sqhd: self.sqhd,
            sqid: self.qid,
            cid,
            status,
        };
        let resp = self.tx.capsule_resp(&cqe.encode());
        self.out.push_raw(&resp, Chain::new(), &[]);
    }
}

/// The command's data transfer direction: bits 1:0 of its opcode (of its
/// FCTYPE for a Fabrics command): 01b host to controller, 10b controller
/// to host.
pub fn direction(sqe: &Sqe) -> u8 {
    if sqe.opcode() == OPC_FABRICS {
        sqe.fctype() & 3
    } else {
        sqe.opcode() & 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use nvme_tcp_wire::{LAST_PDU as LAST, SUCCESS};

    /// Feeds `bytes` to `q` as the driver does; the commands that come out.
    fn feed(q: &mut Queue, bytes: &[u8]) -> Result<Vec<Command>, Stop> {
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        // Alternately as the driver does (capsules without data read in
        // place) and as whole PDUs: both ways must agree.
        let mut in_place = true;
        while let Some(f) = q.frame(&buf)? {
            let c = if in_place {
                q.receive_from(&mut buf, &f)?
            } else {
                let pdu = buf.split_to(f.len).freeze();
                q.receive(pdu, &f)?
            };
            in_place = !in_place;
            if let Some(c) = c {
                out.push(c);
            }
        }
        assert!(buf.is_empty(), "a partial PDU left");
        Ok(out)
    }

    fn host_layout(digests: bool) -> Layout {
        Layout {
            header_digest: digests,
            data_digest: digests,
            alignment: 4,
        }
    }

    fn ic(digests: bool) -> Vec<u8> {
        Ic {
            header_digest: digests,
            data_digest: digests,
            ..Ic::default()
        }
        .encode(false)
        .to_vec()
    }

    fn capsule(l: &Layout, op: u8, cid: u16, sgl: Sgl, data: &[u8]) -> Vec<u8> {
        let mut s = [0u8; 64];
        s[0] = op;
        s[1] = 0x40;
        s[2..4].copy_from_slice(&cid.to_le_bytes());
        s[24..40].copy_from_slice(&sgl.encode());
        let mut b = l.header(PduType::CapsuleCmd, 0, &s, data.len()).to_vec();
        b.extend_from_slice(data);
        if let Some(d) = l.data_digest_of(data) {
            b.extend_from_slice(&d);
        }
        b
    }

    /// What the queue sent since last asked.
    fn sent(q: &mut Queue) -> Vec<u8> {
        let v = q.out.to_vec();
        q.out.advance(v.len());
        v
    }

    #[test]
    fn icreq_is_answered_with_the_digests_asked_and_maxh2cdata() {
        for digests in [false, true] {
            let mut q = Queue::new(1 << 20);
            assert!(feed(&mut q, &ic(digests)).unwrap().is_empty());
            let r = sent(&mut q);
            assert_eq!(r.len(), IC_LEN);
            assert_eq!(r[0], PduType::IcResp as u8);
            let ic = Ic::decode(r[..IC_LEN].try_into().unwrap());
            assert_eq!((ic.header_digest, ic.data_digest), (digests, digests));
            assert_eq!(ic.max, MAXH2CDATA);
            assert_eq!(q.digests(), (digests, digests));
        }
    }

    #[test]
    fn anything_but_icreq_first_is_a_sequence_error() {
        let mut q = Queue::new(1 << 20);
        let c = capsule(
            &host_layout(false),
            0x02,
            1,
            Sgl::Transport { length: 0 },
            &[],
        );
        match feed(&mut q, &c) {
            Err(Stop::Fatal(f)) => assert_eq!(f.fes, Fes::SequenceError),
            other => panic!("{other:?}"),
        }
        assert_eq!(sent(&mut q)[0], PduType::C2hTermReq as u8);
    }

    #[test]
    fn in_capsule_and_r2t_writes_deliver_their_data() {
        for digests in [false, true] {
            let l = host_layout(digests);
            let mut q = Queue::new(1 << 20);
            feed(&mut q, &ic(digests)).unwrap();
            q.connected(1, 32, false);
            sent(&mut q);
            // 4 KiB in the capsule.
            let data = vec![0x11u8; 4096];
            let inc = Sgl::InCapsule {
                offset: 0,
                length: 4096,
            };
            let c = feed(&mut q, &capsule(&l, 0x01, 5, inc, &data)).unwrap();
            assert_eq!(c.len(), 1);
            assert_eq!(
                (c[0].sqe.cid(), c[0].data.to_vec(), c[0].bad_digest),
                (5, data, false)
            );
            // 40 KiB: an R2T for all of it, then two H2CData PDUs.
            let big: Vec<u8> = (0..40960u32).map(|i| i as u8).collect();
            let c = feed(
                &mut q,
                &capsule(&l, 0x01, 6, Sgl::Transport { length: 40960 }, &[]),
            )
            .unwrap();
            assert!(c.is_empty());
            let r2t = sent(&mut q);
            assert_eq!(r2t[0], PduType::R2t as u8);
            let h = DataHeader::decode(&r2t);
            assert_eq!((h.cccid, h.offset, h.length), (6, 0, 40960));
            let mut b = Vec::new();
            for (off, n, last) in [(0usize, 32768usize, false), (32768, 8192, true)] {
                let dh = DataHeader {
                    cccid: 6,
                    ttag: h.ttag,
                    offset: off as u32,
                    length: n as u32,
                };
                b.extend_from_slice(&l.h2c_data(&dh, last));
                b.extend_from_slice(&big[off..off + n]);
                if let Some(d) = l.data_digest_of(&big[off..off + n]) {
                    b.extend_from_slice(&d);
                }
            }
            let c = feed(&mut q, &b).unwrap();
            assert_eq!(c.len(), 1);
            assert_eq!(c[0].data.to_vec(), big);
            // Data for a tag no command has (any more): fatal.
            let first = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
            let c = feed(&mut q, &b[..first]);
            assert!(matches!(c, Err(Stop::Fatal(_))));
        }
    }

    #[test]
    fn a_bad_data_digest_fails_only_its_command() {
        let l = host_layout(true);
        let mut q = Queue::new(1 << 20);
        feed(&mut q, &ic(true)).unwrap();
        q.connected(1, 32, false);
        let mut c = capsule(
            &l,
            0x01,
            9,
            Sgl::InCapsule {
                offset: 0,
                length: 512,
            },
            &[7; 512],
        );
        let n = c.len();
        c[n - 1] ^= 0xff;
        let got = feed(&mut q, &c).unwrap();
        assert!(got[0].bad_digest);
    }

    #[test]
    fn completions_fold_into_the_last_c2hdata_only_without_sq_flow_control() {
        for disabled in [false, true] {
            let mut q = Queue::new(1 << 20);
            feed(&mut q, &ic(false)).unwrap();
            q.connected(1, 32, disabled);
            sent(&mut q);
            q.complete(3, Status::SUCCESS, 0, Chain::from(vec![9u8; 4096]));
            let out = sent(&mut q);
            assert_eq!(out[0], PduType::C2hData as u8);
            assert_eq!(
                out[1] & (LAST | SUCCESS),
                LAST | if disabled { SUCCESS } else { 0 }
            );
            let plen = u32::from_le_bytes(out[4..8].try_into().unwrap()) as usize;
            if disabled {
                assert_eq!(out.len(), plen, "no response capsule");
            } else {
                assert_eq!(out[plen], PduType::CapsuleResp as u8);
                let cqe = Cqe::decode(out[plen + 8..plen + 24].try_into().unwrap());
                assert_eq!((cqe.cid, cqe.status, cqe.sqid), (3, Status::SUCCESS, 1));
            }
            // A failed read sends no data, only the status.
            q.complete(4, Status::LBA_OUT_OF_RANGE, 0, Chain::from(vec![9u8; 4096]));
            let out = sent(&mut q);
            assert_eq!(out[0], PduType::CapsuleResp as u8);
            assert_eq!(out.len(), 24);
        }
    }

    #[test]
    fn oversized_and_bad_sgls_are_refused_per_command() {
        let l = host_layout(false);
        let mut q = Queue::new(1 << 20);
        feed(&mut q, &ic(false)).unwrap();
        q.connected(1, 32, false);
        sent(&mut q);
        // More than MDTS.
        let c = feed(
            &mut q,
            &capsule(&l, 0x01, 1, Sgl::Transport { length: 2 << 20 }, &[]),
        )
        .unwrap();
        assert!(c.is_empty());
        let out = sent(&mut q);
        let cqe = Cqe::decode(out[8..24].try_into().unwrap());
        assert_eq!(cqe.status, Status::generic(0x0f, true));
        // An in-capsule length that is not the data's.
        let c = feed(
            &mut q,
            &capsule(
                &l,
                0x01,
                2,
                Sgl::InCapsule {
                    offset: 0,
                    length: 100,
                },
                &[0; 64],
            ),
        )
        .unwrap();
        assert!(c.is_empty());
        let out = sent(&mut q);
        assert_eq!(Cqe::decode(out[8..24].try_into().unwrap()).cid, 2);
    }
}
