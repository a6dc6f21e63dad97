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
