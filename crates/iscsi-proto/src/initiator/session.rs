//! The full feature phase from the initiator's side (RFC 7143 §4.2, §11).
//!
//! [`InitiatorSession::submit`] queues a SCSI command (with immediate and
//! unsolicited data as negotiated) when the command window has room;
//! [`InitiatorSession::handle_pdu`] consumes what the target sends —
//! Data-In is gathered (a single-PDU read keeps the received bytes without
//! a copy), R2Ts are answered from the command's data-out, NOP-In pings are
//! answered — and reports finished commands as [`InitiatorEvent::Done`].

use bytes::{Bytes, BytesMut};
use iscsi_wire::outbox::Digests;
use iscsi_wire::pdu::*;
use iscsi_wire::{Outbox, RawPdu, Sn};

use crate::params::SessionParams;

/// Direction of a command's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    None,
    /// Read up to this many bytes.
    Read(u32),
    /// Write these bytes.
    Write(Bytes),
}

/// A finished command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskResult {
    /// SCSI status; `None` when the target rejected the command PDU.
    pub status: Option<u8>,
    /// Sense data, without the two-byte length.
    pub sense: Bytes,
    /// Data-in received.
    pub data: Bytes,
    pub residual: Residual,
}

/// What the initiator session reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitiatorEvent {
    /// A command finished.
    Done(Itt, TaskResult),
    /// A task management request was answered.
    TaskMgmt(Itt, TmfResponse),
    /// The logout was answered: the connection may close.
    LoggedOut(LogoutResponse),
    /// A text request was answered (the whole, reassembled text).
    Text(Itt, Bytes),
    /// The target sent an asynchronous message.
    Async(AsyncEvent),
    /// The target broke the protocol; the connection should be dropped.
    ProtocolError(String),
}

use crate::session::LAND_MIN;
use crate::tags::TagMap;

/// Reads of at most this many bytes get one buffer that their Data-In
/// segments of [`LAND_MIN`] bytes or more are received into
/// ([`InitiatorSession::landing`]); larger ones are gathered by copying.
const LAND_IN_MAX: u32 = 16 << 20;

struct Task {
    lun: Lun,
    data_out: Bytes,
    read_len: u32,
    /// Data-In gathered so far (multi-PDU reads).
    data_in: BytesMut,
    /// A single Data-In PDU's payload kept without copying.
    single: Option<Bytes>,
    received: u32,
}

/// The state of one logged-in connection.
pub struct InitiatorSession {
    params: SessionParams,
    dg: Digests,
    cmd_sn: Sn,
    max_cmd_sn: Sn,
    exp_stat_sn: Sn,
    next_itt: u32,
    tasks: TagMap<Task>,
    text_in: BytesMut,
}

impl std::fmt::Debug for InitiatorSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitiatorSession")
            .field("cmd_sn", &self.cmd_sn)
            .field("max_cmd_sn", &self.max_cmd_sn)
            .field("outstanding", &self.tasks.len())
            .finish()
    }
}

impl InitiatorSession {
    /// A session after login: `cmd_sn` is the next CmdSN to use,
    /// `exp_stat_sn` the next StatSN expected.
    pub fn new(params: SessionParams, cmd_sn: Sn, exp_stat_sn: Sn, max_cmd_sn: Sn) -> Self {
        InitiatorSession {
            dg: Digests {
                header: params.header_digest,
                data: params.data_digest,
            },
            params,
            cmd_sn,
            max_cmd_sn,
            exp_stat_sn,
            next_itt: 1,
            tasks: TagMap::default(),
            text_in: BytesMut::new(),
        }
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Commands awaiting their status.
    pub fn outstanding(&self) -> usize {
        self.tasks.len()
    }

    /// True when the target's window admits another non-immediate command.
    pub fn can_submit(&self) -> bool {
        !self.cmd_sn.gt(self.max_cmd_sn)
    }

    /// The window the target currently grants (MaxCmdSN − CmdSN + 1).
    pub fn window(&self) -> u32 {
        self.max_cmd_sn
            .0
            .wrapping_sub(self.cmd_sn.0)
            .wrapping_add(1)
            .min(1 << 30)
    }

    fn fresh_itt(&mut self) -> Itt {
        loop {
            let i = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if i != RESERVED_TAG && !self.tasks.contains_key(&i) {
                return Itt(i);
            }
        }
    }

    fn note_window(&mut self, exp: Sn, max: Sn) {
        // MaxCmdSN only counts when it moves forward and is sane (§4.2.2.1).
        if max.gt(self.max_cmd_sn) && !max.lt(exp.plus(u32::MAX)) {
            self.max_cmd_sn = max;
        }
    }

    /// Queues a SCSI command; the caller checks [`Self::can_submit`] first.
    /// `cdb` is at most 16 bytes.
    pub fn submit(&mut self, lun: Lun, cdb: &[u8], dir: DataDir, out: &mut Outbox) -> Itt {
        let itt = self.fresh_itt();
        let mut c16 = [0u8; 16];
        let n = cdb.len().min(16);
        c16[..n].copy_from_slice(&cdb[..n]);
        let (edtl, read, data_out) = match dir {
            DataDir::None => (0, false, Bytes::new()),
            DataDir::Read(n) => (n, true, Bytes::new()),
            DataDir::Write(b) => (b.len() as u32, false, b),
        };
        let p = &self.params;
        let seg = p.send_max_data_segment as usize;
        let first_burst = (p.first_burst as usize).min(data_out.len());
        let imm_len = if p.immediate_data {
            first_burst.min(seg)
        } else {
            0
        };
        let unsolicited_end = if p.initial_r2t { imm_len } else { first_burst };
        let cmd = ScsiCommand {
            immediate: false,
            final_: unsolicited_end == imm_len,
            read,
            write: !data_out.is_empty(),
            attr: TaskAttr::Simple,
            lun,
            itt,
            edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: c16,
        };
        self.cmd_sn = self.cmd_sn.next();
        out.push_bytes(&cmd.encode(imm_len), data_out.slice(..imm_len), self.dg);
        // Unsolicited Data-Out for the rest of the first burst.
        self.send_data(
            lun,
            itt,
            RESERVED_TAG,
            &data_out,
            imm_len,
            unsolicited_end,
            out,
        );
        self.tasks.insert(
            itt.0,
            Task {
                lun,
                data_out,
                read_len: edtl,
                data_in: BytesMut::new(),
                single: None,
                received: 0,
            },
        );
        itt
    }

    #[allow(clippy::too_many_arguments)]
    fn send_data(
        &self,
        lun: Lun,
        itt: Itt,
        ttt: u32,
        data: &Bytes,
        from: usize,
        to: usize,
        out: &mut Outbox,
    ) {
        let seg = self.params.send_max_data_segment as usize;
        let mut off = from;
        let mut data_sn = 0;
        while off < to {
            let n = seg.min(to - off);
            let d = DataOut {
                final_: off + n == to,
                lun,
                itt,
                ttt,
                exp_stat_sn: self.exp_stat_sn,
                data_sn,
                buffer_offset: off as u32,
            };
            out.push_bytes(&d.encode(n), data.slice(off..off + n), self.dg);
            data_sn += 1;
            off += n;
        }
    }

    /// Sends a NOP-Out ping (immediate, answered by a NOP-In).
    pub fn ping(&mut self, out: &mut Outbox) -> Itt {
        let itt = self.fresh_itt();
        let n = NopOut {
            immediate: true,
            lun: Lun::default(),
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        out.push(&n.encode(0), &[], self.dg);
        itt
    }

    /// Sends a task management request (immediate).
    pub fn task_mgmt(
        &mut self,
        function: TmfFunction,
        lun: Lun,
        ref_itt: Option<Itt>,
        out: &mut Outbox,
    ) -> Itt {
        let itt = self.fresh_itt();
        let t = TaskMgmtReq {
            immediate: true,
            function,
            lun,
            itt,
            ref_task_tag: ref_itt.unwrap_or(Itt(RESERVED_TAG)),
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn: self.cmd_sn,
            exp_data_sn: 0,
        };
        out.push(&t.encode(), &[], self.dg);
        itt
    }

    /// Sends a Text Request (e.g. `SendTargets=All`).
    pub fn text(&mut self, body: &[u8], out: &mut Outbox) -> Itt {
        let itt = self.fresh_itt();
        let t = TextReq {
            immediate: true,
            final_: true,
            cont: false,
            lun: Lun::default(),
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        out.push(&t.encode(body.len()), body, self.dg);
        itt
    }

    /// Sends a Logout Request closing the session.
    pub fn logout(&mut self, out: &mut Outbox) -> Itt {
        let itt = self.fresh_itt();
        let l = LogoutReq {
            immediate: true,
            reason: LogoutReason::CloseSession,
            itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        out.push(&l.encode(), &[], self.dg);
        itt
    }

    /// Forgets every outstanding command (the connection is gone); returns
    /// their tags.
    pub fn fail_all(&mut self) -> Vec<Itt> {
        self.tasks.drain().map(|(k, _)| Itt(k)).collect()
    }

    /// Handles one PDU from the target.
    pub fn handle_pdu(&mut self, raw: RawPdu, out: &mut Outbox, ev: &mut Vec<InitiatorEvent>) {
        if !raw.data_digest_ok {
            ev.push(InitiatorEvent::ProtocolError("data digest error".into()));
            return;
        }
        match Pdu::parse(&raw.bhs) {
            Pdu::DataIn(d) => {
                self.note_window(d.sn.exp_cmd_sn, d.sn.max_cmd_sn);
                let dlen = iscsi_wire::frame::data_segment_len(&raw.bhs) as usize;
                self.data_in(
                    d,
                    raw.data,
                    raw.landed
                        .and_then(bufpool::LandBuf::into_pooled)
                        .map(|b| (b, dlen)),
                    ev,
                )
            }
            Pdu::ScsiResponse(r) => {
                self.note_window(r.sn.exp_cmd_sn, r.sn.max_cmd_sn);
                self.exp_stat_sn = r.sn.stat_sn.next();
                let Some(mut t) = self.tasks.remove(&r.itt.0) else {
                    return;
                };
                let sense = if raw.data.len() >= 2 {
                    let n = usize::from(u16::from_be_bytes([raw.data[0], raw.data[1]]))
                        .min(raw.data.len() - 2);
                    raw.data.slice(2..2 + n)
                } else {
                    Bytes::new()
                };
                let data = t
                    .single
                    .take()
                    .unwrap_or_else(|| t.data_in.split().freeze());
                ev.push(InitiatorEvent::Done(
                    r.itt,
                    TaskResult {
                        status: Some(r.status),
                        sense,
                        data,
                        residual: r.residual,
                    },
                ));
            }
            Pdu::R2t(r) => {
                self.note_window(r.sn.exp_cmd_sn, r.sn.max_cmd_sn);
                let Some(t) = self.tasks.get(&r.itt.0) else {
                    return;
                };
                let from = r.buffer_offset as usize;
                let to = from.saturating_add(r.desired_len as usize);
                if to > t.data_out.len() {
                    ev.push(InitiatorEvent::ProtocolError(format!(
                        "R2T beyond the data of {:?}",
                        r.itt
                    )));
                    return;
                }
                let (lun, data) = (t.lun, t.data_out.clone());
                self.send_data(lun, r.itt, r.ttt, &data, from, to, out);
            }
            Pdu::NopIn(n) => {
                self.note_window(n.sn.exp_cmd_sn, n.sn.max_cmd_sn);
                if n.ttt != RESERVED_TAG {
                    // A ping from the target: answer it.
                    let a = NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: Itt(RESERVED_TAG),
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    out.push(&a.encode(0), &[], self.dg);
                } else {
                    self.exp_stat_sn = n.sn.stat_sn.next();
                }
            }
            Pdu::TaskMgmtResp(t) => {
                self.note_window(t.sn.exp_cmd_sn, t.sn.max_cmd_sn);
                self.exp_stat_sn = t.sn.stat_sn.next();
                ev.push(InitiatorEvent::TaskMgmt(t.itt, t.response));
            }
            Pdu::LogoutResp(l) => {
                self.exp_stat_sn = l.sn.stat_sn.next();
                ev.push(InitiatorEvent::LoggedOut(l.response));
            }
            Pdu::TextResp(t) => {
                self.note_window(t.sn.exp_cmd_sn, t.sn.max_cmd_sn);
                self.exp_stat_sn = t.sn.stat_sn.next();
                if self.text_in.len() + raw.data.len() > iscsi_wire::text::MAX_TEXT_LEN {
                    ev.push(InitiatorEvent::ProtocolError(
                        "text response too long".into(),
                    ));
                    return;
                }
                self.text_in.extend_from_slice(&raw.data);
                if t.cont || !t.final_ {
                    // Ask for the rest with the target's TTT.
                    let r = TextReq {
                        immediate: true,
                        final_: true,
                        cont: false,
                        lun: Lun::default(),
                        itt: t.itt,
                        ttt: t.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    out.push(&r.encode(0), &[], self.dg);
                } else {
                    ev.push(InitiatorEvent::Text(t.itt, self.text_in.split().freeze()));
                }
            }
            Pdu::Reject(r) => {
                self.note_window(r.sn.exp_cmd_sn, r.sn.max_cmd_sn);
                if raw.data.len() >= 48 {
                    let itt = u32::from_be_bytes([
                        raw.data[16],
                        raw.data[17],
                        raw.data[18],
                        raw.data[19],
                    ]);
                    if self.tasks.remove(&itt).is_some() {
                        ev.push(InitiatorEvent::Done(Itt(itt), TaskResult::default()));
                        return;
                    }
                }
                ev.push(InitiatorEvent::ProtocolError(format!(
                    "Reject: {}",
                    r.reason
                )));
            }
            Pdu::AsyncMsg(a) => {
                self.note_window(a.sn.exp_cmd_sn, a.sn.max_cmd_sn);
                ev.push(InitiatorEvent::Async(a.event));
            }
            other => ev.push(InitiatorEvent::ProtocolError(format!(
                "unexpected PDU {other:?}"
            ))),
        }
    }

    /// Where to receive the data segment of the PDU whose basic header is
    /// `bhs`: for a Data-In of at least [`LAND_MIN`] bytes at the offset its
    /// read expects next, the read's own buffer, the segment to go onto its
    /// end (the connection reads it from the socket straight there, and
    /// hands the buffer back in [`RawPdu::landed`]). The PDU is still
    /// checked in full by [`Self::handle_pdu`]. `None`: receive as usual.
    pub fn landing(&mut self, bhs: &[u8; iscsi_wire::frame::BHS_LEN]) -> Option<BytesMut> {
        let dlen = iscsi_wire::frame::data_segment_len(bhs);
        if dlen < LAND_MIN {
            return None;
        }
        let Pdu::DataIn(d) = Pdu::parse(bhs) else {
            return None;
        };
        let t = self.tasks.get_mut(&d.itt.0)?;
        let fits = d.buffer_offset == t.received
            && t.received
                .checked_add(dlen)
                .is_some_and(|e| e <= t.read_len);
        if !fits || t.read_len > LAND_IN_MAX {
            return None;
        }
        if let Some(s) = t.single.take() {
            t.data_in.extend_from_slice(&s);
        }
        if t.data_in.capacity() == 0 {
            t.data_in = bufpool::take(t.read_len as usize);
        } else {
            t.data_in.reserve(t.read_len as usize - t.data_in.len());
        }
        Some(std::mem::take(&mut t.data_in))
    }

    /// A Data-In: its data in `data`, or (`landed`) received onto the end of
    /// the read's buffer, `dlen` bytes.
    fn data_in(
        &mut self,
        d: DataIn,
        data: Bytes,
        landed: Option<(BytesMut, usize)>,
        ev: &mut Vec<InitiatorEvent>,
    ) {
        let Some(t) = self.tasks.get_mut(&d.itt.0) else {
            return;
        };
        let off = d.buffer_offset;
        let n = landed.as_ref().map_or(data.len(), |l| l.1);
        let end = off.checked_add(n as u32);
        let in_place = landed
            .as_ref()
            .is_none_or(|(b, _)| b.len() == t.received as usize + n);
        if off != t.received || end.is_none_or(|e| e > t.read_len) || !in_place {
            ev.push(InitiatorEvent::ProtocolError(format!(
                "Data-In out of order or past EDTL for {:?}",
                d.itt
            )));
            return;
        }
        t.received += n as u32;
        if let Some((buf, _)) = landed {
            t.data_in = buf;
        } else if off == 0 && d.status.is_some() {
            t.single = Some(data);
        } else {
            if let Some(s) = t.single.take() {
                t.data_in.extend_from_slice(&s);
            }
            if t.data_in.is_empty() && off == 0 {
                t.single = Some(data);
            } else {
                t.data_in.extend_from_slice(&data);
            }
        }
        if let Some(status) = d.status {
            self.exp_stat_sn = d.sn.stat_sn.next();
            let mut t = self.tasks.remove(&d.itt.0).expect("present");
            let data = t
                .single
                .take()
                .unwrap_or_else(|| t.data_in.split().freeze());
            ev.push(InitiatorEvent::Done(
                d.itt,
                TaskResult {
                    status: Some(status),
                    sense: Bytes::new(),
                    data,
                    residual: d.residual,
                },
            ));
        }
    }
}
