//! MODE SENSE(6/10) and MODE SELECT(6/10) (SPC-4 §6.9–6.12, §7.5) with
//! the mode pages of a direct-access device (SBC-3 §6.4).
//!
//! | page | name     | changeable                                   |
//! |------|----------|----------------------------------------------|
//! | 08h  | Caching  | WCE, when the backend is not volatile        |
//! | 0Ah  | Control  | nothing (D_SENSE = 0: fixed-format sense)    |
//!
//! WCE always reports the backend's actual policy
//! ([`storage::Caps::write_cache`]); the default page shows the
//! policy the unit was created with. A volatile backend (RAM, null) has no
//! stable storage behind its "cache", so WCE = 1 there and cannot change.
//! Saved pages are not implemented: PC = 11b answers SAVING PARAMETERS NOT
//! SUPPORTED, MODE SELECT with SP = 1 INVALID FIELD IN CDB.
//!
//! The header's device-specific parameter carries WP (write protect) and
//! DPOFUA (DPO and FUA accepted, SBC-3 §6.4.1). MODE SENSE returns a short
//! LBA block descriptor unless DBD is set, or a long one for MODE SENSE(10)
//! with LLBAA.
//!
//! MODE SELECT validates the whole parameter list before changing anything:
//! PF must be 1; the medium type 0; a block descriptor must match the
//! capacity and block size; each page must be one we serve, with our page
//! length, and differ from the current values only in changeable bits
//! (else INVALID FIELD IN PARAMETER LIST pointing at the bit); a list that
//! ends inside a structure is a PARAMETER LIST LENGTH ERROR. A change made
//! establishes MODE PARAMETERS CHANGED for every other nexus.

use volume::WriteCacheError;

use crate::cdb::{be16, be32, be64, op};
use crate::lu::{backend_error, data_in, Command, LogicalUnit, Outcome};
use crate::sense::{Asc, Sense, SenseKey};

const CACHING: u8 = 0x08;
const CONTROL: u8 = 0x0A;
const ALL_PAGES: u8 = 0x3F;
/// Pages served, in the ascending order "all pages" returns them.
const PAGES: [u8; 2] = [CACHING, CONTROL];

const CACHING_LEN: usize = 20;
const CONTROL_LEN: usize = 12;
/// WCE: byte 2 bit 2 of the Caching page.
const WCE: u8 = 0x04;

/// Device-specific parameter bits of the mode header (SBC-3 §6.4.1).
const WP: u8 = 0x80;
const DPOFUA: u8 = 0x10;

/// PAGE CONTROL of MODE SENSE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pc {
    Current,
    Changeable,
    Default,
}

impl LogicalUnit {
    fn wce_changeable(&self) -> bool {
        self.vol.write_cache_switchable()
    }

    fn wce_current(&self) -> bool {
        self.vol.write_back()
    }

    /// The bytes of page `code` as `pc` asks; `None` for pages not served.
    fn mode_page(&self, code: u8, pc: Pc) -> Option<Vec<u8>> {
        match code {
            CACHING => {
                let mut p = vec![0u8; CACHING_LEN];
                p[0] = CACHING;
                p[1] = (CACHING_LEN - 2) as u8;
                let wce = match pc {
                    Pc::Current => self.wce_current(),
                    Pc::Changeable => self.wce_changeable(),
                    Pc::Default => self.vol.default_write_back(),
                };
                if wce {
                    p[2] |= WCE;
                }
                Some(p)
            }
            CONTROL => {
                let mut p = vec![0u8; CONTROL_LEN];
                p[0] = CONTROL;
                p[1] = (CONTROL_LEN - 2) as u8;
                if pc != Pc::Changeable {
                    // TST 000b, D_SENSE 0, QERR 00b; QUEUE ALGORITHM
                    // MODIFIER 1: commands may complete in any order.
                    p[3] = 0x10;
                    // BUSY TIMEOUT PERIOD FFFFh: unlimited.
                    p[8] = 0xFF;
                    p[9] = 0xFF;
                }
                Some(p)
            }
            _ => None,
        }
    }
}

/// MODE SENSE(6) and MODE SENSE(10).
pub fn sense(lu: &LogicalUnit, cdb: &[u8]) -> Outcome {
    let ten = cdb[0] == op::MODE_SENSE_10;
    let dbd = cdb[1] & 0x08 != 0;
    let llbaa = ten && cdb[1] & 0x10 != 0;
    let page = cdb[2] & 0x3F;
    let subpage = cdb[3];
    let alloc = if ten {
        usize::from(be16(cdb, 7))
    } else {
        usize::from(cdb[4])
    };
    let pc = match cdb[2] >> 6 {
        0 => Pc::Current,
        1 => Pc::Changeable,
        2 => Pc::Default,
        _ => {
            return Outcome::check(Sense::new(
                SenseKey::IllegalRequest,
                Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
            ))
        }
    };
    // No subpages are implemented; FFh ("and all subpages") is fine.
    if subpage != 0x00 && subpage != 0xFF {
        return Outcome::check(Sense::invalid_cdb(3, None));
    }
    let single;
    let codes: &[u8] = match page {
        ALL_PAGES => &PAGES,
        p if PAGES.contains(&p) => {
            single = [p];
            &single
        }
        _ => return Outcome::check(Sense::invalid_cdb(2, Some(5))),
    };

    let hdr = if ten { 8 } else { 4 };
    let mut d = vec![0u8; hdr];
    let bd_len = if dbd {
        0
    } else if llbaa {
        d.extend_from_slice(&lu.num_blocks().to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 0]);
        d.extend_from_slice(&lu.cfg.block_size.to_be_bytes());
        16
    } else {
        let n = u32::try_from(lu.num_blocks()).unwrap_or(u32::MAX);
        d.extend_from_slice(&n.to_be_bytes());
        d.extend_from_slice(&lu.cfg.block_size.to_be_bytes()); // byte 4 reserved (0)
        8
    };
    for &c in codes {
        if let Some(p) = lu.mode_page(c, pc) {
            d.extend_from_slice(&p);
        }
    }
    let dsp = DPOFUA | if lu.vol.read_only() { WP } else { 0 };
    if ten {
        let mdl = (d.len() - 2) as u16;
        d[0..2].copy_from_slice(&mdl.to_be_bytes());
        d[3] = dsp;
        d[4] = u8::from(llbaa && !dbd); // LONGLBA
        d[6..8].copy_from_slice(&(bd_len as u16).to_be_bytes());
    } else {
        d[0] = (d.len() - 1) as u8;
        d[2] = dsp;
        d[3] = bd_len as u8;
    }
    data_in(d, alloc)
}

fn length_error() -> Sense {
    Sense::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR)
}

/// Field pointer bit: the most significant bit of `diff`.
fn top_bit(diff: u8) -> Option<u8> {
    Some(7 - diff.leading_zeros() as u8)
}

/// MODE SELECT(6) and MODE SELECT(10).
pub fn select(lu: &LogicalUnit, cdb: &[u8], cmd: &Command<'_>) -> Outcome {
    match select_inner(lu, cdb, cmd) {
        Ok(o) => o,
        Err(s) => Outcome::check(s),
    }
}

fn select_inner(lu: &LogicalUnit, cdb: &[u8], cmd: &Command<'_>) -> Result<Outcome, Sense> {
    let ten = cdb[0] == op::MODE_SELECT_10;
    let list_len = if ten {
        usize::from(be16(cdb, 7))
    } else {
        usize::from(cdb[4])
    };
    if cdb[1] & 0x01 != 0 {
        return Err(Sense::invalid_cdb(1, Some(0))); // SP: no saved pages
    }
    if list_len == 0 {
        return Ok(Outcome::good()); // SPC-4: not an error
    }
    if cdb[1] & 0x10 == 0 {
        return Err(Sense::invalid_cdb(1, Some(4))); // PF = 0: vendor format
    }
    let data = &cmd.data()[..list_len.min(cmd.data().len())];

    let _serial = lu.mode_lock.lock();
    let hdr = if ten { 8 } else { 4 };
    if data.len() < hdr {
        return Err(length_error());
    }
    let (medium_at, bd_len, long_lba) = if ten {
        (2usize, usize::from(be16(data, 6)), data[4] & 0x01 != 0)
    } else {
        (1usize, usize::from(data[3]), false)
    };
    if data[medium_at] != 0 {
        return Err(Sense::invalid_param(medium_at as u16, None));
    }
    let bd_size = if long_lba { 16 } else { 8 };
    if bd_len != 0 && bd_len != bd_size {
        return Err(Sense::invalid_param(if ten { 6 } else { 3 }, None));
    }
    if data.len() < hdr + bd_len {
        return Err(length_error());
    }
    if bd_len != 0 {
        check_block_descriptor(lu, &data[hdr..hdr + bd_len], hdr)?;
    }

    // Validate every page, remembering the new WCE value.
    let mut new_wce = None;
    let mut pos = hdr + bd_len;
    while pos < data.len() {
        if data.len() - pos < 2 {
            return Err(length_error());
        }
        if data[pos] & 0x40 != 0 {
            return Err(Sense::invalid_param(pos as u16, Some(6))); // SPF: no subpages
        }
        let code = data[pos] & 0x3F; // PS is reserved in MODE SELECT
        let Some(current) = lu.mode_page(code, Pc::Current) else {
            return Err(Sense::invalid_param(pos as u16, Some(5)));
        };
        let mask = lu.mode_page(code, Pc::Changeable).unwrap_or_default();
        if usize::from(data[pos + 1]) != current.len() - 2 {
            return Err(Sense::invalid_param(pos as u16 + 1, None));
        }
        if data.len() - pos < current.len() {
            return Err(length_error());
        }
        let sent = &data[pos..pos + current.len()];
        for i in 2..current.len() {
            let diff = (sent[i] ^ current[i]) & !mask[i];
            if diff != 0 {
                return Err(Sense::invalid_param((pos + i) as u16, top_bit(diff)));
            }
        }
        if code == CACHING {
            new_wce = Some((sent[2] & WCE != 0, pos + 2));
        }
        pos += current.len();
    }

    // Apply.
    let mut changed = false;
    if let Some((wce, at)) = new_wce {
        if wce != lu.wce_current() {
            match lu.vol.set_write_back(wce) {
                Ok(()) => {}
                // Not switchable, or the backend did not switch: do not
                // pretend.
                Err(WriteCacheError::Unsupported | WriteCacheError::NotSwitched) => {
                    return Err(Sense::invalid_param(at as u16, Some(2)));
                }
                Err(WriteCacheError::Io(e)) => return Err(backend_error(&e, Asc::WRITE_ERROR)),
            }
            changed = true;
        }
    }
    if changed {
        lu.ua
            .broadcast(Asc::MODE_PARAMETERS_CHANGED, Some(cmd.nexus));
    }
    Ok(Outcome::good())
}

/// A block descriptor in MODE SELECT may not change the format: the block
/// length must be ours and the block count ours or 0 (SBC-3 §6.4.2: zero
/// keeps the current capacity). `at` is its offset in the list.
fn check_block_descriptor(lu: &LogicalUnit, bd: &[u8], at: usize) -> Result<(), Sense> {
    let (blocks, blocks_ours, len_at) = if bd.len() == 16 {
        (be64(bd, 0), lu.num_blocks(), 12)
    } else {
        (
            u64::from(be32(bd, 0)),
            u64::from(u32::try_from(lu.num_blocks()).unwrap_or(u32::MAX)),
            5,
        )
    };
    if blocks != 0 && blocks != blocks_ours {
        return Err(Sense::invalid_param(at as u16, None));
    }
    let block_len = if bd.len() == 16 {
        be32(bd, 12)
    } else {
        be32(bd, 4) & 0x00FF_FFFF
    };
    if block_len != lu.cfg.block_size {
        return Err(Sense::invalid_param((at + len_at) as u16, None));
    }
    Ok(())
}
