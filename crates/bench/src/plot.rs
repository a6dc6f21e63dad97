//! `--plot FILE.svg`: IOPS over time, latency percentiles over time and the
//! latency histogram of a run, as one self-contained SVG written by hand
//! (no fonts, scripts or styles from outside).

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use crate::run::RunResult;
use crate::spec::JobSpec;

const W: f64 = 960.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 60.0;
const GAP: f64 = 70.0;
const READ: &str = "#1f77b4";
const WRITE: &str = "#ff7f0e";
const P99: &str = "#d62728";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

/// Tick steps for an axis ending at a `nice_max` value: round labels.
fn ticks(top: f64) -> usize {
    let lead = top / 10f64.powf(top.log10().floor());
    if (lead - 2.0).abs() < 1e-9 {
        4
    } else {
        5
    }
}

fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn usec(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{} ms", human(ns / 1e6))
    } else {
        format!("{} µs", human(ns / 1e3))
    }
}

struct Panel {
    y0: f64,
}

impl Panel {
    fn x(&self, frac: f64) -> f64 {
        LEFT + frac * (W - LEFT - RIGHT)
    }
    fn y(&self, frac: f64) -> f64 {
        self.y0 + PANEL_H - frac.clamp(0.0, 1.0) * PANEL_H
    }
    fn frame(&self, s: &mut String, title: &str, ylabel: &str, xlabel: &str) {
        let _ = write!(
            s,
            r##"<rect x="{LEFT}" y="{}" width="{}" height="{PANEL_H}" fill="#fafafa" stroke="#999"/>
<text x="{LEFT}" y="{}" font-size="15" font-weight="bold">{}</text>
<text x="16" y="{}" font-size="12" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>
<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>
"##,
            self.y0,
            W - LEFT - RIGHT,
            self.y0 - 10.0,
            esc(title),
            self.y0 + PANEL_H / 2.0,
            self.y0 + PANEL_H / 2.0,
            esc(ylabel),
            LEFT + (W - LEFT - RIGHT) / 2.0,
            self.y0 + PANEL_H + 34.0,
            esc(xlabel)
        );
    }
    fn ytick(&self, s: &mut String, frac: f64, label: &str) {
        let y = self.y(frac);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            esc(label)
        );
    }
    fn xtick(&self, s: &mut String, frac: f64, label: &str) {
        let x = self.x(frac);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#999"/><text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
            self.y0 + PANEL_H,
            self.y0 + PANEL_H + 5.0,
            self.y0 + PANEL_H + 18.0,
            esc(label)
        );
    }
    fn line(&self, s: &mut String, pts: &[(f64, f64)], color: &str) {
        if pts.is_empty() {
            return;
        }
        let p: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", self.x(*x), self.y(*y)))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
            p.join(" ")
        );
        if pts.len() == 1 {
            let _ = writeln!(
                s,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"##,
                self.x(pts[0].0),
                self.y(pts[0].1)
            );
        }
    }
    fn legend(&self, s: &mut String, items: &[(&str, &str)]) {
        let mut x = W - RIGHT - 10.0;
        for (label, color) in items.iter().rev() {
            let w = 14.0 + 7.0 * label.chars().count() as f64;
            x -= w + 16.0;
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{}" font-size="12">{}</text>"##,
                self.y0 - 22.0,
                x + 14.0,
                self.y0 - 13.0,
                esc(label)
            );
        }
    }
}

/// Time axis ticks: about 8 over `n` seconds.
fn time_ticks(p: &Panel, s: &mut String, n: usize) {
    let step = (n as f64 / 8.0).ceil().max(1.0) as usize;
    let mut t = 0;
    while t <= n {
        p.xtick(s, t as f64 / n.max(1) as f64, &format!("{t}s"));
        t += step;
    }
}

/// Log-scale position of `ns` between `lo` and `hi`.
fn logfrac(ns: f64, lo: f64, hi: f64) -> f64 {
    ((ns.max(lo)).ln() - lo.ln()) / (hi.ln() - lo.ln())
}

/// The SVG document: IOPS over time, completion latency over time, and the
/// latency histogram.
pub fn svg(spec: &JobSpec, r: &RunResult) -> String {
    let mut s = String::new();
    let h = TOP + 3.0 * (PANEL_H + GAP) + 20.0;
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="24" font-size="17" font-weight="bold">ironsan bench: {} bs={} iodepth={} numjobs={} ({})</text>
<text x="{LEFT}" y="42" font-size="12">{}</text>
"##,
        esc(spec.rw.name()),
        spec.bs,
        spec.iodepth,
        spec.numjobs,
        esc(r.engine),
        esc(&spec
            .targets
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" "))
    );
    let t = Timeline::new(r);
    let mut all: Histogram<u64> = r.read.lat.clone();
    let _ = all.add(&r.write.lat);
    let (lo, hi) = latency_range(&all);
    iops_panel(&mut s, &t);
    latency_panel(&mut s, &t, lo, hi);
    histogram_panel(&mut s, &all, lo, hi);
    s += "</svg>\n";
    s
}

/// The run's seconds as the time axes draw them.
struct Timeline<'a> {
    secs: &'a [crate::run::Second],
    /// The run's length in seconds (at least 0.25).
    full: f64,
}

impl<'a> Timeline<'a> {
    fn new(r: &'a RunResult) -> Self {
        // Drop a last second that is only the tail of I/Os completing after
        // the deadline (a sliver of a second gives a meaningless rate).
        let full = r.elapsed.as_secs_f64();
        let keep = r
            .series
            .iter()
            .enumerate()
            .take_while(|(i, _)| full - *i as f64 >= 0.25 || *i == 0)
            .count();
        let secs = &r.series[..keep];
        Timeline {
            secs,
            full: full.min(secs.len() as f64).max(0.25),
        }
    }

    /// Where second `i` sits on the time axis: in its middle.
    fn frac(&self, i: usize) -> f64 {
        ((i as f64 + 0.5) / self.full.max(self.secs.len() as f64).max(1.0)).min(1.0)
    }

    /// `ios` in second `i` as a rate (the last second may be partial).
    fn rate(&self, ios: u64, i: usize) -> f64 {
        let len = (self.full - i as f64).clamp(0.05, 1.0);
        ios as f64 / len
    }

    /// Seconds the time axis spans.
    fn seconds(&self) -> usize {
        self.full.max(1.0).ceil() as usize
    }
}

/// Decades of latency (ns) that hold every recorded value.
fn latency_range(all: &Histogram<u64>) -> (f64, f64) {
    if all.is_empty() {
        return (1e3, 1e6);
    }
    let lo = 10f64.powf((all.min().max(1) as f64).log10().floor());
    let hi = 10f64.powf((all.max().max(10) as f64).log10().ceil());
    (lo, hi.max(lo * 10.0))
}

/// Panel 1: IOPS over time, reads and writes.
fn iops_panel(s: &mut String, t: &Timeline<'_>) {
    let p = Panel { y0: TOP + 20.0 };
    p.frame(s, "IOPS over time", "IOPS", "time");
    let secs = t.secs;
    let has_w = secs.iter().any(|x| x.write_ios > 0);
    let has_r = secs.iter().any(|x| x.read_ios > 0);
    let top = nice_max(
        secs.iter()
            .enumerate()
            .map(|(i, x)| t.rate(x.read_ios, i).max(t.rate(x.write_ios, i)))
            .fold(0.0, f64::max),
    );
    let steps = ticks(top);
    for k in 0..=steps {
        let f = k as f64 / steps as f64;
        p.ytick(s, f, &human(top * f));
    }
    time_ticks(&p, s, t.seconds());
    let mut legend = Vec::new();
    if has_r {
        let pts: Vec<_> = secs
            .iter()
            .enumerate()
            .map(|(i, x)| (t.frac(i), t.rate(x.read_ios, i) / top))
            .collect();
        p.line(s, &pts, READ);
        legend.push(("read", READ));
    }
    if has_w {
        let pts: Vec<_> = secs
            .iter()
            .enumerate()
            .map(|(i, x)| (t.frac(i), t.rate(x.write_ios, i) / top))
            .collect();
        p.line(s, &pts, WRITE);
        legend.push(("write", WRITE));
    }
    p.legend(s, &legend);
}

/// Panel 2: p50, p99 and max completion latency per second (log scale).
fn latency_panel(s: &mut String, t: &Timeline<'_>, lo: f64, hi: f64) {
    let p = Panel {
        y0: TOP + 20.0 + PANEL_H + GAP,
    };
    p.frame(
        s,
        "Completion latency over time (p50, p99, max)",
        "latency (log)",
        "time",
    );
    let mut d = lo;
    while d <= hi * 1.001 {
        p.ytick(s, logfrac(d, lo, hi), &usec(d));
        d *= 10.0;
    }
    time_ticks(&p, s, t.seconds());
    let secs = t.secs;
    for (q, color, label) in [(0.5, READ, "p50"), (0.99, P99, "p99"), (1.0, "#888", "max")] {
        let pts: Vec<_> = secs
            .iter()
            .enumerate()
            .filter(|(_, x)| !x.lat.is_empty())
            .map(|(i, x)| {
                let v = if q >= 1.0 {
                    x.lat.max()
                } else {
                    x.lat.value_at_quantile(q)
                };
                (t.frac(i), logfrac(v as f64, lo, hi))
            })
            .collect();
        p.line(s, &pts, color);
        let _ = label;
    }
    p.legend(s, &[("p50", READ), ("p99", P99), ("max", "#888")]);
}

/// Panel 3: the share of I/Os per log-spaced latency bucket (8 per decade).
fn histogram_panel(s: &mut String, all: &Histogram<u64>, lo: f64, hi: f64) {
    let p = Panel {
        y0: TOP + 20.0 + 2.0 * (PANEL_H + GAP),
    };
    p.frame(
        s,
        &format!(
            "Latency histogram ({} I/Os; p50 {}, p99 {}, p99.9 {})",
            all.len(),
            usec(if all.is_empty() {
                0.0
            } else {
                all.value_at_quantile(0.5) as f64
            }),
            usec(if all.is_empty() {
                0.0
            } else {
                all.value_at_quantile(0.99) as f64
            }),
            usec(if all.is_empty() {
                0.0
            } else {
                all.value_at_quantile(0.999) as f64
            }),
        ),
        "share of I/Os",
        "completion latency (log)",
    );
    let per_decade = 8.0;
    let nb = ((hi / lo).log10() * per_decade).round().max(1.0) as usize;
    let mut counts = vec![0u64; nb];
    for v in all.iter_recorded() {
        let x = v.value_iterated_to() as f64;
        let b = ((logfrac(x, lo, hi) * nb as f64) as usize).min(nb - 1);
        counts[b] += v.count_at_value();
    }
    let total = all.len().max(1) as f64;
    let ymax = nice_max(counts.iter().copied().max().unwrap_or(0) as f64 / total);
    let steps = ticks(ymax);
    for k in 0..=steps {
        let f = k as f64 / steps as f64;
        p.ytick(s, f, &format!("{:.0}%", ymax * 100.0 * f));
    }
    let mut d = lo;
    while d <= hi * 1.001 {
        p.xtick(s, logfrac(d, lo, hi), &usec(d));
        d *= 10.0;
    }
    let bw = (W - LEFT - RIGHT) / nb as f64;
    for (i, c) in counts.iter().enumerate() {
        if *c == 0 {
            continue;
        }
        let f = *c as f64 / total / ymax;
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{READ}" opacity="0.8"><title>{:.2}% of I/Os</title></rect>"##,
            p.x(i as f64 / nb as f64) + 1.0,
            p.y(f),
            (bw - 2.0).max(1.0),
            f * PANEL_H,
            *c as f64 * 100.0 / total
        );
    }
}
