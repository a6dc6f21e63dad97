//! The stable-toolchain fuzz runner: for each target, runs every seed in
//! `fuzz/corpus/<target>/` and every saved crash in
//! `fuzz/regressions/<target>/`, then random and mutated inputs for the
//! time budget. A panic is saved to `fuzz/artifacts/<target>/` and ends
//! the run with a failure.
//!
//! ```text
//! cargo run -p ironsan-fuzz --release -- --seconds 60 all
//! cargo run -p ironsan-fuzz --release -- --seconds 10 pdu cdb
//! cargo run -p ironsan-fuzz -- --write-seeds      # regenerate the corpora
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ironsan_fuzz::TARGETS;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const MAX_LEN: usize = 64 * 1024;
const INTERESTING: &[u32] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x1ff,
    512,
    4096,
    8191,
    8192,
    8193,
    0xffff,
    0x1_0000,
    0xff_ffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..=rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 if len + 64 < MAX_LEN => {
                let i = rng.below(len + 1);
                let n = rng.below(64) + 1;
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(i..i, bytes);
            }
            3 if len > 1 => {
                let i = rng.below(len);
                let n = rng.below((len - i).min(256)) + 1;
                input.drain(i..i + n);
            }
            4 if len > 4 => {
                let i = rng.below(len - 3);
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let b = if rng.below(2) == 0 {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                };
                let w = [1, 2, 4][rng.below(3)];
                input[i..i + w].copy_from_slice(&b[4 - w..]);
            }
            5 if len > 1 && len * 2 < MAX_LEN => {
                let i = rng.below(len);
                let n = rng.below((len - i).min(512)) + 1;
                let chunk = input[i..i + n].to_vec();
                let at = rng.below(len + 1);
                input.splice(at..at, chunk);
            }
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                if !other.is_empty() {
                    let i = rng.below(other.len());
                    let cut = rng.below(len + 1);
                    input.truncate(cut);
                    input.extend_from_slice(&other[i..other.len().min(i + 4096)]);
                }
            }
            _ if len > 48 => {
                // Re-randomise one byte of a 48-byte-aligned header.
                let i = rng.below(len / 48) * 48 + rng.below(48);
                input[i] = rng.next() as u8;
            }
            _ => input.push(rng.next() as u8),
        }
    }
    input.truncate(MAX_LEN);
}

fn read_dir(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.path(), std::fs::read(e.path()).ok()?)))
        .collect();
    v.sort();
    v
}

fn hash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Runs `f` on `input`; on a panic saves the input and returns false.
fn check(name: &str, f: fn(&[u8]), input: &[u8], root: &Path) -> bool {
    if std::panic::catch_unwind(|| f(input)).is_ok() {
        return true;
    }
    let dir = root.join("artifacts").join(name);
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(format!("crash-{:016x}", hash(input)));
    let _ = std::fs::write(&p, input);
    eprintln!("fuzz {name}: PANIC, input saved to {}", p.display());
    false
}

/// Seeds and regressions of `name`, then `budget` of random and mutated
/// inputs. Returns the number of inputs run, or None after a crash.
pub fn run(name: &str, f: fn(&[u8]), budget: Duration, seed: u64, root: &Path) -> Option<u64> {
    let mut corpus = Vec::new();
    for sub in ["corpus", "regressions"] {
        for (p, b) in read_dir(&root.join(sub).join(name)) {
            if !check(name, f, &b, root) {
                eprintln!("fuzz {name}: {} fails", p.display());
                return None;
            }
            corpus.push(b);
        }
    }
    let mut rng = Rng(seed | 1);
    let end = Instant::now() + budget;
    let mut n = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            let mut input = if corpus.is_empty() || rng.below(8) == 0 {
                let len = rng.below(512);
                (0..len).map(|_| rng.next() as u8).collect()
            } else {
                corpus[rng.below(corpus.len())].clone()
            };
            mutate(&mut rng, &mut input, &corpus);
            if !check(name, f, &input, root) {
                return None;
            }
            n += 1;
        }
    }
    Some(n)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut seconds = 10u64;
    let mut seed = None;
    let mut names = Vec::new();
    let mut write_seeds = false;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds N")
            }
            "--seed" => seed = args.next().and_then(|s| s.parse().ok()),
            "--write-seeds" => write_seeds = true,
            "all" => names.extend(TARGETS.iter().map(|(n, _)| n.to_string())),
            n => names.push(n.to_string()),
        }
    }
    if write_seeds {
        for (target, name, bytes) in ironsan_fuzz::seeds::all() {
            let dir = root.join("corpus").join(target);
            std::fs::create_dir_all(&dir).expect("corpus directory");
            std::fs::write(dir.join(name), bytes).expect("writing a seed");
        }
        println!("seeds written to {}", root.join("corpus").display());
        if names.is_empty() {
            return;
        }
    }
    if names.is_empty() {
        names.extend(TARGETS.iter().map(|(n, _)| n.to_string()));
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    // Panics are expected to be caught and reported; keep the output short.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    let mut failed = 0;
    for name in &names {
        let Some((_, f)) = TARGETS.iter().find(|(n, _)| n == name) else {
            eprintln!(
                "unknown target {name}; targets: {:?}",
                TARGETS.iter().map(|t| t.0).collect::<Vec<_>>()
            );
            std::process::exit(2);
        };
        match run(name, *f, Duration::from_secs(seconds), seed, &root) {
            Some(n) => println!("fuzz {name}: {n} inputs in {seconds} s, no failure (seed {seed})"),
            None => failed += 1,
        }
    }
    println!("fuzz: {} passed, {failed} failed", names.len() - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
