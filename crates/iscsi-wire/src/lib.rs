//! The iSCSI wire format (RFC 7143 §11): PDU framing, typed basic header
//! segments for every PDU a target or an initiator sends or receives, header
//! and data digests (CRC32C, §12.1), padding, and the text `key=value` codec
//! (§6.1).
//!
//! Nothing here performs I/O. Decoding is split in two steps, as in
//! mini-redis: [`frame::frame_len`] checks that a complete PDU is buffered
//! (bounding every length against the negotiated limits before anything is
//! allocated), then [`frame::split_pdu`] cuts it out of the receive buffer
//! without copying and verifies its digests. [`pdu::Pdu::parse`] turns the
//! 48-byte basic header segment into a typed value.

pub mod digest;
pub mod frame;
pub mod landing;
pub mod outbox;
pub mod pdu;
pub mod receive;
pub mod serial;
pub mod text;

pub use frame::{FrameError, FrameLimits, RawPdu};
pub use outbox::Outbox;
pub use pdu::*;
pub use serial::Sn;
