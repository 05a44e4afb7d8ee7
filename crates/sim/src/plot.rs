//! Small hand-written SVG line charts in the style of seed 003 Figs. 5–8: one line with markers
//! per series, linear axes from zero with round ticks, a grid, axis titles and a legend.

use std::fmt::Write as _;

use crate::report::RunResult;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Legend text.
    pub name: String,
    /// Points, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (e.g. an analytic curve beside a simulated one).
    pub dashed: bool,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// Title of the horizontal axis.
    pub x_label: String,
    /// Title of the vertical axis.
    pub y_label: String,
    /// The lines.
    pub lines: Vec<Line>,
}

const W: f64 = 760.0;
const H: f64 = 470.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 58.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round tick step giving about `n` intervals over `0..=max`.
fn tick_step(max: f64, n: f64) -> f64 {
    if !(max.is_finite() && max > 0.0) {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1e6 && (v / 1e6).fract() == 0.0 {
        format!("{}M", v / 1e6)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

fn marker(out: &mut String, shape: usize, x: f64, y: f64, color: &str) {
    let r = 3.6;
    let _ = match shape % 5 {
        0 => writeln!(
            out,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{color}"/>"#
        ),
        1 => writeln!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="{}" height="{}" fill="{color}"/>"#,
            x - r,
            y - r,
            2.0 * r,
            2.0 * r
        ),
        2 => writeln!(
            out,
            r#"<path d="M{x:.1},{:.1} L{:.1},{:.1} L{:.1},{:.1} Z" fill="{color}"/>"#,
            y - r - 0.8,
            x + r + 0.6,
            y + r,
            x - r - 0.6,
            y + r
        ),
        3 => writeln!(
            out,
            r#"<path d="M{x:.1},{:.1} L{:.1},{y:.1} L{x:.1},{:.1} L{:.1},{y:.1} Z" fill="{color}"/>"#,
            y - r - 1.0,
            x + r + 1.0,
            y + r + 1.0,
            x - r - 1.0
        ),
        _ => writeln!(
            out,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="white" stroke="{color}" stroke-width="1.6"/>"#
        ),
    };
}

/// The chart as a standalone SVG document.
pub fn svg(chart: &Chart) -> String {
    let pts = chart.lines.iter().flat_map(|l| l.points.iter());
    let (mut xmax, mut ymax) = (0f64, 0f64);
    for &(x, y) in pts {
        if x.is_finite() {
            xmax = xmax.max(x);
        }
        if y.is_finite() {
            ymax = ymax.max(y);
        }
    }
    let xstep = tick_step(xmax, 8.0);
    let ystep = tick_step(ymax * 1.05, 6.0);
    let xtop = (xmax / xstep).ceil().max(1.0) * xstep;
    let ytop = (ymax * 1.05 / ystep).ceil().max(1.0) * ystep;
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / xtop * pw;
    let sy = |y: f64| TOP + ph - y / ytop * ph;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        LEFT + pw / 2.0,
        escape(&chart.title)
    );
    // Grid and ticks.
    let mut v = 0.0;
    while v <= ytop + ystep * 1e-9 {
        let y = sy(v);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
            LEFT + pw
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v)
        );
        v += ystep;
    }
    let mut v = 0.0;
    while v <= xtop + xstep * 1e-9 {
        let x = sx(v);
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#f0f0f0"/>"##,
            TOP + ph
        );
        let _ = writeln!(
            o,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 18.0,
            fmt_tick(v)
        );
        v += xstep;
    }
    // Axes.
    let _ = writeln!(
        o,
        r#"<path d="M{LEFT},{TOP} L{LEFT},{:.1} L{:.1},{:.1}" fill="none" stroke="black" stroke-width="1.2"/>"#,
        TOP + ph,
        LEFT + pw,
        TOP + ph
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 14.0,
        escape(&chart.x_label)
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        escape(&chart.y_label)
    );
    // Lines.
    for (i, l) in chart.lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut d = String::new();
        for (k, &(x, y)) in l.points.iter().filter(|p| p.1.is_finite()).enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if k == 0 { "M" } else { "L" },
                sx(x),
                sy(y)
            );
        }
        let dash = if l.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<path d="{}" fill="none" stroke="{color}" stroke-width="1.8"{dash}/>"#,
            d.trim_end()
        );
        if !l.dashed {
            for &(x, y) in l.points.iter().filter(|p| p.1.is_finite()) {
                marker(&mut o, i, sx(x), sy(y), color);
            }
        }
        // Legend entry.
        let ly = TOP + 8.0 + i as f64 * 20.0;
        let lx = W - RIGHT + 18.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="1.8"{dash}/>"#,
            lx + 26.0
        );
        if !l.dashed {
            marker(&mut o, i, lx + 13.0, ly, color);
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 32.0,
            ly + 4.0,
            escape(&l.name)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// A throughput-versus-cluster-size chart (seed 003 Figs. 7 and 8) from sweep results: one line
/// per label, in order of first appearance.
pub fn throughput_chart(title: &str, runs: &[RunResult]) -> Chart {
    let mut lines: Vec<Line> = Vec::new();
    for r in runs {
        let name = if r.label.is_empty() {
            format!("{}/{}/{}", r.policy, r.mechanism, r.http)
        } else {
            r.label.clone()
        };
        let i = match lines.iter().position(|l| l.name == name) {
            Some(i) => i,
            None => {
                lines.push(Line {
                    name,
                    points: Vec::new(),
                    dashed: false,
                });
                lines.len() - 1
            }
        };
        lines[i].points.push((f64::from(r.nodes), r.throughput));
    }
    for l in &mut lines {
        l.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Chart {
        title: title.to_owned(),
        x_label: "number of back-end nodes".into(),
        y_label: "throughput (requests/s)".into(),
        lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(10.0, 5.0), 2.0);
        assert_eq!(tick_step(16.0, 8.0), 2.0);
        assert_eq!(tick_step(3700.0, 6.0), 1000.0);
        assert_eq!(tick_step(0.0, 6.0), 1.0);
        assert_eq!(fmt_tick(2.5), "2.5");
        assert_eq!(fmt_tick(1000.0), "1000");
    }

    #[test]
    fn svg_has_axes_legend_and_lines() {
        let c = Chart {
            title: "T <1>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            lines: vec![
                Line {
                    name: "a".into(),
                    points: vec![(1.0, 10.0), (2.0, 20.0)],
                    dashed: false,
                },
                Line {
                    name: "b & c".into(),
                    points: vec![(1.0, 5.0), (2.0, f64::NAN)],
                    dashed: true,
                },
            ],
        };
        let s = svg(&c);
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert!(s.contains("T &lt;1&gt;"));
        assert!(s.contains("b &amp; c"));
        assert!(s.contains("stroke-dasharray"));
        // The axes and two lines (circles mark the first, the dashed one has no markers).
        assert_eq!(s.matches("<path d=\"M").count(), 3);
        assert!(!s.contains("NaN"));
    }
}
