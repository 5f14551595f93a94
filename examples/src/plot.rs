//! `ps-bench --plot FILE.png`: goodput and p50 latency against value size, one line per
//! (van, mode, requests in flight), drawn from the cluster's totals of every run.
//!
//! Text is rasterized by `ab_glyph` from a DejaVu Sans embedded in the binary (the `dejavu`
//! crate), so drawing needs no system font library (fontconfig, freetype) at build or run time.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::raw::BoxError;
use crate::report::{plural, BenchReport};

/// The picture's size in pixels.
const WIDTH: u32 = 1800;
const HEIGHT: u32 = 860;
/// Width of the legend column on the right.
const LEGEND_WIDTH: u32 = 300;
/// The font family every text of the plot uses (registered from the embedded DejaVu Sans).
const FONT: &str = "sans-serif";

/// Distinct colors for the (mode, in flight) pairs, in order of first appearance (the
/// "tab10" palette most plotting tools default to).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// One line: a (van, mode, window) across the sizes.
struct Line {
    label: String,
    color: RGBColor,
    /// The run's position: the line's dash pattern and marker.
    van_index: usize,
    /// (size position, GB/s, p50 µs) per size, in size order (see [`size_position`]).
    points: Vec<(i32, f64, f64)>,
}

/// Draws `report`'s goodput and p50 latency against value size into the PNG at `path`.
///
/// ```no_run
/// # fn show(report: &examples::report::BenchReport) -> Result<(), examples::raw::BoxError> {
/// examples::plot::draw(report, std::path::Path::new("/tmp/psbench.png"))?;
/// # Ok(()) }
/// ```
pub fn draw(report: &BenchReport, path: &Path) -> Result<(), BoxError> {
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the embedded DejaVu Sans font did not load")?;
    let lines = lines(report);
    if lines.is_empty() {
        return Err("nothing to plot: no benchmark case ran (--mode check or barrier?)".into());
    }
    let mut sizes: Vec<u64> = report
        .runs
        .iter()
        .flat_map(|r| r.cases.iter().map(|c| c.case.size))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let vans: Vec<&str> = report.runs.iter().map(|r| r.van.as_str()).collect();
    let title = format!(
        "ps-bench over {}: {} server{}, {} worker{} (cluster totals)",
        vans.join(", "),
        report.servers,
        plural(report.servers),
        report.workers,
        plural(report.workers),
    );
    let body = root.titled(&title, (FONT, 30))?;
    let (charts, legend) = body.split_horizontally(WIDTH - LEGEND_WIDTH);
    let panels = charts.split_evenly((1, 2));
    panel(
        &panels[0],
        &lines,
        &sizes,
        "goodput (values moved per second)",
        "GB/s (log scale)",
        |p| p.1,
        decimal,
    )?;
    panel(
        &panels[1],
        &lines,
        &sizes,
        "median latency of a request",
        "p50 (log scale)",
        |p| p.2,
        duration,
    )?;
    draw_legend(&legend, &lines)?;
    root.present()?;
    Ok(())
}

/// The lines of every run, from each case's total.
fn lines(report: &BenchReport) -> Vec<Line> {
    let mut lines: Vec<Line> = Vec::new();
    let mut pairs = Vec::new();
    for (van_index, run) in report.runs.iter().enumerate() {
        for c in &run.cases {
            let pair = (c.case.mode, c.case.window);
            let color_index = pairs.iter().position(|p| *p == pair).unwrap_or_else(|| {
                pairs.push(pair);
                pairs.len() - 1
            });
            let label = format!("{} {} ×{}", run.van, c.case.mode, c.case.window);
            let point = (
                size_position(c.case.size),
                c.total.gb_per_s,
                c.total.p50_us as f64,
            );
            match lines.iter_mut().find(|l| l.label == label) {
                Some(line) => line.points.push(point),
                None => lines.push(Line {
                    label,
                    color: COLORS[color_index % COLORS.len()],
                    van_index,
                    points: vec![point],
                }),
            }
        }
    }
    for line in &mut lines {
        line.points.sort_by_key(|p| p.0);
    }
    lines
}

/// Where a size sits on the x axis: 100 × log2 of the size, so the axis is logarithmic and
/// integer (plotters draws custom ticks only on integer axes), with a tick per measured size.
fn size_position(size: u64) -> i32 {
    ((size.max(1) as f64).log2() * 100.0).round() as i32
}

/// One chart: `value` of every line against the size, both on log scales.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    lines: &[Line],
    sizes: &[u64],
    caption: &str,
    y_desc: &str,
    value: fn(&(i32, f64, f64)) -> f64,
    y_label: fn(f64) -> String,
) -> Result<(), BoxError> {
    // A log scale cannot show 0 (a case with no answered request): such points are left out.
    let shown = |p: &(i32, f64, f64)| value(p) > 0.0 && value(p).is_finite();
    let ys: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().filter(|p| shown(p)).map(value))
        .collect();
    let (y_low, y_high) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(*y), hi.max(*y)));
    // Whole decades, so that every part of the axis has ticks: plotters starts a log axis's
    // ticks at the first power of ten inside it, so the bottom one is kept just inside (a
    // rounding error would otherwise leave the lowest decade without a tick).
    let (y_low, y_high) = if ys.is_empty() {
        (1e-3, 1.0)
    } else {
        (
            10f64.powf((y_low / 1.2).log10().floor()) * 0.999,
            10f64.powf((y_high * 1.2).log10().ceil()),
        )
    };
    let decades = (y_high / y_low).log10().round();
    let ticks: Vec<i32> = sizes.iter().map(|s| size_position(*s)).collect();
    let x_low = ticks.first().copied().unwrap_or(0) - 60;
    let x_high = ticks.last().copied().unwrap_or(100) + 60;
    let size_label = |x: &i32| {
        sizes
            .iter()
            .find(|s| size_position(**s) == *x)
            .map_or_else(String::new, |s| bytes(*s))
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 24))
        .margin(18)
        .x_label_area_size(56)
        .y_label_area_size(96)
        .build_cartesian_2d(
            (x_low..x_high).with_key_points(ticks),
            (y_low..y_high).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("value bytes per request (log scale)")
        .y_desc(y_desc)
        .x_label_formatter(&size_label)
        // Ticks at 1..9 of every decade; labels at 1, 2 and 5 (only at 1 beyond 5 decades,
        // where they would crowd).
        .y_labels(100)
        .y_label_formatter(&|y| {
            let power_of_ten = (y.log10() - y.log10().round()).abs() < 1e-9;
            if power_of_ten || (decades <= 5.0 && one_two_five(*y)) {
                y_label(*y)
            } else {
                String::new()
            }
        })
        .label_style((FONT, 17))
        .axis_desc_style((FONT, 19))
        .bold_line_style(BLACK.mix(0.12))
        // The 1..9 ticks of a narrow log axis already make the finer grid.
        .max_light_lines(0)
        .draw()?;
    for line in lines {
        let points: Vec<(i32, f64)> = line
            .points
            .iter()
            .filter(|p| shown(p))
            .map(|p| (p.0, value(p)))
            .collect();
        let style = line.color.stroke_width(3);
        match line.van_index % 3 {
            0 => {
                chart.draw_series(LineSeries::new(points.clone(), style))?;
            }
            1 => {
                chart.draw_series(DashedLineSeries::new(points.clone(), 12, 7, style))?;
            }
            _ => {
                chart.draw_series(DashedLineSeries::new(points.clone(), 4, 5, style))?;
            }
        }
        draw_markers(&mut chart, &points, line)?;
    }
    Ok(())
}

/// The markers of `line` at `points`: a circle, triangle or cross by run.
fn draw_markers<X, Y>(
    chart: &mut ChartContext<'_, BitMapBackend<'_>, Cartesian2d<X, Y>>,
    points: &[(i32, f64)],
    line: &Line,
) -> Result<(), BoxError>
where
    X: Ranged<ValueType = i32>,
    Y: Ranged<ValueType = f64>,
{
    let filled = line.color.filled();
    match line.van_index % 3 {
        0 => chart.draw_series(points.iter().map(|p| Circle::new(*p, 5, filled)))?,
        1 => chart.draw_series(points.iter().map(|p| TriangleMarker::new(*p, 7, filled)))?,
        _ => chart.draw_series(
            points
                .iter()
                .map(|p| Cross::new(*p, 6, line.color.stroke_width(3))),
        )?,
    };
    Ok(())
}

/// The legend: each line's pattern, marker and label, one row each.
fn draw_legend(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    lines: &[Line],
) -> Result<(), BoxError> {
    let top = 70;
    let available = HEIGHT as i32 - 140 - top;
    let row = (available / lines.len().max(1) as i32).clamp(12, 30);
    area.draw(&Text::new(
        "van, mode, × in flight",
        (10, top - 34),
        (FONT, 19).into_font(),
    ))?;
    for (i, line) in lines.iter().enumerate() {
        let y = top + i as i32 * row;
        let style = line.color.stroke_width(3);
        // The dash pattern of `panel`, drawn as segments.
        let segments: &[(i32, i32)] = match line.van_index % 3 {
            0 => &[(10, 60)],
            1 => &[(10, 22), (29, 41), (48, 60)],
            _ => &[(10, 14), (19, 23), (28, 32), (37, 41), (46, 50), (55, 59)],
        };
        for (from, to) in segments {
            area.draw(&PathElement::new(vec![(*from, y), (*to, y)], style))?;
        }
        let filled = line.color.filled();
        match line.van_index % 3 {
            0 => area.draw(&Circle::new((35, y), 5, filled))?,
            1 => area.draw(&TriangleMarker::new((35, y), 7, filled))?,
            _ => area.draw(&Cross::new((35, y), 6, style))?,
        }
        let font = (FONT, (row - 4).clamp(11, 18)).into_font();
        area.draw(&Text::new(line.label.clone(), (72, y - row / 3), font))?;
    }
    Ok(())
}

/// A size as people write it: `8 B`, `64 KiB`, `4 MiB` (`1000 B` when not a whole unit).
fn bytes(size: u64) -> String {
    for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if size >= scale && size % scale == 0 {
            return format!("{} {unit}", size / scale);
        }
    }
    format!("{size} B")
}

/// A number with as many decimals as its first significant digit needs: `0.0002`, `0.5`, `30`.
fn decimal(v: f64) -> String {
    if v <= 0.0 || !v.is_finite() {
        return "0".into();
    }
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// Whether `v` is 1, 2 or 5 times a power of ten.
fn one_two_five(v: f64) -> bool {
    if v <= 0.0 || !v.is_finite() {
        return false;
    }
    let mantissa = v / 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6 * m)
}

/// A latency axis label from µs: `50 µs`, `2 ms`, `1 s`.
fn duration(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", decimal(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", decimal(us / 1e3))
    } else {
        format!("{} µs", decimal(us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_read_as_people_write_them() {
        assert_eq!(bytes(8), "8 B");
        assert_eq!(bytes(65_536), "64 KiB");
        assert_eq!(bytes(4 << 20), "4 MiB");
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(size_position(8), 300);
        assert_eq!(decimal(0.0002), "0.0002");
        assert_eq!(decimal(0.5), "0.5");
        assert_eq!(decimal(30.0), "30");
        assert_eq!(duration(50.0), "50 µs");
        assert_eq!(duration(2000.0), "2 ms");
        assert!(one_two_five(0.002) && one_two_five(500.0) && one_two_five(1e-5));
        assert!(!one_two_five(300.0) && !one_two_five(0.0));
    }
}
