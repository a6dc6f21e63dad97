//! Limits: idle, half-open and trickling sockets cost other sessions
//! nothing; connection and session limits hold.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use iscsi_wire::pdu::*;

const LUN: &str = "[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"";

/// Time for `n` 4 KiB write+read pairs on a fresh session.
fn io_time(addr: std::net::SocketAddr, n: u32, tag: u8) -> Duration {
    let mut c = Client::connect(addr);
    c.login_normal([0x80, 0, 0, 0, 0x55, tag], &[]);
    let data = vec![tag; 4096];
    let t0 = Instant::now();
    for i in 0..n {
        let lba = (i % 1000) * 8;
        let (st, _, _) = c.command(&rw10(0x2a, lba, 8), 4096, false, &data, 4096);
        assert_eq!(st, 0);
        let (st, back, _) = c.command(&rw10(0x28, lba, 8), 4096, true, &[], 0);
        assert_eq!(st, 0);
        assert!(back == data);
    }
    t0.elapsed()
}

#[test]
fn idle_half_open_and_trickling_sockets_do_not_slow_io() {
    let (a, _s) = start(config(LUN, "workers = 2\n[timeouts]\nlogin = 60"));
    let base = io_time(a[0], 500, 1);
    // 1000 idle sockets, 200 with half a header, one sending a byte a
    // second.
    let mut idle: Vec<TcpStream> = (0..1000)
        .map(|_| TcpStream::connect(a[0]).unwrap())
        .collect();
    for s in idle.iter_mut().take(200) {
        use std::io::Write;
        s.write_all(&[0x43, 0x87, 0, 0, 0, 0, 0, 0x40, 0x80])
            .unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        let addr = a[1];
        std::thread::spawn(move || {
            use std::io::Write;
            let mut s = TcpStream::connect(addr).unwrap();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if s.write_all(&[0x43]).is_err() {
                    break;
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let loaded = io_time(a[0], 500, 2);
    let loaded2 = io_time(a[1], 500, 3);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(trickle.join().unwrap() > 0);
    eprintln!("500 I/O pairs: {base:?} alone, {loaded:?} and {loaded2:?} beside 1201 idle sockets");
    let bound = base * 4 + Duration::from_secs(1);
    assert!(
        loaded < bound && loaded2 < bound,
        "slowed down: {base:?} -> {loaded:?}, {loaded2:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    drop(idle);
}

#[test]
fn connection_limit() {
    let (a, _s) = start(config(LUN, "[limits]\nmax_connections = 4"));
    let held: Vec<Client> = (0..4)
        .map(|i| {
            let mut c = Client::connect(a[0]);
            c.login_normal([0x80, 0, 0, 0, 0x56, i], &[]);
            c
        })
        .collect();
    // The fifth is closed at once.
    let mut c = Client::connect(a[0]);
    assert!(c.closed_within(Duration::from_secs(3)), "over the limit");
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    sanity(a[0], 1);
}

#[test]
fn session_limits_refuse_with_0302() {
    let (a, _s) = start(config(LUN, "[limits]\nmax_sessions = 3"));
    let mut held = Vec::new();
    for i in 0..3 {
        let mut c = Client::connect(a[0]);
        c.login_normal([0x80, 0, 0, 0, 0x57, i], &[]);
        held.push(c);
    }
    let mut c = Client::connect(a[0]);
    let r = c.login(
        [0x80, 0, 0, 0, 0x57, 9],
        &[
            ("InitiatorName", "iqn.2026-11.test:e2e"),
            ("TargetName", IQN),
        ],
    );
    assert_eq!(
        r.status,
        iscsi_wire::pdu::LoginStatus::new(3, 2),
        "out of resources"
    );
    // Reinstating an existing session is not a new one.
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 0x57, 0], &[]);
    assert!(c.ping());
    // Discovery sessions are not counted.
    let mut d = Client::connect(a[0]);
    let r = d.login(
        [0x80, 0, 0, 0, 0x58, 1],
        &[
            ("InitiatorName", "iqn.2026-11.test:d"),
            ("SessionType", "Discovery"),
        ],
    );
    assert_eq!(r.status.class, 0);
    let _ = Opcode::NopIn;
}

#[test]
fn per_target_session_limit() {
    let text = format!(
        "listen = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\nmax_sessions = 1\n{LUN}\n"
    );
    let (a, _s) = start(server::Config::from_toml(&text).unwrap());
    let mut one = Client::connect(a[0]);
    one.login_normal([0x80, 0, 0, 0, 0x59, 1], &[]);
    let mut two = Client::connect(a[0]);
    let r = two.login(
        [0x80, 0, 0, 0, 0x59, 2],
        &[("InitiatorName", "iqn.2026-11.test:x"), ("TargetName", IQN)],
    );
    assert_eq!(r.status, iscsi_wire::pdu::LoginStatus::new(3, 2));
    assert!(one.ping());
}

/// The target's end of an accepted connection, found among this process's
/// descriptors (the server runs in the test process) by its peer address.
fn server_side_congestion(client: &TcpStream) -> Option<String> {
    use std::mem::ManuallyDrop;
    use std::os::fd::{AsFd, FromRawFd};
    let me = client.local_addr().ok()?;
    for e in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: the descriptor is only borrowed (ManuallyDrop never closes
        // it); on a descriptor that is not a socket the calls merely fail.
        let s = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
        if s.peer_addr().ok() == Some(me) {
            return netio::congestion(s.as_fd()).ok();
        }
    }
    None
}

#[test]
fn connections_use_the_configured_congestion_control() {
    // reno is built into every kernel; the default (cubic) may not be.
    for (extra, want) in [
        ("[limits]\ntcp_congestion = \"reno\"", Some("reno")),
        ("", None),
    ] {
        let (addrs, _stop) = start(config(LUN, extra));
        let mut c = Client::connect(addrs[0]);
        c.login_normal([0x80, 0, 0, 0, 0x56, 1], &[]);
        let got = server_side_congestion(&c.s).expect("the target's socket is in this process");
        match want {
            Some(w) => assert_eq!(got, w),
            None => {
                // The default asks for cubic; a kernel without it keeps its own.
                let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
                    .unwrap_or_default();
                assert!(
                    got == netio::DEFAULT_CONGESTION || got == system.trim(),
                    "default connection runs {got}"
                );
            }
        }
    }
}

#[test]
fn a_bad_congestion_control_name_is_refused_at_start() {
    let text =
        format!("[limits]\ntcp_congestion = \"no such\"\n[[target]]\nname = \"{IQN}\"\n{LUN}");
    let e = server::Config::from_toml(&text).unwrap_err().to_string();
    assert!(e.contains("tcp_congestion"), "{e}");
    // A well-formed name the kernel does not have: refused when the server
    // starts, not at its first connection.
    let cfg = config(LUN, "[limits]\ntcp_congestion = \"nosuchcc\"");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(server::Server::bind(cfg))
        .map(|_| ())
        .unwrap_err();
    assert!(
        e.contains("nosuchcc") && e.contains("this kernel has"),
        "{e}"
    );
}

#[test]
fn a_busy_polling_connection_still_sees_its_session_reinstated() {
    // 10 ms of polling and a command about every millisecond: the
    // connection never runs out of its budget, and must still look at the
    // other sources of its loop (here: its session taken over by a new
    // login with the same ISID, which closes it).
    let (a, _s) = start(config(LUN, "[limits]\nbusy_poll_us = 10000"));
    let addr = a[0];
    let busy = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        c.login_normal([0x80, 0, 0, 0, 0x57, 1], &[]);
        let t0 = Instant::now();
        let mut answered = 0u32;
        while t0.elapsed() < Duration::from_secs(20) {
            c.cmd(&[0; 6], 0, false, false, true, &[]);
            if c.recv().is_none() {
                return Some(answered);
            }
            answered += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut b = Client::connect(addr);
    b.login_normal([0x80, 0, 0, 0, 0x57, 1], &[]);
    let answered = busy
        .join()
        .unwrap()
        .expect("the old connection is closed when its session is reinstated");
    assert!(
        answered > 20,
        "only {answered} commands before the takeover"
    );
    let (st, _, _) = b.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(
        st, 2,
        "the new session learns of the takeover (unit attention)"
    );
}

#[test]
fn connections_serve_without_busy_polling_too() {
    let (a, _s) = start(config(LUN, "[limits]\nbusy_poll_us = 0"));
    io_time(a[0], 200, 9);
    let text = format!("[limits]\nbusy_poll_us = 10001\n[[target]]\nname = \"{IQN}\"\n{LUN}");
    let e = server::Config::from_toml(&text).unwrap_err().to_string();
    assert!(e.contains("busy_poll_us"), "{e}");
}

#[test]
fn an_idle_initiator_is_pinged_and_dropped_when_it_does_not_answer() {
    // Idle connections look at their timers once a second (not every
    // 100 ms): the ping still goes out, and the drop still follows.
    let (a, _s) = start(config(LUN, "[timeouts]\nnop_interval = 1\nnop_timeout = 1"));
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 0x58, 1], &[]);
    let t0 = Instant::now();
    let r = c
        .recv_within(Duration::from_secs(5))
        .expect("a NOP-In ping within 5 s");
    let Pdu::NopIn(n) = Pdu::parse(&r.bhs) else {
        panic!("expected a NOP-In, got opcode {:#x}", r.bhs[0] & 0x3f);
    };
    assert_eq!(
        n.itt.0, RESERVED_TAG,
        "a ping of the target's own (RFC 7143 §11.19)"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "pinged after {:?}",
        t0.elapsed()
    );
    assert!(
        c.closed_within(Duration::from_secs(5)),
        "unanswered ping: connection dropped"
    );
}
