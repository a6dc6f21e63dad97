//! The coordinator side: sends the job to every bench server, starts them
//! together once all are ready, collects and merges the results.

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

use crate::node::frame::{Conn, ProtoError};
use crate::node::merge::{self, Stonewall};
use crate::node::msg::{Sample, ToCoordinator, ToServer, VERSION};
use crate::node::DEFAULT_PORT;
use crate::run::RunResult;
use crate::spec::{JobSpec, Share, TargetSpec};
use crate::verify;

/// Largest frame accepted from a server (a result with its histograms and
/// per-second series).
pub const RESULT_LIMIT: u32 = 64 << 20;

/// One `--client`: a server's address and, optionally, its own targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// `host:port` as given (the default port added when missing).
    pub addr: String,
    /// Targets for this node only (else the job's).
    pub targets: Option<Vec<TargetSpec>>,
}

impl NodeSpec {
    /// `HOST[:PORT][=TARGET[,TARGET…]]`; IPv6 hosts in brackets.
    pub fn parse(s: &str) -> Result<NodeSpec, String> {
        let (addr, targets) = match s.split_once('=') {
            Some((a, t)) => (a, Some(t)),
            None => (s, None),
        };
        if addr.is_empty() {
            return Err(format!("--client {s:?}: no host"));
        }
        let has_port = if let Some(rest) = addr.strip_prefix('[') {
            let (_, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("--client {s:?}: unclosed ["))?;
            !after.is_empty()
        } else {
            addr.contains(':')
        };
        let addr = if has_port {
            addr.to_string()
        } else {
            format!("{addr}:{DEFAULT_PORT}")
        };
        let targets = targets
            .map(|t| {
                t.split(',')
                    .map(TargetSpec::parse)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--client {addr}: {e}"))
            })
            .transpose()?;
        Ok(NodeSpec { addr, targets })
    }
}

/// Timeouts of the coordinator.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Connecting, the hello, and silence from a running server (it sends
    /// progress every second).
    pub answer: Duration,
    /// Preparing a job (logins, opening files).
    pub prepare: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            answer: Duration::from_secs(10),
            prepare: Duration::from_secs(120),
        }
    }
}

/// A node's part of the run.
#[derive(Clone, Debug)]
pub struct NodeOutcome {
    /// The `--client` address.
    pub addr: String,
    /// The server's host name.
    pub host: String,
    /// The job it ran.
    pub spec: JobSpec,
    pub result: RunResult,
    pub timeline: Vec<Sample>,
}

/// The result of a multi-node run.
#[derive(Clone, Debug)]
pub struct MultiResult {
    pub nodes: Vec<NodeOutcome>,
    /// All nodes: counts summed, histograms added.
    pub merged: RunResult,
    pub stonewall: Option<Stonewall>,
}

/// Each node's job: the base job with the node's targets and its share.
/// Nodes driving the same targets split them like the jobs of one run
/// (see [`Share`]); with `--verify`, writes of every node stamp one run id.
pub fn plan(base: &JobSpec, nodes: &[NodeSpec]) -> Result<Vec<JobSpec>, String> {
    if nodes.is_empty() {
        return Err("no --client given".into());
    }
    let mut base = base.clone();
    let writes = base.rw.read_percent(base.rwmixread) < 100;
    if base.verify && writes && base.verify_id.is_none() {
        base.verify_id = Some(verify::new_run_id());
    }
    let mut specs = Vec::new();
    for n in nodes {
        let mut s = base.clone();
        if let Some(t) = &n.targets {
            s.targets.clone_from(t);
        }
        specs.push(s);
    }
    let key = |s: &JobSpec| {
        s.targets
            .iter()
            .map(|t| String::from(t.clone()))
            .collect::<Vec<_>>()
    };
    let mut groups: HashMap<Vec<String>, u32> = HashMap::new();
    for s in &specs {
        *groups.entry(key(s)).or_default() += 1;
    }
    let mut seen: HashMap<Vec<String>, u32> = HashMap::new();
    for (s, n) in specs.iter_mut().zip(nodes) {
        let k = key(s);
        let i = seen.entry(k.clone()).or_default();
        s.share = Share {
            index: *i,
            count: groups[&k],
        };
        *i += 1;
        s.validate().map_err(|e| format!("node {}: {e}", n.addr))?;
    }
    Ok(specs)
}

/// Connects, says hello, sends the job and waits until it is prepared.
fn prepare_node(
    addr: &str,
    spec: &JobSpec,
    token: Option<&str>,
    t: Timeouts,
) -> Result<(Conn, String), String> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| format!("resolving: {e}"))?
        .collect();
    let mut last = String::from("no address");
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, t.answer) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("connecting to {a}: {e}"),
        }
    }
    let stream = stream.ok_or(last)?;
    stream
        .set_write_timeout(Some(t.answer))
        .map_err(|e| e.to_string())?;
    let mut conn = Conn::new(stream, RESULT_LIMIT);
    let said =
        |e: ProtoError, what: &str| format!("{what}: {e} (is it an `ironsan bench --server`?)");
    conn.send(&ToServer::Hello {
        version: VERSION,
        token: token.map(str::to_string),
    })
    .map_err(|e| said(e, "hello"))?;
    let host = match conn
        .recv::<ToCoordinator>(t.answer)
        .map_err(|e| said(e, "hello"))?
    {
        ToCoordinator::Hello { version, host } if version == VERSION => host,
        ToCoordinator::Hello { version, .. } => {
            return Err(format!(
                "protocol version {version}, this coordinator speaks {VERSION}"
            ))
        }
        ToCoordinator::Error { message } => return Err(message),
        m => return Err(format!("unexpected answer to hello: {m:?}")),
    };
    conn.send(&ToServer::Job {
        spec: Box::new(spec.clone()),
    })
    .map_err(|e| e.to_string())?;
    match conn
        .recv::<ToCoordinator>(t.prepare)
        .map_err(|e| format!("preparing the job: {e}"))?
    {
        ToCoordinator::Ready { .. } => Ok((conn, host)),
        ToCoordinator::Error { message } => Err(message),
        m => Err(format!("unexpected answer to the job: {m:?}")),
    }
}

enum Event {
    Progress { node: usize, ios: u64, bytes: u64 },
    Done(usize, Result<Box<(RunResult, Vec<Sample>)>, String>),
}

/// Runs `specs[i]` on `nodes[i]`, all started together; `progress` gets
/// the summed I/Os and bytes as servers report them (about every second).
pub fn run(
    nodes: &[NodeSpec],
    specs: &[JobSpec],
    token: Option<&str>,
    t: Timeouts,
    mut progress: impl FnMut(u64, u64),
) -> Result<MultiResult, String> {
    if nodes.len() != specs.len() || nodes.is_empty() {
        return Err(format!("{} nodes but {} jobs", nodes.len(), specs.len()));
    }
    // Prepare every node in parallel: logins may take a while.
    let prepared: Vec<Result<(Conn, String), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = nodes
            .iter()
            .zip(specs)
            .map(|(n, s)| sc.spawn(move || prepare_node(&n.addr, s, token, t)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let mut failed = Vec::new();
    let mut conns = Vec::new();
    for (n, p) in nodes.iter().zip(prepared) {
        match p {
            Ok(c) => conns.push(c),
            Err(e) => failed.push(format!("node {}: {e}", n.addr)),
        }
    }
    if !failed.is_empty() {
        for (c, _) in &mut conns {
            let _ = c.send(&ToServer::Abort);
        }
        return Err(failed.join("; "));
    }
    // The barrier: every node is ready; start them all.
    let mut writers = Vec::new();
    for ((c, _), n) in conns.iter_mut().zip(nodes) {
        if let Err(e) = c.send(&ToServer::Start) {
            for (c, _) in &mut conns {
                let _ = c.send(&ToServer::Abort);
            }
            return Err(format!("node {}: sending start: {e}", n.addr));
        }
    }
    let (tx, rx) = mpsc::channel();
    let mut hosts = Vec::new();
    for (i, (mut c, host)) in conns.into_iter().enumerate() {
        hosts.push(host);
        writers.push(c.stream.try_clone().ok());
        let tx = tx.clone();
        let answer = t.answer;
        std::thread::spawn(move || loop {
            let ev = match c.recv::<ToCoordinator>(answer) {
                Ok(ToCoordinator::Progress { ios, bytes, .. }) => Event::Progress {
                    node: i,
                    ios,
                    bytes,
                },
                Ok(ToCoordinator::Result { result }) => {
                    Event::Done(i, result.into_run().map(Box::new))
                }
                Ok(ToCoordinator::Error { message }) => Event::Done(i, Err(message)),
                Ok(m) => Event::Done(i, Err(format!("unexpected {m:?} during the run"))),
                Err(ProtoError::Timeout(d)) => Event::Done(
                    i,
                    Err(format!(
                        "no progress for {d:?}: the server or its host is dead or stuck"
                    )),
                ),
                Err(ProtoError::Closed) => {
                    Event::Done(i, Err("connection closed during the run".into()))
                }
                Err(e) => Event::Done(i, Err(e.to_string())),
            };
            let done = matches!(ev, Event::Done(..));
            if tx.send(ev).is_err() || done {
                break;
            }
        });
    }
    drop(tx);
    let mut latest = vec![(0u64, 0u64); nodes.len()];
    let mut results: Vec<Option<(RunResult, Vec<Sample>)>> = vec![None; nodes.len()];
    let mut left = nodes.len();
    while left > 0 {
        let Ok(ev) = rx.recv() else {
            return Err("lost the nodes' reader threads".into());
        };
        match ev {
            Event::Progress { node, ios, bytes } => {
                latest[node] = (ios, bytes);
                let (i, b) = latest.iter().fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
                progress(i, b);
            }
            Event::Done(node, Ok(r)) => {
                latest[node] = (
                    r.0.read.ios + r.0.write.ios,
                    r.0.read.bytes + r.0.write.bytes,
                );
                results[node] = Some(*r);
                left -= 1;
            }
            Event::Done(node, Err(e)) => {
                // Stop the others: their results would not be comparable.
                for w in writers.iter_mut().flatten() {
                    let _ = crate::node::frame::send(w, &ToServer::Abort);
                    let _ = w.shutdown(std::net::Shutdown::Both);
                }
                return Err(format!("node {}: {e}", nodes[node].addr));
            }
        }
    }
    let mut outcomes = Vec::new();
    for (((n, s), h), r) in nodes.iter().zip(specs).zip(hosts).zip(results) {
        let (result, timeline) = r.ok_or("a node's result is missing")?;
        outcomes.push(NodeOutcome {
            addr: n.addr.clone(),
            host: h,
            spec: s.clone(),
            result,
            timeline,
        });
    }
    let labels: Vec<String> = outcomes.iter().map(|o| o.addr.clone()).collect();
    let merged = merge::merge(
        &outcomes.iter().map(|o| &o.result).collect::<Vec<_>>(),
        &labels,
    );
    let stonewall = merge::stonewall(
        &outcomes
            .iter()
            .map(|o| (&o.result, &o.timeline[..]))
            .collect::<Vec<_>>(),
    );
    Ok(MultiResult {
        nodes: outcomes,
        merged,
        stonewall,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{IoEngineKind, Rw};

    fn base() -> JobSpec {
        JobSpec {
            name: "t".into(),
            targets: vec![TargetSpec::parse("iscsi://h/iqn.x/0").unwrap()],
            rw: Rw::Write,
            rwmixread: 50,
            bs: 4096,
            iodepth: 4,
            numjobs: 2,
            size: None,
            offset: 0,
            runtime: Some(Duration::from_secs(1)),
            ramp_time: Duration::ZERO,
            randseed: 1,
            direct: false,
            create: false,
            initiator: "iqn.x".into(),
            multipath: None,
            ioengine: IoEngineKind::Auto,
            verify: true,
            verify_id: None,
            share: Share::default(),
            busy_poll: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn client_specs_parse() {
        let n = NodeSpec::parse("h").unwrap();
        assert_eq!(n.addr, format!("h:{DEFAULT_PORT}"));
        assert_eq!(
            NodeSpec::parse("[::1]").unwrap().addr,
            format!("[::1]:{DEFAULT_PORT}")
        );
        assert_eq!(NodeSpec::parse("[::1]:7").unwrap().addr, "[::1]:7");
        let n = NodeSpec::parse("10.0.0.1:16001=iscsi://t/iqn.y/1,iscsi://u/iqn.y/1").unwrap();
        assert_eq!(n.addr, "10.0.0.1:16001");
        assert_eq!(n.targets.unwrap().len(), 2);
        assert!(NodeSpec::parse("=x").is_err());
        assert!(NodeSpec::parse("h=iscsi://t/iqn.y").is_err());
    }

    #[test]
    fn plan_shares_same_targets_and_one_verify_id() {
        let nodes = [
            NodeSpec::parse("a").unwrap(),
            NodeSpec::parse("b=iscsi://other/iqn.x/0").unwrap(),
            NodeSpec::parse("c").unwrap(),
        ];
        let specs = plan(&base(), &nodes).unwrap();
        assert_eq!(specs[0].share, Share { index: 0, count: 2 });
        assert_eq!(specs[1].share, Share { index: 0, count: 1 });
        assert_eq!(specs[2].share, Share { index: 1, count: 2 });
        assert_eq!(specs[2].global_job(1), (3, 4));
        let id = specs[0].verify_id.unwrap();
        assert!(specs.iter().all(|s| s.verify_id == Some(id)));
        assert_eq!(
            specs[1].targets[0].to_string(),
            "iscsi://other:3260/iqn.x/0"
        );
        // The job travels as JSON and comes back the same.
        let j = serde_json::to_string(&specs[2]).unwrap();
        let back: JobSpec = serde_json::from_str(&j).unwrap();
        assert_eq!(back.share, specs[2].share);
        assert_eq!(back.targets, specs[2].targets);
        assert!(plan(&base(), &[]).is_err());
    }

    #[test]
    fn dead_servers_give_clear_errors_not_hangs() {
        // Nothing listening: refused at once.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = l.local_addr().unwrap();
        drop(l);
        // Listening but never answering: the hello times out.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let t = Timeouts {
            answer: Duration::from_millis(300),
            prepare: Duration::from_millis(300),
        };
        let nodes = [
            NodeSpec::parse(&closed.to_string()).unwrap(),
            NodeSpec::parse(&silent.local_addr().unwrap().to_string()).unwrap(),
        ];
        let specs = plan(&base(), &nodes).unwrap();
        let start = std::time::Instant::now();
        let e = run(&nodes, &specs, None, t, |_, _| {}).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        assert!(
            e.contains(&format!("node {closed}")) && e.contains("refused"),
            "{e}"
        );
        assert!(e.contains("no answer within"), "{e}");
    }
}
