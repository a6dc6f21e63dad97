//! Sequence numbers with serial number arithmetic (RFC 1982, as RFC 7143
//! §4.2.2.1 requires for CmdSN, StatSN, DataSN and R2TSN).

use std::cmp::Ordering;
use std::fmt;

/// A 32-bit iSCSI sequence number compared with RFC 1982 serial arithmetic.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sn(pub u32);

impl Sn {
    /// The number `n` steps after this one (wrapping).
    #[must_use]
    pub fn plus(self, n: u32) -> Sn {
        Sn(self.0.wrapping_add(n))
    }

    /// The next number.
    #[must_use]
    pub fn next(self) -> Sn {
        self.plus(1)
    }

    /// Serial comparison; `None` when the two are exactly 2^31 apart
    /// (undefined by RFC 1982).
    pub fn serial_cmp(self, other: Sn) -> Option<Ordering> {
        let d = self.0.wrapping_sub(other.0);
        match d {
            0 => Some(Ordering::Equal),
            0x8000_0000 => None,
            d if d < 0x8000_0000 => Some(Ordering::Greater),
            _ => Some(Ordering::Less),
        }
    }

    /// `self < other` in serial arithmetic.
    pub fn lt(self, other: Sn) -> bool {
        self.serial_cmp(other) == Some(Ordering::Less)
    }

    /// `self > other` in serial arithmetic.
    pub fn gt(self, other: Sn) -> bool {
        self.serial_cmp(other) == Some(Ordering::Greater)
    }

    /// True when `lo <= self <= hi` in serial arithmetic.
    pub fn in_window(self, lo: Sn, hi: Sn) -> bool {
        !self.lt(lo) && !self.gt(hi)
    }
}

impl fmt::Debug for Sn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sn({})", self.0)
    }
}

impl fmt::Display for Sn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        assert!(Sn(u32::MAX).lt(Sn(0)));
        assert!(Sn(0).gt(Sn(u32::MAX)));
        assert!(Sn(5).in_window(Sn(u32::MAX - 2), Sn(10)));
        assert!(!Sn(11).in_window(Sn(u32::MAX - 2), Sn(10)));
        assert_eq!(Sn(0).serial_cmp(Sn(0x8000_0000)), None);
    }
}
