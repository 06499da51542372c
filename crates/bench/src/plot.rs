//! Line charts in SVG and PNG (plotters; text drawn with ab_glyph from a
//! bundled Noto Sans, so no system font library is needed).

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{BenchError, Result};

/// One named line.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub series: Vec<Series>,
}

const WIDTH_PX: u32 = 960;
const HEIGHT_PX: u32 = 600;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR)
            .is_err()
        {
            tracing::warn!("bundled font failed to load; plots will have no text");
        }
    });
}

/// Writes `<stem>.svg` and `<stem>.png` in `dir`; returns both paths.
pub fn write_chart(chart: &Chart, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    register_font();
    std::fs::create_dir_all(dir)
        .map_err(crate::error::io_err(format!("mkdir {}", dir.display())))?;
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    {
        let root = SVGBackend::new(&svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        draw(chart, &root).map_err(|msg| plot_err(&svg, msg))?;
        root.present().map_err(|e| plot_err(&svg, e.to_string()))?;
    }
    {
        let root = BitMapBackend::new(&png, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        draw(chart, &root).map_err(|msg| plot_err(&png, msg))?;
        root.present().map_err(|e| plot_err(&png, e.to_string()))?;
    }
    Ok(vec![svg, png])
}

fn plot_err(path: &Path, msg: String) -> BenchError {
    BenchError::Plot {
        path: path.display().to_string(),
        msg,
    }
}

fn bounds(chart: &Chart) -> (f64, f64, f64, f64) {
    let pts = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in pts {
        if x.is_finite() && (!chart.x_log || x > 0.0) {
            x0 = x0.min(x);
            x1 = x1.max(x);
        }
        if y.is_finite() {
            y1 = y1.max(y);
        }
    }
    if x0 > x1 {
        (x0, x1) = (if chart.x_log { 1.0 } else { 0.0 }, 1.0);
    }
    if x0 == x1 {
        x1 = x0 * 2.0 + 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    (x0, x1, 0.0, y1 * 1.08)
}

fn draw<DB: DrawingBackend>(
    chart: &Chart,
    root: &DrawingArea<DB, Shift>,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (x0, x1, y0, y1) = bounds(chart);
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72);
    let palette = |i: usize| Palette99::pick(i).to_rgba();
    macro_rules! body {
        ($ctx:expr) => {{
            let mut ctx = $ctx;
            ctx.configure_mesh()
                .x_desc(chart.x_label.as_str())
                .y_desc(chart.y_label.as_str())
                .label_style(("sans-serif", 14))
                .axis_desc_style(("sans-serif", 16))
                .draw()
                .map_err(e)?;
            for (i, s) in chart.series.iter().enumerate() {
                let color = palette(i);
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite() && (!chart.x_log || *x > 0.0))
                    .collect();
                ctx.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(e)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                if pts.len() <= 40 {
                    ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(e)?;
                }
            }
            ctx.configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(e)?;
        }};
    }
    if chart.x_log {
        body!(builder
            .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
            .map_err(e)?);
    } else {
        body!(builder.build_cartesian_2d(x0..x1, y0..y1).map_err(e)?);
    }
    Ok(())
}
