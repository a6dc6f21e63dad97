//! The text format of Login and Text PDUs (RFC 7143 §6.1): `key=value`
//! pairs, each ended by a NUL byte, possibly spread over several PDUs with
//! the C (continue) bit set.
//!
//! Every length is bounded before it is stored: key names to 63 bytes
//! (§6.1), values to 8192 bytes (the largest any key allows, §6.1 "large
//! binary values"), and a whole continued text to [`MAX_TEXT_LEN`].

use thiserror::Error;

/// Longest key name (RFC 7143 §6.1).
pub const MAX_KEY_LEN: usize = 63;
/// Longest value accepted for any key.
pub const MAX_VALUE_LEN: usize = 8192;
/// Longest text accepted across C-bit continuations.
pub const MAX_TEXT_LEN: usize = 64 * 1024;
/// Most PDUs one continued text may span (bounds a stream of empty
/// continuation PDUs, which [`MAX_TEXT_LEN`] alone does not).
pub const MAX_TEXT_PIECES: usize = 128;

/// Why a text segment was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TextError {
    /// A pair without `=`.
    #[error("text pair without '=': {0:?}")]
    NoEquals(String),
    /// An empty key name.
    #[error("empty key name")]
    EmptyKey,
    /// A key name over 63 bytes.
    #[error("key name longer than {MAX_KEY_LEN} bytes")]
    KeyTooLong,
    /// A value over 8192 bytes.
    #[error("value of {0} longer than {MAX_VALUE_LEN} bytes")]
    ValueTooLong(String),
    /// Bytes that are not UTF-8.
    #[error("text is not UTF-8")]
    NotUtf8,
    /// Continued text over [`MAX_TEXT_LEN`].
    #[error("text longer than {MAX_TEXT_LEN} bytes")]
    TooLong,
    /// Continued text spread over more than [`MAX_TEXT_PIECES`] PDUs.
    #[error("text continued over more than {MAX_TEXT_PIECES} PDUs")]
    TooManyPieces,
}

/// Parses a complete text into pairs, in order. Empty segments (a trailing
/// NUL, or padding NULs) are ignored.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    if data.len() > MAX_TEXT_LEN {
        return Err(TextError::TooLong);
    }
    let mut out = Vec::new();
    for seg in data.split(|&b| b == 0) {
        if seg.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(seg).map_err(|_| TextError::NotUtf8)?;
        let Some((k, v)) = s.split_once('=') else {
            let mut shown = s.to_string();
            shown.truncate(64);
            return Err(TextError::NoEquals(shown));
        };
        if k.is_empty() {
            return Err(TextError::EmptyKey);
        }
        if k.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong);
        }
        if v.len() > MAX_VALUE_LEN {
            return Err(TextError::ValueTooLong(k.to_string()));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Appends `key=value\0` to `out`.
pub fn push(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value.as_bytes());
    out.push(0);
}

/// Encodes pairs.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        push(&mut out, k.as_ref(), v.as_ref());
    }
    out
}

/// Gathers the data segments of a text sent over several PDUs (C bit).
#[derive(Debug, Default)]
pub struct Continuation {
    buf: Vec<u8>,
    pieces: usize,
}

impl Continuation {
    /// Adds one PDU's data segment. Returns the whole text when `cont` is
    /// false (this was the last piece), `None` while more is expected.
    pub fn push(&mut self, data: &[u8], cont: bool) -> Result<Option<Vec<u8>>, TextError> {
        if self.buf.len() + data.len() > MAX_TEXT_LEN {
            self.buf.clear();
            self.pieces = 0;
            return Err(TextError::TooLong);
        }
        self.pieces += 1;
        if cont && self.pieces >= MAX_TEXT_PIECES {
            self.buf.clear();
            self.pieces = 0;
            return Err(TextError::TooManyPieces);
        }
        self.buf.extend_from_slice(data);
        if cont {
            Ok(None)
        } else {
            self.pieces = 0;
            Ok(Some(std::mem::take(&mut self.buf)))
        }
    }

    /// True when part of a text has been received.
    pub fn in_progress(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Splits `text` into chunks of at most `max` bytes for sending with the C
/// bit on all but the last.
pub fn chunks(text: &[u8], max: usize) -> impl Iterator<Item = &[u8]> {
    let max = max.max(1);
    let n = text.len().div_ceil(max).max(1);
    (0..n).map(move |i| &text[(i * max).min(text.len())..((i + 1) * max).min(text.len())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_pairs() {
        let t = b"InitiatorName=iqn.x\0SessionType=Normal\0\0";
        let p = parse(t).unwrap();
        assert_eq!(
            p,
            vec![
                ("InitiatorName".to_string(), "iqn.x".to_string()),
                ("SessionType".to_string(), "Normal".to_string())
            ]
        );
        assert_eq!(parse(b"a=b=c\0").unwrap()[0].1, "b=c");
    }

    #[test]
    fn refuses_bad_text() {
        assert!(matches!(parse(b"novalue\0"), Err(TextError::NoEquals(_))));
        assert_eq!(parse(b"=x\0"), Err(TextError::EmptyKey));
        let long_key = format!("{}=1\0", "k".repeat(64));
        assert_eq!(parse(long_key.as_bytes()), Err(TextError::KeyTooLong));
        let long_val = format!("k={}\0", "v".repeat(8193));
        assert!(matches!(
            parse(long_val.as_bytes()),
            Err(TextError::ValueTooLong(_))
        ));
        assert_eq!(parse(&[0xff, b'=', b'1']), Err(TextError::NotUtf8));
    }

    #[test]
    fn continuation_is_bounded() {
        let mut c = Continuation::default();
        let piece = vec![b'a'; 8192];
        let mut err = None;
        for _ in 0..20 {
            if let Err(e) = c.push(&piece, true) {
                err = Some(e);
                break;
            }
        }
        assert_eq!(err, Some(TextError::TooLong));
        assert_eq!(c.push(b"x=1\0", true), Ok(None));
        assert_eq!(c.push(b"y=2\0", false), Ok(Some(b"x=1\0y=2\0".to_vec())));
        // Endless empty continuations end too.
        let mut c = Continuation::default();
        let r = (0..1000).find_map(|_| c.push(b"", true).err());
        assert_eq!(r, Some(TextError::TooManyPieces));
    }

    proptest! {
        #[test]
        fn round_trip(pairs in proptest::collection::vec(("[A-Za-z][A-Za-z0-9.]{0,20}", "[ -~&&[^=]]{0,40}"), 0..10)) {
            let enc = encode(&pairs);
            let dec = parse(&enc).unwrap();
            prop_assert_eq!(dec.len(), pairs.len());
            for ((k, v), (k2, v2)) in pairs.iter().zip(dec.iter()) {
                prop_assert_eq!(k, k2);
                prop_assert_eq!(v, v2);
            }
        }

        #[test]
        fn chunks_rejoin(text in proptest::collection::vec(any::<u8>(), 0..5000), max in 1usize..3000) {
            let joined: Vec<u8> = chunks(&text, max).flatten().copied().collect();
            prop_assert_eq!(joined, text);
        }

        #[test]
        fn parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse(&data);
        }
    }
}
