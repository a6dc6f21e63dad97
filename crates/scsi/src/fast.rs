//! READ and WRITE without waiting: the completion-driven path for backends
//! with [`storage::AsyncIo`] (RBD).
//!
//! [`LogicalUnit::execute`] runs a command to its end, so on a backend that
//! waits it runs on the driver's I/O pool, one thread per command in
//! flight. For the two commands that carry nearly all the data, the driver
//! can instead split it:
//!
//! 1. [`LogicalUnit::admit_fast`], on the event loop, makes every check
//!    `execute` makes before touching the medium: no unit attention
//!    pending for the nexus, CDB length and NACA, an active ALUA state, no
//!    reservation conflict, protection, transfer length, range, write
//!    protect, the whole data-out present; a READ with FUA on a write-back
//!    cache (which needs a flush first) is not admitted. It then *tries*
//!    the shared range lock (an exclusive holder — COMPARE AND WRITE,
//!    ORWRITE, WRITE ATOMIC — means "not admitted", never a wait). Any
//!    "no" returns `None` and the command takes the ordinary path, which
//!    answers it exactly as before (with the sense data the checks call
//!    for).
//! 2. The driver submits [`FastIo::offset`], [`FastIo::len`] and
//!    [`FastIo::kind`] to the backend.
//! 3. [`LogicalUnit::finish_fast`], wherever the completion arrives, turns
//!    the backend's result into the [`Outcome`] `execute` would have
//!    returned and releases the range lock.
//!
//! Admitted commands are READ(10/16) and WRITE(10/16); the rarer 6- and
//! 12-byte forms take the ordinary path.
//!
//! # Zero-copy reads
//!
//! [`LogicalUnit::zero_copy_read`] uses the same admission for a large
//! READ on a backend that can hand out a file range
//! ([`storage::FastPaths::splice_source`], a file LUN on tmpfs): the
//! command completes with the range, not the bytes, and the connection
//! sends it: when every page of it is in the page cache, from the backend's
//! mapping of the file in the same `writev` as its header (the kernel
//! copies the bytes as it sends them; [`filemap::FileMap`]), otherwise with
//! `sendfile(2)`, after which (on loopback) the receiver copies them out of
//! the very page cache pages later still. Either way the bytes are read
//! after the command's range lock is released.
//! What that allows, and why it is acceptable:
//!
//! * A WRITE overlapping the read and started before the initiator got the
//!   read's status may show up in the data, whole or in part. Such a read
//!   and write are in flight together, and SAM/SBC give them no order (and
//!   plain READ and WRITE share their range lock on every path, so a torn
//!   overlap was possible before too). A write started *after* the status
//!   reached the initiator never shows: the status rides in the last
//!   Data-In PDU, and the initiator has the command complete only once it
//!   has received that PDU's data — copied out of the pages by then.
//! * COMPARE AND WRITE, ORWRITE and WRITE ATOMIC promise more: no command
//!   sees their write half done. They are the exclusive range lock holders
//!   ([`crate::locks`]); the first one on a unit switches zero-copy reads
//!   off for good (it would be too late for a lock). What remains is the
//!   narrow window of that first exclusive command against zero-copy reads
//!   already queued before it: documented, not closed.
//! * A file shrunk under the LUN (by someone else, or a resize racing the
//!   read) makes `sendfile` stop short, and the kernel refuses to copy the
//!   mapping's pages past the new end (`EFAULT`); the status has gone out
//!   ahead of the data by then, so the connection is dropped rather than
//!   sending short or made-up data with GOOD status (the initiator
//!   retries). A hole punched (UNMAP) between the residency check and the
//!   send is read through the mapping as zeros, which allocates that page
//!   again: the data is right, the file a page less sparse.
//! * With DataDigest the CRC must cover the bytes sent. The connection's
//!   send queue computes it over the file's pages in place and keeps the
//!   file's writers off the range while it does and while the kernel
//!   copies the bytes (`filemap::WriteGate`, `iscsi_wire::outbox`); a range
//!   written while it waits in between is read afresh with its digest.
//!   Where no such guard is possible the range is read into memory when
//!   queued.
//!
//! # Writes received in place
//!
//! [`LogicalUnit::place_write`] uses the same admission, when a WRITE's
//! header arrives, for a backend that can give the write's place on the
//! medium ([`storage::FastPaths::place_write`], a file LUN on tmpfs
//! whose pages are all there): the connection receives the data-out
//! straight into the file's pages, one copy by the kernel instead of two
//! (into a buffer, then `pwrite` into the file), and
//! [`LogicalUnit::finish_placed`] answers the command once it is all in.
//! What that allows, and why it is acceptable:
//!
//! * The bytes are on the medium as they arrive, before the command is
//!   complete. A READ overlapping it meanwhile may see part of them: the
//!   two are in flight together, with no order between them (as above).
//!   A command that fails or is aborted after its data began to arrive
//!   (a Data-Out out of order, ABORT TASK, the connection lost) leaves
//!   part of its new data on the medium; SAM-5 leaves the medium of a
//!   write that did not complete undefined, and the initiator retries it.
//! * Nothing that would refuse the command is left for later: the
//!   checks `execute` makes are made when the header arrives, and the
//!   shared range lock is held, from then until the data is in, against
//!   COMPARE AND WRITE, ORWRITE and WRITE ATOMIC. Once a unit has seen one
//!   of those, no write is placed again (one could keep the exclusive
//!   holder waiting on a slow initiator's data).
//! * With DataDigest a segment must be checked before it reaches the
//!   medium: the driver places writes only without data digests.

use std::io;

use bytes::Bytes;
use storage::{AsyncIo, WriteData};

use crate::cdb::op;
use crate::cdb::Lba;
use crate::locks::OwnedShared;
use crate::lu::{backend_error, Command, LogicalUnit, Outcome};
use crate::rw::fields;
use crate::sense::Asc;

/// Reads of at least this many bytes are served zero-copy when they can
/// be ([`LogicalUnit::zero_copy_read`]); smaller ones cost less copied.
pub const ZERO_COPY_MIN: usize = 64 * 1024;

/// What an admitted command does on the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FastKind {
    /// Read [`FastIo::len`] bytes.
    Read,
    /// Write `data` (exactly [`FastIo::len`] bytes); `fua`: stable on
    /// completion whatever the cache policy.
    Write { data: Bytes, fua: bool },
}

/// A READ or WRITE admitted by [`LogicalUnit::admit_fast`]: its byte range
/// on the backend, and the shared range lock it holds until
/// [`LogicalUnit::finish_fast`].
pub struct FastIo {
    /// Byte offset on the backend.
    pub offset: u64,
    /// Length in bytes.
    pub len: usize,
    /// Read, or write with its data.
    pub kind: FastKind,
    _range: OwnedShared,
}

impl std::fmt::Debug for FastIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastIo")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("write", &matches!(self.kind, FastKind::Write { .. }))
            .finish()
    }
}

impl LogicalUnit {
    /// The backend's completion-driven interface, if it has one.
    pub fn async_io(&self) -> Option<&dyn AsyncIo> {
        self.vol.backend().fast()?.async_io()
    }

    /// Every check `execute` makes of a READ(10/16) or WRITE(10/16)
    /// before touching the medium (module docs): `Some((is a write, its
    /// fields))` when they all pass and it moves at least one block;
    /// `None` when any refuses it, which `execute` then answers with its
    /// sense data.
    fn checked_read_or_write(&self, cmd: &Command<'_>) -> Option<(bool, Lba)> {
        let opcode = *cmd.cdb.first()?;
        let write = match opcode {
            op::READ_10 | op::READ_16 => false,
            op::WRITE_10 | op::WRITE_16 => true,
            _ => return None,
        };
        // A path that is not active: `execute` answers the refusal (once:
        // it may set off a gateway's takeover probe, `AluaOwner`).
        if !self.ua.is_quiet(cmd.nexus) || !self.alua.state(cmd.tpg).is_active() {
            return None;
        }
        let cdb = self.admit(opcode, cmd).ok()?;
        let f = self.checked_rw(cdb, write).ok()?;
        (f.len > 0).then_some((write, f))
    }

    /// Admits `cmd` for the completion-driven path (module docs); `None`:
    /// run it with [`LogicalUnit::execute`]. A write is admitted when its
    /// data-out is in one segment (a large one kept in several takes the
    /// ordinary path, which writes it segment by segment).
    pub fn admit_fast(&self, cmd: &Command<'_>) -> Option<FastIo> {
        let (write, f) = self.checked_read_or_write(cmd)?;
        let fua = f.flags & 0x08 != 0;
        let bytes = (f.len as usize) << self.vol.block_shift();
        let kind = if write {
            let d = cmd.data_out;
            if d.segment_count() != 1 || d.len() < bytes {
                return None;
            }
            FastKind::Write {
                data: d.first_bytes()?.slice(..bytes),
                fua,
            }
        } else {
            if fua && self.vol.write_back() {
                return None;
            }
            FastKind::Read
        };
        let range = self.vol.locks().try_shared_owned(f.lba, u64::from(f.len))?;
        Some(FastIo {
            offset: f.lba << self.vol.block_shift(),
            len: bytes,
            kind,
            _range: range,
        })
    }

    /// A READ of at least [`ZERO_COPY_MIN`] bytes that the backend can
    /// serve as a file range, admitted as [`Self::admit_fast`] admits it:
    /// the range, with the command complete (GOOD). `None`: run it as
    /// usual. See the module docs for when this is safe; under data
    /// digests the sender must make the digest cover the bytes it sends
    /// (module docs). Costs nothing measurable for small
    /// reads and for backends that cannot splice.
    pub fn zero_copy_read(&self, cmd: &Command<'_>) -> Option<filemap::FileRange> {
        let fast = self.vol.backend().fast()?;
        if !fast.can_splice() || self.vol.locks().exclusive_seen() {
            return None;
        }
        let f = match *cmd.cdb.first()? {
            op::READ_10 | op::READ_16 => fields(cmd.cdb).ok()?,
            _ => return None,
        };
        if (u64::from(f.len) << self.vol.block_shift()) < ZERO_COPY_MIN as u64 {
            return None;
        }
        let io = self.admit_fast(cmd)?;
        if io.kind != FastKind::Read {
            return None;
        }
        let r = fast.splice_source(io.offset, io.len)?;
        // Checked again now the range lock is held (module docs).
        if self.vol.locks().exclusive_seen() {
            return None;
        }
        drop(io);
        Some(r)
    }

    /// The place on the medium that a WRITE(10/16) of exactly `len` bytes
    /// can receive its data-out into (module docs, "Writes received in
    /// place"), admitted as [`Self::admit_fast`] admits it and holding its
    /// shared range lock until the [`filemap::Placed`] is dropped. `None`:
    /// receive the data as usual. `cmd.data_out` is not looked at (the
    /// data is still to come). The caller must not use it with data
    /// digests, and must answer the command with [`Self::finish_placed`]
    /// once all of its data is in.
    pub fn place_write(&self, cmd: &Command<'_>, len: usize) -> Option<filemap::Placed> {
        // Once an exclusive holder has been seen, never: a write landing
        // over the network could otherwise keep COMPARE AND WRITE (and the
        // commands queued behind it) waiting as long as its initiator
        // takes to send the data.
        if self.vol.locks().exclusive_seen() {
            return None;
        }
        let (true, f) = self.checked_read_or_write(cmd)? else {
            return None;
        };
        if (f.len as usize) << self.vol.block_shift() != len {
            return None;
        }
        let range = self.vol.locks().try_shared_owned(f.lba, u64::from(f.len))?;
        let placed = self
            .vol
            .backend()
            .fast()?
            .place_write(f.lba << self.vol.block_shift(), len)?;
        // Checked again now the range lock is held.
        if self.vol.locks().exclusive_seen() {
            return None;
        }
        Some(placed.holding(range.into_held()))
    }

    /// The outcome of a WRITE whose data-out was all received into the
    /// place [`Self::place_write`] gave it: GOOD once the data is as
    /// stable as the unit promises (FUA, write-through), WRITE ERROR when
    /// part of it could not be written. Releases the range lock.
    pub fn finish_placed(&self, cdb: &[u8], placed: filemap::Placed) -> Outcome {
        let failed = placed
            .error()
            .map(|e| backend_error(e, Asc::WRITE_ERROR))
            .or_else(|| {
                (placed.len() != placed.capacity()).then(|| {
                    crate::sense::Sense::new(crate::sense::SenseKey::MediumError, Asc::WRITE_ERROR)
                })
            });
        if let Some(s) = failed {
            return Outcome::check(s);
        }
        // The data is on the medium: the backend makes it as stable as FUA
        // and the cache policy ask, and the range lock goes with `placed`.
        let (offset, fua) = fields(cdb).map_or((0, false), |f| {
            (f.lba << self.vol.block_shift(), f.flags & 0x08 != 0)
        });
        match self
            .vol
            .backend()
            .write(&WriteData::Placed(placed), offset, fua)
        {
            Ok(()) => Outcome::good(),
            Err(e) => Outcome::check(backend_error(&e, Asc::WRITE_ERROR)),
        }
    }

    /// The outcome of an admitted command whose backend call returned `r`
    /// (a read's data; anything for a write); releases its range lock.
    pub fn finish_fast(&self, io: FastIo, r: io::Result<Bytes>) -> Outcome {
        let write = matches!(io.kind, FastKind::Write { .. });
        drop(io);
        match r {
            Ok(_) if write => Outcome::good(),
            Ok(data) => Outcome::with_data(data),
            Err(e) if write => Outcome::check(backend_error(&e, Asc::WRITE_ERROR)),
            Err(e) => Outcome::check(backend_error(&e, Asc::UNRECOVERED_READ_ERROR)),
        }
    }
}
