//! `ironsan tune`: on the target host, checks what the reference setups
//! tuned (their knobs are listed in docs/TUNING.md) and says what to change
//! and why; with
//! `esxi|linux|windows iscsi://HOST/IQN`, logs in to the target and prints
//! the initiator-side recipe for its LUNs, named by their NAA ids.
//! Sources for every command: docs/TUNING.md.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use initiator::{scsi, Connection, DataDir, LoginConfig, Url};

/// `ironsan tune`.
#[derive(Args, Debug)]
pub struct TuneArgs {
    /// host (default: check this machine), or esxi, linux, windows for an initiator recipe.
    #[arg(default_value = "host")]
    what: String,
    /// For a recipe: iscsi://HOST[:PORT]/IQN of the target (linux: or
    /// nvme-tcp://HOST[:PORT]/NQN of the subsystem).
    url: Option<String>,
    /// The target's configuration file (to find the portals' interfaces).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Sessions you expect (for the open file limit).
    #[arg(long, default_value_t = 1024)]
    sessions: u64,
    /// Read /proc and /sys under this directory (tests).
    #[arg(long, hide = true, default_value = "/")]
    root: PathBuf,
    /// Initiator name for the recipe's login.
    #[arg(long, default_value = initiator::DEFAULT_INITIATOR)]
    initiator: String,
    /// A LUN file to check (where it lives), as given to `serve --lun
    /// file:PATH`; repeatable. The --config file's file LUNs are checked too.
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<PathBuf>,
}

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Ok,
    Change,
    Info,
}

/// One finding: what, what it is, and what to do and why.
#[derive(Clone, Debug)]
pub struct Finding {
    pub level: Level,
    pub what: String,
    pub now: String,
    pub advice: String,
}

/// The 1 MiB socket buffers of the reference setups.
pub const WANT_BUF: u64 = 1 << 20;

/// Reads files under a root (`/` normally, a fixture directory in tests).
pub struct Host {
    pub root: PathBuf,
}

impl Host {
    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    pub fn read(&self, p: &str) -> Option<String> {
        std::fs::read_to_string(self.path(p))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn list(&self, p: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path(p))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// The maximum of a `min default max` triple (`net.ipv4.tcp_rmem`).
pub fn triple_max(s: &str) -> Option<u64> {
    s.split_whitespace().nth(2)?.parse().ok()
}

/// The soft limit of "Max open files" in a `/proc/<pid>/limits` text.
pub fn nofile_soft(limits: &str) -> Option<u64> {
    let l = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let v = l["Max open files".len()..].split_whitespace().next()?;
    if v == "unlimited" {
        Some(u64::MAX)
    } else {
        v.parse().ok()
    }
}

/// `ethtool -g`: (maximum, current) RX ring entries.
pub fn rx_ring(out: &str) -> Option<(u64, u64)> {
    let (pre, cur) = out.split_once("Current hardware settings:")?;
    let rx = |t: &str| {
        t.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("RX:")
                    .map(|v| v.trim().parse::<u64>().ok())
            })
            .flatten()
    };
    Some((rx(pre)?, rx(cur)?))
}

/// `key: value` lines of `ethtool -c` / `ethtool -k` output.
pub fn ethtool_values(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .collect()
}

/// The interfaces carrying `ips` in `ip -o addr` output (all non-loopback
/// interfaces for a wildcard address).
pub fn interfaces_for(ip_o_addr: &str, ips: &[std::net::IpAddr]) -> Vec<String> {
    let mut out = Vec::new();
    for line in ip_o_addr.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let dev = f[1].trim_end_matches(':').to_string();
        let addr = f[3].split('/').next().unwrap_or("");
        let hit = ips.iter().any(|ip| {
            if ip.is_unspecified() {
                dev != "lo"
            } else {
                addr.parse::<std::net::IpAddr>().ok() == Some(*ip)
            }
        });
        if hit && !out.contains(&dev) {
            out.push(dev);
        }
    }
    out
}

/// Congestion controls that pace every burst ([`netio`]).
const PACING_CONGESTION: [&str; 3] = ["bbr", "bbr2", "bbr3"];

/// The kernel's default TCP congestion control, and whether the one
/// ironsan's connections ask for is there.
fn congestion_check(h: &Host) -> Option<Finding> {
    use netio::DEFAULT_CONGESTION;
    let what = "net.ipv4.tcp_congestion_control".to_string();
    let now = h.read("/proc/sys/net/ipv4/tcp_congestion_control")?;
    let available = h
        .read("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    if !available
        .split_whitespace()
        .any(|c| c == DEFAULT_CONGESTION)
    {
        return Some(Finding {
            level: Level::Change,
            what,
            now: format!("{now} (available: {available})"),
            advice: format!(
                "modprobe tcp_{DEFAULT_CONGESTION}   # ironsan's connections ask for {DEFAULT_CONGESTION} (limits.tcp_congestion) and keep {now} without it"
            ),
        });
    }
    Some(if PACING_CONGESTION.contains(&now.as_str()) {
        Finding {
            level: Level::Info,
            what,
            now,
            advice: format!(
                "ironsan's own connections use {DEFAULT_CONGESTION} (limits.tcp_congestion); on initiator hosts, whose writes BBR would pace: sysctl -w net.ipv4.tcp_congestion_control={DEFAULT_CONGESTION}"
            ),
        }
    } else {
        Finding {
            level: Level::Ok,
            what,
            now,
            advice: String::new(),
        }
    })
}

/// The host checks, from files under `h` and the interfaces `ifaces`.
pub fn check_host(h: &Host, ifaces: &[String], sessions: u64) -> Vec<Finding> {
    let mut f = socket_checks(h);
    let ethtool = which("ethtool");
    if !ethtool && ifaces.iter().any(|i| i != "lo") {
        f.push(Finding {
            level: Level::Info,
            what: "NIC checks (coalescing, offloads, RX ring)".into(),
            now: "ethtool is not installed: not checked".into(),
            advice: "apt-get install ethtool   # then run ironsan tune again".into(),
        });
    }
    for i in ifaces {
        f.extend(nic_checks(h, i));
    }
    f.extend(cpu_checks(h));
    f.extend(nofile_check(h, sessions));
    f
}

/// Socket buffer limits, TCP autotuning, congestion control and window
/// scaling.
fn socket_checks(h: &Host) -> Vec<Finding> {
    let mut f = Vec::new();
    let mb = |v: u64| format!("{} bytes ({:.1} MiB)", v, v as f64 / 1048576.0);
    for (key, file, why) in [
        (
            "net.core.rmem_max",
            "/proc/sys/net/core/rmem_max",
            "caps SO_RCVBUF: ironsan asks for 1 MiB (limits.socket_buffer) so a session can keep 1 MiB in flight per connection",
        ),
        (
            "net.core.wmem_max",
            "/proc/sys/net/core/wmem_max",
            "caps SO_SNDBUF: large reads (128K-1M) need the send buffer to fill the pipe",
        ),
    ] {
        if let Some(v) = h.read(file).and_then(|s| s.parse::<u64>().ok()) {
            f.push(if v >= WANT_BUF {
                Finding { level: Level::Ok, what: key.into(), now: mb(v), advice: String::new() }
            } else {
                Finding {
                    level: Level::Change,
                    what: key.into(),
                    now: mb(v),
                    advice: format!("sysctl -w {key}={WANT_BUF}   # {why}"),
                }
            });
        }
    }
    for (key, file) in [
        ("net.ipv4.tcp_rmem", "/proc/sys/net/ipv4/tcp_rmem"),
        ("net.ipv4.tcp_wmem", "/proc/sys/net/ipv4/tcp_wmem"),
    ] {
        if let Some(s) = h.read(file) {
            let max = triple_max(&s).unwrap_or(0);
            f.push(if max >= WANT_BUF {
                Finding { level: Level::Ok, what: key.into(), now: s, advice: String::new() }
            } else {
                let parts: Vec<&str> = s.split_whitespace().collect();
                let (lo, def) = (parts.first().unwrap_or(&"4096"), parts.get(1).unwrap_or(&"131072"));
                Finding {
                    level: Level::Change,
                    what: key.into(),
                    now: s.clone(),
                    advice: format!(
                        "sysctl -w {key}=\"{lo} {def} {WANT_BUF}\"   # autotuning may grow a connection's buffer to 1 MiB (the seeds' tcp_recvspace/tcp_sendspace)"
                    ),
                }
            });
        }
    }
    f.extend(congestion_check(h));
    if let Some(v) = h.read("/proc/sys/net/ipv4/tcp_window_scaling") {
        f.push(if v == "1" {
            Finding { level: Level::Ok, what: "net.ipv4.tcp_window_scaling".into(), now: v, advice: String::new() }
        } else {
            Finding {
                level: Level::Change,
                what: "net.ipv4.tcp_window_scaling".into(),
                now: v,
                advice: "sysctl -w net.ipv4.tcp_window_scaling=1   # RFC 1323 window scaling (the seeds' rfc1323 1): without it no connection has more than 64 KiB in flight, whatever the buffers".into(),
            }
        });
    }
    f
}

/// One interface: MTU, NUMA node, and with ethtool its interrupt
/// coalescing, RX ring and offloads.
fn nic_checks(h: &Host, i: &str) -> Vec<Finding> {
    let mut f = Vec::new();
    let mtu = h.read(&format!("/sys/class/net/{i}/mtu"));
    if let Some(m) = mtu.and_then(|m| m.parse::<u32>().ok()) {
        f.push(if m >= 9000 || i == "lo" {
            Finding { level: Level::Ok, what: format!("MTU of {i}"), now: m.to_string(), advice: String::new() }
        } else {
            Finding {
                level: Level::Change,
                what: format!("MTU of {i}"),
                now: m.to_string(),
                advice: format!(
                    "ip link set dev {i} mtu 9000   # jumbo frames: fewer packets and interrupts per 4K-1M I/O; only if every switch port and initiator NIC on the path is set to 9000 too"
                ),
            }
        });
    }
    if let Some(node) = h.read(&format!("/sys/class/net/{i}/device/numa_node")) {
        if node != "-1" {
            f.push(Finding {
                level: Level::Info,
                what: format!("NUMA node of {i}"),
                now: node.clone(),
                advice: format!(
                    "numactl --cpunodebind={node} --membind={node} ironsan serve ...   # keep the event loops and their buffers next to the NIC"
                ),
            });
        }
    }
    if let Some(out) = run_cmd("ethtool", &["-c", i]) {
        let v = ethtool_values(&out);
        let get = |k: &str| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone());
        let adaptive = get("Adaptive RX").or_else(|| get("adaptive-rx"));
        let usecs = get("rx-usecs");
        let now = format!(
            "adaptive-rx {}, rx-usecs {}",
            adaptive.clone().unwrap_or("?".into()),
            usecs.clone().unwrap_or("?".into())
        );
        let low = usecs.as_deref().is_none_or(|u| u == "0" || u == "n/a")
            && !adaptive.as_deref().is_some_and(|a| a.starts_with("on"));
        f.push(Finding {
            level: if low { Level::Ok } else { Level::Change },
            what: format!("interrupt coalescing on {i}"),
            now,
            advice: if low {
                String::new()
            } else {
                format!(
                    "ethtool -C {i} adaptive-rx off rx-usecs 0   # the seeds turned coalescing off: each held interrupt adds its delay to every Q1 I/O (costs CPU at high packet rates)"
                )
            },
        });
    }
    if let Some(out) = run_cmd("ethtool", &["-g", i]) {
        if let Some((max, now)) = rx_ring(&out) {
            let full = now >= max.min(4096);
            f.push(Finding {
                level: if full { Level::Ok } else { Level::Change },
                what: format!("RX ring of {i}"),
                now: format!("{now} (maximum {max})"),
                advice: if full {
                    String::new()
                } else {
                    format!(
                        "ethtool -G {i} rx {}   # a deeper RX ring drops fewer packets in bursts (the seeds' VMXNET3 RX ring 4096)",
                        max.min(4096)
                    )
                },
            });
        }
    }
    if let Some(out) = run_cmd("ethtool", &["-k", i]) {
        let v = ethtool_values(&out);
        for (k, why) in [
            (
                "tcp-segmentation-offload",
                "the NIC cuts large Data-In into packets",
            ),
            (
                "generic-receive-offload",
                "large Data-Out arrive as fewer, larger buffers",
            ),
        ] {
            if let Some((_, val)) = v.iter().find(|(a, _)| a == k) {
                let on = val.starts_with("on");
                let fixed = val.contains("[fixed]");
                f.push(Finding {
                    level: if on || fixed {
                        Level::Ok
                    } else {
                        Level::Change
                    },
                    what: format!("{k} on {i}"),
                    now: val.clone(),
                    advice: if on || fixed {
                        String::new()
                    } else {
                        let short = if k.starts_with("tcp") { "tso" } else { "gro" };
                        format!("ethtool -K {i} {short} on   # {why}")
                    },
                });
            }
        }
    }
    f
}

/// CPU frequency governors and NUMA nodes.
fn cpu_checks(h: &Host) -> Vec<Finding> {
    let mut f = Vec::new();
    let cpus: Vec<String> = h
        .list("/sys/devices/system/cpu")
        .into_iter()
        .filter(|c| {
            c.starts_with("cpu") && c[3..].chars().all(|x| x.is_ascii_digit()) && c.len() > 3
        })
        .collect();
    let govs: Vec<String> = cpus
        .iter()
        .filter_map(|c| {
            h.read(&format!(
                "/sys/devices/system/cpu/{c}/cpufreq/scaling_governor"
            ))
        })
        .collect();
    if govs.is_empty() {
        f.push(Finding {
            level: Level::Info,
            what: "CPU frequency governor".into(),
            now: "not exposed (virtual machine or no cpufreq driver)".into(),
            advice: String::new(),
        });
    } else {
        let slow = govs.iter().filter(|g| *g != "performance").count();
        f.push(Finding {
            level: if slow == 0 { Level::Ok } else { Level::Change },
            what: "CPU frequency governor".into(),
            now: format!("{} of {} CPUs not 'performance' ({})", slow, govs.len(), govs[0]),
            advice: if slow == 0 {
                String::new()
            } else {
                "cpupower frequency-set -g performance   # a clocked-down core adds latency to every Q1 I/O; the seeds reserved 100% CPU".into()
            },
        });
    }
    let nodes: Vec<String> = h
        .list("/sys/devices/system/node")
        .into_iter()
        .filter(|n| {
            n.starts_with("node") && n[4..].chars().all(|x| x.is_ascii_digit()) && n.len() > 4
        })
        .collect();
    f.push(Finding {
        level: Level::Info,
        what: "NUMA nodes".into(),
        now: nodes.len().max(1).to_string(),
        advice: if nodes.len() > 1 {
            format!(
                "run ironsan on the node of its NIC (numactl --cpunodebind=N --membind=N{}); the seeds sized the storage VM to one node",
                if which("numactl") { "" } else { "; install numactl" }
            )
        } else {
            String::new()
        },
    });
    f
}

/// The open-file limit against `sessions` sessions and the LUN files.
fn nofile_check(h: &Host, sessions: u64) -> Option<Finding> {
    let n = nofile_soft(&h.read("/proc/self/limits")?)?;
    // A socket per session, a file per LUN, and headroom.
    let want = (sessions + 64).next_power_of_two().max(4096);
    let what = "open files (RLIMIT_NOFILE)".to_string();
    Some(if n >= want {
        Finding {
            level: Level::Ok,
            what,
            now: n.to_string(),
            advice: String::new(),
        }
    } else {
        Finding {
            level: Level::Change,
            what,
            now: n.to_string(),
            advice: format!(
                "ulimit -n {want}  (systemd: LimitNOFILE={want})   # one descriptor per session plus LUN files; {sessions} sessions would hit the limit"
            ),
        }
    })
}

/// A cache-line round trip above this many nanoseconds means the two CPUs
/// do not share a last-level cache (this project's VMs: ~65 ns on one die,
/// ~330 ns across dies; docs/PERFORMANCE.md, "The placement probe").
pub const NEAR_NS: f64 = 150.0;

/// Measures where the first two CPUs sit, five times over half a second
/// (`ironsan probe cores`); nothing on a one-CPU host.
fn measure_placement() -> Option<Finding> {
    let (x, y) = crate::probe::first_two_cpus().ok()?;
    let mut ns = Vec::new();
    for i in 0..5 {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ns.push(crate::probe::cache_line_round_trip(x, y, 2000).ok()?);
    }
    let vm = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" hypervisor"));
    Some(placement_finding((x, y), &ns, vm))
}

/// The finding for cache-line round trips `ns` measured between CPUs `cpus`:
/// every I/O crosses between the threads of the target (and of an initiator
/// on the same host) several times, so CPUs that do not share a cache, or
/// that a hypervisor moves apart now and then, slow every exchange (4K Q1
/// reads over loopback: a third slower). The seeds' answer: NUMA affinity
/// and, on ESXi, latency sensitivity high. `vm`: this host is a virtual
/// machine (the CPU reports a hypervisor), where only the hypervisor can
/// place the CPUs.
pub fn placement_finding(cpus: (usize, usize), ns: &[f64], vm: bool) -> Finding {
    let what = format!("CPU placement (CPUs {} and {})", cpus.0, cpus.1);
    let lo = ns.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ns.iter().copied().fold(0.0, f64::max);
    let range = if hi - lo < 1.0 {
        format!("{lo:.0} ns per cache-line round trip")
    } else {
        format!("{lo:.0}-{hi:.0} ns per cache-line round trip")
    };
    let pin_vcpus = "on the hypervisor, pin the virtual CPUs to cores of one die: ESXi: VM Options > Latency Sensitivity = High (needs a full CPU and memory reservation; the seeds' setting), KVM: virsh vcpupin DOMAIN VCPU HOSTCPU for each vCPU onto cores that share an L3";
    if hi <= NEAR_NS {
        Finding {
            level: Level::Ok,
            what,
            now: format!("{range} (they share a cache)"),
            advice: String::new(),
        }
    } else if lo <= NEAR_NS {
        Finding {
            level: Level::Change,
            what,
            now: format!("{range}: they share a cache only part of the time (a hypervisor moving them)"),
            advice: format!("{pin_vcpus}   # each move apart slows every I/O's hand-offs between threads (4K Q1 over loopback: a third)"),
        }
    } else {
        Finding {
            level: Level::Change,
            what,
            now: format!("{range}: they do not share a cache (different dies or sockets)"),
            advice: if vm {
                pin_vcpus.to_string()
            } else {
                "run the target's workers on cores of one die: numactl --physcpubind=CPUS ironsan serve ...   # CPUS: cores listed together in /sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list".into()
            },
        }
    }
}

/// The mount that holds `path` in a `/proc/mounts` text: its mount point,
/// file system type and options (the longest mount point that is `path` or
/// one of its parent directories; octal escapes such as `\040` decoded).
pub fn mount_of<'a>(mounts: &'a str, path: &Path) -> Option<(PathBuf, &'a str, &'a str)> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (_dev, dir, fs, opts) = (w.next()?, w.next()?, w.next()?, w.next()?);
            Some((PathBuf::from(unescape_mount(dir)), fs, opts))
        })
        .filter(|(dir, _, _)| path.starts_with(dir))
        .max_by_key(|(dir, _, _)| dir.components().count())
}

fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where each LUN file lives: a file on tmpfs without huge pages copies
/// every large write into the page cache 4 KiB page by 4 KiB page;
/// `huge=within_size` takes it 2 MiB at a time (docs/PERFORMANCE.md: raw
/// 1 MiB page-cache writes 2.4x, 1 MiB writes to a file LUN 1.4-1.7x end to
/// end; a raw `pread` loop reads 20-40 % slower from huge pages, end to end
/// reads of a file LUN were within the noise).
pub fn check_lun_files(h: &Host, files: &[PathBuf]) -> Vec<Finding> {
    let Some(mounts) = h.read("/proc/mounts") else {
        return Vec::new();
    };
    let mut f = Vec::new();
    for p in files {
        let Some((dir, fs, opts)) = mount_of(&mounts, p) else {
            continue;
        };
        let what = format!("LUN file {}", p.display());
        if fs != "tmpfs" {
            f.push(Finding {
                level: Level::Info,
                what,
                now: format!("on {fs} ({})", dir.display()),
                advice: String::new(),
            });
            continue;
        }
        let huge = opts
            .split(',')
            .find_map(|o| o.strip_prefix("huge="))
            .unwrap_or("never");
        f.push(if matches!(huge, "within_size" | "always") {
            Finding {
                level: Level::Ok,
                what,
                now: format!("on tmpfs {} with huge={huge}", dir.display()),
                advice: String::new(),
            }
        } else {
            Finding {
                level: Level::Change,
                what,
                now: format!("on tmpfs {} with huge={huge} (4 KiB pages)", dir.display()),
                advice: format!(
                    "mount -o remount,huge=within_size {}   # the page cache takes large writes 2 MiB at a time, not per 4 KiB page (1 MiB writes to a file LUN 1.4-1.7x); in /etc/fstab: huge=within_size",
                    dir.display()
                ),
            }
        });
    }
    f
}

/// `path` with links resolved, for finding its mount. A LUN file may not
/// exist yet (serve creates it): then its directory decides where it will
/// live; a path that cannot be resolved at all is taken as it is.
fn where_it_lives(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| match (path.parent(), path.file_name()) {
            (Some(dir), Some(name)) => std::fs::canonicalize(dir).map(|d| d.join(name)),
            _ => Ok(path.to_path_buf()),
        })
        .unwrap_or_else(|_| path.to_path_buf())
}

fn which(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

fn run_cmd(cmd: &str, args: &[&str]) -> Option<String> {
    if !which(cmd) {
        return None;
    }
    let o = Command::new(cmd).args(args).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn print_findings(f: &[Finding]) {
    for x in f {
        let tag = match x.level {
            Level::Ok => "ok    ",
            Level::Change => "CHANGE",
            Level::Info => "info  ",
        };
        println!("[{tag}] {}: {}", x.what, x.now);
        if !x.advice.is_empty() {
            println!("         {}", x.advice);
        }
    }
}

/// What the recipe needs to know of one LUN.
#[derive(Clone, Debug)]
pub struct LunFacts {
    pub lun: u16,
    pub naa: String,
    pub vendor: String,
    pub product: String,
    /// INQUIRY TPGS field (0: no ALUA).
    pub tpgs: u8,
}

/// A SendTargets portal `HOST:PORT,TPGT` (RFC 7143 §12.1) as the tools
/// want it: `HOST:PORT`, no portal group tag.
fn portal_addr(p: &str) -> &str {
    p.rsplit_once(',')
        .filter(|(_, tag)| tag.bytes().all(|b| b.is_ascii_digit()))
        .map_or(p, |(a, _)| a)
}

/// `HOST:PORT` (or `[V6]:PORT`) split for tools that take them apart, the
/// host without brackets; port 3260 when none is given.
fn host_and_port(p: &str) -> (&str, &str) {
    let p = portal_addr(p);
    match p.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !port.is_empty() => {
            let h = h
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(h);
            if h.contains(':') && !p.starts_with('[') {
                // A bare IPv6 address: no port in it.
                (p, "3260")
            } else {
                (h, port)
            }
        }
        _ => (p, "3260"),
    }
}

/// What the recipe needs to know of the target.
#[derive(Clone, Debug)]
pub struct TargetFacts {
    pub name: String,
    pub portals: Vec<String>,
    pub window: u32,
    pub luns: Vec<LunFacts>,
}

/// Logs in to the target of `url` and gathers the facts.
pub fn probe(url: &Url, initiator: &str) -> Result<TargetFacts> {
    let Some(target) = url.target.clone() else {
        bail!("{url}: the URL must name the target: iscsi://HOST[:PORT]/IQN");
    };
    let portals = initiator::discover(&url.addr(), initiator)
        .ok()
        .and_then(|l| l.into_iter().find(|(n, _)| *n == target).map(|(_, p)| p))
        .unwrap_or_else(|| vec![url.addr()])
        .iter()
        .map(|p| portal_addr(p).to_string())
        .collect();
    let cfg = LoginConfig::new(initiator, Some(&target), initiator::random_isid());
    let mut c =
        Connection::login(&url.addr(), cfg).with_context(|| format!("login to {target}"))?;
    let window = c.session().window();
    let rl = c.execute(0, &scsi::report_luns(4096), DataDir::Read(4096))?;
    let mut luns = Vec::new();
    for lun in scsi::parse_report_luns(&rl.data) {
        // The first command may meet a unit attention.
        let _ = c.execute(lun, &scsi::test_unit_ready(), DataDir::None);
        let inq = c.execute(lun, &scsi::inquiry(None, 96), DataDir::Read(96))?;
        let (_, vendor, product, _) = scsi::parse_inquiry(&inq.data).unwrap_or_default();
        let tpgs = inq.data.get(5).map_or(0, |b| (b >> 4) & 3);
        let id = c.execute(lun, &scsi::inquiry(Some(0x83), 1024), DataDir::Read(1024))?;
        let naa = scsi::naa_id(&id.data).unwrap_or_else(|| "naa.?".into());
        luns.push(LunFacts {
            lun,
            naa,
            vendor: vendor.trim().into(),
            product: product.trim().into(),
            tpgs,
        });
    }
    let _ = c.logout();
    Ok(TargetFacts {
        name: target,
        portals,
        window,
        luns,
    })
}

/// The ESXi recipe.
pub fn recipe_esxi(t: &TargetFacts) -> String {
    let mut o = String::new();
    let vendor = t.luns.first().map_or("IRONSAN", |l| l.vendor.as_str());
    let alua = t.luns.iter().all(|l| l.tpgs != 0);
    o.push_str(&format!(
        "# ESXi recipe for {} ({} LUNs, {} portals, command window {})\n",
        t.name,
        t.luns.len(),
        t.portals.len(),
        t.window
    ));
    o.push_str("# Run in the ESXi shell. vmhbaNN is the software iSCSI adapter (esxcli iscsi adapter list).\n\n");
    o.push_str("# 1. Claim rule: ironsan LUNs use the ALUA SATP with round robin switching paths after every I/O.\n");
    let mut products: Vec<&str> = t.luns.iter().map(|l| l.product.as_str()).collect();
    products.sort();
    products.dedup();
    for p in products {
        if alua {
            o.push_str(&format!(
                "esxcli storage nmp satp rule add -s VMW_SATP_ALUA -V {vendor} -M \"{p}\" -c tpgs_on -P VMW_PSP_RR -O iops=1 -e \"ironsan {p}: ALUA, round robin, iops=1\"\n"
            ));
        } else {
            o.push_str(&format!(
                "esxcli storage nmp satp rule add -s VMW_SATP_DEFAULT_AA -V {vendor} -M \"{p}\" -P VMW_PSP_RR -O iops=1 -e \"ironsan {p}: round robin, iops=1 (target reports no TPGS)\"\n"
            ));
        }
    }
    o.push_str("#    The rule applies to devices claimed after it: for LUNs already seen, reboot or unclaim/reclaim them.\n\n");
    o.push_str(
        "# 2. For devices already claimed: round robin, next path after 1 I/O (default 1000).\n",
    );
    for l in &t.luns {
        o.push_str(&format!(
            "esxcli storage nmp device set --device={} --psp=VMW_PSP_RR   # LUN {}\n",
            l.naa, l.lun
        ));
        o.push_str(&format!(
            "esxcli storage nmp psp roundrobin deviceconfig set --type=iops --iops=1 --device={}\n",
            l.naa
        ));
    }
    let qd = t.window.clamp(32, 1024);
    o.push_str(&format!(
        "\n# 3. LUN queue depth of the software iSCSI initiator (default 128, effective maximum 1024); reboot to apply.\n#    ironsan's command window per session is {}: a deeper LUN queue than that only queues in ESXi.\nesxcli system module parameters set -m iscsi_vmk -p iscsivmk_LunQDepth={qd}\n",
        t.window
    ));
    o.push_str("\n# 4. Per device: its maximum queue depth (-m) and the outstanding I/Os when several VMs share it\n#    (-O, DSNRO), up to the LUN queue depth (the seeds set both high).\n");
    for l in &t.luns {
        o.push_str(&format!(
            "esxcli storage core device set -d {} -m {qd}\nesxcli storage core device set -d {} -O {qd}\n",
            l.naa, l.naa
        ));
    }
    if t.window < 8192 {
        o.push_str(&format!(
            "#    On the target: ironsan grants {} commands per session; the seeds ran 8192 outstanding target\n#    commands: ironsan serve --queue-depth 8192 (or [limits] queue_depth = 8192).\n",
            t.window
        ));
    }
    o.push_str("\n# 5. Delayed ACK off on the iSCSI adapter: acknowledgements are not held back for up to 200 ms\n#    (the seeds' setting; it matters most for writes and for low queue depths).\n");
    o.push_str("esxcli iscsi adapter param set --adapter=vmhbaNN --key=DelayedAck --value=false\n");
    o.push_str("\n# 6. Port binding: one VMkernel port per physical NIC (each with a single active uplink),\n#    so every NIC carries its own path to every portal.\n");
    for k in 1..=t.portals.len().clamp(2, 4) {
        o.push_str(&format!(
            "esxcli iscsi networkportal add --adapter=vmhbaNN --nic=vmk{k}\n"
        ));
    }
    for p in &t.portals {
        o.push_str(&format!(
            "esxcli iscsi adapter discovery sendtarget add --adapter=vmhbaNN --address={}\n",
            portal_addr(p)
        ));
    }
    o.push_str("esxcli storage core adapter rescan --adapter=vmhbaNN\n");
    o.push_str("\n# 7. Jumbo frames end to end (only if the switches are set to 9000 too).\n");
    o.push_str("esxcli network vswitch standard set --vswitch-name=vSwitchN --mtu=9000\n");
    for k in 1..=t.portals.len().clamp(2, 4) {
        o.push_str(&format!(
            "esxcli network ip interface set --interface-name=vmk{k} --mtu=9000\n"
        ));
    }
    o.push_str("\n# 8. Interrupt coalescing off (the seeds): on the host's virtual NICs, and per VM in its advanced\n#    configuration (.vmx): ethernetX.coalescingScheme = \"disabled\" for each vNIC X.\n");
    o.push_str("esxcli system settings advanced set -o /Net/CoalesceDefaultOn -i 0\n");
    o.push_str(
        "#    Leave /Disk/ReqCallThreshold at its default: the seeds found lowering it hurt.\n",
    );
    o.push_str("#    VMs that run I/O-heavy guests: Latency Sensitivity = High, full CPU and memory reservation,\n#    sized to one NUMA node (the seeds).\n");
    o.push_str("\n# 9. In the guests (the seeds' values):\n#    PVSCSI ring 32 pages, queue depth 254 - Windows (reboot):\n");
    o.push_str("#      REG ADD HKLM\\SYSTEM\\CurrentControlSet\\services\\pvscsi\\Parameters\\Device /v DriverParameter /t REG_SZ /d \"RequestRingPages=32,MaxQueueDepth=254\" /f\n");
    o.push_str(
        "#      Linux: kernel command line vmw_pvscsi.cmd_per_lun=254 vmw_pvscsi.ring_pages=32\n",
    );
    o.push_str("#    VMXNET3 RX ring 4096, small RX buffers 8192 - Windows:\n");
    o.push_str("#      Set-NetAdapterAdvancedProperty -Name Ethernet0 -DisplayName 'Rx Ring #1 Size' -DisplayValue 4096\n#      Set-NetAdapterAdvancedProperty -Name Ethernet0 -DisplayName 'Small Rx Buffers' -DisplayValue 8192\n");
    o.push_str("#      Linux: ethtool -G ethN rx 4096\n");
    o.push_str("#    Switches: flow control on (send and receive), MTU 9000 end to end; a LAG hashes by source and\n#    destination IP and port so that each path's connection keeps one link (the seeds).\n");
    o.push_str("\n# 10. Check: every LUN should show VMW_SATP_ALUA, VMW_PSP_RR with iops=1, and one path per portal and VMkernel port.\n");
    for l in &t.luns {
        o.push_str(&format!(
            "esxcli storage nmp device list --device={}\n",
            l.naa
        ));
    }
    o
}

/// The Linux (open-iscsi + dm-multipath) recipe.
pub fn recipe_linux(t: &TargetFacts) -> String {
    let vendor = t.luns.first().map_or("IRONSAN", |l| l.vendor.as_str());
    let qd = t.window.clamp(32, 1024);
    let mut o = String::new();
    o.push_str(&format!("# Linux (open-iscsi + dm-multipath) recipe for {} ({} LUNs, {} portals, command window {})\n\n", t.name, t.luns.len(), t.portals.len(), t.window));
    o.push_str(
        "# 1. Discover and log in through every portal (one session per portal = one path).\n",
    );
    for p in &t.portals {
        o.push_str(&format!(
            "iscsiadm -m discovery -t sendtargets -p {}\n",
            portal_addr(p)
        ));
    }
    o.push_str(&format!(
        "\n# 2. Session queue: commands per session (cmds_max) and per LUN (queue_depth); open-iscsi's defaults are 128 and 32.\n#    ironsan grants {} commands per session.\niscsiadm -m node -T {} -o update -n node.session.cmds_max -v {}\niscsiadm -m node -T {} -o update -n node.session.queue_depth -v {qd}\n",
        t.window, t.name, t.window.clamp(16, 2048).next_power_of_two().min(2048), t.name
    ));
    o.push_str(&format!("# Larger PDUs and bursts than the defaults (fewer PDUs per large I/O):\niscsiadm -m node -T {} -o update -n node.conn[0].iscsi.MaxRecvDataSegmentLength -v 262144\niscsiadm -m node -T {} -o update -n node.session.iscsi.MaxBurstLength -v 1048576\niscsiadm -m node -T {} --login\n", t.name, t.name, t.name));
    o.push_str("\n# 3. dm-multipath: group paths by ALUA priority, round robin inside the best group,\n#    next path after every request (the seeds' iops=1). A file of its own beside /etc/multipath.conf.\n");
    o.push_str(
        "mkdir -p /etc/multipath/conf.d\ncat > /etc/multipath/conf.d/ironsan.conf <<'EOF'\n",
    );
    let mut products: Vec<&str> = t.luns.iter().map(|l| l.product.as_str()).collect();
    products.sort();
    products.dedup();
    o.push_str("devices {\n");
    for p in products {
        // multipath-tools reads one keyword and its value per line;
        // comments stand on lines of their own.
        o.push_str(&format!(
            "    device {{\n        vendor \"{vendor}\"\n        product \"{p}\"\n        # one path group per ALUA state, priority from REPORT TARGET PORT GROUPS\n        path_grouping_policy group_by_prio\n        prio alua\n        # follow ALUA state changes\n        hardware_handler \"1 alua\"\n        # spread I/O over the paths of the best group, next path after every request\n        path_selector \"round-robin 0\"\n        rr_min_io_rq 1\n        path_checker tur\n        # back to optimized paths as soon as they return\n        failback immediate\n        # queue 12 checker intervals before failing I/O\n        no_path_retry 12\n    }}\n"
        ));
    }
    o.push_str("}\n");
    o.push_str("multipaths {\n");
    for l in &t.luns {
        let wwid = format!("3{}", l.naa.trim_start_matches("naa."));
        o.push_str(&format!(
            "    # LUN {}, {}\n    multipath {{\n        wwid {wwid}\n        alias ironsan_lun{}\n    }}\n",
            l.lun, l.naa, l.lun
        ));
    }
    o.push_str("}\nEOF\n\n# 4. Apply and check: each LUN should show its paths grouped by ALUA priority.\nmultipath -T >/dev/null   # the configuration parses without warnings\nsystemctl reload multipathd\nmultipath -ll\n");
    o.push_str(
        "\n# 5. Per device: no I/O scheduler (the target schedules), deeper request queue.\n",
    );
    o.push_str("for d in /sys/block/dm-*/queue; do echo none > $d/scheduler 2>/dev/null; echo 1024 > $d/nr_requests 2>/dev/null; done\n");
    o.push_str("\n# 6. Network (the seeds): RFC 1323 window scaling, 1 MiB socket buffers, and on each iSCSI NIC\n#    (ethN) coalescing off, a deep RX ring, jumbo frames where every hop allows.\n");
    o.push_str("sysctl -w net.ipv4.tcp_window_scaling=1 net.core.rmem_max=1048576 net.core.wmem_max=1048576\n");
    o.push_str("sysctl -w net.ipv4.tcp_rmem=\"4096 131072 1048576\" net.ipv4.tcp_wmem=\"4096 16384 1048576\"\n");
    o.push_str("# ethtool -C ethN adaptive-rx off rx-usecs 0; ethtool -G ethN rx 4096; ip link set dev ethN mtu 9000\n");
    o.push_str("#    Switches: flow control on (send and receive); a LAG hashes by source and destination IP and port.\n");
    if t.window < 8192 {
        o.push_str(&format!(
            "#    On the target: ironsan grants {} commands per session; the seeds ran 8192: ironsan serve --queue-depth 8192.\n",
            t.window
        ));
    }
    o
}

/// What the NVMe/TCP recipe needs to know of a subsystem.
#[derive(Clone, Debug)]
pub struct NvmeFacts {
    pub nqn: String,
    /// Its ports (address, port), from the discovery log page.
    pub ports: Vec<(String, String)>,
    /// Active namespaces: NSID and NGUID (hex).
    pub namespaces: Vec<(u32, String)>,
}

/// Connects to the subsystem of `url` (and its discovery controller) and
/// gathers the facts.
pub fn probe_nvme(url: &initiator::nvme::NvmeUrl, hostnqn: &str) -> Result<NvmeFacts> {
    use initiator::nvme;
    let host = if hostnqn.starts_with("nqn.") {
        hostnqn.to_owned()
    } else {
        nvme::host_nqn(&initiator::random_bytes::<16>())
    };
    let mut ports: Vec<(String, String)> = nvme::discover(url.addr, &host)
        .map(|l| {
            l.into_iter()
                .filter(|e| e.subtype == 2 && e.subnqn == url.subnqn)
                .map(|e| (e.traddr, e.trsvcid))
                .collect()
        })
        .unwrap_or_default();
    if ports.is_empty() {
        ports.push((url.addr.ip().to_string(), url.addr.port().to_string()));
    }
    let mut c = nvme::Controller::connect(url.addr, &url.subnqn, &host, (false, false), 1)
        .with_context(|| format!("connect to {}", url.subnqn))?;
    let mut namespaces = Vec::new();
    for n in c.active_namespaces()? {
        let ns = c.namespace(n)?;
        namespaces.push((n, ns.nguid.iter().map(|b| format!("{b:02x}")).collect()));
    }
    Ok(NvmeFacts {
        nqn: url.subnqn.clone(),
        ports,
        namespaces,
    })
}

/// The Linux NVMe/TCP recipe (nvme-cli, native NVMe multipath).
pub fn recipe_linux_nvme(t: &NvmeFacts) -> String {
    let mut o = String::new();
    o.push_str(&format!(
        "# Linux NVMe/TCP recipe for {} ({} namespaces, {} ports)

",
        t.nqn,
        t.namespaces.len(),
        t.ports.len()
    ));
    o.push_str(
        "# 1. The host: the NVMe/TCP module, native NVMe multipath (Y), and this host's NQN
#    (the target's nvme_allow names it when the subsystem is restricted).
",
    );
    o.push_str(
        "modprobe nvme-tcp
cat /sys/module/nvme_core/parameters/multipath
[ -s /etc/nvme/hostnqn ] || nvme gen-hostnqn > /etc/nvme/hostnqn; cat /etc/nvme/hostnqn
",
    );
    o.push_str(
        "
# 2. One controller per port: an I/O queue per CPU, 1024 entries each (the target's most),
#    reconnecting every 2 s for as long as it takes after a path is lost.
",
    );
    for (a, p) in &t.ports {
        o.push_str(&format!(
            "nvme connect -t tcp -a {a} -s {p} -n {} --nr-io-queues=$(nproc) --queue-size=1024 --reconnect-delay=2 --ctrl-loss-tmo=-1
",
            t.nqn
        ));
    }
    o.push_str("
# 3. Every I/O to the next optimized path (the seeds' round robin with iops=1), now and at every boot.
");
    o.push_str(&format!(
        "for s in /sys/class/nvme-subsystem/nvme-subsys*; do [ \"$(cat $s/subsysnqn)\" = \"{}\" ] && echo round-robin > $s/iopolicy; done
",
        t.nqn
    ));
    o.push_str(&format!(
        "cat > /etc/udev/rules.d/71-nvme-iopolicy-ironsan.rules <<'EOF'\nACTION==\"add|change\", SUBSYSTEM==\"nvme-subsystem\", ATTR{{subsysnqn}}==\"{}\", ATTR{{iopolicy}}=\"round-robin\"\nEOF\n",
        t.nqn
    ));
    o.push_str(
        "
# 4. Check: every path live and optimized (ANA), the namespaces by their NGUID (the LUN's NAA).
nvme list-subsys
",
    );
    for (n, g) in &t.namespaces {
        o.push_str(&format!(
            "ls -l /dev/disk/by-id/nvme-eui.{g}   # NSID {n} (LUN {})
",
            n - 1
        ));
    }
    o.push_str(
        "
# 5. Per namespace: no I/O scheduler (the target schedules).
for q in /sys/block/nvme*n*/queue; do echo none > $q/scheduler 2>/dev/null; done
",
    );
    o.push_str(
        "
# 6. Network: as for iSCSI (ironsan tune linux iscsi://…, step 6): 1 MiB socket buffers,
#    coalescing off, deep RX rings, jumbo frames where every hop allows.
",
    );
    o
}

/// The ESXi NVMe/TCP recipe (ESXi 7.0 U3 and later: the software NVMe/TCP
/// adapter, esxcli nvme fabrics, HPP multipathing).
pub fn recipe_esxi_nvme(t: &NvmeFacts) -> String {
    let mut o = String::new();
    o.push_str(&format!(
        "# ESXi NVMe/TCP recipe for {} ({} namespaces, {} ports)
# Run in the ESXi shell (7.0 U3 or later). vmnicN is the uplink toward the target, vmkN its
# VMkernel adapter; vmhbaNN is the NVMe/TCP adapter step 1 creates (esxcli nvme adapter list).

",
        t.nqn,
        t.namespaces.len(),
        t.ports.len()
    ));
    o.push_str(
        "# 1. The software NVMe/TCP adapter on the uplink; NVMe/TCP traffic on its VMkernel adapter.
esxcli nvme fabrics enable --protocol TCP --device vmnicN
esxcli network ip interface tag add --interface-name vmkN --tagname NVMeTCP
esxcli nvme adapter list

# 2. Each port's discovery controller lists the subsystem; one controller per port.
",
    );
    for (a, p) in &t.ports {
        o.push_str(&format!(
            "esxcli nvme fabrics discover -a vmhbaNN -i {a} -p {p}
"
        ));
    }
    for (a, p) in &t.ports {
        o.push_str(&format!(
            "esxcli nvme fabrics connect -a vmhbaNN -i {a} -p {p} -s {}
",
            t.nqn
        ));
    }
    o.push_str(
        "
# 3. Check: a controller per port, the namespaces by their NGUID (the LUN's NAA).
esxcli nvme controller list
esxcli nvme namespace list
",
    );
    for (n, g) in &t.namespaces {
        o.push_str(&format!(
            "#    NSID {n} (LUN {}): NGUID {g}
",
            n - 1
        ));
    }
    o.push_str(
        "
# 4. Multipathing: ESXi's High Performance Plugin (HPP) claims NVMe-oF namespaces itself, no claim
#    rule needed, with round robin (LB-RR) by default over the paths ANA reports optimized.
#    LB-RR moves to the next path after 1000 I/Os; the seeds' every-I/O switching is its
#    IOPS setting 1 (vSphere Client: the device's multipathing policy).
",
    );
    o
}

/// The Windows (MPIO + Microsoft iSCSI initiator) recipe.
pub fn recipe_windows(t: &TargetFacts) -> String {
    let vendor = t.luns.first().map_or("IRONSAN", |l| l.vendor.as_str());
    let mut o = String::new();
    o.push_str(&format!(
        "# Windows Server recipe for {} ({} LUNs, {} portals), in an elevated PowerShell.\n\n",
        t.name,
        t.luns.len(),
        t.portals.len()
    ));
    o.push_str("# 1. MPIO: install it, let the Microsoft DSM claim ironsan disks, round robin by default.\n");
    o.push_str("Install-WindowsFeature -Name Multipath-IO   # needs a reboot\n");
    let mut products: Vec<&str> = t.luns.iter().map(|l| l.product.as_str()).collect();
    products.sort();
    products.dedup();
    for p in products {
        o.push_str(&format!("New-MSDSMSupportedHW -VendorId \"{vendor}\" -ProductId \"{p}\"   # no space padding (unlike mpclaim)\n"));
    }
    o.push_str(
        "Update-MPIOClaimedHW -Confirm:$false                # claim now (may ask for a reboot)\n",
    );
    o.push_str("Set-MSDSMGlobalDefaultLoadBalancePolicy -Policy RR   # round robin over all active/optimized paths\n");
    o.push_str(
        "Enable-MSDSMAutomaticClaim -BusType iSCSI            # claim iSCSI disks automatically\n",
    );
    o.push_str("\n# 2. One session per portal (each is a path); -IsMultipathEnabled makes them MPIO paths.\n");
    for p in &t.portals {
        let (host, port) = host_and_port(p);
        o.push_str(&format!(
            "New-IscsiTargetPortal -TargetPortalAddress {host} -TargetPortalPortNumber {port}\n"
        ));
        o.push_str(&format!(
            "Connect-IscsiTarget -NodeAddress {} -TargetPortalAddress {host} -TargetPortalPortNumber {port} -IsMultipathEnabled $true -IsPersistent $true\n",
            t.name
        ));
    }
    o.push_str("\n# 3. Delayed ACK off on the iSCSI NIC(s): TcpAckFrequency=1 under the interface's key\n#    (HKLM\\SYSTEM\\CurrentControlSet\\Services\\Tcpip\\Parameters\\Interfaces\\{GUID}); reboot to apply.\n");
    o.push_str("Get-NetAdapter | Where-Object Name -like 'iSCSI*' | ForEach-Object {\n  New-ItemProperty -Path \"HKLM:\\SYSTEM\\CurrentControlSet\\Services\\Tcpip\\Parameters\\Interfaces\\$($_.InterfaceGuid)\" -Name TcpAckFrequency -PropertyType DWord -Value 1 -Force }\n");
    o.push_str("\n# 4. Larger transfers per command: MaxTransferLength of the iSCSI initiator (default 256 KiB) to 1 MiB,\n#    under the initiator's instance key HKLM\\SYSTEM\\CurrentControlSet\\Control\\Class\\{4D36E97B-E325-11CE-BFC1-08002BE10318}\\<instance>\\Parameters;\n#    also MaxBurstLength 1 MiB and MaxRecvDataSegmentLength 256 KiB there. Reboot to apply.\n");
    o.push_str("$k = Get-ChildItem 'HKLM:\\SYSTEM\\CurrentControlSet\\Control\\Class\\{4D36E97B-E325-11CE-BFC1-08002BE10318}' | Where-Object { (Get-ItemProperty $_.PSPath).DriverDesc -eq 'Microsoft iSCSI Initiator' }\n");
    o.push_str("Set-ItemProperty -Path \"$($k.PSPath)\\Parameters\" -Name MaxTransferLength -Value 1048576\n");
    o.push_str(
        "Set-ItemProperty -Path \"$($k.PSPath)\\Parameters\" -Name MaxBurstLength -Value 1048576\n",
    );
    o.push_str("Set-ItemProperty -Path \"$($k.PSPath)\\Parameters\" -Name MaxRecvDataSegmentLength -Value 262144\n");
    o.push_str("\n# 5. Check: each disk should list one path per portal, policy Round Robin.\n");
    o.push_str("mpclaim -s -d\n");
    for l in &t.luns {
        o.push_str(&format!(
            "# LUN {}: {}  (Get-Disk | Where-Object UniqueId -eq '{}')\n",
            l.lun,
            l.naa,
            l.naa.trim_start_matches("naa.").to_uppercase()
        ));
    }
    o
}

pub fn run(a: TuneArgs) -> Result<()> {
    match a.what.as_str() {
        "host" => {
            let h = Host {
                root: a.root.clone(),
            };
            let config = a
                .config
                .as_deref()
                .map(server::Config::from_file)
                .transpose()?;
            let ips: Vec<std::net::IpAddr> = match &config {
                Some(c) => c.listen.iter().map(|s| s.ip()).collect(),
                None => vec![std::net::Ipv4Addr::UNSPECIFIED.into()],
            };
            let cwd = std::env::current_dir().unwrap_or_default();
            let files: Vec<PathBuf> = a
                .files
                .iter()
                .cloned()
                .chain(config.iter().flat_map(|c| {
                    c.target.iter().flat_map(|t| {
                        t.lun
                            .iter()
                            .filter(|l| l.backend == server::config::BackendKind::File)
                            .filter_map(|l| l.path.clone())
                    })
                }))
                .map(|p| where_it_lives(&cwd.join(p)))
                .collect();
            let ifaces = match run_cmd("ip", &["-o", "addr", "show"]) {
                Some(out) => interfaces_for(&out, &ips),
                None => h
                    .list("/sys/class/net")
                    .into_iter()
                    .filter(|i| i != "lo")
                    .collect(),
            };
            println!("ironsan tune: checking this host for the portals' interfaces {ifaces:?}\n");
            let mut findings = check_host(&h, &ifaces, a.sessions);
            findings.extend(check_lun_files(&h, &files));
            if a.root == Path::new("/") {
                findings.extend(measure_placement());
            }
            print_findings(&findings);
            println!("\nPersist sysctl changes in /etc/sysctl.d/90-ironsan.conf; see docs/TUNING.md for why each one matters.");
            Ok(())
        }
        w @ ("linux" | "esxi")
            if a.url
                .as_deref()
                .is_some_and(|u| u.starts_with("nvme-tcp://")) =>
        {
            let u = a.url.as_deref().unwrap_or_default();
            let url = initiator::nvme::NvmeUrl::parse(u).map_err(anyhow::Error::msg)?;
            let facts = probe_nvme(&url, &a.initiator)?;
            let text = if w == "esxi" {
                recipe_esxi_nvme(&facts)
            } else {
                recipe_linux_nvme(&facts)
            };
            print!("{text}");
            Ok(())
        }
        w @ ("esxi" | "linux" | "windows") => {
            let Some(u) = &a.url else {
                bail!("ironsan tune {w} iscsi://HOST[:PORT]/IQN (linux, esxi: or nvme-tcp://HOST[:PORT]/NQN)");
            };
            let url: Url = u.parse().map_err(anyhow::Error::msg)?;
            let facts = probe(&url, &a.initiator)?;
            let text = match w {
                "esxi" => recipe_esxi(&facts),
                "linux" => recipe_linux(&facts),
                _ => recipe_windows(&facts),
            };
            print!("{text}");
            Ok(())
        }
        other => bail!("{other}: expected host, esxi, linux or windows"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, s: &str| {
            let f = d.path().join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, s).unwrap();
        };
        w("proc/sys/net/core/rmem_max", "212992\n");
        w("proc/sys/net/core/wmem_max", "4194304\n");
        w("proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n");
        w("proc/sys/net/ipv4/tcp_wmem", "4096\t16384\t65536\n");
        w("proc/sys/net/ipv4/tcp_congestion_control", "bbr\n");
        w(
            "proc/sys/net/ipv4/tcp_available_congestion_control",
            "reno bbr cubic\n",
        );
        w("sys/class/net/eth0/mtu", "1500\n");
        w("sys/class/net/eth1/mtu", "9000\n");
        w("sys/class/net/eth1/device/numa_node", "1\n");
        w(
            "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
            "powersave\n",
        );
        w(
            "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor",
            "performance\n",
        );
        w("sys/devices/system/node/node0/cpulist", "0\n");
        w("sys/devices/system/node/node1/cpulist", "1\n");
        w(
            "proc/self/limits",
            "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n",
        );
        d
    }

    #[test]
    fn parsers() {
        assert_eq!(triple_max("4096 131072 6291456"), Some(6291456));
        assert_eq!(triple_max("4096"), None);
        assert_eq!(
            nofile_soft(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(u64::MAX)
        );
        let e = ethtool_values(
            "Coalesce parameters for eth0:\nAdaptive RX: off  TX: off\nrx-usecs: 3\n",
        );
        assert!(e.contains(&("rx-usecs".into(), "3".into())));
        let ip = "1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\n3: eth1    inet 10.1.0.5/24 scope global eth1\n";
        assert_eq!(
            interfaces_for(ip, &["10.1.0.5".parse().unwrap()]),
            vec!["eth1"]
        );
        assert_eq!(
            interfaces_for(ip, &["0.0.0.0".parse().unwrap()]),
            vec!["eth0", "eth1"]
        );
        assert_eq!(
            interfaces_for(ip, &["127.0.0.1".parse().unwrap()]),
            vec!["lo"]
        );
    }

    #[test]
    fn cpu_placement_near_far_and_moving() {
        let near = placement_finding((0, 1), &[64.0, 66.0, 70.0], true);
        assert_eq!(near.level, Level::Ok, "{near:?}");
        assert!(near.now.starts_with("64-70 ns"), "{near:?}");
        let far = placement_finding((0, 1), &[330.0, 330.4], false);
        assert_eq!(far.level, Level::Change);
        assert!(
            far.now
                .starts_with("330 ns per cache-line round trip: they do not share"),
            "{far:?}"
        );
        assert!(far.advice.contains("numactl --physcpubind"), "{far:?}");
        let far_vm = placement_finding((0, 1), &[330.0], true);
        assert_eq!(far_vm.level, Level::Change);
        assert!(far_vm.advice.contains("virsh vcpupin"), "{far_vm:?}");
        let moving = placement_finding((2, 5), &[66.0, 325.0, 67.0], true);
        assert_eq!(moving.level, Level::Change);
        assert_eq!(moving.what, "CPU placement (CPUs 2 and 5)");
        assert!(moving.now.contains("only part of the time"), "{moving:?}");
        assert!(
            moving.advice.contains("Latency Sensitivity = High"),
            "{moving:?}"
        );
        assert!(moving.advice.contains("virsh vcpupin"), "{moving:?}");
    }

    #[test]
    fn host_checks_against_fixture_files() {
        let d = fixture();
        let h = Host {
            root: d.path().to_path_buf(),
        };
        let f = check_host(&h, &["eth0".into(), "eth1".into()], 2000);
        let get = |w: &str| {
            f.iter()
                .find(|x| x.what == w)
                .unwrap_or_else(|| panic!("{w}: {f:?}"))
        };
        assert_eq!(get("net.core.rmem_max").level, Level::Change);
        assert!(get("net.core.rmem_max")
            .advice
            .contains("sysctl -w net.core.rmem_max=1048576"));
        assert_eq!(get("net.core.wmem_max").level, Level::Ok);
        assert_eq!(get("net.ipv4.tcp_rmem").level, Level::Ok);
        assert!(get("net.ipv4.tcp_wmem")
            .advice
            .contains("\"4096 16384 1048576\""));
        let cc = get("net.ipv4.tcp_congestion_control");
        assert_eq!((cc.level, cc.now.as_str()), (Level::Info, "bbr"));
        assert!(cc
            .advice
            .contains("sysctl -w net.ipv4.tcp_congestion_control=cubic"));
        assert_eq!(get("MTU of eth0").level, Level::Change);
        assert!(get("MTU of eth0").advice.contains("mtu 9000"));
        assert_eq!(get("MTU of eth1").level, Level::Ok);
        assert!(get("NUMA node of eth1").advice.contains("--cpunodebind=1"));
        assert_eq!(get("CPU frequency governor").level, Level::Change);
        assert_eq!(get("NUMA nodes").now, "2");
        let nofile = get("open files (RLIMIT_NOFILE)");
        assert_eq!((nofile.level, nofile.now.as_str()), (Level::Change, "1024"));
        assert!(nofile.advice.contains("ulimit -n 4096"));
    }

    #[test]
    fn congestion_control_is_ok_unless_it_paces_or_cubic_is_missing() {
        let d = fixture();
        let h = Host {
            root: d.path().to_path_buf(),
        };
        let w = |s: &str, avail: &str| {
            let p = d.path().join("proc/sys/net/ipv4");
            std::fs::write(p.join("tcp_congestion_control"), s).unwrap();
            std::fs::write(p.join("tcp_available_congestion_control"), avail).unwrap();
        };
        w("cubic\n", "reno cubic\n");
        assert_eq!(congestion_check(&h).unwrap().level, Level::Ok);
        w("bbr\n", "reno bbr\n");
        let f = congestion_check(&h).unwrap();
        assert_eq!(f.level, Level::Change);
        assert!(f.advice.starts_with("modprobe tcp_cubic"), "{f:?}");
    }

    #[test]
    fn lun_files_on_tmpfs_want_huge_pages() {
        let d = tempfile::tempdir().unwrap();
        let mounts = "/dev/vda / ext4 rw,relatime 0 0\n\
            tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n\
            tmpfs /srv/luns tmpfs rw,relatime,size=4194304k,huge=within_size 0 0\n\
            tmpfs /srv/my\\040disks tmpfs rw,huge=advise 0 0\n";
        std::fs::create_dir_all(d.path().join("proc")).unwrap();
        std::fs::write(d.path().join("proc/mounts"), mounts).unwrap();
        let h = Host {
            root: d.path().to_path_buf(),
        };
        let files: Vec<PathBuf> = [
            "/dev/shm/a.img",
            "/srv/luns/b.img",
            "/srv/luns2/c.img",
            "/srv/my disks/d.img",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let f = check_lun_files(&h, &files);
        let lv: Vec<Level> = f.iter().map(|x| x.level).collect();
        assert_eq!(
            lv,
            [Level::Change, Level::Ok, Level::Info, Level::Change],
            "{f:?}"
        );
        assert!(f[0]
            .advice
            .starts_with("mount -o remount,huge=within_size /dev/shm "));
        assert_eq!(f[1].now, "on tmpfs /srv/luns with huge=within_size");
        // /srv/luns2 is not under /srv/luns: the root file system holds it.
        assert_eq!(f[2].now, "on ext4 (/)");
        assert!(f[3].now.contains("huge=advise"), "{:?}", f[3]);
        assert!(f[3].advice.contains("/srv/my disks"));
    }

    fn facts() -> TargetFacts {
        TargetFacts {
            name: "iqn.2026-11.io.ironsan:t".into(),
            portals: vec!["10.0.0.1:3260".into(), "10.0.1.1:3260".into()],
            window: 128,
            luns: vec![LunFacts {
                lun: 0,
                naa: "naa.6abcdef0123456789abcdef012345678".into(),
                vendor: "IRONSAN".into(),
                product: "FILE DISK".into(),
                tpgs: 1,
            }],
        }
    }

    #[test]
    fn rx_ring_of_ethtool_g() {
        let out = "Ring parameters for eth0:\nPre-set maximums:\nRX:\t\t4096\nRX Mini:\t2048\nTX:\t\t4096\nCurrent hardware settings:\nRX:\t\t256\nRX Mini:\t128\nTX:\t\t512\n";
        assert_eq!(rx_ring(out), Some((4096, 256)));
        assert_eq!(rx_ring("nothing"), None);
    }

    #[test]
    fn portals_lose_their_group_tag() {
        assert_eq!(portal_addr("127.0.0.1:3450,1"), "127.0.0.1:3450");
        assert_eq!(portal_addr("[fd00::1]:3260,17"), "[fd00::1]:3260");
        assert_eq!(portal_addr("10.0.0.1:3260"), "10.0.0.1:3260");
        assert_eq!(host_and_port("127.0.0.1:3450,1"), ("127.0.0.1", "3450"));
        assert_eq!(host_and_port("[fd00::1]:3261,2"), ("fd00::1", "3261"));
        assert_eq!(host_and_port("fd00::1"), ("fd00::1", "3260"));
        assert_eq!(host_and_port("san1"), ("san1", "3260"));
        let mut t = facts();
        t.portals = vec!["127.0.0.1:3450,1".into(), "[fd00::1]:3451,2".into()];
        let w = recipe_windows(&t);
        assert!(
            w.contains("-TargetPortalAddress 127.0.0.1 -TargetPortalPortNumber 3450\n"),
            "{w}"
        );
        assert!(
            w.contains("-TargetPortalAddress fd00::1 -TargetPortalPortNumber 3451\n"),
            "{w}"
        );
        assert!(!w.contains(",1") && !w.contains(",2"), "{w}");
        let e = recipe_esxi(&t);
        assert!(e.contains("--address=127.0.0.1:3450\n"), "{e}");
        assert!(e.contains("--address=[fd00::1]:3451\n"), "{e}");
        let l = recipe_linux(&t);
        assert!(l.contains("-p 127.0.0.1:3450\n"), "{l}");
    }

    #[test]
    fn multipath_entries_take_a_line_per_keyword() {
        let l = recipe_linux(&facts());
        assert!(l.contains(
            "    multipath {\n        wwid 36abcdef0123456789abcdef012345678\n        alias ironsan_lun0\n    }\n"
        ), "{l}");
        // Between the heredoc's markers, no keyword line carries a comment.
        let conf = l
            .split("<<'EOF'\n")
            .nth(1)
            .unwrap()
            .split("\nEOF\n")
            .next()
            .unwrap();
        for line in conf.lines() {
            let t = line.trim();
            assert!(t.starts_with('#') || !t.contains('#'), "{line}");
        }
    }

    /// A subsystem at two ports with one namespace.
    fn two_port_subsystem() -> NvmeFacts {
        NvmeFacts {
            nqn: "nqn.2026-11.io.ironsan:disk0".into(),
            ports: vec![
                ("10.0.0.1".into(), "4420".into()),
                ("10.0.1.1".into(), "4420".into()),
            ],
            namespaces: vec![(1, "60f33e79".into())],
        }
    }

    #[test]
    fn the_esxi_nvme_recipe_connects_every_port() {
        let t = two_port_subsystem();
        let r = recipe_esxi_nvme(&t);
        assert!(r.contains("esxcli nvme fabrics enable --protocol TCP --device vmnicN"));
        assert!(r.contains("--tagname NVMeTCP"));
        assert_eq!(
            r.matches("esxcli nvme fabrics discover -a vmhbaNN").count(),
            2
        );
        assert!(r.contains(
            "esxcli nvme fabrics connect -a vmhbaNN -i 10.0.1.1 -p 4420 -s nqn.2026-11.io.ironsan:disk0"
        ));
        assert!(r.contains("NSID 1 (LUN 0): NGUID 60f33e79"));
    }

    #[test]
    fn the_nvme_recipe_connects_every_port_and_sets_round_robin() {
        let t = two_port_subsystem();
        let r = recipe_linux_nvme(&t);
        assert_eq!(r.matches("nvme connect -t tcp").count(), 2);
        assert!(r.contains("-a 10.0.1.1 -s 4420 -n nqn.2026-11.io.ironsan:disk0"));
        assert!(r.contains("--queue-size=1024"));
        assert!(r.contains("echo round-robin > $s/iopolicy"));
        assert!(r.contains(
            r#"ATTR{subsysnqn}=="nqn.2026-11.io.ironsan:disk0", ATTR{iopolicy}="round-robin""#
        ));
        assert!(r.contains("nvme-eui.60f33e79   # NSID 1 (LUN 0)"));
    }

    #[test]
    fn recipes_name_the_naa_ids() {
        let t = facts();
        let e = recipe_esxi(&t);
        assert!(e.contains("esxcli storage nmp satp rule add -s VMW_SATP_ALUA -V IRONSAN -M \"FILE DISK\" -c tpgs_on -P VMW_PSP_RR -O iops=1"));
        assert!(e.contains("esxcli storage nmp psp roundrobin deviceconfig set --type=iops --iops=1 --device=naa.6abcdef0123456789abcdef012345678"));
        assert!(e.contains("iscsivmk_LunQDepth=128"));
        assert!(e.contains(
            "esxcli storage core device set -d naa.6abcdef0123456789abcdef012345678 -O 128"
        ));
        assert!(e.contains("--key=DelayedAck --value=false"));
        // Every seed knob has its line (docs/TUNING.md).
        for knob in [
            "esxcli storage core device set -d naa.6abcdef0123456789abcdef012345678 -m 128",
            "ironsan serve --queue-depth 8192",
            "esxcli system settings advanced set -o /Net/CoalesceDefaultOn -i 0",
            "ethernetX.coalescingScheme = \"disabled\"",
            "/Disk/ReqCallThreshold",
            "RequestRingPages=32,MaxQueueDepth=254",
            "vmw_pvscsi.cmd_per_lun=254 vmw_pvscsi.ring_pages=32",
            "'Small Rx Buffers' -DisplayValue 8192",
            "'Rx Ring #1 Size' -DisplayValue 4096",
            "flow control on (send and receive)",
            "source and\n#    destination IP and port",
        ] {
            assert!(e.contains(knob), "ESXi recipe lacks {knob:?}");
        }
        let l = recipe_linux(&t);
        assert!(l.contains("wwid 36abcdef0123456789abcdef012345678"));
        assert!(l.contains("rr_min_io_rq 1"));
        assert!(l.contains("node.session.cmds_max -v 128"));
        assert!(l.contains("sysctl -w net.ipv4.tcp_window_scaling=1"));
        assert!(l.contains("ethtool -G ethN rx 4096"));
        let w = recipe_windows(&t);
        assert!(w.contains("New-MSDSMSupportedHW -VendorId \"IRONSAN\" -ProductId \"FILE DISK\""));
        assert!(w.contains("Set-MSDSMGlobalDefaultLoadBalancePolicy -Policy RR"));
    }
}

/// The recipes' commands against the documented syntax of the tools that
/// will run them: every esxcli namespace and option, every PowerShell
/// cmdlet, parameter and value type used, from the vendors' references.
#[cfg(test)]
mod syntax {
    use super::*;

    /// esxcli command → its options (long and short), from VMware's ESXCLI
    /// Command Reference
    /// (https://developer.broadcom.com/xapis/esxcli-command-reference/latest/).
    const ESXCLI: &[(&str, &[&str])] = &[
        (
            "storage nmp satp rule add",
            &[
                "-s",
                "--satp",
                "-V",
                "--vendor",
                "-M",
                "--model",
                "-c",
                "--claim-option",
                "-P",
                "--psp",
                "-O",
                "--psp-option",
                "-e",
                "--description",
            ],
        ),
        (
            "storage nmp device set",
            &["-d", "--device", "-P", "--psp", "-E", "--default"],
        ),
        (
            "storage nmp psp roundrobin deviceconfig set",
            &[
                "-d", "--device", "-t", "--type", "-I", "--iops", "-B", "--bytes", "-U", "--useano",
            ],
        ),
        (
            "system module parameters set",
            &[
                "-m",
                "--module",
                "-p",
                "--parameter-string",
                "-a",
                "--append",
            ],
        ),
        (
            "storage core device set",
            &[
                "-d",
                "--device",
                "-O",
                "--sched-num-req-outstanding",
                "-m",
                "--max-queue-depth",
            ],
        ),
        (
            "iscsi adapter param set",
            &[
                "-A",
                "--adapter",
                "-k",
                "--key",
                "-v",
                "--value",
                "-D",
                "--default",
            ],
        ),
        (
            "iscsi networkportal add",
            &["-A", "--adapter", "-n", "--nic", "-f", "--force"],
        ),
        (
            "iscsi adapter discovery sendtarget add",
            &["-A", "--adapter", "-a", "--address"],
        ),
        (
            "storage core adapter rescan",
            &["-A", "--adapter", "-a", "--all"],
        ),
        (
            "network vswitch standard set",
            &["-v", "--vswitch-name", "-m", "--mtu"],
        ),
        (
            "network ip interface set",
            &["-i", "--interface-name", "-m", "--mtu"],
        ),
        ("storage nmp device list", &["-d", "--device"]),
        (
            "system settings advanced set",
            &[
                "-o",
                "--option",
                "-i",
                "--int-value",
                "-s",
                "--string-value",
            ],
        ),
    ];

    /// Checks one esxcli line; returns the command matched.
    fn check_esxcli(line: &str) -> &'static str {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "esxcli", "{line}");
        let rest = words[1..].join(" ");
        let (cmd, opts) = ESXCLI
            .iter()
            .filter(|(c, _)| rest.starts_with(&format!("{c} ")) || rest == *c)
            .max_by_key(|(c, _)| c.len())
            .unwrap_or_else(|| panic!("esxcli command not in the reference table: {line}"));
        let mut quoted = false;
        for a in rest[cmd.len()..].split_whitespace() {
            if quoted {
                quoted = !a.ends_with('"');
                continue;
            }
            if !a.starts_with('-') {
                // A value: quoted values may span words.
                quoted = a.starts_with('"') && !(a.len() > 1 && a.ends_with('"'));
                continue;
            }
            let name = a.split('=').next().unwrap();
            assert!(
                opts.contains(&name),
                "esxcli {cmd}: no option {name} ({line})"
            );
            if let Some(v) = a.split_once('=').map(|(_, v)| v) {
                assert!(!v.is_empty(), "{line}");
            }
        }
        cmd
    }

    /// PowerShell cmdlet → (parameter, type) from Microsoft's module
    /// references (learn.microsoft.com/powershell/module: iscsi, mpio,
    /// servermanager, netadapter, microsoft.powershell.management).
    const CMDLETS: &[(&str, &[(&str, &str)])] = &[
        ("Install-WindowsFeature", &[("-Name", "string")]),
        (
            "New-MSDSMSupportedHW",
            &[("-VendorId", "string"), ("-ProductId", "string")],
        ),
        ("Update-MPIOClaimedHW", &[("-Confirm:$false", "switch")]),
        (
            "Set-MSDSMGlobalDefaultLoadBalancePolicy",
            &[("-Policy", "None|FOO|RR|LQD|LB")],
        ),
        ("Enable-MSDSMAutomaticClaim", &[("-BusType", "iSCSI|SAS")]),
        (
            "New-IscsiTargetPortal",
            &[
                ("-TargetPortalAddress", "string"),
                ("-TargetPortalPortNumber", "uint16"),
            ],
        ),
        (
            "Connect-IscsiTarget",
            &[
                ("-NodeAddress", "string"),
                ("-TargetPortalAddress", "string"),
                ("-TargetPortalPortNumber", "uint16"),
                ("-IsMultipathEnabled", "bool"),
                ("-IsPersistent", "bool"),
            ],
        ),
        (
            "Set-ItemProperty",
            &[
                ("-Path", "string"),
                ("-Name", "string"),
                ("-Value", "string"),
            ],
        ),
        ("Get-ChildItem", &[]),
        ("Get-NetAdapter", &[]),
        ("Where-Object", &[]),
        ("ForEach-Object", &[]),
        ("New-ItemProperty", &[]),
        ("mpclaim", &[]),
    ];

    fn check_value(cmdlet: &str, p: &str, ty: &str, v: Option<&str>, line: &str) {
        match ty {
            "switch" => {}
            "uint16" => {
                let v = v.unwrap_or_else(|| panic!("{cmdlet} {p}: no value ({line})"));
                assert!(
                    v.parse::<u16>().is_ok(),
                    "{cmdlet} {p} {v}: not a UInt16 ({line})"
                );
            }
            "bool" => {
                let v = v.unwrap_or_else(|| panic!("{cmdlet} {p}: no value ({line})"));
                assert!(
                    v == "$true" || v == "$false",
                    "{cmdlet} {p} {v}: not a Boolean ({line})"
                );
            }
            "string" => assert!(v.is_some(), "{cmdlet} {p}: no value ({line})"),
            set => {
                let v = v.unwrap_or_else(|| panic!("{cmdlet} {p}: no value ({line})"));
                assert!(
                    set.split('|').any(|x| x == v),
                    "{cmdlet} {p} {v}: not one of {set} ({line})"
                );
            }
        }
    }

    /// Checks the cmdlet lines of a Windows recipe; returns the cmdlets.
    fn check_powershell(recipe: &str) -> Vec<&'static str> {
        let mut seen = Vec::new();
        for line in recipe.lines().map(str::trim) {
            let code = line.split("   #").next().unwrap().trim();
            if code.is_empty()
                || code.starts_with('#')
                || code.starts_with('$')
                || code.starts_with('}')
            {
                continue;
            }
            let first = code.split_whitespace().next().unwrap();
            let Some((cmdlet, params)) = CMDLETS.iter().find(|(c, _)| *c == first) else {
                panic!("cmdlet not in the reference table: {line}");
            };
            seen.push(*cmdlet);
            if params.is_empty() {
                continue;
            }
            let words: Vec<&str> = code.split_whitespace().skip(1).collect();
            let mut i = 0;
            while i < words.len() {
                let w = words[i];
                if w.starts_with('-') {
                    let (p, ty) = params
                        .iter()
                        .find(|(p, _)| *p == w)
                        .unwrap_or_else(|| panic!("{cmdlet}: no parameter {w} ({line})"));
                    let v = words.get(i + 1).copied().filter(|v| !v.starts_with('-'));
                    check_value(cmdlet, p, ty, v, line);
                    i += if v.is_some() { 2 } else { 1 };
                } else {
                    i += 1;
                }
            }
        }
        seen
    }

    fn facts() -> TargetFacts {
        TargetFacts {
            name: "iqn.2026-11.io.ironsan:t".into(),
            portals: vec!["10.0.0.1:3260,1".into(), "[fd00::1]:3261,2".into()],
            window: 128,
            luns: vec![LunFacts {
                lun: 0,
                naa: "naa.6abcdef0123456789abcdef012345678".into(),
                vendor: "IRONSAN".into(),
                product: "RAM DISK".into(),
                tpgs: 1,
            }],
        }
    }

    #[test]
    fn every_esxcli_line_uses_documented_commands_and_options() {
        let e = recipe_esxi(&facts());
        let mut used: Vec<&str> = e
            .lines()
            .map(|l| l.split("   #").next().unwrap().trim())
            .filter(|l| l.starts_with("esxcli "))
            .map(check_esxcli)
            .collect();
        used.sort();
        used.dedup();
        assert!(used.len() >= 12, "{used:?}");
        // The checker catches what it is for.
        let bad = std::panic::catch_unwind(|| {
            check_esxcli("esxcli storage core device set -d x --queue-full-sample-size 32")
        });
        assert!(bad.is_err());
    }

    #[test]
    fn every_powershell_line_uses_documented_cmdlets_and_types() {
        let w = recipe_windows(&facts());
        let used = check_powershell(&w);
        for c in [
            "New-IscsiTargetPortal",
            "Connect-IscsiTarget",
            "New-MSDSMSupportedHW",
            "Set-MSDSMGlobalDefaultLoadBalancePolicy",
        ] {
            assert!(used.contains(&c), "{c} not checked: {used:?}");
        }
        let bad = std::panic::catch_unwind(|| {
            check_powershell("Connect-IscsiTarget -NodeAddress x -TargetPortalAddress h -TargetPortalPortNumber 3450,1 -IsMultipathEnabled $true")
        });
        assert!(bad.is_err(), "a ,TPGT port must be refused");
    }
}
