//! `virtnet bench --plot FILE.svg`: the busy-poll sweep (experiment 3) drawn as two panels,
//! latency (p50, p99) and device CPU per transaction against the busy-poll timeout. Plain
//! SVG written by hand: two line charts do not need a plotting library.

use std::fmt::Write as _;

use serde_json::Value;

/// One point of the sweep, read from experiment 3's JSON results.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    timeout_us: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
}

fn points(results: &Value) -> Option<Vec<Point>> {
    let median = |v: &Value, k: &str| v.get(k)?.get("median")?.as_f64();
    results
        .get("sweep")?
        .as_array()?
        .iter()
        // The fixed timeouts: the auto row has no place on the axis.
        .filter(|s| s.get("busy_poll_us").is_some_and(Value::is_number))
        .map(|s| {
            Some(Point {
                timeout_us: s.get("busy_poll_us")?.as_f64()?,
                p50_us: median(s, "p50_us")?,
                p99_us: median(s, "p99_us")?,
                cpu_us: median(s, "device_cpu_us_per_transaction")?,
            })
        })
        .collect()
}

const W: f64 = 420.0;
const H: f64 = 300.0;
const M: f64 = 55.0; // margin for axes and labels

/// Draws one panel at x offset `ox`: several series (name, colour, values) over `xs`.
fn panel(
    out: &mut String,
    ox: f64,
    title: &str,
    y_label: &str,
    xs: &[f64],
    series: &[(&str, &str, Vec<f64>)],
) {
    let x_max = xs.iter().cloned().fold(1.0, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.2.iter().cloned())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let px = |x: f64| ox + M + x / x_max * (W - 1.5 * M);
    let py = |y: f64| H - M - y / y_max * (H - 1.6 * M);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" font-size="14" text-anchor="middle">{title}</text>"#,
        ox + W / 2.0
    );
    let _ = writeln!(
        out,
        r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        px(0.0),
        py(0.0),
        px(x_max),
        py(0.0)
    );
    let _ = writeln!(
        out,
        r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        px(0.0),
        py(0.0),
        px(0.0),
        py(y_max)
    );
    for &x in xs {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{x}</text>"#,
            px(x),
            py(0.0) + 15.0
        );
    }
    for k in 0..=4 {
        let y = y_max * k as f64 / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{y:.1}</text>"#,
            px(0.0) - 5.0,
            py(y) + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">busy-poll timeout (us)</text>"#,
        ox + W / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle" transform="rotate(-90 {} {})">{y_label}</text>"#,
        ox + 14.0,
        H / 2.0,
        ox + 14.0,
        H / 2.0
    );
    for (i, (name, colour, ys)) in series.iter().enumerate() {
        let pts: Vec<String> = xs
            .iter()
            .zip(ys)
            .filter(|(_, y)| y.is_finite())
            .map(|(&x, &y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
        let ly = 40.0 + 16.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{ly}" font-size="12" fill="{colour}">{name}</text>"#,
            ox + W - 90.0
        );
    }
}

/// The SVG for experiment 3's results, or `None` if they hold no sweep.
pub fn busy_poll_svg(results: &Value) -> Option<String> {
    let pts = points(results)?;
    if pts.is_empty() {
        return None;
    }
    let xs: Vec<f64> = pts.iter().map(|p| p.timeout_us).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{H}" font-family="sans-serif">"#,
        2.0 * W
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let latency = [
        ("p50", "#1f77b4", pts.iter().map(|p| p.p50_us).collect()),
        ("p99", "#d62728", pts.iter().map(|p| p.p99_us).collect()),
    ];
    panel(
        &mut out,
        0.0,
        "request-response latency",
        "latency (us)",
        &xs,
        &latency,
    );
    let cpu = [(
        "device CPU",
        "#2ca02c",
        pts.iter().map(|p| p.cpu_us).collect(),
    )];
    panel(
        &mut out,
        W,
        "device CPU per transaction",
        "CPU (us)",
        &xs,
        &cpu,
    );
    out.push_str("</svg>\n");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_point_per_timeout_in_both_panels() {
        let s = |m: f64| serde_json::json!({ "median": m, "min": m, "max": m, "runs": 1 });
        let results = serde_json::json!({ "sweep": [
            { "busy_poll_us": 0, "p50_us": s(50.0), "p99_us": s(200.0), "device_cpu_us_per_transaction": s(8.0) },
            { "busy_poll_us": 50, "p50_us": s(20.0), "p99_us": s(90.0), "device_cpu_us_per_transaction": s(15.0) },
        ]});
        let svg = busy_poll_svg(&results).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3, "p50, p99 and CPU");
        assert_eq!(svg.matches("<circle").count(), 6);
        assert!(busy_poll_svg(&serde_json::json!({ "sweep": [] })).is_none());
        assert!(busy_poll_svg(&serde_json::json!({})).is_none());
    }
}
