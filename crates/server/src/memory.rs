//! Giving memory back after sessions end.
//!
//! Each connection holds a few buffers of hundreds of KiB while it lives.
//! Under glibc's malloc, a thousand sessions logging in and out at once
//! left their freed buffers scattered among long-lived allocations, and
//! the process kept them: RSS grew by 12-19 MiB with every round of 1000
//! concurrent sessions (docs/PERFORMANCE.md "Memory over session rounds").
//! So once connections have ended, and at most every [`PERIOD`], the heap's
//! free pages are handed back with `malloc_trim(0)` (glibc: `madvise` of
//! the free pages of every arena, not only the top), on a blocking thread
//! so no event loop waits for it. Nothing on the data path allocates, so
//! the trim costs only what teardown freed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often ended connections may trigger a trim.
const PERIOD: Duration = Duration::from_secs(2);

/// Connections ended since the server started.
static ENDED: AtomicU64 = AtomicU64::new(0);

/// Counts an ended connection (its buffers are free now).
pub(crate) fn connection_ended() {
    ENDED.fetch_add(1, Ordering::Relaxed);
}

/// Trims the heap every [`PERIOD`] in which connections ended; runs until
/// aborted.
pub(crate) async fn trim_after_teardown() {
    let mut seen = ENDED.load(Ordering::Relaxed);
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = ENDED.load(Ordering::Relaxed);
        if now == seen {
            continue;
        }
        seen = now;
        let _ = tokio::task::spawn_blocking(trim).await;
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only walks and advises the allocator's own free
    // chunks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
