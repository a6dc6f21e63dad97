//! `ironsan top`: an esxtop-like live view of the admin endpoint's
//! per-LUN and per-session rates, refreshed every second; `q` quits.
//! `--once` prints one screen as text, `--batch` prints CSV rows (like
//! `esxtop -b`) for scripts.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use crossterm::event::{self, Event, KeyCode, KeyModifiers};
use crossterm::{cursor, execute, queue, terminal};
use serde_json::Value;

use crate::admin::EndpointArgs;

/// `ironsan top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    ep: EndpointArgs,
    /// Print one screen as plain text and exit.
    #[arg(long)]
    once: bool,
    /// Print CSV rows, one per LUN and interval, instead of the live view.
    #[arg(long, short = 'b')]
    batch: bool,
    /// Intervals to print in batch mode (0: until interrupted).
    #[arg(long, short = 'n', default_value_t = 0)]
    iterations: u64,
    /// Seconds between refreshes.
    #[arg(long, short = 'd', default_value_t = 1.0)]
    delay: f64,
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// One column of a table: header, width, left-aligned, and how long it
/// stays when the terminal is narrow (lower goes first; 0 never goes).
struct Col {
    head: &'static str,
    width: usize,
    left: bool,
    drop: u8,
}

const fn col(head: &'static str, width: usize, left: bool, drop: u8) -> Col {
    Col {
        head,
        width,
        left,
        drop,
    }
}

/// The shortest the name column gets before other columns go.
const MIN_NAME: usize = 12;

/// The tail of `s` in at most `w` characters (names differ at their end:
/// `iqn.…:target0`, `…:target1`).
fn tail(s: &str, w: usize) -> String {
    let n = s.chars().count();
    s.chars().skip(n.saturating_sub(w)).collect()
}

/// A table that fits `width`: column 1 is the name, given what is left
/// (between [`MIN_NAME`] and its longest value); when even that does not
/// fit, the columns with the lowest `drop` go first (a rank at a time). Returns the lines
/// and how many columns were left out.
fn table(cols: &[Col], rows: &[Vec<String>], width: usize) -> (Vec<String>, usize) {
    let longest = rows
        .iter()
        .map(|r| r[1].chars().count())
        .chain([cols[1].head.len()])
        .max()
        .unwrap_or(0);
    let mut keep: Vec<bool> = vec![true; cols.len()];
    let fixed = |keep: &[bool]| -> usize {
        cols.iter()
            .zip(keep)
            .enumerate()
            .filter(|(i, (_, k))| **k && *i != 1)
            .map(|(_, (c, _))| c.width + 1)
            .sum()
    };
    while fixed(&keep) + MIN_NAME.min(longest) > width {
        // Columns of one rank go together (MB read and written).
        let Some(rank) = (0..cols.len())
            .filter(|&i| keep[i] && cols[i].drop > 0)
            .map(|i| cols[i].drop)
            .min()
        else {
            break;
        };
        for (k, c) in keep.iter_mut().zip(cols) {
            if c.drop == rank {
                *k = false;
            }
        }
    }
    let name_w = width
        .saturating_sub(fixed(&keep))
        .min(longest)
        .max(MIN_NAME.min(longest));
    let line = |cells: &[String]| -> String {
        let mut l = String::new();
        for (i, c) in cols.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if !l.is_empty() {
                l.push(' ');
            }
            let w = if i == 1 { name_w } else { c.width };
            let v = tail(&cells[i], w);
            if c.left {
                l += &format!("{v:<w$}");
            } else {
                l += &format!("{v:>w$}");
            }
        }
        l.trim_end().to_string()
    };
    let mut out = vec![line(
        &cols.iter().map(|c| c.head.to_string()).collect::<Vec<_>>(),
    )];
    out.extend(rows.iter().map(|r| line(r)));
    (out, keep.iter().filter(|k| !**k).count())
}

const LUN_COLS: [Col; 11] = [
    col("LUN", 3, false, 0),
    col("TARGET", 0, true, 0),
    col("READS/s", 8, false, 0),
    col("WRITES/s", 8, false, 0),
    col("MBREAD/s", 8, false, 7),
    col("MBWRTN/s", 8, false, 7),
    col("LAT_R_us", 8, false, 9),
    col("LAT_W_us", 8, false, 9),
    col("P99_us", 7, false, 8),
    col("QD", 5, false, 5),
    col("ERR", 5, false, 6),
];

const SESSION_COLS: [Col; 10] = [
    col("SID", 4, true, 0),
    col("INITIATOR", 0, true, 0),
    col("ISID", 12, true, 3),
    col("PORTAL", 21, true, 6),
    col("READS/s", 8, false, 0),
    col("WRITES/s", 8, false, 0),
    col("MB/s", 7, false, 8),
    col("LAT_us", 7, false, 9),
    col("INFLT", 6, false, 5),
    col("WINDOW", 6, false, 4),
];

/// The screen's lines for one `/api/stats` answer, fitted to `width`
/// columns: long names keep their tail, and on a narrow terminal the
/// least telling columns go (the header says how many).
pub fn lines(v: &Value, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let luns = v["luns"].as_array().cloned().unwrap_or_default();
    let sessions = v["sessions"].as_array().cloned().unwrap_or_default();
    let tot = |k: &str| luns.iter().map(|l| f(&l["rate"], k)).sum::<f64>();
    let lun_rows: Vec<Vec<String>> = luns
        .iter()
        .map(|l| {
            let r = &l["rate"];
            vec![
                // JSON values ignore widths: their text is padded.
                l["lun"].to_string(),
                s(l, "target").to_string(),
                format!("{:.0}", f(r, "read_iops")),
                format!("{:.0}", f(r, "write_iops")),
                format!("{:.1}", f(r, "read_mbps")),
                format!("{:.1}", f(r, "write_mbps")),
                format!("{:.0}", f(r, "read_lat_us")),
                format!("{:.0}", f(r, "write_lat_us")),
                format!("{:.0}", f(r, "p99_us")),
                format!("{:.1}", f(r, "qd")),
                r["errors"].to_string(),
            ]
        })
        .collect();
    let session_rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|x| {
            let i = &x["info"];
            let r = &x["rate"];
            vec![
                i["id"].to_string(),
                s(i, "initiator").to_string(),
                s(i, "isid").to_string(),
                s(i, "portal").to_string(),
                format!("{:.0}", f(r, "read_iops")),
                format!("{:.0}", f(r, "write_iops")),
                format!("{:.1}", f(r, "read_mbps") + f(r, "write_mbps")),
                format!("{:.0}", f(r, "read_lat_us").max(f(r, "write_lat_us"))),
                x["in_flight"].to_string(),
                i["queue_depth"].to_string(),
            ]
        })
        .collect();
    let (lun_lines, lun_hidden) = table(&LUN_COLS, &lun_rows, width);
    let (ses_lines, ses_hidden) = table(&SESSION_COLS, &session_rows, width);
    let head = format!(
        "ironsan top   up {}s   {} LUNs   {} sessions   IOPS r {:.0} w {:.0}   MB/s r {:.1} w {:.1}",
        v["uptime_s"],
        luns.len(),
        sessions.len(),
        tot("read_iops"),
        tot("write_iops"),
        tot("read_mbps"),
        tot("write_mbps")
    );
    out.push(head);
    out.push(if lun_hidden + ses_hidden > 0 {
        format!(
            "({} columns hidden: widen the terminal)",
            lun_hidden + ses_hidden
        )
    } else {
        String::new()
    });
    out.extend(lun_lines);
    out.push(String::new());
    out.extend(ses_lines);
    for l in &mut out {
        if l.chars().count() > width {
            *l = l.chars().take(width).collect();
        }
    }
    out
}

/// Prints one screen as plain text (or CSV rows with `csv`).
pub fn print_batch(v: &Value, csv: bool) {
    if csv {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for l in v["luns"].as_array().into_iter().flatten() {
            let r = &l["rate"];
            println!(
                "{t},{},{},{:.0},{:.0},{:.3},{:.3},{:.1},{:.1},{:.1},{:.2},{}",
                s(l, "target"),
                l["lun"],
                f(r, "read_iops"),
                f(r, "write_iops"),
                f(r, "read_mbps"),
                f(r, "write_mbps"),
                f(r, "read_lat_us"),
                f(r, "write_lat_us"),
                f(r, "p99_us"),
                f(r, "qd"),
                r["errors"]
            );
        }
    } else {
        for l in lines(v, usize::MAX) {
            println!("{l}");
        }
    }
}

pub fn run(a: TopArgs) -> Result<()> {
    let ep = a.ep.endpoint()?;
    let delay = Duration::from_secs_f64(a.delay.max(0.2));
    if a.once {
        print_batch(&ep.get_json("/api/stats")?, false);
        return Ok(());
    }
    if a.batch {
        println!("time,target,lun,read_iops,write_iops,read_mbps,write_mbps,read_lat_us,write_lat_us,p99_us,qd,errors");
        let mut n = 0;
        loop {
            print_batch(&ep.get_json("/api/stats")?, true);
            std::io::stdout().flush()?;
            n += 1;
            if a.iterations != 0 && n >= a.iterations {
                return Ok(());
            }
            std::thread::sleep(delay);
        }
    }
    let mut out = std::io::stdout();
    terminal::enable_raw_mode()?;
    execute!(out, terminal::EnterAlternateScreen, cursor::Hide)?;
    let res = (|| -> Result<()> {
        loop {
            let (w, h) = terminal::size().unwrap_or((120, 40));
            let text = match ep.get_json("/api/stats") {
                Ok(v) => lines(&v, usize::from(w)),
                Err(e) => vec![format!("ironsan top: {e:#}")],
            };
            queue!(
                out,
                cursor::MoveTo(0, 0),
                terminal::Clear(terminal::ClearType::All)
            )?;
            for (i, l) in text
                .iter()
                .take(usize::from(h).saturating_sub(1))
                .enumerate()
            {
                queue!(out, cursor::MoveTo(0, i as u16))?;
                write!(out, "{l}")?;
            }
            queue!(out, cursor::MoveTo(0, h.saturating_sub(1)))?;
            write!(out, "q: quit")?;
            out.flush()?;
            let until = Instant::now() + delay;
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                if event::poll(left)? {
                    if let Event::Key(k) = event::read()? {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if k.code == KeyCode::Char('q') || k.code == KeyCode::Esc || ctrl_c {
                            return Ok(());
                        }
                    }
                }
            }
        }
    })();
    execute!(out, cursor::Show, terminal::LeaveAlternateScreen)?;
    terminal::disable_raw_mode()?;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_with_their_headers() {
        let v: Value = serde_json::json!({
            "uptime_s": 3,
            "luns": [{"target": "iqn.2026-11.io.ironsan:target0", "lun": 0,
                      "rate": {"read_iops": 182961.0, "errors": 0}}],
            "sessions": [{"info": {"id": 1, "initiator": "iqn.2026-11.io.ironsan:initiator",
                                   "isid": "802bade7b9f1", "portal": "127.0.0.1:3398",
                                   "queue_depth": 128},
                          "rate": {}, "in_flight": 0}],
        });
        for width in [usize::MAX, 160, 120, 100, 80, 60] {
            let l = lines(&v, width);
            let (lun_head, lun_row) = (&l[2], &l[3]);
            let (ses_head, ses_row) = (&l[5], &l[6]);
            // Every header ends where its column's values end.
            for (h, r) in [(lun_head, lun_row), (ses_head, ses_row)] {
                assert_eq!(h.len(), r.len(), "width {width}\n{h}\n{r}");
            }
            assert!(
                l.iter().all(|x| x.chars().count() <= width),
                "width {width}:\n{}",
                l.join("\n")
            );
            assert!(ses_row.starts_with("1    "), "{ses_row}");
            assert!(
                lun_row.contains("target0"),
                "the name keeps its tail: {lun_row}"
            );
            // The rate columns stay at every width; the rest go last.
            assert!(lun_head.contains("READS/s") && lun_head.contains("WRITES/s"));
            assert!(lun_row.contains("182961"), "{lun_row}");
            let hidden = l[1].contains("columns hidden");
            assert_eq!(
                hidden,
                !lun_head.contains("ERR") || !ses_head.contains("ISID"),
                "width {width}: {}",
                l[1]
            );
        }
        // 80 columns keep the latencies, the p99 and both MB/s.
        let l = lines(&v, 80);
        for c in ["LAT_R_us", "LAT_W_us", "P99_us", "MBREAD/s", "MBWRTN/s"] {
            assert!(l[2].contains(c), "{}", l[2]);
        }
        // Not ASCII: no panic, still within the width.
        let mut w = v.clone();
        w["luns"][0]["target"] = "iqn.2026-11.io.ironsan:zielspeicher-größe-äöü-𝔘".into();
        assert!(lines(&w, 70).iter().all(|x| x.chars().count() <= 70));
    }
}
