//! Metrics for monitoring, in the Prometheus text exposition format (version 0.0.4), written
//! to a file a node_exporter textfile collector reads (`--metrics-file`).
//!
//! [`Exposition`] is a small typed writer: metric families (name, help, type) with samples
//! (labels, value), rendered with `# HELP` and `# TYPE` lines and label values escaped as the
//! format says (`\\`, `\"`, `\n`). [`write()`] replaces the file atomically
//! (`crate::state::durable`: a temp file beside it, fsync, rename), so the collector never reads half
//! a file; the temp name does not end in `.prom`, which the collector ignores.
//!
//! Which series a sweep and doctor write, and what they mean: [`report`] (and the README's
//! "Metrics" section). Each run rewrites the file, so every value is the last run's: gauges
//! named `natledger_<command>_last_…`.

pub mod report;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::state::durable;

pub use report::{doctor, sweep};

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Gauge,
    Counter,
}

impl Type {
    fn name(self) -> &'static str {
        match self {
            Type::Gauge => "gauge",
            Type::Counter => "counter",
        }
    }
}

/// One metric family: its samples share name, help and type.
#[derive(Debug)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: Type,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    /// Add a sample with these labels (names are constants, values any text).
    pub fn sample(&mut self, labels: &[(&'static str, &str)], value: f64) -> &mut Self {
        debug_assert!(
            labels.iter().all(|(n, _)| valid_label_name(n)),
            "{labels:?}"
        );
        let labels = labels.iter().map(|(n, v)| (*n, v.to_string())).collect();
        self.samples.push((labels, value));
        self
    }
}

/// A whole exposition: metric families in the order they were added.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new gauge family. Names follow Prometheus' conventions (checked in debug builds):
    /// `natledger_` prefix, base units, no `_total`.
    pub fn gauge(&mut self, name: &'static str, help: &'static str) -> &mut Family {
        self.family(name, help, Type::Gauge)
    }

    /// A new counter family; its name ends in `_total`.
    pub fn counter(&mut self, name: &'static str, help: &'static str) -> &mut Family {
        debug_assert!(name.ends_with("_total"), "{name}");
        self.family(name, help, Type::Counter)
    }

    fn family(&mut self, name: &'static str, help: &'static str, kind: Type) -> &mut Family {
        debug_assert!(valid_metric_name(name), "{name}");
        debug_assert!(self.families.iter().all(|f| f.name != name), "{name} twice");
        debug_assert!(kind == Type::Counter || !name.ends_with("_total"), "{name}");
        self.families.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    /// The families' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.families.iter().map(|f| f.name)
    }

    /// The text format: per family `# HELP`, `# TYPE`, then one line per sample.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.name());
            for (labels, value) in &f.samples {
                out.push_str(f.name);
                if !labels.is_empty() {
                    out.push('{');
                    for (i, (name, value)) in labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{name}=\"{}\"", escape_label_value(value));
                    }
                    out.push('}');
                }
                let _ = writeln!(out, " {}", format_value(*value));
            }
        }
        out
    }
}

/// A label value as the text format quotes it: backslash, double quote and line feed escaped.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A `# HELP` text: backslash and line feed escaped (a double quote is kept).
pub fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value: integers without a fraction, `NaN`, `+Inf`, `-Inf` as the format spells
/// them, anything else as Rust's shortest round-tripping decimal.
pub fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

/// What [`write()`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// The file was replaced.
    Replaced,
    /// The file's directory does not exist (no node_exporter textfile collector on this host):
    /// nothing was created.
    NoDirectory(PathBuf),
}

#[derive(Debug, Error)]
#[error("writing metrics: {action} {}", path.display())]
pub struct WriteError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Replace `path` with `text` atomically (mode 0644: node_exporter runs as another user).
/// When `path`'s directory does not exist, nothing is created: [`Written::NoDirectory`].
pub fn write(path: &Path, text: &str) -> Result<Written, WriteError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Written::NoDirectory(dir.to_path_buf()));
        }
        // Anything else in the way (a file, no permission) fails the create below, naming it.
        _ => {}
    }
    let name = path.file_name().ok_or_else(|| WriteError {
        action: "naming",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"),
    })?;
    // Not `*.prom`: the collector never reads the temp file.
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    durable::replace(path, &tmp, text.as_bytes(), 0o644).map_err(|f| {
        // A temp file left by a failed write or rename goes (best effort; after the rename
        // there is none).
        if f.action != "create" {
            let _ = std::fs::remove_file(&tmp);
        }
        WriteError {
            action: f.action,
            path: f.path,
            source: f.source,
        }
    })?;
    Ok(Written::Replaced)
}

/// [`write()`] for the commands' `--metrics-file`: `None` writes nothing; a missing directory is
/// a warning on stderr, not an error (see the README's "Metrics").
pub fn write_option(path: Option<&Path>, exposition: &Exposition) -> Result<(), WriteError> {
    let Some(path) = path else {
        return Ok(());
    };
    if let Written::NoDirectory(dir) = write(path, &exposition.render())? {
        log::warn!(
            "metrics not written: {} does not exist (no textfile collector \
             here?)",
            dir.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
