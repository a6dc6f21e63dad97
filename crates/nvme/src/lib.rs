//! The NVMe personality of a volume and the NVMe/TCP controller, sans-IO.
//!
//! - [`queue`]: one NVMe/TCP connection's transport state machine (ICReq,
//!   capsules, R2T and H2CData, C2HData and response capsules).
//! - [`ctrl`]: subsystems, the dynamic controller model, Connect, the
//!   controller properties, keep alive.
//! - [`admin`]: the admin command set and the Discovery log page.
//! - [`nvm`]: the NVM command set on a [`volume::Volume`].
//! - [`resv`]: the reservation commands, on the state the server keeps
//!   with the logical unit's SCSI persistent reservations.
//!
//! The connection driver (sockets, threads) is the server's
//! (`crates/server/src/nvme.rs`); nothing here performs I/O but the
//! volume's own.

pub mod admin;
pub mod ctrl;
pub mod nvm;
pub mod queue;
pub mod resv;

pub use admin::{Outcome, Port, Reply};
pub use ctrl::{Controller, Namespaces, Registry, Subsystem, DISCOVERY_NQN};
pub use queue::{Command, Queue, Stop};
