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

/// The screen's lines for one `/api/stats` answer.
pub fn lines(v: &Value, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let luns = v["luns"].as_array().cloned().unwrap_or_default();
    let sessions = v["sessions"].as_array().cloned().unwrap_or_default();
    let tot = |k: &str| luns.iter().map(|l| f(&l["rate"], k)).sum::<f64>();
    out.push(format!(
        "ironsan top   up {}s   {} LUNs   {} sessions   IOPS r {:.0} w {:.0}   MB/s r {:.1} w {:.1}",
        v["uptime_s"],
        luns.len(),
        sessions.len(),
        tot("read_iops"),
        tot("write_iops"),
        tot("read_mbps"),
        tot("write_mbps")
    ));
    out.push(String::new());
    out.push(format!(
        "{:<34} {:>3} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6}",
        "TARGET",
        "LUN",
        "READS/s",
        "WRITES/s",
        "MBREAD/s",
        "MBWRTN/s",
        "LAT_R_us",
        "LAT_W_us",
        "P99_us",
        "QD",
        "ERR"
    ));
    for l in &luns {
        let r = &l["rate"];
        let name = s(l, "target");
        let name = if name.len() > 34 {
            &name[name.len() - 34..]
        } else {
            name
        };
        out.push(format!(
            "{:<34} {:>3} {:>9.0} {:>9.0} {:>8.1} {:>8.1} {:>8.0} {:>8.0} {:>8.0} {:>6.1} {:>6}",
            name,
            // JSON values ignore widths: pad their text.
            l["lun"].to_string(),
            f(r, "read_iops"),
            f(r, "write_iops"),
            f(r, "read_mbps"),
            f(r, "write_mbps"),
            f(r, "read_lat_us"),
            f(r, "write_lat_us"),
            f(r, "p99_us"),
            f(r, "qd"),
            r["errors"].to_string()
        ));
    }
    out.push(String::new());
    out.push(format!(
        "{:<4} {:<34} {:<12} {:<21} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6}",
        "SID",
        "INITIATOR",
        "ISID",
        "PORTAL",
        "READS/s",
        "WRITES/s",
        "MB/s",
        "LAT_us",
        "INFLT",
        "WINDOW"
    ));
    for x in &sessions {
        let i = &x["info"];
        let r = &x["rate"];
        let ini = s(i, "initiator");
        let ini = if ini.len() > 34 {
            &ini[ini.len() - 34..]
        } else {
            ini
        };
        out.push(format!(
            "{:<4} {:<34} {:<12} {:<21} {:>9.0} {:>9.0} {:>8.1} {:>8.0} {:>6} {:>6}",
            i["id"].to_string(),
            ini,
            s(i, "isid"),
            s(i, "portal"),
            f(r, "read_iops"),
            f(r, "write_iops"),
            f(r, "read_mbps") + f(r, "write_mbps"),
            f(r, "read_lat_us").max(f(r, "write_lat_us")),
            x["in_flight"].to_string(),
            i["queue_depth"].to_string()
        ));
    }
    for l in &mut out {
        if l.len() > width {
            l.truncate(width);
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
        let l = lines(&v, usize::MAX);
        let (lun_head, lun_row) = (&l[2], &l[3]);
        let (ses_head, ses_row) = (&l[5], &l[6]);
        assert_eq!(lun_head.len(), lun_row.len(), "\n{lun_head}\n{lun_row}");
        assert_eq!(ses_head.len(), ses_row.len(), "\n{ses_head}\n{ses_row}");
        assert!(ses_row.starts_with("1    iqn."), "{ses_row}");
    }
}
