//! Persist Through Power Loss (SPC-4 §5.9.4): the reservation state of a
//! logical unit whose last registration asked for APTPL = 1 is kept in one
//! small text file, rewritten atomically (temporary file, fsync, rename,
//! fsync of the directory) before the PERSISTENT RESERVE OUT that changed
//! it returns GOOD. With APTPL = 0 the file is removed, so a restart starts
//! with no registrations, as SPC-4 requires.
//!
//! Format (one record per line, fields separated by a tab; iSCSI names
//! cannot contain tabs or newlines):
//!
//! ```text
//! ironsan-pr 1
//! generation <decimal u32>
//! reg <key, 16 hex digits> <relative target port> <target port name or *> <initiator port name>
//! res <type 1..8> <holder target port name or *> <holder initiator port name or *>
//! ```

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::state::{Holder, PrState, PrType, Registration, Reservation};
use super::MAX_REGISTRATIONS;

const MAGIC: &str = "ironsan-pr 1";
/// Largest state file accepted (registrations are bounded).
const MAX_FILE: u64 = 4 << 20;

/// Renders `st` in the file format.
fn render(st: &PrState) -> String {
    let mut s = format!("{MAGIC}\ngeneration\t{}\n", st.generation);
    for r in &st.regs {
        s.push_str(&format!(
            "reg\t{:016x}\t{}\t{}\t{}\n",
            r.key,
            r.rel_port,
            r.target.as_deref().unwrap_or("*"),
            r.initiator
        ));
    }
    if let Some(res) = &st.res {
        let (t, i) = res
            .holder
            .as_ref()
            .map_or(("*", "*"), |h| (h.target.as_str(), h.initiator.as_str()));
        s.push_str(&format!("res\t{}\t{t}\t{i}\n", res.kind.code()));
    }
    s
}

/// Parses a state file; `Err` says what is wrong.
fn parse(text: &str) -> Result<PrState, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err("not an ironsan reservation state file".into());
    }
    let mut st = PrState {
        aptpl: true,
        ..PrState::default()
    };
    let name = |s: &str| -> Result<String, String> {
        if s.is_empty() || s.len() > 512 || !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("bad name {s:?}"));
        }
        Ok(s.to_owned())
    };
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let bad = || format!("line {}: {line:?}", n + 2);
        match f.as_slice() {
            ["generation", g] => st.generation = g.parse().map_err(|_| bad())?,
            ["reg", key, rel, target, initiator] => {
                if st.regs.len() >= MAX_REGISTRATIONS {
                    return Err("too many registrations".into());
                }
                let key = u64::from_str_radix(key, 16).map_err(|_| bad())?;
                if key == 0 {
                    return Err(bad());
                }
                st.regs.push(Registration {
                    initiator: name(initiator)?,
                    target: if *target == "*" {
                        None
                    } else {
                        Some(name(target)?)
                    },
                    rel_port: rel.parse().map_err(|_| bad())?,
                    key,
                });
            }
            ["res", kind, target, initiator] => {
                let kind = kind
                    .parse()
                    .ok()
                    .and_then(PrType::from_code)
                    .ok_or_else(bad)?;
                let holder = match (*target, *initiator) {
                    ("*", "*") if kind.all_registrants() => None,
                    (t, i) if !kind.all_registrants() && t != "*" && i != "*" => Some(Holder {
                        initiator: name(i)?,
                        target: name(t)?,
                    }),
                    _ => return Err(bad()),
                };
                st.res = Some(Reservation { kind, holder });
            }
            [""] => {}
            _ => return Err(bad()),
        }
    }
    Ok(st)
}

/// Loads the state saved at `path`; an absent file is an empty state.
pub(crate) fn load(path: &Path) -> Result<PrState, String> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(PrState::default()),
        Err(e) => return Err(e.to_string()),
    };
    if meta.len() > MAX_FILE {
        return Err("file too large".into());
    }
    let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
    parse(&text)
}

/// Makes `st` the saved state: written durably when `st.aptpl`, removed
/// otherwise. Returns only once the change is on stable storage.
pub(crate) fn store(path: &Path, st: &PrState) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if st.aptpl {
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = Path::new(&tmp_name);
        let mut f = fs::File::create(tmp)?;
        f.write_all(render(st).as_bytes())?;
        f.sync_all()?;
        drop(f);
        fs::rename(tmp, path)?;
    } else {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PrState {
        PrState {
            generation: 7,
            aptpl: true,
            regs: vec![
                Registration {
                    initiator: "iqn.a:x,i,0x800000000001".into(),
                    target: Some("iqn.t:y,t,0x0001".into()),
                    rel_port: 1,
                    key: 0xABCD,
                },
                Registration {
                    initiator: "iqn.b:z,i,0x800000000002".into(),
                    target: None,
                    rel_port: 0,
                    key: u64::MAX,
                },
            ],
            res: Some(Reservation {
                kind: PrType::WriteExclusive,
                holder: Some(Holder {
                    initiator: "iqn.a:x,i,0x800000000001".into(),
                    target: "iqn.t:y,t,0x0001".into(),
                }),
            }),
        }
    }

    #[test]
    fn round_trip_and_rejects() {
        let st = sample();
        assert_eq!(parse(&render(&st)).unwrap(), st);
        let mut ar = st.clone();
        ar.res = Some(Reservation {
            kind: PrType::ExclusiveAccessAllRegistrants,
            holder: None,
        });
        assert_eq!(parse(&render(&ar)).unwrap(), ar);
        assert!(parse("something else\n").is_err());
        assert!(
            parse(&format!("{MAGIC}\nreg\t0\t1\t*\tiqn.a\n")).is_err(),
            "key 0"
        );
        assert!(
            parse(&format!("{MAGIC}\nres\t2\t*\t*\n")).is_err(),
            "type 2"
        );
        assert!(
            parse(&format!("{MAGIC}\nres\t1\t*\t*\n")).is_err(),
            "WE without holder"
        );
        assert!(parse(&format!("{MAGIC}\nbogus\n")).is_err());
    }

    #[test]
    fn store_and_load() {
        let dir = std::env::temp_dir().join(format!("ironsan-pr-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lu0.pr");
        assert_eq!(load(&path).unwrap(), PrState::default());
        store(&path, &sample()).unwrap();
        assert_eq!(load(&path).unwrap(), sample());
        let mut off = sample();
        off.aptpl = false;
        store(&path, &off).unwrap();
        assert!(!path.exists());
        store(&path, &off).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
