//! Framing of the multi-node bench protocol: every message is one frame,
//!
//! ```text
//! +--------------+---------------------+------------------------+
//! | magic "ISNB" | length: u32, big    | body: `length` bytes   |
//! | (4 bytes)    | endian (4 bytes)    | of JSON                |
//! +--------------+---------------------+------------------------+
//! ```
//!
//! The reader checks the magic and bounds the length against its limit
//! before it reads (or allocates for) the body, and never buffers more than
//! one frame. "Not yet complete" (`Ok(None)`) is not "malformed" (`Err`).

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"ISNB";
/// Magic and length.
pub const HEADER: usize = 8;

/// Why a peer's bytes could not be used, or the connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The peer closed the connection.
    #[error("connection closed by the peer")]
    Closed,
    /// Nothing (or not a whole message) arrived in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A frame announced more bytes than this side accepts.
    #[error("the peer sent a frame of {len} bytes, over the limit of {max}")]
    TooLong { len: u32, max: u32 },
    /// The bytes are not this protocol at all.
    #[error("not an ironsan bench peer (frame starts with {0:02x?}, expected \"ISNB\")")]
    BadMagic([u8; 4]),
    /// A complete frame that does not decode as an expected message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl ProtoError {
    /// True when the peer broke the protocol (as opposed to going away or
    /// being slow).
    pub fn is_peer_fault(&self) -> bool {
        matches!(
            self,
            ProtoError::TooLong { .. } | ProtoError::BadMagic(_) | ProtoError::Malformed(_)
        )
    }
}

/// Encodes a message as one frame.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serializing our own message types to JSON cannot fail: they have no
    // maps with non-string keys and no failing Serialize impls.
    let body = serde_json::to_vec(msg).unwrap_or_default();
    let mut f = Vec::with_capacity(HEADER + body.len());
    f.extend_from_slice(&MAGIC);
    f.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    f.extend_from_slice(&body);
    f
}

/// Writes one message.
pub fn send<T: Serialize, W: Write>(w: &mut W, msg: &T) -> Result<(), ProtoError> {
    w.write_all(&encode(msg))?;
    w.flush()?;
    Ok(())
}

/// Decodes a frame's body.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtoError> {
    serde_json::from_slice(body).map_err(|e| ProtoError::Malformed(e.to_string()))
}

/// Collects the bytes of one frame at a time from a stream.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    limit: u32,
}

impl FrameReader {
    /// A reader that refuses bodies over `limit` bytes.
    pub fn new(limit: u32) -> FrameReader {
        FrameReader {
            buf: Vec::new(),
            limit,
        }
    }

    /// Changes the limit (e.g. once the peer has authenticated).
    pub fn set_limit(&mut self, limit: u32) {
        self.limit = limit;
    }

    /// The body length once the header is complete, checked against the
    /// limit and the magic.
    fn wanted(&self) -> Result<Option<usize>, ProtoError> {
        if self.buf.len() < HEADER {
            // Garbage is refused as soon as it cannot be the magic.
            let n = self.buf.len().min(4);
            if self.buf[..n] != MAGIC[..n] {
                let mut m = [0u8; 4];
                m[..n].copy_from_slice(&self.buf[..n]);
                return Err(ProtoError::BadMagic(m));
            }
            return Ok(None);
        }
        let mut m = [0u8; 4];
        m.copy_from_slice(&self.buf[..4]);
        if m != MAGIC {
            return Err(ProtoError::BadMagic(m));
        }
        let len = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]);
        if len > self.limit {
            return Err(ProtoError::TooLong {
                len,
                max: self.limit,
            });
        }
        Ok(Some(len as usize))
    }

    /// Takes a complete frame's body out of the buffer, if there is one.
    pub fn take(&mut self) -> Result<Option<Vec<u8>>, ProtoError> {
        match self.wanted()? {
            Some(len) if self.buf.len() >= HEADER + len => {
                let body = self.buf[HEADER..HEADER + len].to_vec();
                self.buf.drain(..HEADER + len);
                Ok(Some(body))
            }
            _ => Ok(None),
        }
    }

    /// Reads what the stream has, up to the end of the current frame, and
    /// returns the frame's body once it is complete. A read timeout on the
    /// stream (`WouldBlock`/`TimedOut`) gives `Ok(None)`; end of stream
    /// gives [`ProtoError::Closed`].
    pub fn read_frame<R: Read>(&mut self, r: &mut R) -> Result<Option<Vec<u8>>, ProtoError> {
        if let Some(b) = self.take()? {
            return Ok(Some(b));
        }
        // Read only up to the end of this frame: the buffer never holds more
        // than a header and `limit` bytes.
        let want = match self.wanted()? {
            None => HEADER - self.buf.len(),
            Some(len) => HEADER + len - self.buf.len(),
        };
        let mut chunk = [0u8; 64 * 1024];
        let n = want.min(chunk.len());
        match r.read(&mut chunk[..n]) {
            Ok(0) => Err(ProtoError::Closed),
            Ok(got) => {
                self.buf.extend_from_slice(&chunk[..got]);
                self.take()
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// A blocking connection of the protocol: a TCP stream and its frame reader.
#[derive(Debug)]
pub struct Conn {
    pub stream: std::net::TcpStream,
    pub reader: FrameReader,
}

impl Conn {
    /// Wraps a stream; bodies over `limit` bytes are refused.
    pub fn new(stream: std::net::TcpStream, limit: u32) -> Conn {
        let _ = stream.set_nodelay(true);
        Conn {
            stream,
            reader: FrameReader::new(limit),
        }
    }

    /// Sends one message.
    pub fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), ProtoError> {
        send(&mut self.stream, msg)
    }

    /// Waits up to `timeout` for one message.
    pub fn recv<T: DeserializeOwned>(&mut self, timeout: Duration) -> Result<T, ProtoError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ProtoError::Timeout(timeout));
            }
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            if let Some(body) = self.reader.read_frame(&mut self.stream)? {
                return decode(&body);
            }
        }
    }

    /// Returns a message if one is complete within `wait` (a short poll).
    pub fn poll<T: DeserializeOwned>(&mut self, wait: Duration) -> Result<Option<T>, ProtoError> {
        self.stream
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        match self.reader.read_frame(&mut self.stream)? {
            Some(body) => decode(&body).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(bytes: &[u8], limit: u32) -> Result<Vec<Vec<u8>>, ProtoError> {
        let mut r = FrameReader::new(limit);
        let mut src = bytes;
        let mut out = Vec::new();
        loop {
            match r.read_frame(&mut src) {
                Ok(Some(b)) => out.push(b),
                Ok(None) => {}
                Err(ProtoError::Closed) => return Ok(out),
                Err(e) => return Err(e),
            }
        }
    }

    #[test]
    fn round_trip_and_split_reads() {
        let mut wire = encode(&serde_json::json!({"msg": "start"}));
        wire.extend(encode(&serde_json::json!({"msg": "abort"})));
        let got = frames(&wire, 1024).unwrap();
        assert_eq!(got.len(), 2);
        let v: serde_json::Value = decode(&got[1]).unwrap();
        assert_eq!(v["msg"], "abort");
        // One byte at a time gives the same frames.
        let mut r = FrameReader::new(1024);
        let mut n = 0;
        for b in &wire {
            let mut one: &[u8] = std::slice::from_ref(b);
            if r.read_frame(&mut one).unwrap().is_some() {
                n += 1;
            }
        }
        assert_eq!(n, 2);
    }

    #[test]
    fn oversized_length_is_refused_before_reading_the_body() {
        let mut wire = MAGIC.to_vec();
        wire.extend_from_slice(&u32::MAX.to_be_bytes());
        // No body at all: the header alone is enough to refuse it.
        match frames(&wire, 1 << 20) {
            Err(ProtoError::TooLong { len, max }) => {
                assert_eq!((len, max), (u32::MAX, 1 << 20));
            }
            other => panic!("{other:?}"),
        }
        let f = encode(&"x".repeat(100));
        assert!(matches!(frames(&f, 50), Err(ProtoError::TooLong { .. })));
        assert!(frames(&f, 102).is_ok());
    }

    #[test]
    fn garbage_is_refused() {
        for g in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"\x16\x03\x01\x02\x00",
            b"IS\x00",
        ] {
            let e = frames(g, 1024).unwrap_err();
            assert!(matches!(e, ProtoError::BadMagic(_)), "{g:?}: {e:?}");
            assert!(e.is_peer_fault());
        }
        // A well-framed body that is not JSON of the expected shape.
        let mut wire = MAGIC.to_vec();
        wire.extend_from_slice(&3u32.to_be_bytes());
        wire.extend_from_slice(b"{]x");
        let body = frames(&wire, 1024).unwrap().remove(0);
        let e = decode::<serde_json::Value>(&body).unwrap_err();
        assert!(matches!(e, ProtoError::Malformed(_)));
        // A truncated frame is "incomplete", then "closed", never a panic.
        let f = encode(&"hello");
        assert!(frames(&f[..f.len() - 1], 1024).unwrap().is_empty());
    }
}
