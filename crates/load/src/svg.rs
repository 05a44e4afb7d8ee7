//! A small hand-written SVG plot of the per-second series: requests/s and p99 latency.

use std::fmt::Write as _;

use crate::stats::SeriesPoint;

const WIDTH: f64 = 800.0;
const PANEL_H: f64 = 180.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 34.0;
const GAP: f64 = 56.0;

/// Renders the series as a standalone SVG document with two stacked panels sharing the time
/// axis: completed requests per second, and the 99th-percentile latency in milliseconds.
pub fn render(series: &[SeriesPoint], title: &str) -> String {
    let height = TOP + 2.0 * PANEL_H + GAP + 40.0;
    let mut s = String::with_capacity(8 * 1024);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" font-size="14" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let secs = series.len().max(1) as f64;
    let rps: Vec<f64> = series.iter().map(|p| p.requests as f64).collect();
    let issued: Vec<f64> = series.iter().map(|p| p.issued as f64).collect();
    let p99: Vec<f64> = series.iter().map(|p| p.p99_us as f64 / 1000.0).collect();
    // Show the offered load too when it differs from the completions (open loop, overload).
    let differs = series
        .iter()
        .any(|p| p.issued.abs_diff(p.requests) > p.issued.max(p.requests) / 50 + 1);
    let mut top = vec![Line {
        values: &rps,
        color: "#1f77b4",
        dashed: false,
        name: "completed",
    }];
    if differs {
        top.push(Line {
            values: &issued,
            color: "#7f7f7f",
            dashed: true,
            name: "issued",
        });
    }
    panel(&mut s, TOP, "requests/s", &top, secs);
    let bottom = [Line {
        values: &p99,
        color: "#d62728",
        dashed: false,
        name: "",
    }];
    panel(
        &mut s,
        TOP + PANEL_H + GAP,
        "p99 latency (ms)",
        &bottom,
        secs,
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds</text>"#,
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        height - 6.0
    );
    s.push_str("</svg>\n");
    s
}

struct Line<'a> {
    values: &'a [f64],
    color: &'a str,
    dashed: bool,
    name: &'a str,
}

fn panel(s: &mut String, top: f64, label: &str, lines: &[Line<'_>], secs: f64) {
    let w = WIDTH - LEFT - RIGHT;
    let h = PANEL_H;
    let max = lines
        .iter()
        .flat_map(|l| l.values.iter().copied())
        .fold(0.0f64, f64::max);
    let (ymax, ystep) = nice_axis(max);
    let (xmax, xstep) = nice_axis(secs);
    let x = |t: f64| LEFT + t / xmax * w;
    let y = |v: f64| top + h - v / ymax * h;
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{}</text>"#,
        top - 6.0,
        escape(label)
    );
    // Grid and y ticks.
    let mut v = 0.0;
    while v <= ymax + ystep * 0.01 {
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + w,
            LEFT - 6.0,
            yy + 4.0,
            fmt_tick(v)
        );
        v += ystep;
    }
    // X ticks.
    let mut t = 0.0;
    while t <= xmax + xstep * 0.01 {
        let xx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#888"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + h,
            top + h + 4.0,
            top + h + 16.0,
            fmt_tick(t)
        );
        t += xstep;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>"##
    );
    for (k, line) in lines.iter().enumerate() {
        if line.values.is_empty() {
            continue;
        }
        let dash = if line.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.5"{dash} points=""#,
            line.color
        );
        for (i, &v) in line.values.iter().enumerate() {
            // Each point sits in the middle of its second.
            let _ = write!(s, "{:.1},{:.1} ", x(i as f64 + 0.5), y(v));
        }
        s.push_str("\"/>\n");
        if lines.len() > 1 {
            let lx = LEFT + w - 90.0;
            let ly = top + 14.0 + 14.0 * k as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="1.5"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
                ly - 4.0,
                lx + 20.0,
                ly - 4.0,
                line.color,
                lx + 26.0,
                ly,
                escape(line.name)
            );
        }
    }
}

/// A round axis maximum at or above `max` and a tick step giving about five ticks.
fn nice_axis(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&st| st >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn fmt_tick(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim_float(v / 1e6))
    } else if v >= 1e4 {
        format!("{}k", trim_float(v / 1e3))
    } else {
        trim_float(v)
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_is_round() {
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(nice_axis(95.0), (100.0, 20.0));
        let (m, st) = nice_axis(12_345.0);
        assert!(m >= 12_345.0 && st == 2500.0);
    }

    #[test]
    fn renders_valid_looking_svg() {
        let pts: Vec<SeriesPoint> = (0..10)
            .map(|i| SeriesPoint {
                second: i,
                requests: 100 * i,
                issued: 100 * i,
                p99_us: 1500 + i * 10,
                ..Default::default()
            })
            .collect();
        let svg = render(&pts, "a <b> & c");
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("NaN"));
        // Offered load that differs from the completions gets its own dashed line.
        let mut open = pts.clone();
        open[9].issued = 2000;
        let svg = render(&open, "open");
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.contains("stroke-dasharray") && svg.contains(">issued<"));
        let empty = render(&[], "x");
        assert!(!empty.contains("NaN") && !empty.contains("inf"));
    }
}
