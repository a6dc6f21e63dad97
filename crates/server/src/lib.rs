//! The ironsan server's data plane: configuration, portals, connection
//! drivers, sessions and LUN tables.
//!
//! The protocol ([`iscsi_proto`]) and SCSI ([`scsi`]) crates make every
//! decision; this crate moves bytes between them and sockets, runs backend
//! I/O where it cannot block the event loop, and keeps the registry of
//! sessions (for TSIH assignment and session reinstatement, RFC 7143 §6.3.5).
//! A running server is changed only through [`control::Control`], the
//! handle the control plane (the `admin-api` crate) drives; this crate does
//! not know that crate.

mod access;
pub mod admission;
pub mod config;
mod conn;
pub mod control;
pub mod control_acl;
pub mod gateway;
mod lunmap;
mod memory;
mod nvme;
pub mod opening;
mod server;
pub mod size;
pub mod stats;

pub use config::{Config, ConfigError};
pub use server::{Server, ServerHandle};
