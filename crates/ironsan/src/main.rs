//! The `ironsan` command: `serve` runs the iSCSI target; `ls`, `inq` and
//! `bench` drive any iSCSI target through the built-in initiator.
// The argument structs' doc comments are the CLI's --help text, where
// `iscsi://host[:port]` and `[global]` mean what they say, not doc links.
#![allow(rustdoc::broken_intra_doc_links)]

mod admin;
mod client;
mod http;
mod multinode;
mod probe;
mod probe_nvme;
mod tools;
mod top;
mod tune;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use server::config::{
    Config, CredConfig, DigestConfig, LunConfig, TargetConfig, DEFAULT_LISTEN, DEFAULT_TARGET,
};
use server::Server;

/// 1 MiB buffers (RAM LUN chunks, large I/O) behind transparent huge pages.
#[global_allocator]
static ALLOC: bufpool::HugeAlloc = bufpool::HugeAlloc;

#[derive(Parser, Debug)]
#[command(
    name = "ironsan",
    version,
    about = "A software-defined SAN: iSCSI target, initiator and benchmarks"
)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long, global = true, default_value = "info")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve LUNs over iSCSI. With no options: a 1 GiB RAM LUN on 127.0.0.1:3260.
    Serve(ServeArgs),
    /// Benchmark iSCSI LUNs, files or block devices (fio's options and JSON); on several load nodes with --server and --client.
    #[command(after_help = "Multi-node (like fio --server/--client):\n  \
        on each load node:   ironsan bench --server [ADDR:PORT]          (default 127.0.0.1:9261)\n  \
        on the coordinator:  ironsan bench --client node1 --client node2:9261 --rw randread --runtime 10s iscsi://target/iqn.../0\n\
        Each node may drive its own LUN: --client node2=iscsi://other/iqn.../1. Results: per node, all nodes merged\n\
        (HDR histograms added) and a stonewall figure (all nodes' I/Os until the first job finished).")]
    Bench(client::BenchArgs),
    /// List targets and portals of a portal (discovery); -s also lists LUNs.
    Ls(client::LsArgs),
    /// Show INQUIRY data, identifiers and capacity of a LUN.
    Inq(client::InqArgs),
    /// CrystalDiskMark's tests: read and write MB/s and IOPS per test (profiles cdm8, cdm6, nvme).
    Cdm(tools::CdmArgs),
    /// gpfsperf's command line and report: create|read|write|mixrw seq|rand TARGET -r SIZE -th N -n SIZE.
    Gpfsperf(tools::GpfsperfArgs),
    /// Change and inspect a running server through its admin endpoint.
    Admin(admin::AdminArgs),
    /// Live per-LUN and per-session I/O view (like esxtop), from the admin endpoint.
    Top(top::TopArgs),
    /// Check this host's tuning, or print the initiator-side recipe for a target's LUNs.
    Tune(tune::TuneArgs),
    /// Measurement probes for the side-by-side script (null responder, raw loopback).
    #[command(subcommand, hide = true)]
    Probe(probe::Probe),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// A portal address to listen on (repeatable; each is its own portal group).
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    listen: Vec<SocketAddr>,
    /// An NVMe/TCP port to listen on as well (repeatable): the target is
    /// also an NVMe subsystem there, its LUNs the namespaces (NSID = LUN + 1).
    #[arg(long = "nvme-listen", value_name = "ADDR:PORT")]
    nvme_listen: Vec<SocketAddr>,
    /// The target's iSCSI name.
    #[arg(long = "target", value_name = "IQN")]
    target: Option<String>,
    /// A LUN: mem:SIZE, null:SIZE, file:PATH, file:PATH:SIZE or rbd:POOL/IMAGE, optionally
    /// followed by ,physical_block_size=BYTES (e.g. mem:64M,physical_block_size=4096 for 512e);
    /// repeatable, the first is LUN 0. An rbd LUN reaches the cluster of $CEPH_CONF (or
    /// /etc/ceph/ceph.conf) as client.admin; a config file sets ceph_conf, ceph_client and
    /// ceph_keyring.
    #[arg(long = "lun", value_name = "SPEC")]
    lun: Vec<String>,
    /// Logical block size of the --lun LUNs (512 or 4096).
    #[arg(long, value_name = "BYTES")]
    block_size: Option<u32>,
    /// Write-back caching for --lun file LUNs (WCE=1; FUA and SYNCHRONIZE CACHE make data stable).
    #[arg(long)]
    write_back: bool,
    /// Command window per session, 1..=8192 (MaxCmdSN - ExpCmdSN + 1).
    #[arg(long, value_name = "N")]
    queue_depth: Option<u32>,
    /// TCP congestion control of every connection (default cubic; "system": the kernel's default).
    #[arg(long, value_name = "NAME")]
    tcp_congestion: Option<String>,
    /// Microseconds a connection polls its socket before it sleeps (default 50; 0: never polls).
    #[arg(long, value_name = "US")]
    busy_poll_us: Option<u32>,
    /// Header and data digests (CRC32C): off, allowed or required.
    #[arg(long, value_name = "POLICY", value_parser = parse_digest)]
    digest: Option<DigestConfig>,
    /// Header digest only: off, allowed or required (overrides --digest).
    #[arg(long, value_name = "POLICY", value_parser = parse_digest)]
    header_digest: Option<DigestConfig>,
    /// Data digest only: off, allowed or required (overrides --digest).
    #[arg(long, value_name = "POLICY", value_parser = parse_digest)]
    data_digest: Option<DigestConfig>,
    /// Directory for persistent reservation state (APTPL); none: APTPL is refused.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Event loop threads (default: one per CPU).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Require CHAP from initiators (every target and discovery); the secret is 12..=255 bytes.
    /// Visible to every user in `ps`: prefer --chap-file or IRONSAN_CHAP.
    #[arg(long, value_name = "USER:SECRET", value_parser = CredConfig::from_spec)]
    chap: Option<CredConfig>,
    /// As --chap, from a file (mode 0600) whose first line is USER:SECRET; also IRONSAN_CHAP
    /// (USER:SECRET in the environment).
    #[arg(long, value_name = "FILE", conflicts_with = "chap")]
    chap_file: Option<PathBuf>,
    /// The target's own CHAP credentials for mutual CHAP (needs --chap; a different secret).
    /// Visible in `ps`: prefer --mutual-chap-file or IRONSAN_MUTUAL_CHAP.
    #[arg(long, value_name = "USER:SECRET", value_parser = CredConfig::from_spec)]
    mutual_chap: Option<CredConfig>,
    /// As --mutual-chap, from a file whose first line is USER:SECRET; also IRONSAN_MUTUAL_CHAP.
    #[arg(long, value_name = "FILE", conflicts_with = "mutual_chap")]
    mutual_chap_file: Option<PathBuf>,
    /// Allow only this initiator name on every target (repeatable).
    #[arg(long = "allow", value_name = "IQN")]
    allow: Vec<String>,
    /// Serve the rbd LUNs as one of several gateways (docs/GATEWAYS.md): GROUP is this
    /// gateway's ALUA target port group, optionally :TAG the portal tag of its first portal
    /// (gateways must not share tags). Needs --gateway-peer.
    #[arg(long, value_name = "GROUP[:TAG]", value_parser = parse_gateway)]
    gateway: Option<(u16, u16)>,
    /// Another gateway of the same LUs: its ALUA group and its relative port ids (repeatable).
    #[arg(long = "gateway-peer", value_name = "GROUP=PORT[,PORT...]", value_parser = parse_peer)]
    gateway_peer: Vec<server::config::GatewayPeerConfig>,
    /// A TOML configuration file (see docs/CONFIG.md); flags above override its values.
    /// Changes made through the admin API are written back to it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Serve the admin API, /metrics and the web console over HTTP (default address
    /// 127.0.0.1:9260), and the admin socket for `ironsan admin` (docs/ADMIN.md).
    #[arg(long, value_name = "ADDR:PORT", num_args = 0..=1, default_missing_value = admin::DEFAULT_ADMIN)]
    admin: Option<SocketAddr>,
    /// A file whose first line is the token HTTP requests must carry; also IRONSAN_ADMIN_TOKEN.
    /// Default: the admin directory's admin.token, generated at the first start.
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Serve GET /metrics without the token (read-only counters).
    #[arg(long)]
    admin_metrics_open: bool,
}

fn parse_digest(s: &str) -> Result<DigestConfig, String> {
    match s {
        "off" => Ok(DigestConfig::Off),
        "allowed" => Ok(DigestConfig::Allowed),
        "required" => Ok(DigestConfig::Required),
        _ => Err(format!("{s:?}: expected off, allowed or required")),
    }
}

fn parse_gateway(s: &str) -> Result<(u16, u16), String> {
    let num = |v: &str| {
        v.parse::<u16>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{v:?}: expected 1..=65535"))
    };
    match s.split_once(':') {
        Some((g, t)) => Ok((num(g)?, num(t)?)),
        None => Ok((num(s)?, 1)),
    }
}

fn parse_peer(s: &str) -> Result<server::config::GatewayPeerConfig, String> {
    let (g, ports) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected GROUP=PORT[,PORT...]"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<u16>()
            .map_err(|_| format!("{v:?}: expected 1..=65535"))
    };
    Ok(server::config::GatewayPeerConfig {
        group: num(g)?,
        ports: ports.split(',').map(num).collect::<Result<_, _>>()?,
    })
}

/// Builds the configuration from a file and/or the quick flags.
fn build_config(a: &ServeArgs) -> Result<Config> {
    let mut cfg = match &a.config {
        Some(p) => Config::from_file(p)?,
        None => Config {
            listen: vec![DEFAULT_LISTEN.parse().expect("valid")],
            nvme_listen: Vec::new(),
            limits: Default::default(),
            timeouts: Default::default(),
            alua: Default::default(),
            workers: None,
            target: Vec::new(),
            state_dir: None,
            admin: Default::default(),
            discovery: Default::default(),
            gateway: None,
        },
    };
    if !a.listen.is_empty() {
        cfg.listen = a.listen.clone();
    }
    if !a.nvme_listen.is_empty() {
        cfg.nvme_listen = a.nvme_listen.clone();
    }
    if !a.lun.is_empty() || cfg.target.is_empty() {
        let specs = if a.lun.is_empty() {
            vec!["mem:1G".to_string()]
        } else {
            a.lun.clone()
        };
        let mut luns = Vec::new();
        for s in &specs {
            let mut l = LunConfig::from_spec(s)?;
            if let Some(bs) = a.block_size {
                l.block_size = bs;
            }
            if a.write_back {
                l.write_cache = server::config::CacheConfig::Back;
            }
            luns.push(l);
        }
        let name = a
            .target
            .clone()
            .unwrap_or_else(|| DEFAULT_TARGET.to_string());
        let no_targets = cfg.target.is_empty();
        match cfg.target.iter_mut().find(|t| t.name == name) {
            Some(t) => t.lun = luns,
            None if no_targets || a.target.is_some() => {
                cfg.target.push(TargetConfig::new(&name, luns))
            }
            None => bail!("--lun given with a config of several targets: name one with --target"),
        }
    } else if let Some(name) = &a.target {
        if !cfg.target.iter().any(|t| &t.name == name) {
            bail!("--target {name}: not in the configuration, and no --lun given for it");
        }
    }
    if let Some(d) = &a.state_dir {
        cfg.state_dir = Some(d.clone());
    }
    if let Some((group, first_portal_tag)) = a.gateway {
        cfg.gateway = Some(server::config::GatewayConfig {
            group,
            first_portal_tag,
            peer: a.gateway_peer.clone(),
            check_interval_ms: cfg.gateway.as_ref().map_or(1000, |g| g.check_interval_ms),
            implicit_failover: cfg.gateway.as_ref().is_none_or(|g| g.implicit_failover),
            owner_timeout_ms: cfg.gateway.as_ref().map_or(3000, |g| g.owner_timeout_ms),
        });
    } else if !a.gateway_peer.is_empty() {
        bail!("--gateway-peer needs --gateway");
    }
    if let Some(l) = a.admin {
        cfg.admin.listen = Some(l);
    }
    if let Some(f) = &a.admin_token_file {
        cfg.admin.token_file = Some(f.clone());
        cfg.admin.token = None;
    } else if let Ok(t) = std::env::var("IRONSAN_ADMIN_TOKEN") {
        cfg.admin.token = Some(server::config::SecretString(t));
        cfg.admin.token_file = None;
    }
    if a.admin_metrics_open {
        cfg.admin.metrics_open = true;
    }
    if let Some(w) = a.workers {
        cfg.workers = Some(w);
    }
    if let Some(q) = a.queue_depth {
        cfg.limits.queue_depth = q;
    }
    if let Some(c) = &a.tcp_congestion {
        cfg.limits.tcp_congestion.clone_from(c);
    }
    if let Some(us) = a.busy_poll_us {
        cfg.limits.busy_poll_us = us;
    }
    if let Some(d) = a.digest {
        cfg.limits.header_digest = d;
        cfg.limits.data_digest = d;
    }
    if let Some(d) = a.header_digest {
        cfg.limits.header_digest = d;
    }
    if let Some(d) = a.data_digest {
        cfg.limits.data_digest = d;
    }
    let chap = secret_arg(
        a.chap.as_ref(),
        a.chap_file.as_deref(),
        "chap",
        "IRONSAN_CHAP",
    )?;
    let mutual_chap = secret_arg(
        a.mutual_chap.as_ref(),
        a.mutual_chap_file.as_deref(),
        "mutual-chap",
        "IRONSAN_MUTUAL_CHAP",
    )?;
    if chap.is_some() || mutual_chap.is_some() {
        for t in &mut cfg.target {
            t.chap.clone_from(&chap);
            t.mutual_chap.clone_from(&mutual_chap);
        }
        cfg.discovery.chap.clone_from(&chap);
        cfg.discovery.mutual_chap.clone_from(&mutual_chap);
    }
    if !a.allow.is_empty() {
        for t in &mut cfg.target {
            t.allow.clone_from(&a.allow);
        }
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Start-up output of `serve`: a closed or broken stdout must not stop the
/// target (println! would panic on EPIPE once a supervisor stops reading).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write;
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, $($t)*);
        let _ = o.flush();
    }};
}

/// CHAP credentials from `--NAME USER:SECRET` (visible in `ps`: warned
/// about), `--NAME-file FILE` or the environment variable `env`.
fn secret_arg(
    flag: Option<&CredConfig>,
    file: Option<&std::path::Path>,
    name: &str,
    env: &str,
) -> Result<Option<CredConfig>> {
    if let Some(c) = flag {
        tracing::warn!(
            "--{name} USER:SECRET puts the secret where every user of this host can read it (ps, /proc/PID/cmdline): use --{name}-file or {env}"
        );
        return Ok(Some(c.clone()));
    }
    if let Some(f) = file {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("--{name}-file {}", f.display()))?;
        let line = text.lines().next().unwrap_or("");
        return CredConfig::from_spec(line)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--{name}-file {}: {e}", f.display()));
    }
    match std::env::var(env) {
        Ok(v) => CredConfig::from_spec(&v)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{env}: {e}")),
        Err(_) => Ok(None),
    }
}

/// The admin endpoint's options: the token (given, or generated in the
/// admin directory), the socket and the path policy.
fn admin_options(
    cfg: &Config,
    listen: SocketAddr,
    config_path: Option<PathBuf>,
) -> Result<admin_api::AdminOptions> {
    use admin_api::auth;
    let dir = cfg
        .admin
        .dir
        .clone()
        .or_else(|| cfg.state_dir.clone())
        .unwrap_or_else(auth::default_dir);
    let token = match (&cfg.admin.token, &cfg.admin.token_file) {
        (Some(t), _) => {
            auth::check_token(&t.0).map_err(anyhow::Error::msg)?;
            t.0.clone()
        }
        (None, Some(f)) => auth::read_token_file(f).map_err(anyhow::Error::msg)?,
        (None, None) => {
            let (t, created) = auth::load_or_create_token(&dir).map_err(anyhow::Error::msg)?;
            if created {
                say!(
                    "ironsan: admin token generated in {} (mode 0600)",
                    dir.join(auth::TOKEN_FILE).display()
                );
            }
            t
        }
    };
    Ok(admin_api::AdminOptions {
        listen,
        token,
        socket: Some(dir.join(auth::SOCKET_FILE)),
        allowed_hosts: cfg.admin.allowed_hosts.clone(),
        metrics_open: cfg.admin.metrics_open,
        paths: admin_api::paths::PathPolicy::from_config(cfg, &dir),
        config_path,
    })
}

/// Installs the SIGINT and SIGTERM handlers now (so a signal that arrives
/// before the server runs is not lost) and returns the future that
/// resolves on the first of them.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

/// Raises the soft limit on open files to the hard one: every connection
/// is a descriptor, and admission control (server::admission) needs room
/// to accept and evict a flood of idle sockets.
fn raise_open_files() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for getrlimit to fill and setrlimit to
    // read; neither keeps the pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn serve(a: ServeArgs) -> Result<()> {
    raise_open_files();
    let cfg = build_config(&a)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        let stop = shutdown_signal()?;
        let server = Server::bind(cfg.clone())
            .await
            .map_err(anyhow::Error::msg)?;
        let addrs = server.local_addrs();
        if let Some(listen) = cfg.admin.listen {
            let opts = admin_options(&cfg, listen, a.config.clone())?;
            let socket = opts.socket.clone();
            let admin = admin_api::Admin::bind(opts, server.control())
                .await
                .map_err(anyhow::Error::msg)?;
            let at = admin.local_addr().context("admin endpoint address")?;
            say!("ironsan: admin API and console on http://{at}/");
            say!("ironsan: every admin request is authenticated: `ironsan admin console` prints a log-in link");
            if let Some(s) = socket {
                say!("ironsan: admin socket {} (this user and root only)", s.display());
            }
            if a.config.is_none() {
                println!(
                    "ironsan: no --config: changes made through the admin API last until exit"
                );
            }
            tokio::spawn(admin.run());
        }
        for t in &cfg.target {
            for (i, l) in t.lun.iter().enumerate() {
                let what = match l.backend {
                    server::config::BackendKind::Mem => {
                        "RAM (volatile: for tests and benchmarks, lost at exit)".to_string()
                    }
                    server::config::BackendKind::Null => {
                        "null (reads zeros, discards writes)".to_string()
                    }
                    server::config::BackendKind::Rbd => format!(
                        "rbd {}/{}",
                        l.pool.as_deref().unwrap_or_default(),
                        l.image.as_deref().unwrap_or_default()
                    ),
                    server::config::BackendKind::File => format!(
                        "file {} ({})",
                        l.path
                            .as_deref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                        match l.write_cache {
                            server::config::CacheConfig::Through => "write-through",
                            server::config::CacheConfig::Back => "write-back",
                        }
                    ),
                };
                let physical = match l.physical_block_size {
                    Some(p) if p != l.block_size => format!(" ({p} byte physical blocks)"),
                    _ => String::new(),
                };
                say!(
                    "ironsan: {} LUN {i}: {what}, {} byte blocks{physical}",
                    t.name,
                    l.block_size
                );
            }
        }
        for a in &addrs {
            say!("ironsan: listening on {a}");
        }
        let nvme_addrs = server.nvme_addrs();
        for (a, t) in nvme_addrs.iter().zip(std::iter::repeat(cfg.target.first())) {
            say!("ironsan: NVMe/TCP on {a}");
            if let Some(t) = t {
                say!(
                    "ironsan: try  nvme connect -t tcp -a {} -s {} -n {}",
                    a.ip(),
                    a.port(),
                    t.subsystem_nqn()
                );
            }
        }
        if let (Some(a), Some(t)) = (addrs.first(), cfg.target.first()) {
            say!(
                "ironsan: try  iscsi-ls -s iscsi://{a}  or  iscsi-inq iscsi://{a}/{}/0",
                t.name
            );
        }
        server.run(stop).await;
        Ok::<_, anyhow::Error>(())
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a terminal: logs written to files or journald
        // carry no escape codes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.cmd {
        Cmd::Serve(a) => serve(a),
        Cmd::Bench(a) => client::bench(a),
        Cmd::Ls(a) => client::ls(a),
        Cmd::Inq(a) => client::inq(a),
        Cmd::Cdm(a) => tools::cdm(a),
        Cmd::Gpfsperf(a) => tools::gpfsperf(a),
        Cmd::Admin(a) => admin::run(a),
        Cmd::Top(a) => top::run(a),
        Cmd::Tune(a) => tune::run(a),
        Cmd::Probe(p) => probe::run(p),
    }
}
