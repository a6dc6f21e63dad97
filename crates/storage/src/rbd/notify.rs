//! Asking every client that watches an image whether it is still there:
//! a RADOS notify on the image's header object (`rados_notify2`), which
//! every librbd client with the image open watches and acknowledges.
//!
//! A gateway that holds the exclusive lock but is hung (stopped, stuck in
//! the kernel) or dead still looks connected to the cluster until the
//! OSDs expire its watch (`osd_client_watch_timeout`, 30 s by default),
//! which is as long as an initiator's command timeout. A notify finds out
//! within its own timeout: a client that does not acknowledge in time is
//! listed as timed out. librbd takes a notify without a payload as a
//! header update (it refreshes the image and acknowledges), which is
//! harmless.
//!
//! The reply's layout is given in `librados.h` (`rados_notify2`): all
//! little-endian,
//!
//! ```text
//!   le32 num_acks
//!   { le64 gid; le64 cookie; le32 buflen; u8 payload[buflen] } * num_acks
//!   le32 num_timeouts
//!   { le64 gid; le64 cookie } * num_timeouts
//! ```

/// A watch: the client's global id (`client.<gid>`) and the watch cookie.
pub(super) type Watch = (u64, u64);

/// Who answered a notify.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Reply {
    /// Watches that acknowledged.
    pub acked: Vec<Watch>,
    /// Watches that did not within the timeout.
    pub missed: Vec<Watch>,
}

/// Reads `n` little-endian bytes at `*at`, advancing it.
fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Option<&'a [u8]> {
    let end = at.checked_add(n)?;
    let s = b.get(*at..end)?;
    *at = end;
    Some(s)
}

fn u32_at(b: &[u8], at: &mut usize) -> Option<u32> {
    Some(u32::from_le_bytes(take(b, at, 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: &mut usize) -> Option<u64> {
    Some(u64::from_le_bytes(take(b, at, 8)?.try_into().ok()?))
}

/// Parses a notify reply; `None` when it is malformed (a count larger
/// than the bytes that follow can hold is refused before anything is
/// allocated for it).
pub(super) fn parse_reply(b: &[u8]) -> Option<Reply> {
    let mut at = 0;
    let n = u32_at(b, &mut at)? as usize;
    // An ack takes at least 20 bytes.
    if n > (b.len() - at) / 20 {
        return None;
    }
    let mut r = Reply {
        acked: Vec::with_capacity(n),
        missed: Vec::new(),
    };
    for _ in 0..n {
        let w = (u64_at(b, &mut at)?, u64_at(b, &mut at)?);
        let len = u32_at(b, &mut at)? as usize;
        take(b, &mut at, len)?;
        r.acked.push(w);
    }
    let m = u32_at(b, &mut at)? as usize;
    if m > (b.len() - at) / 16 {
        return None;
    }
    r.missed.reserve(m);
    for _ in 0..m {
        r.missed.push((u64_at(b, &mut at)?, u64_at(b, &mut at)?));
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(acked: &[(u64, u64, &[u8])], missed: &[Watch]) -> Vec<u8> {
        let mut v = (acked.len() as u32).to_le_bytes().to_vec();
        for (g, c, p) in acked {
            v.extend(g.to_le_bytes());
            v.extend(c.to_le_bytes());
            v.extend((p.len() as u32).to_le_bytes());
            v.extend(*p);
        }
        v.extend((missed.len() as u32).to_le_bytes());
        for (g, c) in missed {
            v.extend(g.to_le_bytes());
            v.extend(c.to_le_bytes());
        }
        v
    }

    #[test]
    fn replies_parse_and_bad_ones_are_refused() {
        let b = encode(
            &[(4123, 94_000_001, b""), (4130, 7, b"reply")],
            &[(4200, 9)],
        );
        let r = parse_reply(&b).unwrap();
        assert_eq!(r.acked, vec![(4123, 94_000_001), (4130, 7)]);
        assert_eq!(r.missed, vec![(4200, 9)]);
        assert_eq!(parse_reply(&encode(&[], &[])).unwrap(), Reply::default());
        // Every truncation is refused, never a panic.
        for cut in 0..b.len() {
            assert_eq!(parse_reply(&b[..cut]), None, "cut at {cut}");
        }
        // Counts beyond what the bytes can hold are refused up front.
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend([0u8; 64]);
        assert_eq!(parse_reply(&huge), None);
        let mut huge = encode(&[], &[]);
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_reply(&huge), None);
        // A payload length past the end.
        let mut bad = encode(&[(1, 2, b"x")], &[]);
        bad[20..24].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(parse_reply(&bad), None);
    }
}
