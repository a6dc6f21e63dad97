//! Connection admission against floods (crate::admission): thousands of
//! idle sockets do not keep an allowed initiator out, a connection that
//! never authenticates is closed after the security timeout, and parallel
//! CHAP guessers from one address get about one answer a second in total.

mod common;

use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use initiator::{Connection, LoginConfig};
use iscsi_proto::chap::Credential;

const ALLOWED: &str = "iqn.2026-12.io.example:allowed";

/// Raises this process's open-file limit to at least `want` (both ends of
/// every test socket live here); false if it cannot.
fn enough_files(want: u64) -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid rlimit for getrlimit/setrlimit to read and write.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return false;
        }
        if r.rlim_cur >= want {
            return true;
        }
        let n = libc::rlimit {
            rlim_cur: want.max(r.rlim_cur),
            rlim_max: want.max(r.rlim_max),
        };
        libc::setrlimit(libc::RLIMIT_NOFILE, &n) == 0
            || libc::setrlimit(
                libc::RLIMIT_NOFILE,
                &libc::rlimit {
                    rlim_cur: r.rlim_max,
                    rlim_max: r.rlim_max,
                },
            ) == 0
                && r.rlim_max >= want
    }
}

#[test]
fn an_allowed_initiator_logs_in_past_4200_idle_sockets() {
    assert!(
        enough_files(12_000),
        "cannot raise RLIMIT_NOFILE to 12000 for 4200 sockets and their peers: run as root or raise the hard limit"
    );
    let (a, _s) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"",
        &format!("[[target]]\nname = \"iqn.2026-12.io.ironsan:other\"\nallow = [\"{ALLOWED}\"]\n[[target.lun]]\nbackend = \"null\"\nsize = \"1M\"\n"),
    ));
    // An attacker's idle sockets: connected, never a byte sent.
    let idle: Vec<TcpStream> = (0..4200)
        .filter_map(|_| TcpStream::connect(a[0]).ok())
        .collect();
    assert!(idle.len() >= 4200, "opened {}", idle.len());
    // Let the server accept them all.
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let mut c = Connection::login(
        &a[0].to_string(),
        LoginConfig::new(
            ALLOWED,
            Some("iqn.2026-12.io.ironsan:other"),
            initiator::random_isid(),
        ),
    )
    .expect("the allowed initiator logs in");
    let took = t0.elapsed();
    eprintln!("logged in past {} idle sockets in {took:?}", idle.len());
    let r = c
        .execute(
            0,
            &initiator::scsi::test_unit_ready(),
            initiator::DataDir::None,
        )
        .unwrap();
    assert_eq!(r.status, Some(0));
    // Functional bound only (the login timeout is 15 s): not a speed goal.
    assert!(took < Duration::from_secs(5), "{took:?}");
    drop(idle);
}

#[test]
fn a_connection_that_never_authenticates_is_closed() {
    let (a, _s) = start(config(
        "[[target.lun]]\nbackend = \"null\"\nsize = \"1M\"",
        "[timeouts]\nsecurity = 1\nlogin = 30",
    ));
    let mut c = Client::connect(a[0]);
    let t0 = Instant::now();
    assert!(c.closed_within(Duration::from_secs(10)), "still open");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed too early: {took:?}"
    );
}

#[test]
fn parallel_chap_guessers_get_about_one_answer_a_second() {
    let (a, _s) = start(config(
        "chap = { user = \"u\", secret = \"the-real-secret\" }\n[[target.lun]]\nbackend = \"null\"\nsize = \"1M\"",
        "",
    ));
    let answered = Arc::new(AtomicUsize::new(0));
    let stop = Instant::now() + Duration::from_secs(4);
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let answered = answered.clone();
            let addr = a[0].to_string();
            std::thread::spawn(move || {
                while Instant::now() < stop {
                    let mut cfg = LoginConfig::new(
                        &format!("iqn.2026-12.io.example:guess{i}"),
                        Some(IQN),
                        initiator::random_isid(),
                    );
                    cfg.chap = Some(Credential::new("u", b"guess-guess-guess"));
                    match Connection::login(&addr, cfg) {
                        Ok(_) => panic!("a wrong secret got in"),
                        // Answered: the guess was checked (or refused).
                        Err(initiator::Error::Login(_)) if Instant::now() < stop => {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        // Closed unanswered: evicted by the guesser's own
                        // newer connections (crate::admission).
                        Err(_) => {}
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let n = answered.load(Ordering::Relaxed);
    eprintln!("50 guessers, 4 s: {n} answered");
    // Three free, then 125/250/500 ms, then 1 s each: about 9 in 4 s;
    // unthrottled it was about 100.
    assert!(n <= 12, "{n} guesses answered in 4 s");
    // The right secret still gets in once the guessing stops (it waits its
    // turn behind the last guess).
    let mut cfg = LoginConfig::new(
        "iqn.2026-12.io.example:honest",
        Some(IQN),
        initiator::random_isid(),
    );
    cfg.chap = Some(Credential::new("u", b"the-real-secret"));
    std::thread::sleep(Duration::from_secs(2));
    Connection::login(&a[0].to_string(), cfg).expect("the real secret");
}
