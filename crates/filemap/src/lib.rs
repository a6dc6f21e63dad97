//! Files in memory: what lets a LUN file's pages be sent, received into and
//! digested in place, with no copy through a buffer (docs/ARCHITECTURE.md,
//! "A command's life").
//!
//! - [`FileMap`] (`map.rs`): a shared mapping of a LUN file, with the record
//!   of pages known present (`known.rs`) so that a range is served from the
//!   mapping only where reading it cannot fault.
//! - `store.rs`: copies into and reads from the mapping that survive a page
//!   going away (SIGBUS recovered at known instructions, as the kernel's
//!   exception tables do), and non-temporal stores for large copies.
//! - [`WriteGate`], [`Pin`] (`gate.rs`): writers of a file against readers
//!   of its pages in place, so a data digest is computed over bytes that
//!   cannot change before they are sent.
//! - [`BlockSums`], [`FileSums`] (`sums.rs`): cached CRC32C of 4 KiB blocks
//!   of a buffer or a file, folded into data digests (RFC 7143 §13.1).
//! - [`FileRange`] (`range.rs`): a range of a file for the send queue
//!   (`sendfile(2)` or the mapping); [`Placed`] (`place.rs`): a write's
//!   place in the mapping, for the receive path.
//!
//! Only storage (which makes these) and the connection's send and receive
//! paths for file ranges and placed writes use them; `bufpool`'s chains and
//! landing buffers name [`FileRange`] and [`Placed`] as one of their forms.

mod gate;
mod known;
mod map;
mod place;
mod range;
mod store;
mod sums;
pub use gate::{Pin, WriteGate, WriteToken};
pub use map::FileMap;
pub use place::{Held, Placed, Release};
pub use range::FileRange;
pub use store::NT_STORE_MIN;
pub use sums::{BlockSums, FileSums, MAX_SUM_BLOCKS, SUM_BLOCK, SUM_CHUNK};

/// A file of its own in `dir`, already unlinked (tests of file ranges
/// and mappings).
#[cfg(test)]
fn unlinked_file(dir: &std::path::Path, tag: &str) -> std::io::Result<std::fs::File> {
    let p = dir.join(format!(
        "filemap-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)?;
    let _ = std::fs::remove_file(&p);
    Ok(f)
}
