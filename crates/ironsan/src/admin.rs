//! `ironsan admin`: the admin API from the command line.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use target::config::LunConfig;

use crate::http::{check, Endpoint};

/// The admin endpoint's address when `--admin` is given without one.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9260";

/// Where the admin endpoint is (shared by `admin` and `top`).
#[derive(Args, Debug, Clone)]
pub struct EndpointArgs {
    /// The admin endpoint: http://HOST:PORT.
    #[arg(
        long,
        default_value = "http://127.0.0.1:9260",
        env = "IRONSAN_ADMIN_URL"
    )]
    pub url: String,
    /// The admin token, if the endpoint has one.
    #[arg(long, env = "IRONSAN_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl EndpointArgs {
    pub fn endpoint(&self) -> Result<Endpoint> {
        Endpoint::parse(&self.url, self.token.clone())
    }
}

/// `ironsan admin`.
#[derive(Args, Debug)]
pub struct AdminArgs {
    #[command(flatten)]
    ep: EndpointArgs,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: AdminCmd,
}

#[derive(Subcommand, Debug)]
enum AdminCmd {
    /// Targets, LUNs (NAA id, size), ALUA states and portals.
    List,
    /// Sessions: initiator, ISID, portal, negotiated parameters, I/O.
    Sessions,
    /// Add a LUN: SPEC is mem:SIZE, null:SIZE, file:PATH or file:PATH:SIZE.
    AddLun {
        target: String,
        spec: String,
        /// LUN number (default: the lowest free one).
        #[arg(long)]
        number: Option<u16>,
        /// Logical block size: 512 or 4096.
        #[arg(long)]
        block_size: Option<u32>,
        /// Write-back cache (file LUNs).
        #[arg(long)]
        write_back: bool,
        /// Present the LUN read-only.
        #[arg(long)]
        read_only: bool,
    },
    /// Remove a LUN (sessions get REPORTED LUNS DATA HAS CHANGED).
    RemoveLun { target: String, lun: u16 },
    /// Grow a LUN to SIZE (sessions get CAPACITY DATA HAS CHANGED).
    ResizeLun {
        target: String,
        lun: u16,
        size: String,
    },
    /// Add a portal (listen address), optionally in an ALUA group.
    AddPortal {
        addr: String,
        #[arg(long)]
        alua_group: Option<u16>,
    },
    /// Set an ALUA target port group's state: active-optimized,
    /// active-non-optimized, standby or unavailable.
    SetAlua { group: u16, state: String },
    /// Per-LUN and per-portal counters and the last second's rates.
    Stats,
    /// The Prometheus metrics text.
    Metrics,
}

fn show(json_out: bool, v: &Value, table: impl FnOnce(&Value)) {
    if json_out {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        table(v);
    }
}

fn send(ep: &Endpoint, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
    let b = body.map(|b| b.to_string());
    let (code, text) = ep.request(method, path, b.as_deref())?;
    check(code, &text)?;
    serde_json::from_str(&text).context("the admin endpoint did not answer JSON")
}

fn persisted_note(v: &Value) {
    if v.get("persisted").and_then(Value::as_bool) == Some(false) {
        println!("(not persisted: the server runs without --config)");
    }
}

/// URL path segment escaping for target names.
fn seg(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub fn run(a: AdminArgs) -> Result<()> {
    let ep = a.ep.endpoint()?;
    match a.cmd {
        AdminCmd::List => {
            let t = ep.get_json("/api/targets")?;
            let p = ep.get_json("/api/portals")?;
            let v = json!({ "targets": t, "portals": p });
            show(a.json, &v, |v| {
                for t in v["targets"].as_array().into_iter().flatten() {
                    println!("target {}", t["name"].as_str().unwrap_or(""));
                    for l in t["luns"].as_array().into_iter().flatten() {
                        println!(
                            "  LUN {:<3} {}  {:>12} bytes  {:>4}-byte blocks  {}{}",
                            l["lun"],
                            l["naa"].as_str().unwrap_or(""),
                            l["size_bytes"],
                            l["block_size"],
                            l["product"].as_str().unwrap_or(""),
                            if l["read_only"].as_bool() == Some(true) {
                                "  read-only"
                            } else {
                                ""
                            }
                        );
                    }
                    for g in t["alua"].as_array().into_iter().flatten() {
                        println!(
                            "  ALUA group {:<3} {}",
                            g["group"],
                            g["state"].as_str().unwrap_or("")
                        );
                    }
                }
                for p in v["portals"].as_array().into_iter().flatten() {
                    println!(
                        "portal {} (TPGT {}, ALUA group {})",
                        p["addr"].as_str().unwrap_or(""),
                        p["tpgt"],
                        p["alua_group"]
                    );
                }
            });
        }
        AdminCmd::Sessions => {
            let v = ep.get_json("/api/sessions")?;
            show(a.json, &v, |v| {
                println!(
                    "{:<4} {:<40} {:<12} {:<21} {:<7} {:>8} {:>8} {:>6} {:>6}",
                    "id",
                    "initiator",
                    "ISID",
                    "portal",
                    "digests",
                    "MRDSL",
                    "burst",
                    "window",
                    "inflt"
                );
                for s in v.as_array().into_iter().flatten() {
                    let i = &s["info"];
                    let dg = match (i["header_digest"].as_bool(), i["data_digest"].as_bool()) {
                        (Some(true), Some(true)) => "hdr+dat",
                        (Some(true), _) => "hdr",
                        (_, Some(true)) => "data",
                        _ => "none",
                    };
                    println!(
                        "{:<4} {:<40} {:<12} {:<21} {:<7} {:>8} {:>8} {:>6} {:>6}",
                        i["id"],
                        i["initiator"].as_str().unwrap_or(""),
                        i["isid"].as_str().unwrap_or(""),
                        i["portal"].as_str().unwrap_or(""),
                        dg,
                        i["send_max_data_segment"],
                        i["max_burst"],
                        i["queue_depth"],
                        s["in_flight"]
                    );
                }
            });
        }
        AdminCmd::AddLun {
            target,
            spec,
            number,
            block_size,
            write_back,
            read_only,
        } => {
            let mut l = LunConfig::from_spec(&spec)?;
            l.number = number;
            let mut body = json!({
                "backend": format!("{:?}", l.backend).to_lowercase(),
                "block_size": block_size.unwrap_or(l.block_size),
                "read_only": read_only,
            });
            if let Some(s) = &l.size {
                body["size"] = json!(s);
            }
            if let Some(p) = &l.path {
                body["path"] = json!(p);
            }
            if let Some(n) = number {
                body["number"] = json!(n);
            }
            if let Some(p) = l.physical_block_size {
                body["physical_block_size"] = json!(p);
            }
            if write_back {
                body["write_cache"] = json!("back");
            }
            let v = send(
                &ep,
                "POST",
                &format!("/api/targets/{}/luns", seg(&target)),
                Some(body),
            )?;
            show(a.json, &v, |v| {
                println!(
                    "added LUN {} ({}, {} bytes)",
                    v["lun"]["lun"],
                    v["lun"]["naa"].as_str().unwrap_or(""),
                    v["lun"]["size_bytes"]
                );
                persisted_note(v);
            });
        }
        AdminCmd::RemoveLun { target, lun } => {
            let v = send(
                &ep,
                "DELETE",
                &format!("/api/targets/{}/luns/{lun}", seg(&target)),
                None,
            )?;
            show(a.json, &v, |v| {
                println!("removed LUN {lun}");
                persisted_note(v);
            });
        }
        AdminCmd::ResizeLun { target, lun, size } => {
            let v = send(
                &ep,
                "POST",
                &format!("/api/targets/{}/luns/{lun}/resize", seg(&target)),
                Some(json!({ "size": size })),
            )?;
            show(a.json, &v, |v| {
                println!("LUN {lun} now has {} bytes", v["lun"]["size_bytes"]);
                persisted_note(v);
            });
        }
        AdminCmd::AddPortal { addr, alua_group } => {
            let v = send(
                &ep,
                "POST",
                "/api/portals",
                Some(json!({ "addr": addr, "alua_group": alua_group })),
            )?;
            show(a.json, &v, |v| {
                println!(
                    "listening on {} (TPGT {})",
                    v["portal"]["addr"].as_str().unwrap_or(""),
                    v["portal"]["tpgt"]
                );
                persisted_note(v);
            });
        }
        AdminCmd::SetAlua { group, state } => {
            let v = send(
                &ep,
                "PUT",
                &format!("/api/alua/{group}"),
                Some(json!({ "state": state })),
            )?;
            show(a.json, &v, |v| {
                println!("ALUA group {group}: {}", v["state"].as_str().unwrap_or(""));
                persisted_note(v);
            });
        }
        AdminCmd::Stats => {
            let v = ep.get_json("/api/stats")?;
            show(a.json, &v, |v| crate::top::print_batch(v, false));
        }
        AdminCmd::Metrics => {
            let (code, text) = ep.request("GET", "/metrics", None)?;
            check(code, &text)?;
            print!("{text}");
        }
    }
    Ok(())
}
