//! The demo's plots, as SVG and PNG.
//!
//! Text in PNGs is rendered by plotters' `ab_glyph` backend with DejaVu Sans embedded from the
//! `dejavu` crate, so no system font library (fontconfig, freetype) is needed on the machine.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::CliError;

const SIZE: (u32, u32) = (960, 600);
const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

fn register_fonts() -> Result<(), CliError> {
    // Registered once per process; the outcome is kept, so every later call reports a
    // failure too (not only the first).
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = *LOADED.get_or_init(|| {
        [
            (FontStyle::Normal, dejavu::sans::regular()),
            (FontStyle::Bold, dejavu::sans::bold()),
        ]
        .into_iter()
        .all(|(style, bytes)| plotters::style::register_font("sans-serif", style, bytes).is_ok())
    });
    if loaded {
        Ok(())
    } else {
        Err(CliError::Output(
            "the embedded DejaVu font did not load".into(),
        ))
    }
}

fn err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> CliError + '_ {
    move |e| CliError::Output(format!("cannot draw {what}: {e:?}"))
}

fn color(i: usize) -> RGBColor {
    COLORS.get(i % COLORS.len()).copied().unwrap_or(BLACK)
}

/// CDF points of sorted `samples`, at most ~400 of them.
fn cdf_points(samples: &[f64]) -> Vec<(f64, f64)> {
    let n = samples.len();
    if n == 0 {
        return Vec::new();
    }
    let step = (n / 400).max(1);
    let mut pts: Vec<(f64, f64)> = samples
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || *i == n - 1)
        .map(|(i, &x)| (x.max(0.1), (i + 1) as f64 / n as f64))
        .collect();
    pts.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    pts
}

fn draw_cdf<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    series: &[(String, &[f64])],
    title: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let lo = series
        .iter()
        .filter_map(|(_, s)| s.first().copied())
        .fold(f64::INFINITY, f64::min)
        .max(0.1);
    let hi = series
        .iter()
        .filter_map(|(_, s)| s.last().copied())
        .fold(0.0, f64::max)
        .max(lo * 2.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(60)
        .build_cartesian_2d((lo * 0.9..hi * 1.1).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("latency, intended issue to completion (model µs, log scale)")
        .y_desc("fraction of transfers")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, (name, samples)) in series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(cdf_points(samples), c.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()
}

fn draw_throughput<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let x_hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1.0, f64::max);
    let y_hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("Throughput vs faulting-page rate", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_hi * 1.05, 0.0..y_hi * 1.15)?;
    chart
        .configure_mesh()
        .x_desc("pages taken away before the engine uses them (%)")
        .y_desc("aggregate throughput (Gb/s, model time)")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()
}

/// One latency CDF plot: the file stem, its title and one sample set per strategy.
pub type Cdf<'a> = (&'a str, String, Vec<(String, &'a [f64])>);

/// Draws the latency CDFs and the throughput plot as SVG and PNG into `dir`; returns the
/// files written.
pub fn draw_all(
    dir: &Path,
    cdfs: &[Cdf<'_>],
    throughput: &[(String, Vec<(f64, f64)>)],
) -> Result<Vec<PathBuf>, CliError> {
    register_fonts()?;
    let mut files = Vec::new();
    for (stem, title, series) in cdfs {
        let svg = dir.join(format!("{stem}.svg"));
        let png = dir.join(format!("{stem}.png"));
        draw_cdf(
            SVGBackend::new(&svg, SIZE).into_drawing_area(),
            series,
            title,
        )
        .map_err(err("a latency CDF (SVG)"))?;
        draw_cdf(
            BitMapBackend::new(&png, SIZE).into_drawing_area(),
            series,
            title,
        )
        .map_err(err("a latency CDF (PNG)"))?;
        files.push(svg);
        files.push(png);
    }
    let thr_svg = dir.join("throughput_vs_fault_rate.svg");
    let thr_png = dir.join("throughput_vs_fault_rate.png");
    draw_throughput(
        SVGBackend::new(&thr_svg, SIZE).into_drawing_area(),
        throughput,
    )
    .map_err(err("throughput_vs_fault_rate.svg"))?;
    draw_throughput(
        BitMapBackend::new(&thr_png, SIZE).into_drawing_area(),
        throughput,
    )
    .map_err(err("throughput_vs_fault_rate.png"))?;
    files.push(thr_svg);
    files.push(thr_png);
    Ok(files)
}
