//! `--plot FILE.png` for the benches: PNG pictures drawn with plotters' bitmap backend.
//!
//! Text is rendered by plotters' pure-Rust `ab_glyph` feature from a TTF file read at run
//! time (DejaVu Sans from Debian's fonts-dejavu-core, installed by scripts/setup.sh, or
//! `$ZYGOTE_PLOT_FONT`), so building needs neither fontconfig nor freetype.
//! Only the major grid is drawn (the minor one is set to white): the fine grid cluttered
//! the pictures and made the PNGs compress poorly.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(
        "no font for the plot's text: install fonts-dejavu-core (scripts/setup.sh) or set \
         ZYGOTE_PLOT_FONT to a .ttf file (tried {tried})"
    )]
    NoFont { tried: String },
    #[error("{path} is not a usable TTF font")]
    BadFont { path: PathBuf },
    #[error("drawing {path}: {msg}")]
    Draw { path: PathBuf, msg: String },
    #[error("nothing to plot in {0}: no samples")]
    Empty(PathBuf),
}

/// Where Debian (and most distributions) keep DejaVu Sans.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Register the font once per process under plotters' default family name.
fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let env = std::env::var("ZYGOTE_PLOT_FONT").ok();
            let candidates: Vec<String> = env
                .into_iter()
                .chain(FONT_CANDIDATES.iter().map(|s| s.to_string()))
                .collect();
            let Some((path, bytes)) = candidates
                .iter()
                .find_map(|p| std::fs::read(p).ok().map(|b| (p.clone(), b)))
            else {
                return Err(candidates.join(", "));
            };
            // plotters keeps a 'static reference: the font lives as long as the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("bad:{path}"))
        })
        .clone()
        .map_err(|e| match e.strip_prefix("bad:") {
            Some(path) => PlotError::BadFont { path: path.into() },
            None => PlotError::NoFont { tried: e },
        })
}

/// Step-function points of the sorted `samples`, each sample raising the curve by
/// `rise`: with `rise = 1/n` an empirical CDF, with `rise = 1` a count over time. The
/// curve starts at (first sample, 0).
pub fn steps(samples: &[f64], rise: f64) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let mut out = Vec::with_capacity(2 * v.len());
    for (i, &x) in v.iter().enumerate() {
        out.push((x, i as f64 * rise));
        out.push((x, (i + 1) as f64 * rise));
    }
    out
}

/// Empirical CDF of `samples` as step points (fraction of samples <= x).
pub fn cdf(samples: &[f64]) -> Vec<(f64, f64)> {
    steps(samples, 1.0 / samples.len().max(1) as f64)
}

/// A tick label without trailing zeros: 0.25, 1, 10, 100.
pub fn tick(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A named set of samples (ms).
pub struct Series {
    pub label: String,
    pub samples: Vec<f64>,
}

/// One chart of a multi-chart picture.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

fn color(i: usize) -> RGBColor {
    // Distinguishable on white, in a fixed order so a mode keeps its colour across panels.
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(23, 190, 207),
        RGBColor(127, 127, 127),
    ];
    COLORS[i % COLORS.len()]
}

/// Run a drawing into `path`, naming the file in any error.
fn drawn(path: &Path, draw: impl FnOnce() -> Result<(), String>) -> Result<(), PlotError> {
    ensure_font()?;
    draw().map_err(|msg| PlotError::Draw {
        path: path.to_path_buf(),
        msg,
    })
}

fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

type Chart<'a, X, Y> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>;

/// A labelled line in the colour of series `i`.
fn line<'a, X, Y>(
    chart: &mut Chart<'a, X, Y>,
    points: Vec<(f64, f64)>,
    label: &str,
    i: usize,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let c = color(i);
    chart
        .draw_series(LineSeries::new(points, c.stroke_width(2)))
        .map_err(text)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    Ok(())
}

fn legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut Chart<'a, X, Y>,
    at: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(text)
}

/// Range of the positive finite `values` with some room either side, for a log axis.
fn log_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|x| x.is_finite() && *x > 0.0)
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    (lo <= hi).then_some((lo / 1.5, hi * 1.5))
}

/// A white picture of `size` with `title` on top; returns the area below the title.
fn canvas<'a>(
    path: &'a Path,
    size: (u32, u32),
    title: &str,
) -> Result<DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>, String> {
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(text)?;
    root.titled(title, ("sans-serif", 22)).map_err(text)
}

/// Side-by-side CDFs, one panel each, on one shared logarithmic x axis (ms).
pub fn cdf_panels(
    path: &Path,
    title: &str,
    x_desc: &str,
    panels: &[Panel],
) -> Result<(), PlotError> {
    let all = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|s| s.samples.iter().copied()));
    let (lo, hi) = log_range(all).ok_or_else(|| PlotError::Empty(path.into()))?;
    drawn(path, || {
        let width = 120 + 560 * panels.len() as u32;
        let root = canvas(path, (width, 480), title)?;
        for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)
                .map_err(text)?;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .x_desc(x_desc)
                .y_desc("fraction of samples")
                .x_label_formatter(&|v| tick(*v))
                .draw()
                .map_err(text)?;
            for (i, s) in panel.series.iter().enumerate() {
                line(&mut chart, cdf(&s.samples), &s.label, i)?;
            }
            legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        }
        root.present().map_err(text)
    })
}

/// Counts over time: for each series, how many of its samples (instants, ms) have
/// happened by x. For "children ready since the request".
pub fn timeline(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    let x_max = series
        .iter()
        .flat_map(|s| s.samples.iter().copied())
        .filter(|x| x.is_finite())
        .fold(f64::NAN, f64::max);
    if x_max.is_nan() {
        return Err(PlotError::Empty(path.into()));
    }
    let y_max = series.iter().map(|s| s.samples.len()).max().unwrap_or(0) as f64;
    drawn(path, || {
        let root = canvas(path, (900, 540), title)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max * 1.05, 0f64..(y_max * 1.05).max(1.0))
            .map_err(text)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(text)?;
        for (i, s) in series.iter().enumerate() {
            let mut points = vec![(0.0, 0.0)];
            points.extend(steps(&s.samples, 1.0));
            line(&mut chart, points, &s.label, i)?;
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(text)
    })
}

/// One chart of grouped bars: `groups` along x, one bar per series in each group.
pub struct BarPanel {
    pub title: String,
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
}

pub struct BarSeries {
    pub label: String,
    /// Index into the palette: the same thing keeps its colour across panels even when
    /// a panel lacks some series.
    pub color: usize,
    /// `values[g]` for group g; None = no bar (e.g. a skipped method).
    pub values: Vec<Option<f64>>,
}

/// Grouped bars on a logarithmic y axis, panels side by side.
pub fn bar_panels(
    path: &Path,
    title: &str,
    y_desc: &str,
    panels: &[BarPanel],
) -> Result<(), PlotError> {
    let values = panels.iter().flat_map(|p| {
        p.series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied())
    });
    let (lo, hi) = log_range(values).ok_or_else(|| PlotError::Empty(path.into()))?;
    drawn(path, || {
        let width = 100 + 520 * panels.len() as u32;
        let root = canvas(path, (width, 560), title)?;
        for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
            bar_chart(area, panel, y_desc, (lo, hi))?;
        }
        root.present().map_err(text)
    })
}

/// An x axis of `n` groups over [0, n) whose only key points (labels, ticks) are the
/// group centres: one name under each group of bars. plotters' `with_key_points` would
/// do, but its axis has no default label formatting, which `configure_mesh` requires.
struct Groups(usize);

impl Ranged for Groups {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let frac = v / self.0 as f64;
        limit.0 + ((limit.1 - limit.0) as f64 * frac).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        (0..self.0).map(|g| g as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.0 as f64
    }
}

fn bar_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    panel: &BarPanel,
    y_desc: &str,
    (lo, hi): (f64, f64),
) -> Result<(), String> {
    let n = panel.groups.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(Groups(n), (lo..hi).log_scale())
        .map_err(text)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .disable_x_mesh()
        .y_desc(y_desc)
        .y_label_formatter(&|v| tick(*v))
        .x_label_formatter(&|v| {
            let g = v.floor() as usize;
            panel.groups.get(g).cloned().unwrap_or_default()
        })
        .draw()
        .map_err(text)?;
    let width = 0.8 / panel.series.len().max(1) as f64;
    for (s, series) in panel.series.iter().enumerate() {
        let c = color(series.color);
        let bars = series.values.iter().enumerate().filter_map(|(g, v)| {
            let x0 = g as f64 + 0.1 + s as f64 * width;
            v.map(|v| Rectangle::new([(x0, lo), (x0 + width * 0.9, v)], c.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(text)?
            .label(&series.label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_rises_one_sample_at_a_time_in_order() {
        let c = cdf(&[3.0, 1.0, 2.0, f64::NAN]);
        // A NaN sample is not drawn but still counts in n: the curve ends below 1,
        // showing that a sample is missing rather than hiding it.
        assert_eq!(c.first(), Some(&(1.0, 0.0)));
        assert_eq!(c.len(), 6);
        assert_eq!(c[1], (1.0, 0.25));
        assert_eq!(c.last(), Some(&(3.0, 0.75)));
        let c = cdf(&[5.0, 4.0]);
        assert_eq!(c, vec![(4.0, 0.0), (4.0, 0.5), (5.0, 0.5), (5.0, 1.0)]);
        assert!(cdf(&[]).is_empty());
    }

    #[test]
    fn ticks_drop_trailing_zeros() {
        assert_eq!(tick(1.0), "1");
        assert_eq!(tick(100.0), "100");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(2.5), "2.5");
    }

    #[test]
    fn timeline_counts_children_ready_by_each_instant() {
        let t = steps(&[10.0, 2.0, 2.0], 1.0);
        assert_eq!(
            t,
            vec![
                (2.0, 0.0),
                (2.0, 1.0),
                (2.0, 1.0),
                (2.0, 2.0),
                (10.0, 2.0),
                (10.0, 3.0)
            ]
        );
    }

    #[test]
    fn log_range_spans_positive_samples_only() {
        let (lo, hi) = log_range([0.0, 2.0, 300.0, f64::INFINITY].into_iter()).unwrap();
        assert!((lo - 2.0 / 1.5).abs() < 1e-9 && (hi - 450.0).abs() < 1e-9);
        assert!(log_range([0.0, -1.0, f64::NAN].into_iter()).is_none());
    }

    #[test]
    fn draws_a_png_when_a_font_is_installed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cdf.png");
        let panel = Panel {
            title: "idle".into(),
            series: vec![Series {
                label: "fork".into(),
                samples: vec![1.0, 1.5, 2.0],
            }],
        };
        match cdf_panels(&out, "t", "ms", &[panel]) {
            Err(PlotError::NoFont { tried }) => {
                eprintln!("skipped: no TTF font here ({tried})");
            }
            other => {
                other.unwrap();
                let bytes = std::fs::read(&out).unwrap();
                assert_eq!(&bytes[1..4], b"PNG");
            }
        }
    }
}
