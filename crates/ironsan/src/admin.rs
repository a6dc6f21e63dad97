//! `ironsan admin`: the admin API from the command line.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use server::config::LunConfig;

use crate::http::{check, Endpoint};

/// The admin endpoint's address when `--admin` is given without one.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9260";

/// Where the admin endpoint is (shared by `admin` and `top`).
#[derive(Args, Debug, Clone)]
pub struct EndpointArgs {
    /// The admin endpoint over HTTP: http://HOST:PORT. Default: the admin
    /// socket, which needs no token.
    #[arg(long, env = "IRONSAN_ADMIN_URL")]
    pub url: Option<String>,
    /// The admin socket (default: admin.sock in the state directory); --url wins.
    #[arg(long, env = "IRONSAN_ADMIN_SOCKET")]
    pub socket: Option<PathBuf>,
    /// The server's state directory (its --state-dir or [admin] dir), where
    /// the socket and the generated token are.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// With --url: a file whose first line is the token (also
    /// IRONSAN_ADMIN_TOKEN; default: the state directory's admin.token).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

impl EndpointArgs {
    pub fn endpoint(&self) -> Result<Endpoint> {
        use admin_api::auth;
        let dir = self.state_dir.clone().unwrap_or_else(auth::default_dir);
        let Some(url) = &self.url else {
            let path = self
                .socket
                .clone()
                .unwrap_or_else(|| dir.join(auth::SOCKET_FILE));
            return Ok(Endpoint::socket(path));
        };
        let token = match (&self.token_file, std::env::var("IRONSAN_ADMIN_TOKEN")) {
            (Some(f), _) => auth::read_token_file(f).map_err(anyhow::Error::msg)?,
            (None, Ok(t)) => t,
            (None, Err(_)) => {
                let f = dir.join(auth::TOKEN_FILE);
                auth::read_token_file(&f).map_err(|e| {
                    anyhow::anyhow!(
                        "{url} needs the admin token: {e}; give --token-file or IRONSAN_ADMIN_TOKEN, or leave out --url to use the admin socket"
                    )
                })?
            }
        };
        Endpoint::parse(url, token)
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
    /// Print a one-time link (good for a minute) that logs a browser in to
    /// the web console; the token itself never goes into a URL.
    Console,
    /// Sessions: initiator, ISID, portal, negotiated parameters, I/O.
    Sessions,
    /// Add a target, served at once through every portal and, as an NVMe
    /// subsystem, through every NVMe/TCP port.
    ///
    /// Protect it from the start with --allow / --allow-net / --nvme-allow
    /// (CHAP is set with set-chap once it exists).
    AddTarget(AddTargetArgs),
    /// Remove a target: it leaves discovery, new logins and Connects are
    /// refused, and its sessions and NVMe/TCP controllers end.
    RemoveTarget(RemoveTargetArgs),
    /// Add a LUN: SPEC is mem:SIZE, null:SIZE, file:PATH or file:PATH:SIZE.
    AddLun(AddLunArgs),
    /// Remove a LUN (sessions get REPORTED LUNS DATA HAS CHANGED).
    RemoveLun(RemoveLunArgs),
    /// Resize a LUN to SIZE (sessions get CAPACITY DATA HAS CHANGED).
    ///
    /// Every LUN can grow; RAM and null LUNs can shrink with --shrink.
    ResizeLun(ResizeLunArgs),
    /// Add a portal (listen address), optionally in an ALUA group.
    AddPortal(AddPortalArgs),
    /// Remove a portal, named by its group tag or its address.
    ///
    /// It stops listening and leaves SendTargets and its ALUA group; its
    /// connections close once their commands are done (initiators fail
    /// over to other portals). The last portal cannot be removed.
    RemovePortal(RemovePortalArgs),
    /// Add an NVMe/TCP port (listen address): the discovery log lists it
    /// at once; its ANA state is that of the ALUA group of the iSCSI portal
    /// at its position (the last portal beyond them), as at start.
    AddNvmePort(AddNvmePortArgs),
    /// Remove an NVMe/TCP port, named by its port ID or its address: it
    /// leaves the discovery log and stops listening; its connections
    /// close once their commands are done.
    RemoveNvmePort(RemoveNvmePortArgs),
    /// Show a target's ACL and whether CHAP is set (never a secret).
    ///
    /// TARGET `discovery` shows the CHAP state of discovery sessions.
    Acl(AclArgs),
    /// Allow an initiator name or a source network (CIDR) to log in.
    ///
    /// ENTRY is an iqn./eui./naa. name or a network such as 10.0.0.0/8.
    /// An empty list allows any, so the first entry restricts the target
    /// to the list. New logins are checked at once; sessions already
    /// logged in keep running unless --drop-sessions.
    Allow(AllowArgs),
    /// Remove an initiator name or a network from a target's ACL.
    Disallow(DisallowArgs),
    /// Require CHAP for new logins (--mutual: the target's own credentials).
    ///
    /// TARGET is a target name, or `discovery` for discovery sessions.
    /// The secret (12..=255 bytes, RFC 7143 §12.1.3) comes from
    /// --secret-file (a file on the target host, read by the server),
    /// IRONSAN_CHAP_SECRET, or the first line of standard input; never from
    /// an argument. Sessions already logged in keep running unless
    /// --drop-sessions.
    SetChap(SetChapArgs),
    /// Stop requiring CHAP (clears mutual CHAP too; --mutual: only that).
    ///
    /// TARGET is a target name, or `discovery` for discovery sessions.
    ClearChap(ClearChapArgs),
    /// Set an ALUA target port group's state: active-optimized,
    /// active-non-optimized, standby or unavailable.
    SetAlua(SetAluaArgs),
    /// Per-LUN and per-portal counters and the last second's rates.
    Stats,
    /// The Prometheus metrics text.
    Metrics,
}

/// The arguments of `admin add-target`.
#[derive(Args, Debug)]
struct AddTargetArgs {
    /// The target's iSCSI name (iqn./eui./naa.).
    name: String,
    /// A LUN, numbered from 0 in order: mem:SIZE, null:SIZE, file:PATH or
    /// file:PATH:SIZE, optionally followed by ,uuid=UUID and
    /// ,physical_block_size=BYTES. Repeat for more.
    #[arg(long = "lun", required = true)]
    luns: Vec<String>,
    /// Its NVMe subsystem NQN (default: the name with iqn. made nqn.).
    #[arg(long)]
    nqn: Option<String>,
    #[arg(long)]
    alias: Option<String>,
    /// An initiator name that may log in (repeat; none: any).
    #[arg(long)]
    allow: Vec<String>,
    /// A source network (CIDR) that may connect (repeat; none: any).
    #[arg(long)]
    allow_net: Vec<String>,
    /// A host NQN that may connect over NVMe/TCP (repeat; none: any).
    #[arg(long)]
    nvme_allow: Vec<String>,
    /// NVMe/TCP hosts authenticate with DH-HMAC-CHAP: the file (under the
    /// admin API's secret_roots) whose first line is the hosts' secret,
    /// DHHC-1:xx:…: as `nvme gen-dhchap-key` prints it.
    #[arg(long)]
    dhchap_secret_file: Option<std::path::PathBuf>,
    /// The controller's DH-HMAC-CHAP secret file, for bidirectional
    /// authentication (needs --dhchap-secret-file).
    #[arg(long, requires = "dhchap_secret_file")]
    dhchap_ctrl_secret_file: Option<std::path::PathBuf>,
}

/// The arguments of `admin remove-target`.
#[derive(Args, Debug)]
struct RemoveTargetArgs {
    target: String,
}

/// The arguments of `admin add-nvme-port`.
#[derive(Args, Debug)]
struct AddNvmePortArgs {
    addr: String,
}

/// The arguments of `admin remove-nvme-port`.
#[derive(Args, Debug)]
struct RemoveNvmePortArgs {
    /// Port ID or address.
    port: String,
}

/// The arguments of `admin add-lun`.
#[derive(Args, Debug)]
struct AddLunArgs {
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
}

/// The arguments of `admin remove-lun`.
#[derive(Args, Debug)]
struct RemoveLunArgs {
    target: String,
    lun: u16,
}

/// The arguments of `admin resize-lun`.
#[derive(Args, Debug)]
struct ResizeLunArgs {
    target: String,
    lun: u16,
    size: String,
    /// Allow making a RAM or null LUN smaller (the data past SIZE is
    /// lost; file LUNs are never shrunk).
    #[arg(long)]
    shrink: bool,
}

/// The arguments of `admin add-portal`.
#[derive(Args, Debug)]
struct AddPortalArgs {
    addr: String,
    #[arg(long)]
    alua_group: Option<u16>,
}

/// The arguments of `admin remove-portal`.
#[derive(Args, Debug)]
struct RemovePortalArgs {
    portal: String,
}

/// The arguments of `admin acl`.
#[derive(Args, Debug)]
struct AclArgs {
    target: String,
}

/// The arguments of `admin allow`.
#[derive(Args, Debug)]
struct AllowArgs {
    target: String,
    entry: String,
    /// End the sessions the new ACL no longer allows (they keep
    /// running otherwise).
    #[arg(long)]
    drop_sessions: bool,
}

/// The arguments of `admin disallow`.
#[derive(Args, Debug)]
struct DisallowArgs {
    target: String,
    entry: String,
    /// Removing the last entry lets any initiator (or address) in:
    /// say so.
    #[arg(long)]
    allow_any: bool,
    /// End the sessions the new ACL no longer allows.
    #[arg(long)]
    drop_sessions: bool,
}

/// The arguments of `admin set-chap`.
#[derive(Args, Debug)]
struct SetChapArgs {
    target: String,
    user: String,
    /// The target's own credentials, for mutual CHAP.
    #[arg(long)]
    mutual: bool,
    /// A file on the target host whose first line is the secret.
    #[arg(long)]
    secret_file: Option<String>,
    /// End the target's sessions: they log in again with the new
    /// credentials.
    #[arg(long)]
    drop_sessions: bool,
}

/// The arguments of `admin clear-chap`.
#[derive(Args, Debug)]
struct ClearChapArgs {
    target: String,
    #[arg(long)]
    mutual: bool,
    /// End the target's sessions.
    #[arg(long)]
    drop_sessions: bool,
}

/// The arguments of `admin set-alua`.
#[derive(Args, Debug)]
struct SetAluaArgs {
    group: u16,
    state: String,
}

fn show(json_out: bool, v: &Value, table: impl FnOnce(&Value)) {
    if json_out {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        table(v);
    }
}

/// Sends a change to the API and shows its answer: the JSON, or `table`'s
/// lines.
fn change(
    json_out: bool,
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<Value>,
    table: impl FnOnce(&Value),
) -> Result<()> {
    let v = send(ep, method, path, body)?;
    show(json_out, &v, table);
    Ok(())
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

/// Whether an ACL entry is an initiator name (else a network).
fn is_name(e: &str) -> bool {
    e.starts_with("iqn.") || e.starts_with("eui.") || e.starts_with("naa.")
}

/// The API path of a target's CHAP credentials, or of discovery's when
/// TARGET is the word `discovery`.
fn chap_path(target: &str, mutual: bool) -> String {
    if target == "discovery" {
        format!("/api/discovery/{}", chap_key(mutual))
    } else {
        format!("/api/targets/{}/{}", seg(target), chap_key(mutual))
    }
}

fn chap_key(mutual: bool) -> &'static str {
    if mutual {
        "mutual_chap"
    } else {
        "chap"
    }
}

/// The CHAP secret from IRONSAN_CHAP_SECRET or the first line of standard
/// input (so it never shows in the process list or shell history).
fn read_secret() -> Result<String> {
    if let Ok(s) = std::env::var("IRONSAN_CHAP_SECRET") {
        return Ok(s);
    }
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        eprint!("CHAP secret (12..=255 bytes; the input is shown): ");
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the CHAP secret from standard input")?;
    let s = line.trim_end_matches(['\r', '\n']).to_string();
    if s.is_empty() {
        anyhow::bail!(
            "no CHAP secret: give --secret-file, IRONSAN_CHAP_SECRET or a line on standard input"
        );
    }
    Ok(s)
}

/// Prints an ACL as `admin acl` shows it.
fn print_acl(v: &Value) {
    let list = |k: &str| {
        let l: Vec<&str> = v[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if l.is_empty() {
            "any".to_string()
        } else {
            l.join(", ")
        }
    };
    let chap = |k: &str, u: &str| match (v[k].as_str(), v[u].as_str()) {
        (Some("set"), Some(user)) => format!("set (user {user})"),
        (s, _) => s.unwrap_or("unset").to_string(),
    };
    match v["target"].as_str() {
        Some("discovery") => println!("discovery sessions"),
        t => {
            println!("target {}", t.unwrap_or(""));
            println!("  initiators:  {}", list("initiators"));
            println!("  networks:    {}", list("networks"));
        }
    }
    println!("  CHAP:        {}", chap("chap", "chap_user"));
    println!("  mutual CHAP: {}", chap("mutual_chap", "mutual_chap_user"));
}

/// After an ACL or CHAP change: the new state and what became of sessions.
fn changed(v: &Value) {
    print_acl(&v["acl"]);
    match v["dropped_sessions"].as_u64() {
        Some(0) | None => {
            println!("(applies to new logins; sessions already logged in keep running)")
        }
        Some(n) => println!("(applies to new logins; {n} session(s) dropped)"),
    }
    persisted_note(v);
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

/// `admin console`: a one-time login link to the web console.
fn console(ep: &Endpoint) -> Result<()> {
    let (code, body) = ep.request("POST", "/api/login-codes", Some("{}"))?;
    check(code, &body)?;
    let v: Value = serde_json::from_str(&body).context("login code: not JSON")?;
    let path = v["path"].as_str().unwrap_or_default();
    let host = match ep.http_addr() {
        Some(a) => a.to_string(),
        None => {
            let a: std::net::SocketAddr = v["http"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .context("the server did not say where its HTTP endpoint is")?;
            if a.ip().is_unspecified() {
                format!("127.0.0.1:{}", a.port())
            } else {
                a.to_string()
            }
        }
    };
    println!("http://{host}{path}");
    Ok(())
}

/// `admin list`: targets with their access rules, LUNs and ALUA groups, and the portals.
fn list(ep: &Endpoint, json_out: bool) -> Result<()> {
    let mut t = ep.get_json("/api/targets")?;
    for t in t.as_array_mut().into_iter().flatten() {
        let name = t["name"].as_str().unwrap_or("").to_string();
        t["acl"] = ep.get_json(&format!("/api/targets/{}/acl", seg(&name)))?;
    }
    let p = ep.get_json("/api/portals")?;
    let n = ep.get_json("/api/nvme-ports")?;
    let v = json!({ "targets": t, "portals": p, "nvme_ports": n });
    show(json_out, &v, print_list);
    Ok(())
}

fn print_list(v: &Value) {
    for t in v["targets"].as_array().into_iter().flatten() {
        println!(
            "target {}  (NVMe subsystem {})",
            t["name"].as_str().unwrap_or(""),
            t["nqn"].as_str().unwrap_or("")
        );
        let acl = &t["acl"];
        let n = |k: &str| acl[k].as_array().map_or(0, Vec::len);
        println!(
            "  access: {} initiator name(s), {} network(s) allowed (0: any); CHAP {}, mutual CHAP {}",
            n("initiators"),
            n("networks"),
            acl["chap"].as_str().unwrap_or("?"),
            acl["mutual_chap"].as_str().unwrap_or("?")
        );
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
            if l["state"].as_str() == Some("opening") {
                println!(
                    "          opening (NOT READY, becoming ready meanwhile): {} attempt(s){}",
                    l["attempts"],
                    l["last_error"]
                        .as_str()
                        .map(|e| format!(", last: {e}"))
                        .unwrap_or_default()
                );
            }
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
    for p in v["nvme_ports"].as_array().into_iter().flatten() {
        println!(
            "NVMe/TCP port {} (port ID {}, ANA state of ALUA group {})",
            p["addr"].as_str().unwrap_or(""),
            p["id"],
            p["alua_group"]
        );
    }
}

/// `admin sessions`: one line per session with what it negotiated.
fn sessions(ep: &Endpoint, json_out: bool) -> Result<()> {
    let v = ep.get_json("/api/sessions")?;
    show(json_out, &v, print_sessions);
    Ok(())
}

fn print_sessions(v: &Value) {
    println!(
        "{:<4} {:<40} {:<12} {:<21} {:<7} {:>8} {:>8} {:>6} {:>6}",
        "id", "initiator", "ISID", "portal", "digests", "MRDSL", "burst", "window", "inflt"
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
            // JSON values ignore widths: pad their text.
            i["id"].to_string(),
            i["initiator"].as_str().unwrap_or(""),
            i["isid"].as_str().unwrap_or(""),
            i["portal"].as_str().unwrap_or(""),
            dg,
            i["send_max_data_segment"].to_string(),
            i["max_burst"].to_string(),
            i["queue_depth"].to_string(),
            s["in_flight"].to_string()
        );
    }
}

/// The body of `POST /api/targets/{iqn}/luns` for `admin add-lun`.
fn lun_body(
    spec: &str,
    number: Option<u16>,
    block_size: Option<u32>,
    write_back: bool,
    read_only: bool,
) -> Result<Value> {
    let mut l = LunConfig::from_spec(spec)?;
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
    if let Some(u) = &l.uuid {
        body["uuid"] = json!(u);
    }
    if write_back {
        body["write_cache"] = json!("back");
    }
    Ok(body)
}

pub fn run(a: AdminArgs) -> Result<()> {
    let ep = a.ep.endpoint()?;
    match a.cmd {
        AdminCmd::Console => console(&ep)?,
        AdminCmd::List => list(&ep, a.json)?,
        AdminCmd::Sessions => sessions(&ep, a.json)?,
        AdminCmd::AddTarget(x) => add_target(&ep, a.json, x)?,
        AdminCmd::RemoveTarget(x) => remove_target(&ep, a.json, x)?,
        AdminCmd::AddLun(x) => add_lun(&ep, a.json, x)?,
        AdminCmd::AddNvmePort(x) => change(
            a.json,
            &ep,
            "POST",
            "/api/nvme-ports",
            Some(json!({ "addr": x.addr })),
            |v| {
                println!(
                    "NVMe/TCP on {} (port {}, ALUA group {})",
                    v["port"]["addr"].as_str().unwrap_or(""),
                    v["port"]["id"],
                    v["port"]["alua_group"]
                );
                persisted_note(v);
            },
        )?,
        AdminCmd::RemoveNvmePort(x) => change(
            a.json,
            &ep,
            "DELETE",
            &format!("/api/nvme-ports/{}", seg(&x.port)),
            None,
            |v| {
                println!(
                    "removed NVMe/TCP port {} ({})",
                    v["removed"]["id"],
                    v["removed"]["addr"].as_str().unwrap_or("")
                );
                persisted_note(v);
            },
        )?,
        AdminCmd::RemoveLun(x) => remove_lun(&ep, a.json, x)?,
        AdminCmd::ResizeLun(x) => resize_lun(&ep, a.json, x)?,
        AdminCmd::AddPortal(x) => add_portal(&ep, a.json, x)?,
        AdminCmd::RemovePortal(x) => remove_portal(&ep, a.json, x)?,
        AdminCmd::Acl(x) => acl(&ep, a.json, x)?,
        AdminCmd::Allow(x) => allow(&ep, a.json, x)?,
        AdminCmd::Disallow(x) => disallow(&ep, a.json, x)?,
        AdminCmd::SetChap(x) => set_chap(&ep, a.json, x)?,
        AdminCmd::ClearChap(x) => clear_chap(&ep, a.json, x)?,
        AdminCmd::SetAlua(x) => set_alua(&ep, a.json, x)?,
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

/// `ironsan admin add-target`.
fn add_target(ep: &Endpoint, json_out: bool, a: AddTargetArgs) -> Result<()> {
    let lun = a
        .luns
        .iter()
        .enumerate()
        .map(|(i, spec)| lun_body(spec, Some(i as u16), None, false, false))
        .collect::<Result<Vec<_>>>()?;
    let mut body = json!({ "name": a.name, "lun": lun });
    for (k, v) in [("nqn", &a.nqn), ("alias", &a.alias)] {
        if let Some(v) = v {
            body[k] = json!(v);
        }
    }
    for (k, v) in [
        ("allow", &a.allow),
        ("allow_net", &a.allow_net),
        ("nvme_allow", &a.nvme_allow),
    ] {
        if !v.is_empty() {
            body[k] = json!(v);
        }
    }
    if let Some(f) = &a.dhchap_secret_file {
        body["dhchap"] = json!({ "secret_file": f });
        if let Some(c) = &a.dhchap_ctrl_secret_file {
            body["dhchap"]["ctrl_secret_file"] = json!(c);
        }
    }
    change(json_out, ep, "POST", "/api/targets", Some(body), |v| {
        let t = &v["target"];
        let n = t["luns"].as_array().map_or(0, Vec::len);
        println!(
            "added target {} ({n} LUN(s))",
            t["name"].as_str().unwrap_or("")
        );
        persisted_note(v);
    })
}

/// `ironsan admin remove-target`.
fn remove_target(ep: &Endpoint, json_out: bool, a: RemoveTargetArgs) -> Result<()> {
    change(
        json_out,
        ep,
        "DELETE",
        &format!("/api/targets/{}", seg(&a.target)),
        None,
        |v| {
            println!("removed target {}", a.target);
            persisted_note(v);
        },
    )
}

/// `ironsan admin add-lun`.
fn add_lun(ep: &Endpoint, json_out: bool, a: AddLunArgs) -> Result<()> {
    let AddLunArgs {
        target,
        spec,
        number,
        block_size,
        write_back,
        read_only,
    } = a;
    let body = lun_body(&spec, number, block_size, write_back, read_only)?;
    change(
        json_out,
        ep,
        "POST",
        &format!("/api/targets/{}/luns", seg(&target)),
        Some(body),
        |v| {
            println!(
                "added LUN {} ({}, {} bytes)",
                v["lun"]["lun"],
                v["lun"]["naa"].as_str().unwrap_or(""),
                v["lun"]["size_bytes"]
            );
            persisted_note(v);
        },
    )
}

/// `ironsan admin remove-lun`.
fn remove_lun(ep: &Endpoint, json_out: bool, a: RemoveLunArgs) -> Result<()> {
    let RemoveLunArgs { target, lun } = a;
    change(
        json_out,
        ep,
        "DELETE",
        &format!("/api/targets/{}/luns/{lun}", seg(&target)),
        None,
        |v| {
            println!("removed LUN {lun}");
            persisted_note(v);
        },
    )
}

/// `ironsan admin resize-lun`.
fn resize_lun(ep: &Endpoint, json_out: bool, a: ResizeLunArgs) -> Result<()> {
    let ResizeLunArgs {
        target,
        lun,
        size,
        shrink,
    } = a;
    change(
        json_out,
        ep,
        "POST",
        &format!("/api/targets/{}/luns/{lun}/resize", seg(&target)),
        Some(json!({ "size": size, "shrink": shrink })),
        |v| {
            println!("LUN {lun} now has {} bytes", v["lun"]["size_bytes"]);
            persisted_note(v);
        },
    )
}

/// `ironsan admin add-portal`.
fn add_portal(ep: &Endpoint, json_out: bool, a: AddPortalArgs) -> Result<()> {
    let AddPortalArgs { addr, alua_group } = a;
    change(
        json_out,
        ep,
        "POST",
        "/api/portals",
        Some(json!({ "addr": addr, "alua_group": alua_group })),
        |v| {
            println!(
                "listening on {} (TPGT {})",
                v["portal"]["addr"].as_str().unwrap_or(""),
                v["portal"]["tpgt"]
            );
            persisted_note(v);
        },
    )
}

/// `ironsan admin remove-portal`.
fn remove_portal(ep: &Endpoint, json_out: bool, a: RemovePortalArgs) -> Result<()> {
    let RemovePortalArgs { portal } = a;
    change(
        json_out,
        ep,
        "DELETE",
        &format!("/api/portals/{}", seg(&portal)),
        None,
        |v| {
            println!(
                "removed portal {} (TPGT {})",
                v["removed"]["addr"].as_str().unwrap_or(""),
                v["removed"]["tpgt"]
            );
            persisted_note(v);
        },
    )
}

/// `ironsan admin acl`.
fn acl(ep: &Endpoint, json_out: bool, a: AclArgs) -> Result<()> {
    let AclArgs { target } = a;
    let v = if target == "discovery" {
        ep.get_json("/api/discovery")?
    } else {
        ep.get_json(&format!("/api/targets/{}/acl", seg(&target)))?
    };
    show(json_out, &v, print_acl);
    Ok(())
}

/// `ironsan admin allow`.
fn allow(ep: &Endpoint, json_out: bool, a: AllowArgs) -> Result<()> {
    let AllowArgs {
        target,
        entry,
        drop_sessions,
    } = a;
    let key = if is_name(&entry) {
        "initiator"
    } else {
        "network"
    };
    change(
        json_out,
        ep,
        "POST",
        &format!(
            "/api/targets/{}/acl?drop_sessions={drop_sessions}",
            seg(&target)
        ),
        Some(json!({ key: entry })),
        |v| {
            println!("allowed {entry}");
            changed(v);
        },
    )
}

/// `ironsan admin disallow`.
fn disallow(ep: &Endpoint, json_out: bool, a: DisallowArgs) -> Result<()> {
    let DisallowArgs {
        target,
        entry,
        allow_any,
        drop_sessions,
    } = a;
    change(
        json_out,
        ep,
        "DELETE",
        &format!(
            "/api/targets/{}/acl/{}?allow_any={allow_any}&drop_sessions={drop_sessions}",
            seg(&target),
            seg(&entry)
        ),
        None,
        |v| {
            println!("removed {entry}");
            changed(v);
        },
    )
}

/// `ironsan admin set-chap`.
fn set_chap(ep: &Endpoint, json_out: bool, a: SetChapArgs) -> Result<()> {
    let SetChapArgs {
        target,
        user,
        mutual,
        secret_file,
        drop_sessions,
    } = a;
    let body = match secret_file {
        Some(f) => json!({ "user": user, "secret_file": f }),
        None => json!({ "user": user, "secret": read_secret()? }),
    };
    change(
        json_out,
        ep,
        "PUT",
        &format!(
            "{}?drop_sessions={drop_sessions}",
            chap_path(&target, mutual)
        ),
        Some(body),
        |v| {
            println!("{} set for {target} (user {user})", chap_key(mutual));
            changed(v);
        },
    )
}

/// `ironsan admin clear-chap`.
fn clear_chap(ep: &Endpoint, json_out: bool, a: ClearChapArgs) -> Result<()> {
    let ClearChapArgs {
        target,
        mutual,
        drop_sessions,
    } = a;
    change(
        json_out,
        ep,
        "DELETE",
        &format!(
            "{}?drop_sessions={drop_sessions}",
            chap_path(&target, mutual)
        ),
        None,
        |v| {
            println!("{} cleared for {target}", chap_key(mutual));
            changed(v);
        },
    )
}

/// `ironsan admin set-alua`.
fn set_alua(ep: &Endpoint, json_out: bool, a: SetAluaArgs) -> Result<()> {
    let SetAluaArgs { group, state } = a;
    change(
        json_out,
        ep,
        "PUT",
        &format!("/api/alua/{group}"),
        Some(json!({ "state": state })),
        |v| {
            println!("ALUA group {group}: {}", v["state"].as_str().unwrap_or(""));
            persisted_note(v);
        },
    )
}
