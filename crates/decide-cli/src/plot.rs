//! The plots the commands draw: `decide calibrate --plot`'s reliability diagram (predicted
//! probability against the share of pairs that were positive, per bin, before and after the fit;
//! a calibrated model lies on the diagonal) and `decide bench --plot`'s throughput against batch
//! size.

use std::path::Path;

use anyhow::Context;
use decide_eval::Reliability;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// Registers the bundled font once: a PNG carries no fonts, and the system's may be missing.
fn font() -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        )
        .is_ok()
    });
    anyhow::ensure!(ok, "the bundled font could not be loaded");
    Ok(())
}

/// Draws `curves` (a label and its reliability) into a PNG at `path`.
pub fn reliability_png(
    path: &Path,
    title: &str,
    curves: &[(&str, &Reliability)],
) -> anyhow::Result<()> {
    font()?;
    draw(path, title, curves)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("--plot {}", path.display()))
}

fn draw(
    path: &Path,
    title: &str,
    curves: &[(&str, &Reliability)],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (720, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0f64..1.0, 0.0f64..1.0)?;
    chart
        .configure_mesh()
        .x_desc("predicted probability")
        .y_desc("share actually needed")
        .label_style(("sans-serif", 16))
        .draw()?;
    chart
        .draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.4)))?
        .label("perfect calibration")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
    for (i, (label, reliability)) in curves.iter().enumerate() {
        let points = reliability
            .bins
            .iter()
            .filter(|b| b.count > 0)
            .map(|b| (b.mean_probability, b.positive_rate))
            .collect();
        let label = format!("{label} (ECE {:.3})", reliability.ece);
        line_with_dots(&mut chart, points, label, COLOURS[i % COLOURS.len()])?;
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

const COLOURS: [RGBColor; 6] = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One series: a line with a dot at each point, named `label` in the legend.
fn line_with_dots(
    chart: &mut Chart,
    points: Vec<(f64, f64)>,
    label: String,
    colour: RGBColor,
) -> Result<(), Box<dyn std::error::Error>> {
    chart
        .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    chart.draw_series(
        points
            .into_iter()
            .map(|p| Circle::new(p, 4, colour.filled())),
    )?;
    Ok(())
}

/// The legend box, top left.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Result<(), Box<dyn std::error::Error>> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

/// Draws throughput (pairs/s) against batch size, one line per `(label, points)` series, into a
/// PNG at `path`. The measured batch sizes are spaced evenly and labelled exactly: they usually
/// double, and a log axis would label sizes nobody measured.
pub fn throughput_png(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(usize, f64)>)],
) -> anyhow::Result<()> {
    font()?;
    draw_throughput(path, title, series)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("--plot {}", path.display()))
}

fn draw_throughput(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(usize, f64)>)],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut batches: Vec<usize> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.0))
        .collect();
    batches.sort_unstable();
    batches.dedup();
    let slot = |b: usize| batches.iter().position(|&x| x == b).unwrap_or(0) as f64;
    let max_rate = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let n = batches.len().max(1);
    let root = BitMapBackend::new(path, (880, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0.0f64..max_rate * 1.15)?;
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            batches
                .get(i as usize)
                .map(|b| b.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .disable_x_mesh()
        .x_desc("batch size (pairs per forward pass)")
        .y_desc("pairs per second")
        .label_style(("sans-serif", 16))
        .draw()?;
    for (i, (label, points)) in series.iter().enumerate() {
        let points = points.iter().map(|&(b, r)| (slot(b), r)).collect();
        line_with_dots(
            &mut chart,
            points,
            label.clone(),
            COLOURS[i % COLOURS.len()],
        )?;
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}
