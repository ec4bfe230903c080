//! `--plot FILE.png`: a run's per-second series, or a sweep over fleet
//! sizes (over-admission beside the lesson's `N × B`, store calls beside
//! N), drawn here with no outside tool: a raster ([`canvas`]), a bitmap
//! font ([`font`]) and a palette PNG ([`png`]).

mod canvas;
mod font;
mod png;

use canvas::{Canvas, BLACK, BLUE, CHAR_H, GREEN, GREY, GRID, PURPLE, RED};

use super::Report;

/// One line of a panel: points in data units, left to right.
pub struct Line {
    pub name: String,
    pub color: u8,
    pub points: Vec<(f64, f64)>,
    /// A square at each point (few points: a sweep).
    pub marks: bool,
}

/// One chart: axes fitted to its lines.
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub lines: Vec<Line>,
}

const WIDTH: i32 = 960;
const TITLE_H: i32 = 40;
const PANEL_H: i32 = 380;
const LEFT: i32 = 110;
const RIGHT: i32 = 30;

/// A step of 1, 2 or 5 × 10^k giving about five ticks over `span`.
fn nice_step(span: f64) -> f64 {
    let raw = (span / 5.0).max(f64::MIN_POSITIVE);
    let pow = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * pow)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * pow);
    if step.is_finite() && step > 0.0 {
        step
    } else {
        1.0
    }
}

/// `lo..hi` widened to whole steps, with its step.
fn axis(lo: f64, hi: f64) -> (f64, f64, f64) {
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo - 0.5, lo + 0.5) };
    let step = nice_step(hi - lo);
    ((lo / step).floor() * step, (hi / step).ceil() * step, step)
}

/// A tick's label: 12 000 as `12K`, 1 500 000 as `1.5M`.
fn tick_label(v: f64, step: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let v = if v.abs() < step * 1e-9 { 0.0 } else { v };
    if v.abs() >= 1e6 && step >= 1e5 {
        format!("{}M", trim(format!("{:.1}", v / 1e6)))
    } else if v.abs() >= 1e4 && step >= 1e3 {
        format!("{}K", trim(format!("{:.1}", v / 1e3)))
    } else if step >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
        trim(format!("{v:.decimals$}"))
    }
}

fn draw_panel(c: &mut Canvas, top: i32, panel: &Panel) {
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let (y0, y1) = (top + 34, top + PANEL_H - 96);
    c.text(LEFT, top + 8, &panel.title, BLACK);
    let points = || panel.lines.iter().flat_map(|l| l.points.iter().copied());
    let fin = |v: &f64| v.is_finite();
    let xs = points().map(|p| p.0).filter(fin);
    let (xmin, xmax) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let ys = points().map(|p| p.1).filter(fin);
    let (ymin, ymax) = ys.fold((0.0f64, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
    if xmin > xmax {
        c.text(LEFT, (y0 + y1) / 2, "no data", GREY);
        return;
    }
    let (xlo, xhi, xstep) = axis(xmin, xmax);
    let (ylo, yhi, ystep) = axis(ymin, ymax * 1.05);
    let px = |x: f64| x0 + ((x - xlo) / (xhi - xlo) * f64::from(x1 - x0)).round() as i32;
    let py = |y: f64| y1 - ((y - ylo) / (yhi - ylo) * f64::from(y1 - y0)).round() as i32;
    // Grid and ticks.
    let mut y = ylo;
    while y <= yhi + ystep * 1e-6 {
        let at = py(y);
        c.line((x0, at), (x1, at), 1, if y.abs() < ystep * 1e-6 { GREY } else { GRID });
        let label = tick_label(y, ystep);
        c.text(x0 - 8 - Canvas::text_width(&label), at - CHAR_H / 2, &label, BLACK);
        y += ystep;
    }
    let mut x = xlo;
    while x <= xhi + xstep * 1e-6 {
        let at = px(x);
        c.line((at, y1), (at, y1 + 5), 1, BLACK);
        let label = tick_label(x, xstep);
        c.text(at - Canvas::text_width(&label) / 2, y1 + 10, &label, BLACK);
        x += xstep;
    }
    c.line((x0, y0), (x0, y1), 1, BLACK);
    c.line((x0, y1), (x1, y1), 1, BLACK);
    let xl = &panel.x_label;
    c.text((x0 + x1 - Canvas::text_width(xl)) / 2, y1 + 30, xl, BLACK);
    // The lines.
    for line in &panel.lines {
        let pts: Vec<(i32, i32)> = line
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| (px(x), py(y)))
            .collect();
        for w in pts.windows(2) {
            c.line(w[0], w[1], 2, line.color);
        }
        if line.marks || pts.len() == 1 {
            for &(x, y) in &pts {
                c.fill(x - 4, y - 4, 9, 9, line.color);
            }
        }
    }
    // The legend, under the axis label, wrapped to the width.
    let (mut lx, mut ly) = (x0, y1 + 56);
    for line in &panel.lines {
        let w = 32 + Canvas::text_width(&line.name) + 28;
        if lx > x0 && lx + w > x1 {
            (lx, ly) = (x0, ly + 20);
        }
        c.fill(lx, ly + CHAR_H / 2 - 2, 24, 4, line.color);
        c.text(lx + 32, ly, &line.name, BLACK);
        lx += w;
    }
}

/// The panels under a title, as PNG bytes.
pub fn draw(title: &str, panels: &[Panel]) -> Vec<u8> {
    let mut c = Canvas::new(WIDTH, TITLE_H + PANEL_H * panels.len() as i32);
    c.text(LEFT, 14, title, BLACK);
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(&mut c, TITLE_H + PANEL_H * i as i32, panel);
    }
    c.into_png()
}

fn per_second(values: &[u64]) -> Vec<(f64, f64)> {
    values.iter().enumerate().map(|(i, v)| (i as f64, *v as f64)).collect()
}

/// One run: admitted and refused per second, store calls per second.
pub fn series(r: &Report) -> Vec<u8> {
    let title = format!(
        "{} ({}): {} instances, {} offered, seed {}",
        r.limit, r.algorithm, r.instances, r.offered, r.seed
    );
    let line = |name: &str, color, values: &[u64]| Line {
        name: name.to_string(),
        color,
        points: per_second(values),
        marks: false,
    };
    draw(
        &title,
        &[
            Panel {
                title: "requests per second".into(),
                x_label: "virtual second".into(),
                lines: vec![
                    line("admitted", BLUE, &r.series.admitted),
                    line("refused", RED, &r.series.refused),
                ],
            },
            Panel {
                title: "store calls per second (acquires and releases)".into(),
                x_label: "virtual second".into(),
                lines: vec![line("store calls", GREEN, &r.series.store_calls)],
            },
        ],
    )
}

/// A sweep over fleet sizes: over-admission beside the lesson's `N × B`,
/// store calls per second beside N.
pub fn sweep(reports: &[Report]) -> Vec<u8> {
    let Some(first) = reports.first() else {
        return draw("no runs", &[]);
    };
    let at = |f: &dyn Fn(&Report) -> f64| -> Vec<(f64, f64)> {
        reports.iter().map(|r| (r.instances as f64, f(r))).collect()
    };
    let line = |name: &str, color, points| Line {
        name: name.to_string(),
        color,
        points,
        marks: true,
    };
    let mut over = vec![
        line("lesson: N × B", RED, at(&|r| r.bound as f64 - r.allowance as f64)),
        line("run: admitted - allowance", PURPLE, at(&|r| r.over_admitted as f64)),
    ];
    if reports.iter().all(|r| r.worst_interval.is_some()) {
        over.push(line(
            "worst stretch",
            BLUE,
            at(&|r| r.worst_interval.as_ref().map_or(0.0, |w| w.over as f64)),
        ));
    }
    let title = format!(
        "{} ({}): {} s, {} offered, seed {}",
        first.limit, first.algorithm, first.seconds, first.offered, first.seed
    );
    draw(
        &title,
        &[
            Panel {
                title: "over-admission: admitted - allowance, tokens".into(),
                x_label: "instances (N)".into(),
                lines: over,
            },
            Panel {
                title: "store calls per second".into(),
                x_label: "instances (N)".into(),
                lines: vec![line("store calls/s", GREEN, at(&|r| r.store_calls_per_s))],
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_take_whole_nice_steps() {
        assert_eq!(nice_step(100.0), 20.0);
        assert_eq!(nice_step(7.0), 2.0);
        assert_eq!(axis(0.0, 93.0), (0.0, 100.0, 20.0));
        assert_eq!(axis(-978.0, 10_000.0), (-5000.0, 10_000.0, 5000.0));
        assert_eq!(axis(-978.0, 4_000.0), (-1000.0, 4_000.0, 1000.0));
        // A flat line still gets an axis.
        let (lo, hi, step) = axis(5.0, 5.0);
        assert!(lo < 5.0 && hi > 5.0 && step > 0.0);
        assert_eq!(tick_label(12_000.0, 2_000.0), "12K");
        assert_eq!(tick_label(1_500_000.0, 500_000.0), "1.5M");
        assert_eq!(tick_label(-2_000.0, 1_000.0), "-2000");
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        assert_eq!(tick_label(1e-12, 0.5), "0");
    }

    #[test]
    fn a_panel_with_nothing_finite_draws_no_data() {
        let png = draw(
            "t",
            &[Panel {
                title: "p".into(),
                x_label: "x".into(),
                lines: vec![Line {
                    name: "nan".into(),
                    color: BLUE,
                    points: vec![(f64::NAN, 1.0)],
                    marks: true,
                }],
            }],
        );
        assert_eq!(&png[1..4], b"PNG");
    }
}
