//! `ironsan bench --server`: runs the jobs coordinators send, one at a
//! time, and streams back progress and results.
//!
//! Each connection gets its own thread (at most [`MAX_CONNECTIONS`]); one
//! job runs at a time (another coordinator is told the server is busy).
//! Until the hello is accepted a peer may send only small frames; a bad
//! frame or an unexpected message gets an `Error` answer and the
//! connection is dropped. A coordinator that goes away (or sends `Abort`)
//! stops its job: the jobs finish what they have in flight and the result
//! is dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::node::frame::{Conn, ProtoError};
use crate::node::msg::{NodeRun, Sample, ToCoordinator, ToServer, VERSION};
use crate::run::{self, Progress};
use crate::spec::{JobSpec, TargetSpec};

/// Largest frame accepted before the hello (bytes).
pub const PRE_HELLO_LIMIT: u32 = 64 * 1024;
/// Largest frame accepted from a coordinator after the hello (a job).
pub const JOB_LIMIT: u32 = 1 << 20;
/// Connections served at once (one runs a job, the others are told busy).
pub const MAX_CONNECTIONS: usize = 16;
/// How long a new connection has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may wait for a job after the hello or between
/// jobs.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a prepared job waits for its start (the coordinator waits up
/// to two minutes for the slowest node to prepare).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How often a running job's I/O counts are sampled for the timeline.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// Samples kept before the timeline is thinned (every other one dropped
/// and the interval doubled).
const MAX_SAMPLES: usize = 4096;

/// What a bench server accepts.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The token coordinators must present (none: any coordinator).
    pub token: Option<String>,
    /// Accept jobs on files and block devices (default: iscsi:// only).
    pub allow_files: bool,
}

/// A bound bench server.
pub struct BenchServer {
    listener: TcpListener,
    opts: Arc<ServerOptions>,
    busy: Arc<Mutex<()>>,
    conns: Arc<AtomicUsize>,
}

impl BenchServer {
    /// Binds the listening socket.
    pub fn bind(addr: SocketAddr, opts: ServerOptions) -> std::io::Result<BenchServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(BenchServer {
            listener,
            opts: Arc::new(opts),
            busy: Arc::new(Mutex::new(())),
            conns: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The address bound (the port chosen when asked for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves coordinators until `stop` is set.
    pub fn run(self, stop: &AtomicBool) -> std::io::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            let (stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(e) => {
                    log(&format!("accept: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if self.conns.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                log(&format!(
                    "{peer}: refused, {MAX_CONNECTIONS} connections open"
                ));
                continue;
            }
            self.conns.fetch_add(1, Ordering::Relaxed);
            let (opts, busy, conns) = (self.opts.clone(), self.busy.clone(), self.conns.clone());
            std::thread::spawn(move || {
                if let Err(e) = serve_conn(stream, &opts, &busy) {
                    log(&format!("{peer}: {e}"));
                }
                conns.fetch_sub(1, Ordering::Relaxed);
            });
        }
        Ok(())
    }
}

fn log(s: &str) {
    eprintln!("ironsan bench server: {s}");
}

/// The host name, for reports.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Compares in constant time (`subtle`).
fn same_token(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// Tells the peer why, then gives the error back for the log. The peer's
/// unread bytes are drained briefly after our half is shut, so that
/// closing does not reset the connection and lose the answer.
fn refuse(conn: &mut Conn, why: String) -> Result<(), String> {
    use std::io::Read;
    let _ = conn.send(&ToCoordinator::Error {
        message: why.clone(),
    });
    let _ = conn.stream.shutdown(std::net::Shutdown::Write);
    let _ = conn
        .stream
        .set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut budget = 1usize << 20;
    while let Ok(n @ 1..) = conn.stream.read(&mut sink) {
        budget = budget.saturating_sub(n);
        if budget == 0 {
            break;
        }
    }
    Err(why)
}

/// Sends an error answer for a protocol failure (when the peer is still
/// there to hear it).
fn fail(conn: &mut Conn, e: ProtoError, during: &str) -> Result<(), String> {
    match e {
        ProtoError::Closed => Err(format!("coordinator went away {during}")),
        e if e.is_peer_fault() => refuse(conn, format!("{e} {during}")),
        e => Err(format!("{e} {during}")),
    }
}

fn serve_conn(stream: TcpStream, opts: &ServerOptions, busy: &Mutex<()>) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let mut conn = Conn::new(stream, PRE_HELLO_LIMIT);
    let hello = match conn.recv::<ToServer>(HELLO_TIMEOUT) {
        Ok(m) => m,
        Err(e) => return fail(&mut conn, e, "before the hello"),
    };
    let ToServer::Hello { version, token } = hello else {
        return refuse(&mut conn, "the first message must be a hello".into());
    };
    if version != VERSION {
        return refuse(
            &mut conn,
            format!("protocol version {version}; this server speaks {VERSION}"),
        );
    }
    if let Some(want) = &opts.token {
        if !token.as_deref().is_some_and(|t| same_token(t, want)) {
            return refuse(
                &mut conn,
                "wrong or missing token (give the server's --token)".into(),
            );
        }
    }
    conn.reader.set_limit(JOB_LIMIT);
    conn.send(&ToCoordinator::Hello {
        version: VERSION,
        host: host_name(),
    })
    .map_err(|e| e.to_string())?;
    loop {
        let spec = match conn.recv::<ToServer>(IDLE_TIMEOUT) {
            Ok(ToServer::Job { spec }) => spec,
            Ok(ToServer::Abort) => continue,
            Ok(m) => return refuse(&mut conn, format!("expected a job, got {m:?}")),
            Err(ProtoError::Closed) => return Ok(()),
            Err(e) => return fail(&mut conn, e, "waiting for a job"),
        };
        // One job at a time on this machine.
        let Ok(_guard) = busy.try_lock() else {
            return refuse(
                &mut conn,
                "busy: running another coordinator's job; try again later".into(),
            );
        };
        if !job(&mut conn, &spec, opts)? {
            return Ok(());
        }
    }
}

/// Prepares and runs one job. `Ok(false)`: the connection is finished.
fn job(conn: &mut Conn, spec: &JobSpec, opts: &ServerOptions) -> Result<bool, String> {
    if let Err(e) = spec.validate() {
        return refuse(conn, e).map(|_| false);
    }
    if !opts.allow_files
        && spec
            .targets
            .iter()
            .any(|t| matches!(t, TargetSpec::File(_)))
    {
        return refuse(
            conn,
            "this bench server takes only iscsi:// targets; start it with --allow-files to let \
             coordinators name files and block devices"
                .into(),
        )
        .map(|_| false);
    }
    let peer = conn
        .stream
        .peer_addr()
        .map_or("?".into(), |a| a.to_string());
    log(&format!(
        "{peer}: job {}: {} bs={} iodepth={} numjobs={} on {} (node {} of {})",
        spec.name,
        spec.rw.name(),
        spec.bs,
        spec.iodepth,
        spec.numjobs,
        spec.targets
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        spec.share.index + 1,
        spec.share.count
    ));
    let prepared = match run::prepare(spec) {
        Ok(p) => p,
        Err(e) => return refuse(conn, e).map(|_| false),
    };
    conn.send(&ToCoordinator::Ready {
        engine: prepared.engine_name().to_string(),
        capacity: prepared.capacity(),
    })
    .map_err(|e| e.to_string())?;
    match conn.recv::<ToServer>(START_TIMEOUT) {
        Ok(ToServer::Start) => {}
        Ok(ToServer::Abort) => {
            log(&format!("{peer}: job aborted before the start"));
            return Ok(true);
        }
        Ok(m) => return refuse(conn, format!("expected start, got {m:?}")).map(|_| false),
        Err(e) => return fail(conn, e, "waiting for the start").map(|_| false),
    }
    let progress = Arc::new(Progress::default());
    let abort = Arc::new(AtomicBool::new(false));
    let handle = {
        let (progress, abort) = (progress.clone(), abort.clone());
        std::thread::spawn(move || prepared.run(Some(progress), Some(abort)))
    };
    let mut timeline = vec![Sample {
        us: 0,
        ios: 0,
        bytes: 0,
    }];
    let mut every = SAMPLE_EVERY;
    let mut next_sample = Instant::now() + every;
    let mut next_progress = Instant::now() + Duration::from_secs(1);
    // Times count from the jobs' own start plus the ramp, like their
    // elapsed and first-finish times.
    let ramp = spec.ramp_time;
    let sample = |at: Instant| Sample {
        us: progress.started.get().map_or(0, |t0| {
            u64::try_from(at.saturating_duration_since(*t0 + ramp).as_micros()).unwrap_or(u64::MAX)
        }),
        ios: progress.ios.load(Ordering::Relaxed),
        bytes: progress.bytes.load(Ordering::Relaxed),
    };
    let mut gone: Option<String> = None;
    while !handle.is_finished() {
        match conn.poll::<ToServer>(Duration::from_millis(5)) {
            Ok(None) => {}
            Ok(Some(ToServer::Abort)) => gone = Some("aborted by the coordinator".into()),
            Ok(Some(m)) => gone = Some(format!("unexpected {m:?} during the run")),
            Err(ProtoError::Closed) => gone = Some("coordinator went away".into()),
            Err(e) => gone = Some(e.to_string()),
        }
        let now = Instant::now();
        if now >= next_sample {
            timeline.push(sample(now));
            next_sample = now + every;
            if timeline.len() > MAX_SAMPLES {
                let mut i = 0;
                timeline.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                every *= 2;
            }
        }
        if gone.is_none() && now >= next_progress {
            next_progress = now + Duration::from_secs(1);
            let s = sample(now);
            let m = ToCoordinator::Progress {
                elapsed_ms: s.us / 1000,
                ios: s.ios,
                bytes: s.bytes,
            };
            if let Err(e) = conn.send(&m) {
                gone = Some(format!("sending progress: {e}"));
            }
        }
        if let Some(why) = &gone {
            abort.store(true, Ordering::Relaxed);
            let _ = handle.join();
            log(&format!("{peer}: job stopped: {why}"));
            return Ok(false);
        }
    }
    let r = match handle.join() {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return refuse(conn, e).map(|_| false),
        Err(_) => return refuse(conn, "a job thread panicked".into()).map(|_| false),
    };
    // The last sample is the end of the run with the final counts.
    timeline.retain(|s| s.us < u64::try_from(r.elapsed.as_micros()).unwrap_or(u64::MAX));
    timeline.push(Sample {
        us: u64::try_from(r.elapsed.as_micros()).unwrap_or(u64::MAX),
        ios: r.read.ios + r.write.ios,
        bytes: r.read.bytes + r.write.bytes,
    });
    log(&format!(
        "{peer}: job done: {} I/Os in {:.2}s",
        r.read.ios + r.write.ios,
        r.elapsed.as_secs_f64()
    ));
    conn.send(&ToCoordinator::Result {
        result: Box::new(NodeRun::from_run(&r, timeline)),
    })
    .map_err(|e| e.to_string())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::coordinator::{self, NodeSpec, Timeouts};
    use crate::spec::{IoEngineKind, Rw, Share};

    fn start(opts: ServerOptions) -> (SocketAddr, Arc<AtomicBool>) {
        let s = BenchServer::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
        let addr = s.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        std::thread::spawn(move || s.run(&st));
        (addr, stop)
    }

    fn spec(path: &std::path::Path, runtime_ms: u64) -> JobSpec {
        JobSpec {
            name: "t".into(),
            targets: vec![TargetSpec::File(path.to_path_buf())],
            rw: Rw::RandRead,
            rwmixread: 50,
            bs: 4096,
            iodepth: 1,
            numjobs: 1,
            size: Some(1 << 20),
            offset: 0,
            runtime: Some(Duration::from_millis(runtime_ms)),
            ramp_time: Duration::ZERO,
            randseed: 1,
            direct: false,
            create: true,
            initiator: "iqn.x".into(),
            multipath: None,
            ioengine: IoEngineKind::Psync,
            verify: false,
            verify_id: None,
            share: Share::default(),
            busy_poll: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn two_servers_run_merge_and_survive_a_lost_coordinator() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("data");
        let opts = ServerOptions {
            token: Some("s3cret".into()),
            allow_files: true,
        };
        let (a, stop_a) = start(opts.clone());
        let (b, stop_b) = start(opts);
        let nodes = [
            NodeSpec::parse(&a.to_string()).unwrap(),
            NodeSpec::parse(&b.to_string()).unwrap(),
        ];
        let specs = coordinator::plan(&spec(&f, 300), &nodes).unwrap();
        let t = Timeouts::default();
        // A wrong token is refused before any job.
        let e = coordinator::run(&nodes, &specs, Some("nope"), t, |_, _| {}).unwrap_err();
        assert!(e.contains("token"), "{e}");
        let m = coordinator::run(&nodes, &specs, Some("s3cret"), t, |_, _| {}).unwrap();
        assert_eq!(m.nodes.len(), 2);
        let sum: u64 = m.nodes.iter().map(|n| n.result.read.ios).sum();
        assert!(sum > 0);
        assert_eq!(m.merged.read.ios, sum);
        assert_eq!(m.merged.read.lat.len(), sum);
        let w = m.stonewall.unwrap();
        assert!(w.ios > 0 && w.ios <= sum && w.at <= m.merged.elapsed);

        // A coordinator that vanishes mid-run: the server stops that job and
        // serves the next one.
        let mut c = Conn::new(TcpStream::connect(a).unwrap(), 1 << 26);
        c.send(&ToServer::Hello {
            version: VERSION,
            token: Some("s3cret".into()),
        })
        .unwrap();
        assert!(matches!(
            c.recv::<ToCoordinator>(Duration::from_secs(5)).unwrap(),
            ToCoordinator::Hello { .. }
        ));
        c.send(&ToServer::Job {
            spec: Box::new(spec(&f, 60_000)),
        })
        .unwrap();
        assert!(matches!(
            c.recv::<ToCoordinator>(Duration::from_secs(5)).unwrap(),
            ToCoordinator::Ready { .. }
        ));
        c.send(&ToServer::Start).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        drop(c);
        // The busy lock is released once the job stopped.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match coordinator::run(&nodes, &specs, Some("s3cret"), t, |_, _| {}) {
                Ok(m) => {
                    assert_eq!(m.nodes.len(), 2);
                    break;
                }
                Err(e) if e.contains("busy") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => panic!("{e}"),
            }
        }
        stop_a.store(true, Ordering::Relaxed);
        stop_b.store(true, Ordering::Relaxed);
    }

    #[test]
    fn bad_peers_get_an_error_and_are_dropped() {
        use std::io::{Read, Write};
        let (a, stop) = start(ServerOptions {
            token: None,
            allow_files: false,
        });
        // Garbage, an oversized frame before the hello, a job before the
        // hello: each gets an error frame, then the connection closes.
        let mut huge = crate::node::frame::MAGIC.to_vec();
        huge.extend_from_slice(&(PRE_HELLO_LIMIT + 1).to_be_bytes());
        let job_first = crate::node::frame::encode(&ToServer::Start);
        for bytes in [&b"GET / HTTP/1.0\r\n\r\n"[..], &huge, &job_first] {
            let mut s = TcpStream::connect(a).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(bytes).unwrap();
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            let mut r = crate::node::frame::FrameReader::new(1 << 20);
            let mut src = &got[..];
            let body = loop {
                if let Some(b) = r.read_frame(&mut src).expect("an error frame") {
                    break b;
                }
            };
            let m: ToCoordinator = crate::node::frame::decode(&body).unwrap();
            assert!(matches!(m, ToCoordinator::Error { .. }), "{m:?}");
        }
        // Files need --allow-files.
        let nodes = [NodeSpec::parse(&a.to_string()).unwrap()];
        let specs = coordinator::plan(&spec(std::path::Path::new("/tmp/x"), 100), &nodes).unwrap();
        let e = coordinator::run(&nodes, &specs, None, Timeouts::default(), |_, _| {}).unwrap_err();
        assert!(e.contains("--allow-files"), "{e}");
        stop.store(true, Ordering::Relaxed);
    }
}
