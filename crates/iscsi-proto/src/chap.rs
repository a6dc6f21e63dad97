//! CHAP with MD5 (RFC 1994, RFC 7143 §12.1.3): the response function,
//! the encodings of CHAP_C and CHAP_R (hex `0x…` or base64 `0b…`, §6.1),
//! secrets that never show in logs, and a constant-time comparison.
//!
//! Both roles use these: the target in [`crate::login`], the initiator in
//! [`crate::initiator::login`]. Nothing here draws random numbers: the
//! caller supplies challenge bytes from the OS random source.

use std::fmt;

/// CHAP_A value of MD5, the only algorithm offered or accepted.
pub const ALGORITHM_MD5: u32 = 5;
/// Largest CHAP_C or CHAP_R accepted, decoded (RFC 7143 §12.1.3 lets
/// challenges be long; bounded here before anything is allocated).
pub const MAX_BINARY: usize = 1024;
/// Length of the challenges this implementation sends.
pub const CHALLENGE_LEN: usize = 16;
/// Shortest secret accepted: 96 bits (RFC 7143 §12.1.3 requires at least
/// that much when the connection is not protected by IPsec).
pub const MIN_SECRET_LEN: usize = 12;
/// Longest secret accepted.
pub const MAX_SECRET_LEN: usize = 255;

/// A CHAP secret. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps secret bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Secret(bytes.into())
    }

    /// The secret bytes, for computing responses.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for an empty secret.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A CHAP name and secret.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Credential {
    pub user: String,
    pub secret: Secret,
}

impl Credential {
    /// A credential from a name and secret bytes.
    pub fn new(user: &str, secret: &[u8]) -> Self {
        Credential {
            user: user.to_string(),
            secret: Secret::new(secret),
        }
    }
}

/// What a target demands of logins to it (or to discovery).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ChapPolicy {
    /// The initiator must authenticate with this name and secret. `None`:
    /// no authentication (AuthMethod=None).
    pub initiator: Option<Credential>,
    /// The target authenticates itself with this name and secret when the
    /// initiator asks (mutual CHAP).
    pub target: Option<Credential>,
}

/// The CHAP response: MD5(id ‖ secret ‖ challenge) (RFC 1994 §4.1).
pub fn response(id: u8, secret: &Secret, challenge: &[u8]) -> [u8; 16] {
    use md5::Digest;
    let mut m = md5::Md5::new();
    m.update([id]);
    m.update(secret.expose());
    m.update(challenge);
    m.finalize().into()
}

/// Compares in constant time (`subtle`), so the time taken does not tell
/// how many leading bytes matched. Lengths are not secret.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// Encodes binary as a hex constant (`0x…`).
pub fn encode_hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Decodes a CHAP_C/CHAP_R value: hex (`0x`/`0X`) or base64 (`0b`/`0B`),
/// at most [`MAX_BINARY`] bytes decoded and at least one. The length is
/// checked before decoding.
pub fn decode_binary(v: &str) -> Option<Vec<u8>> {
    let (kind, body) = (v.get(..2)?, v.get(2..)?);
    match kind {
        "0x" | "0X" => {
            if body.is_empty() || body.len() > 2 * MAX_BINARY {
                return None;
            }
            let digits: Vec<u8> = body
                .bytes()
                .map(|c| (c as char).to_digit(16).map(|d| d as u8))
                .collect::<Option<_>>()?;
            // An odd count has an implied leading zero.
            let mut out = Vec::with_capacity(digits.len().div_ceil(2));
            let mut it = digits.iter();
            if !digits.len().is_multiple_of(2) {
                out.push(*it.next()?);
            }
            while let (Some(h), Some(l)) = (it.next(), it.next()) {
                out.push(h << 4 | l);
            }
            Some(out)
        }
        "0b" | "0B" => {
            if body.is_empty() || body.len() > MAX_BINARY.div_ceil(3) * 4 {
                return None;
            }
            let out = decode_base64(body)?;
            (!out.is_empty() && out.len() <= MAX_BINARY).then_some(out)
        }
        _ => None,
    }
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
        return None;
    }
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    let n = b.len() / 4;
    for (i, q) in b.chunks(4).enumerate() {
        let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && i + 1 != n) {
            return None;
        }
        let mut acc = 0u32;
        for &c in &q[..4 - pad] {
            acc = acc << 6 | val(c)?;
        }
        acc <<= 6 * pad as u32;
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pad]);
    }
    Some(out)
}

/// Parses CHAP_I: a number 0..=255, decimal or hex.
pub fn parse_id(v: &str) -> Option<u8> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 8 {
            return None;
        }
        return u32::from_str_radix(h, 16)
            .ok()
            .and_then(|n| u8::try_from(n).ok());
    }
    if v.is_empty() || v.len() > 3 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md5(data: &[u8]) -> String {
        use md5::Digest;
        encode_hex(&md5::Md5::digest(data))
    }

    #[test]
    fn md5_rfc1321_vectors() {
        assert_eq!(md5(b""), "0xd41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5(b"abc"), "0x900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(
            md5(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "0x57edf4a22be3c955ac49da2e2107b67a"
        );
        assert_eq!(
            md5(b"abcdefghijklmnopqrstuvwxyz"),
            "0xc3fcd3d76192e4007dfb496cca67e13b"
        );
    }

    #[test]
    fn binary_encodings() {
        assert_eq!(decode_binary("0x0102ff"), Some(vec![1, 2, 0xff]));
        assert_eq!(decode_binary("0X102"), Some(vec![1, 2]));
        assert_eq!(decode_binary("0bAQL/"), Some(vec![1, 2, 0xff]));
        assert_eq!(decode_binary("0bAQ=="), Some(vec![1]));
        assert_eq!(decode_binary("0bAQI="), Some(vec![1, 2]));
        for bad in [
            "",
            "0x",
            "0b",
            "12",
            "0xzz",
            "0bA",
            "0bA===",
            "0bAQ==AQ==",
            "0b!!!!",
            "0y00",
        ] {
            assert_eq!(decode_binary(bad), None, "{bad:?}");
        }
        assert!(decode_binary(&format!("0x{}", "ab".repeat(1024))).is_some());
        assert!(decode_binary(&format!("0x{}", "ab".repeat(1025))).is_none());
        assert!(decode_binary(&format!("0b{}", "AAAA".repeat(342))).is_none());
        let b = vec![7u8; 1024];
        assert_eq!(decode_binary(&encode_hex(&b)), Some(b));
    }

    #[test]
    fn ids_and_comparison() {
        assert_eq!(parse_id("0"), Some(0));
        assert_eq!(parse_id("255"), Some(255));
        assert_eq!(parse_id("0xff"), Some(255));
        assert_eq!(parse_id("256"), None);
        assert_eq!(parse_id("-1"), None);
        assert_eq!(parse_id(""), None);
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }

    #[test]
    fn secrets_are_redacted() {
        let c = Credential::new("bob", b"very-secret-1");
        let shown = format!(
            "{c:?} {:?}",
            ChapPolicy {
                initiator: Some(c.clone()),
                target: None
            }
        );
        assert!(!shown.contains("very-secret"), "{shown}");
        assert!(shown.contains("bob"));
    }

    #[test]
    fn rfc1994_response() {
        // MD5(0x01 ‖ "secret" ‖ 16 zero bytes), from Python's hashlib.
        let r = response(1, &Secret::new(&b"secret"[..]), &[0u8; 16]);
        assert_eq!(encode_hex(&r), "0x7570c653cdf4755ccffcaa80f29268d1");
    }
}
