//! The other logical units of the same SCSI target device, as the target
//! driver lets one logical unit see them.
//!
//! A logical unit knows nothing of its siblings; two commands need them:
//! EXTENDED COPY (SPC-4 §6.4), whose CSCD descriptors name copy sources and
//! destinations by designator (SPC-4 §6.4.5.1), and SET TARGET PORT GROUPS
//! (SPC-4 §6.46), whose state change is seen through every logical unit of
//! the target and so raises ASYMMETRIC ACCESS STATE CHANGED on all of them
//! (SPC-4 §5.15.2.6). The target driver passes a [`TargetLus`] in
//! [`crate::Command::lus`]; it decides which units the nexus may reach.

use std::fmt;
use std::sync::Arc;

use crate::LogicalUnit;

/// The logical units an I_T nexus may reach through this target.
pub trait TargetLus: Send + Sync + fmt::Debug {
    /// The logical unit whose NAA designator (VPD page 83h, association
    /// logical unit) is `naa`, if this nexus may access it.
    fn by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>>;

    /// Calls `f` for every logical unit of the target.
    fn for_each_lu(&self, f: &mut dyn FnMut(&LogicalUnit));
}
