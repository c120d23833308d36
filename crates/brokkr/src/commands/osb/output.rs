//! How `brokkr osb` shows results: aligned tables like kubectl's, or JSON or YAML; and a live
//! progress line while it waits for an operation.

use std::io::{IsTerminal as _, Write as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use brokkr_osb::LastOperation;
use clap::ValueEnum;
use serde_json::Value;

/// Output format.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Format {
    /// Aligned columns with upper-case headers.
    Table,
    /// The result as JSON.
    Json,
    /// The result as YAML.
    Yaml,
}

/// Rows under upper-case headers.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: Vec<&'static str>) -> Self {
        Self {
            headers,
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text: columns padded to their widest cell, three spaces apart.
    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .chain([self.headers[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let line = |cells: Vec<&str>| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    text.push_str(cell);
                } else {
                    text.push_str(&format!("{cell:<w$}   ", w = widths[i]));
                }
            }
            text.trim_end().to_owned()
        };
        let mut out = vec![line(self.headers.clone())];
        for row in &self.rows {
            out.push(line(row.iter().map(String::as_str).collect()));
        }
        out.join("\n")
    }
}

/// Prints `value` as JSON or YAML, or `table` in table format.
pub fn print(format: Format, value: &Value, table: impl FnOnce() -> Table) -> Result<()> {
    let text = match format {
        Format::Table => table().render(),
        Format::Json => serde_json::to_string_pretty(value)?,
        Format::Yaml => serde_saphyr::to_string(value)?.trim_end().to_owned(),
    };
    println!("{text}");
    Ok(())
}

/// What the user sees while an operation runs, on stderr: on a terminal, one line redrawn in
/// place (a spinner, the elapsed time and the broker's description); otherwise a plain line each
/// time the description changes.
pub struct Progress {
    what: String,
    started: Instant,
    state: Arc<Mutex<String>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

impl Progress {
    /// Starts showing the progress of `what` (e.g. `provision of instance i1`).
    pub fn start(what: String) -> Self {
        let started = Instant::now();
        let state = Arc::new(Mutex::new(String::new()));
        let ticker = std::io::stderr().is_terminal().then(|| {
            let (what, state) = (what.clone(), state.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                for frame in SPINNER.iter().cycle() {
                    tick.tick().await;
                    let description = state.lock().map(|s| s.clone()).unwrap_or_default();
                    let elapsed = started.elapsed().as_secs();
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[2K{frame} {what} ({elapsed}s) {description}");
                    let _ = err.flush();
                }
            })
        });
        Self {
            what,
            started,
            state,
            ticker,
        }
    }

    /// Shows the state the broker reported.
    pub fn update(&self, last: &LastOperation) {
        let description = last.description.clone().unwrap_or_default();
        let Ok(mut shown) = self.state.lock() else {
            return;
        };
        if *shown == description {
            return;
        }
        if self.ticker.is_none() {
            eprintln!(
                "{} ({}s): {}: {description}",
                self.what,
                self.started.elapsed().as_secs(),
                last.state.as_str()
            );
        }
        *shown = description;
    }

    /// Clears the progress line.
    pub fn finish(self) {
        if let Some(ticker) = self.ticker {
            ticker.abort();
            eprint!("\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let mut t = Table::new(vec!["SERVICE", "PLAN", "BINDABLE"]);
        t.row(vec!["postgresql".into(), "s".into(), "true".into()]);
        t.row(vec!["x".into(), "large".into(), "".into()]);
        assert_eq!(
            t.render(),
            "SERVICE      PLAN    BINDABLE\n\
             postgresql   s       true\n\
             x            large"
        );
    }
}
