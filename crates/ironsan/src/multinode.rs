//! `ironsan bench --server` and `ironsan bench --client …`: the command-line
//! side of the multi-node bench (the protocol lives in `bench::node`).

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bench::node::coordinator::{self, NodeSpec, Timeouts};
use bench::node::server::{BenchServer, ServerOptions};
use bench::JobSpec;

use crate::client::{parse_duration, BenchArgs};

/// Where `--server` listens when given no address.
pub const DEFAULT_SERVER: &str = "127.0.0.1:9261";

/// The generated token's file in the state directory.
const TOKEN_FILE: &str = "bench.token";

/// The shared token from --token-file, --token (warned about: `ps` shows
/// it) or IRONSAN_BENCH_TOKEN; `None` when none is given.
fn given_token(a: &BenchArgs) -> Result<Option<String>> {
    use admin_api::auth;
    if let Some(f) = &a.token_file {
        return auth::read_token_file(f)
            .map(Some)
            .map_err(anyhow::Error::msg);
    }
    if let Some(t) = &a.token {
        eprintln!(
            "ironsan bench: warning: --token puts the token where every user of this host can read it (ps): use --token-file or IRONSAN_BENCH_TOKEN"
        );
        return Ok(Some(t.clone()));
    }
    Ok(std::env::var("IRONSAN_BENCH_TOKEN").ok())
}

/// `ironsan bench --server [ADDR:PORT]`: serve jobs until killed.
pub fn server(a: &BenchArgs, addr: SocketAddr) -> Result<()> {
    if !a.targets.is_empty() {
        bail!(
            "--server takes no targets: the coordinator (ironsan bench --client …) sends the job"
        );
    }
    // Every coordinator presents the token, loopback included.
    let token = match given_token(a)? {
        Some(t) => t,
        None => {
            let path = admin_api::auth::default_dir().join(TOKEN_FILE);
            let (t, _) =
                admin_api::auth::load_or_create_token_file(&path).map_err(anyhow::Error::msg)?;
            eprintln!(
                "ironsan bench: coordinators must present the token in {} (--token-file or IRONSAN_BENCH_TOKEN; on this host they read it there)",
                path.display()
            );
            t
        }
    };
    if !addr.ip().is_loopback() {
        eprintln!(
            "ironsan bench: warning: listening on {addr}, reachable from other machines: whoever \
             connects with the token can drive I/O against the targets they name (the token \
             travels in clear: use trusted networks)"
        );
    }
    let s = BenchServer::bind(
        addr,
        ServerOptions {
            token: Some(token),
            allow_files: a.allow_files,
        },
    )
    .with_context(|| format!("--server {addr}"))?;
    let bound = s.local_addr()?;
    // Scripts and tests read this line for the port chosen.
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "ironsan bench: server listening on {bound}");
    let _ = o.flush();
    drop(o);
    s.run(&AtomicBool::new(false))?;
    Ok(())
}

/// `ironsan bench --client HOST … <job>`: run on every node, merge, report.
pub fn coordinator(a: &BenchArgs, base: JobSpec) -> Result<()> {
    let nodes = a
        .clients
        .iter()
        .map(|c| NodeSpec::parse(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let specs = coordinator::plan(&base, &nodes).map_err(anyhow::Error::msg)?;
    let answer =
        parse_duration(&a.client_timeout).map_err(|e| anyhow::anyhow!("--client-timeout: {e}"))?;
    if answer.is_zero() {
        bail!("--client-timeout must be more than 0");
    }
    let t = Timeouts {
        answer,
        ..Timeouts::default()
    };
    let live = std::io::stderr().is_terminal() && !a.json_out();
    let mut last = (Instant::now(), 0u64, 0u64);
    // The token given, else the one a server on this host generated.
    let token = match given_token(a)? {
        Some(t) => Some(t),
        None => {
            let path = admin_api::auth::default_dir().join(TOKEN_FILE);
            admin_api::auth::read_token_file(&path).ok()
        }
    };
    let m = coordinator::run(&nodes, &specs, token.as_deref(), t, |ios, bytes| {
        let dt = last.0.elapsed().as_secs_f64();
        if live && dt >= 0.9 {
            eprint!(
                "\r  {} nodes: {:.0} IOPS, {:.1} MB/s        ",
                nodes.len(),
                (ios - last.1) as f64 / dt,
                (bytes - last.2) as f64 / 1e6 / dt
            );
            last = (Instant::now(), ios, bytes);
        }
    });
    if live {
        eprint!("\r{:60}\r", "");
    }
    let m = m.map_err(anyhow::Error::msg)?;
    for n in &m.merged.notes {
        eprintln!("ironsan: note: {n}");
    }
    if let Some(p) = &a.plot {
        std::fs::write(p, bench::plot::svg(&m.nodes[0].spec, &m.merged))
            .with_context(|| format!("--plot {}", p.display()))?;
    }
    if a.json_out() {
        println!(
            "{}",
            serde_json::to_string_pretty(&bench::node::report::json(&m))?
        );
    } else {
        print!("{}", bench::node::report::text(&m));
    }
    let errors = m.merged.errors();
    if errors > 0 {
        bail!("{errors} I/O errors");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_server_address_uses_the_documented_port() {
        let a: std::net::SocketAddr = super::DEFAULT_SERVER.parse().unwrap();
        assert!(a.ip().is_loopback());
        assert_eq!(a.port(), bench::node::DEFAULT_PORT);
    }
}
