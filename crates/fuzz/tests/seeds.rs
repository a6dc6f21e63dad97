//! The seeds reach the full feature phase, and every committed corpus and
//! regression input runs clean (the timed random run is the runner's job:
//! `cargo run -p ironsan-fuzz --release -- --seconds 60 all`).

use std::path::Path;

#[test]
fn seeds_log_in_and_run_traffic() {
    for (name, s) in ironsan_fuzz::seeds::streams() {
        let n = ironsan_fuzz::drive_session(&s);
        assert!(n.is_some_and(|n| n >= 8), "{name}: {n:?}");
    }
}

#[test]
fn corpora_and_regressions_run_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    for sub in ["corpus", "regressions"] {
        for (name, f) in ironsan_fuzz::TARGETS {
            let dir = root.join(sub).join(name);
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let b = std::fs::read(e.path()).unwrap();
                f(&b);
            }
        }
    }
}

#[test]
fn nvme_tcp_seeds_frame_to_their_end() {
    use nvme_tcp_wire::{frame, Negotiated};
    let seeds: Vec<_> = ironsan_fuzz::seeds::all()
        .into_iter()
        .filter(|(t, _, _)| *t == "nvme_tcp")
        .collect();
    assert!(seeds.len() >= 4);
    for (_, name, b) in seeds {
        let flags = b[0];
        let n = Negotiated {
            header_digest: flags & 1 != 0,
            data_digest: flags & 2 != 0,
            alignment: 4,
            max_data: 128 << 10,
        };
        let (mut at, mut pdus) = (1, 0);
        while let Ok(Some(f)) = frame(&b[at..], &n) {
            at += f.len;
            pdus += 1;
        }
        assert_eq!(at, b.len(), "{name}: every byte framed ({pdus} PDUs)");
    }
}
