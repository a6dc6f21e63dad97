//! LUNs whose storage does not answer at start: `serve` listens without
//! waiting for them, reports each as becoming ready, and opens it in the
//! background.
//!
//! A Ceph cluster may be down when a gateway starts (a power cut that
//! brings everything back at once, a monitor restarting): a target that
//! exits then must be restarted by hand once the cluster is up. Instead,
//! an rbd LUN ([`crate::config::LunConfig::open_retry`]) is opened on a
//! thread of its own:
//!
//! 1. `serve` waits for it at most `ceph_start_wait` seconds. Opened: it is
//!    served as usual. A first failure that retrying cannot mend (no such
//!    pool or image, access denied, a bad ceph.conf: [`LunError`] says
//!    which) fails the start, as before.
//! 2. Otherwise (still connecting, or a failure of a cluster that does not
//!    answer) the LUN is served as a [`PendingLu`]: listed by REPORT LUNS,
//!    identified by INQUIRY (the identity it will have), NOT READY, LOGICAL
//!    UNIT IS IN PROCESS OF BECOMING READY (04/01) to everything else
//!    ([`scsi::BecomingReady`]).
//! 3. The thread tries again after pauses of 1 s, 2 s, 4 s … up to
//!    `ceph_retry` seconds, logging why; once the image opens, the full
//!    logical unit takes the pending one's place (with POWER ON OCCURRED
//!    for each nexus: the device changed under the initiators that were
//!    told to wait). The LUNs of a gateway's target are handed over
//!    together, once all are open and the gateway role has started
//!    ([`crate::gateway`]): a gateway never serves an image without
//!    taking part in the arbitration of its lock.
//!
//! Removing a pending LUN (the admin API) or stopping the server ends its
//! thread after the attempt under way.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use scsi::LogicalUnit;

use crate::config::OpenRetry;

/// Why a LUN could not be opened.
#[derive(Clone, Debug)]
pub struct LunError {
    /// What happened, for the operator.
    pub msg: String,
    /// Trying again may work (the storage did not answer, refused the
    /// connection, timed out); false for mistakes that need a person.
    pub transient: bool,
}

impl LunError {
    /// A failure retrying cannot mend.
    pub fn lasting(msg: impl Into<String>) -> LunError {
        LunError {
            msg: msg.into(),
            transient: false,
        }
    }

    /// `e` from the storage, transient when it says the storage did not
    /// answer or could not be reached.
    pub fn from_io(e: &std::io::Error) -> LunError {
        use std::io::ErrorKind as K;
        let transient = storage::Unresponsive::is(e)
            || matches!(
                e.kind(),
                K::TimedOut
                    | K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::WouldBlock
                    | K::Interrupted
            );
        LunError {
            msg: e.to_string(),
            transient,
        }
    }
}

impl std::fmt::Display for LunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<String> for LunError {
    fn from(msg: String) -> LunError {
        LunError::lasting(msg)
    }
}

/// Builds one LU, once per attempt.
pub type OpenFn = Box<dyn Fn() -> Result<Arc<LogicalUnit>, LunError> + Send>;

/// How the attempts at one LUN are going (shown by the admin API).
#[derive(Debug)]
pub struct Progress {
    since: Instant,
    attempts: AtomicU32,
    last_error: Mutex<Option<String>>,
}

impl Progress {
    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// Why the last attempt failed, if one did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Nothing to wait for: the LU is open.
    pub fn done() -> Progress {
        Progress {
            since: Instant::now(),
            attempts: AtomicU32::new(1),
            last_error: Mutex::new(None),
        }
    }

    /// Since when the LUN is being opened.
    pub fn since(&self) -> Instant {
        self.since
    }
}

/// A LUN served while its storage is being opened; see the module docs.
pub struct PendingLu {
    /// What initiators see meanwhile.
    pub unit: scsi::BecomingReady,
    /// What is being opened (`rbd pool/image`).
    pub what: String,
    /// The block size it will have.
    pub block_size: u32,
    /// Whether it will be read-only.
    pub read_only: bool,
    /// How the attempts are going.
    pub progress: Arc<Progress>,
}

impl std::fmt::Debug for PendingLu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLu")
            .field("what", &self.what)
            .field("attempts", &self.progress.attempts())
            .finish()
    }
}

/// Where an LU goes once open, after `serve` went on without it.
pub struct Deferred {
    /// Whether it is still wanted (not removed, server running); checked
    /// before each attempt and before handing it over.
    pub wanted: Box<dyn Fn() -> bool + Send>,
    /// Hands it over (installs it).
    pub deliver: Box<dyn FnOnce(Arc<LogicalUnit>) + Send>,
}

enum State {
    /// `serve` waits for it; the first failure, if any.
    Waiting(Option<LunError>),
    /// Opened while `serve` waited.
    Opened(Arc<LogicalUnit>),
    /// `serve` went on without it.
    Deferred(Option<Deferred>),
    /// Not wanted anymore.
    Abandoned,
}

struct Handoff {
    state: Mutex<State>,
    changed: Condvar,
}

/// What [`Opening::wait`] found.
pub enum Waited {
    /// The LU is open.
    Opened(Arc<LogicalUnit>),
    /// The first attempt failed for a reason retrying cannot mend; the
    /// thread has stopped.
    Failed(LunError),
    /// Not open yet: serve it as pending and [`Opening::defer`] it.
    Pending,
}

/// One LU being opened by a thread of its own.
pub struct Opening {
    handoff: Arc<Handoff>,
    /// How it is going.
    pub progress: Arc<Progress>,
}

impl Opening {
    /// Starts opening with `open` on a thread named after `label`
    /// (`target … LUN n`), retrying as `retry` says.
    pub fn start(label: String, retry: OpenRetry, open: OpenFn) -> Result<Opening, String> {
        let handoff = Arc::new(Handoff {
            state: Mutex::new(State::Waiting(None)),
            changed: Condvar::new(),
        });
        let progress = Arc::new(Progress {
            since: Instant::now(),
            attempts: AtomicU32::new(0),
            last_error: Mutex::new(None),
        });
        let (h, p) = (handoff.clone(), progress.clone());
        std::thread::Builder::new()
            .name("lun-open".into())
            .spawn(move || attempts(&label, retry.max_pause, &open, &h, &p))
            .map_err(|e| format!("cannot start a thread to open the LUN: {e}"))?;
        Ok(Opening { handoff, progress })
    }

    /// Waits until the LU is open, the first attempt failed, or
    /// `deadline`.
    pub fn wait(&self, deadline: Instant) -> Waited {
        let mut st = self.handoff.state.lock();
        loop {
            match &mut *st {
                State::Opened(_) => {
                    let State::Opened(lu) = std::mem::replace(&mut *st, State::Abandoned) else {
                        unreachable!()
                    };
                    return Waited::Opened(lu);
                }
                State::Waiting(Some(e)) if !e.transient => {
                    let e = e.clone();
                    *st = State::Abandoned;
                    return Waited::Failed(e);
                }
                State::Waiting(Some(_)) => return Waited::Pending,
                State::Waiting(None) => {
                    if self
                        .handoff
                        .changed
                        .wait_until(&mut st, deadline)
                        .timed_out()
                    {
                        return Waited::Pending;
                    }
                }
                State::Deferred(_) | State::Abandoned => return Waited::Pending,
            }
        }
    }

    /// Hands the LU to `to` once open (at once, when it opened since
    /// [`Opening::wait`]).
    pub fn defer(self, to: Deferred) {
        let mut st = self.handoff.state.lock();
        match std::mem::replace(&mut *st, State::Abandoned) {
            State::Opened(lu) => {
                drop(st);
                if (to.wanted)() {
                    lu.announce_power_on();
                    (to.deliver)(lu);
                }
            }
            State::Waiting(_) => *st = State::Deferred(Some(to)),
            other => *st = other,
        }
    }
}

impl Drop for Opening {
    /// Dropped without [`Opening::defer`] (the start failed): the thread
    /// stops.
    fn drop(&mut self) {
        let mut st = self.handoff.state.lock();
        if matches!(*st, State::Waiting(_) | State::Opened(_)) {
            *st = State::Abandoned;
        }
    }
}

/// The opening thread: attempts until the LU is open or not wanted.
fn attempts(label: &str, max_pause: Duration, open: &OpenFn, h: &Handoff, p: &Progress) {
    let mut pause = Duration::from_secs(1).min(max_pause);
    loop {
        let r = open();
        let n = p.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let e = match r {
            Ok(lu) => return opened(label, lu, h, p, n),
            Err(e) => e,
        };
        let changed = p.last_error.lock().replace(e.msg.clone()).as_ref() != Some(&e.msg);
        if let State::Waiting(first) = &mut *h.state.lock() {
            first.get_or_insert(e.clone());
            h.changed.notify_all();
            // `serve` fails its start with this reason.
            if !e.transient {
                return;
            }
        }
        if !h.keep_trying() {
            return;
        }
        // Each new reason, then every power of two attempts, at warn.
        if changed || n.is_power_of_two() {
            tracing::warn!(
                "{e}; attempt {n} failed, trying again in {} s",
                pause.as_secs()
            );
        } else {
            tracing::debug!("{label}: attempt {n} failed: {e}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(max_pause);
        if !h.keep_trying() {
            return;
        }
    }
}

impl Handoff {
    /// Whether the LU is still wanted: `serve` waits for it, or it was
    /// deferred to a place that still wants it.
    fn keep_trying(&self) -> bool {
        match &*self.state.lock() {
            State::Waiting(_) => true,
            State::Deferred(Some(d)) => (d.wanted)(),
            _ => false,
        }
    }
}

/// The LU opened: to `serve` if it still waits, else to where it was
/// deferred.
fn opened(label: &str, lu: Arc<LogicalUnit>, h: &Handoff, p: &Progress, n: u32) {
    let mut st = h.state.lock();
    match std::mem::replace(&mut *st, State::Abandoned) {
        State::Waiting(_) => {
            *st = State::Opened(lu);
            h.changed.notify_all();
        }
        State::Deferred(Some(d)) => {
            drop(st);
            if (d.wanted)() {
                tracing::info!(
                    "{label}: open after {n} attempt(s) in {:.1} s; served",
                    p.since.elapsed().as_secs_f64()
                );
                lu.announce_power_on();
                (d.deliver)(lu);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn lu() -> Arc<LogicalUnit> {
        crate::lunmap::build_lu(
            "iqn.x:t",
            0,
            &crate::config::LunConfig::from_spec("mem:1M").unwrap(),
            &Arc::new(scsi::PortGroups::default()),
            None,
            true,
        )
        .unwrap()
    }

    fn retry() -> OpenRetry {
        OpenRetry {
            start_wait: Duration::from_millis(200),
            max_pause: Duration::from_millis(10),
        }
    }

    /// An opener that fails `fails` times with `transient` errors first.
    fn opener(fails: u32, transient: bool) -> (OpenFn, Arc<AtomicU32>) {
        let tries = Arc::new(AtomicU32::new(0));
        let t = tries.clone();
        let open: OpenFn = Box::new(move || {
            if t.fetch_add(1, Ordering::SeqCst) < fails {
                Err(LunError {
                    msg: "no answer".into(),
                    transient,
                })
            } else {
                Ok(lu())
            }
        });
        (open, tries)
    }

    #[test]
    fn opened_in_time_is_served_at_once() {
        let (open, _) = opener(0, true);
        let o = Opening::start("t".into(), retry(), open).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(matches!(o.wait(deadline), Waited::Opened(_)));
    }

    #[test]
    fn a_lasting_failure_fails_the_start_and_stops_trying() {
        let (open, tries) = opener(u32::MAX, false);
        let o = Opening::start("t".into(), retry(), open).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let Waited::Failed(e) = o.wait(deadline) else {
            panic!("a lasting failure must fail the start")
        };
        assert_eq!(e.msg, "no answer");
        let n = tries.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        assert!(tries.load(Ordering::SeqCst) <= n + 1, "the thread stopped");
    }

    #[test]
    fn a_transient_failure_is_retried_and_delivered_later() {
        let (open, tries) = opener(5, true);
        let o = Opening::start("t".into(), retry(), open).unwrap();
        let progress = o.progress.clone();
        assert!(matches!(
            o.wait(Instant::now() + Duration::from_secs(10)),
            Waited::Pending
        ));
        let (tx, rx) = std::sync::mpsc::channel();
        o.defer(Deferred {
            wanted: Box::new(|| true),
            deliver: Box::new(move |lu| tx.send(lu).unwrap()),
        });
        let lu = rx.recv_timeout(Duration::from_secs(10)).expect("delivered");
        assert_eq!(tries.load(Ordering::SeqCst), 6);
        assert_eq!(progress.attempts(), 6);
        assert_eq!(progress.last_error().as_deref(), Some("no answer"));
        // Initiators that were told to wait learn that the device changed.
        let out = lu.execute(&scsi::Command {
            cdb: &[0, 0, 0, 0, 0, 0],
            data_out: &bufpool::WriteData::None,
            nexus: scsi::NexusId(7),
            relative_port: 1,
            tpg: 1,
            target_port_name: "iqn.x:t,t,0x1",
            initiator_port_name: "iqn.y,i,0x1",
            expected_data_out: Some(0),
            lus: None,
        });
        assert_eq!(out.sense.map(|s| s.code), Some(scsi::Asc::POWER_ON_RESET));
    }

    #[test]
    fn no_answer_before_the_deadline_is_pending_and_an_unwanted_lu_is_dropped() {
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        let open: OpenFn = Box::new(move || {
            while !g.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(lu())
        });
        let o = Opening::start("t".into(), retry(), open).unwrap();
        let t0 = Instant::now();
        assert!(matches!(
            o.wait(t0 + Duration::from_millis(100)),
            Waited::Pending
        ));
        assert!(t0.elapsed() >= Duration::from_millis(100));
        let delivered = Arc::new(AtomicBool::new(false));
        let d = delivered.clone();
        o.defer(Deferred {
            wanted: Box::new(|| false),
            deliver: Box::new(move |_| d.store(true, Ordering::SeqCst)),
        });
        gate.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        assert!(!delivered.load(Ordering::SeqCst), "removed meanwhile");
    }
}
