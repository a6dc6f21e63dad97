//! Storage faults the SCSI layer turned into sense data: counted by kind
//! for `/metrics` (`ironsan_storage_faults_total`), and logged at warn once
//! per burst, with the failing operation and how many more followed, so a
//! cluster that stops answering shows in the logs without one line per I/O.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// What kind of storage fault a command ended on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The storage did not answer in time ([`storage::Unresponsive`]).
    Unresponsive,
    /// This process may not use the storage now ([`storage::NotAccessible`]).
    NotAccessible,
    /// The storage is out of space (ENOSPC, EDQUOT).
    NoSpace,
    /// Anything else (MEDIUM ERROR).
    Medium,
}

impl FaultKind {
    /// Every kind, in the order of [`storage_faults`].
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Unresponsive,
        FaultKind::NotAccessible,
        FaultKind::NoSpace,
        FaultKind::Medium,
    ];

    /// The label value in `/metrics`.
    pub const fn name(self) -> &'static str {
        match self {
            FaultKind::Unresponsive => "unresponsive",
            FaultKind::NotAccessible => "not_accessible",
            FaultKind::NoSpace => "no_space",
            FaultKind::Medium => "medium",
        }
    }
}

/// The least time between two log lines of one kind.
const QUIET: Duration = Duration::from_secs(10);

struct Burst {
    last: Option<Instant>,
    /// Faults since the last line.
    unsaid: u64,
}

struct Faults {
    total: [AtomicU64; 4],
    bursts: Mutex<[Burst; 4]>,
}

static FAULTS: Faults = Faults {
    total: [const { AtomicU64::new(0) }; 4],
    bursts: Mutex::new(
        [const {
            Burst {
                last: None,
                unsaid: 0,
            }
        }; 4],
    ),
};

/// Faults of each kind since the process started, in [`FaultKind::ALL`]'s
/// order.
pub fn storage_faults() -> [(FaultKind, u64); 4] {
    FaultKind::ALL.map(|k| (k, FAULTS.total[k as usize].load(Ordering::Relaxed)))
}

/// Counts `e` as a fault of `kind` and logs it unless a line of that kind
/// was logged in the last ten seconds (the next line then says how many
/// were not).
pub(crate) fn record(kind: FaultKind, e: &io::Error) {
    FAULTS.total[kind as usize].fetch_add(1, Ordering::Relaxed);
    let mut bursts = FAULTS.bursts.lock();
    let b = &mut bursts[kind as usize];
    let now = Instant::now();
    if b.last.is_some_and(|t| now.duration_since(t) < QUIET) {
        b.unsaid += 1;
        return;
    }
    let unsaid = std::mem::take(&mut b.unsaid);
    b.last = Some(now);
    drop(bursts);
    tracing::warn!(
        kind = kind.name(),
        more_since_last_line = unsaid,
        "storage fault: {e}"
    );
}
