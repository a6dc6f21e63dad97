//! Text and JSON of a multi-node run: each node, then all nodes merged,
//! then the stonewall. The JSON keeps fio's client/server layout
//! (`client_stats[]`, one entry per node plus "All clients") and puts the
//! merged job in `jobs[0]` so readers of single-node JSON read the total.

use serde_json::{json, Value};

use crate::node::coordinator::MultiResult;
use crate::node::merge;
use crate::report;
use crate::spec::JobSpec;

/// The job as reported for all nodes: node 0's, with every node's targets.
fn merged_spec(m: &MultiResult) -> JobSpec {
    let mut s = m.nodes[0].spec.clone();
    s.name = "All clients".into();
    s.numjobs = m.nodes.iter().map(|n| n.spec.numjobs).sum();
    s.targets.clear();
    for n in &m.nodes {
        for t in &n.spec.targets {
            if !s.targets.contains(t) {
                s.targets.push(t.clone());
            }
        }
    }
    s
}

/// Per node, merged and stonewall, as text.
pub fn text(m: &MultiResult) -> String {
    let mut s = String::new();
    for n in &m.nodes {
        s += &format!("node {} ({}):\n", n.addr, n.host);
        s += &report::text(&n.spec, &n.result);
    }
    s += &format!("all {} nodes, merged:\n", m.nodes.len());
    s += &report::text(&merged_spec(m), &m.merged);
    if let Some(w) = &m.stonewall {
        s += &format!(
            "  stonewall: IOPS={:.0}, BW={:.1}MiB/s ({:.1}MB/s), {} I/Os in the first {:.3}s, while all {} nodes ran (first to finish: {})\n",
            w.iops(),
            w.bw() / (1 << 20) as f64,
            w.bw() / 1e6,
            w.ios,
            w.at.as_secs_f64(),
            m.nodes.len(),
            m.nodes[w.first_node].addr
        );
    }
    s
}

/// fio's client/server JSON with an `ironsan` section per node and merged.
pub fn json(m: &MultiResult) -> Value {
    let ms = merged_spec(m);
    let mut all = report::json(&ms, &m.merged);
    let mut clients = Vec::new();
    let mut nodes = Vec::new();
    let wall_us = m
        .stonewall
        .as_ref()
        .map(|w| u64::try_from(w.at.as_micros()).unwrap_or(u64::MAX));
    for n in &m.nodes {
        let mut v = report::json(&n.spec, &n.result);
        let mut job = v["jobs"][0].take();
        job["hostname"] = json!(n.host);
        job["client"] = json!(n.addr);
        clients.push(job);
        nodes.push(json!({
            "client": n.addr,
            "hostname": n.host,
            "share": {"index": n.spec.share.index, "count": n.spec.share.count},
            "elapsed_us": u64::try_from(n.result.elapsed.as_micros()).unwrap_or(u64::MAX),
            "first_finish_us": u64::try_from(n.result.first_finish.as_micros()).unwrap_or(u64::MAX),
            "stonewall_ios": wall_us.map(|t| merge::at(&n.timeline, t).0),
            "ironsan": v["ironsan"].take(),
        }));
    }
    let mut merged_job = all["jobs"][0].clone();
    merged_job["hostname"] = json!("All clients");
    clients.push(merged_job);
    all["client_stats"] = Value::Array(clients);
    all["ironsan"]["nodes"] = Value::Array(nodes);
    all["ironsan"]["stonewall"] = match &m.stonewall {
        Some(w) => json!({
            "at_us": u64::try_from(w.at.as_micros()).unwrap_or(u64::MAX),
            "first_to_finish": m.nodes[w.first_node].addr,
            "total_ios": w.ios,
            "io_bytes": w.bytes,
            "iops": w.iops(),
            "bw_bytes": w.bw() as u64,
        }),
        None => Value::Null,
    };
    all
}
