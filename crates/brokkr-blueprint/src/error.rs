//! Configuration errors: each names the file, the field and, where known, the line and column,
//! and shows the line with a caret, rustc-style.

use std::fmt;

use crate::span::{Position, SourceMap};

/// One problem in a configuration, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as given.
    pub file: String,
    /// The field path, e.g. `catalog.services[0].plans[1].id`; empty when the problem is not
    /// one field's (a syntax error, an unreadable file).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// 1-based line of the field (or of its nearest written ancestor); 0 when unknown.
    pub line: usize,
    /// 1-based column, in characters; 0 when unknown.
    pub column: usize,
    /// The source line, for the snippet; empty when it is not shown.
    pub source: String,
    /// How many characters of the line the caret underlines.
    pub width: usize,
}

impl ConfigError {
    pub(crate) fn new(file: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            field: field.into(),
            message: message.into(),
            line: 0,
            column: 0,
            source: String::new(),
            width: 0,
        }
    }

    /// Places the error at `position` of `map`, with the line as its snippet. Lines of the
    /// broker's credentials, and lines that may hold a literal password, token or key, are never
    /// shown.
    pub(crate) fn at(mut self, map: &SourceMap, position: Option<Position>) -> Self {
        if let Some(p) = position {
            self.line = p.line;
            self.column = p.column;
            self.width = p.width;
            let sensitive = self.field.contains("auth")
                || map.line(p.line).is_some_and(|l| {
                    let l = l.to_ascii_lowercase();
                    ["password", "token", "private-key"]
                        .iter()
                        .any(|word| l.contains(word))
                        && !l.contains("{{")
                });
            if !sensitive {
                self.source = map.line(p.line).unwrap_or_default().to_owned();
            }
        }
        self
    }
}

/// `field: message`, then rustc-style `--> file:line:column` and the line with a caret.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)?;
        } else {
            write!(f, "{}: {}", self.field, self.message)?;
        }
        if self.line == 0 {
            return write!(f, "\n  --> {}", self.file);
        }
        let gutter = " ".repeat(self.line.to_string().len());
        write!(
            f,
            "\n{gutter}--> {}:{}:{}",
            self.file, self.line, self.column
        )?;
        if !self.source.is_empty() {
            let line = self.source.trim_end();
            // Columns count characters; a tab in the indentation is kept so carets line up.
            let pad: String = line
                .chars()
                .take(self.column - 1)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let carets = "^".repeat(self.width.max(1));
            write!(
                f,
                "\n{gutter} |\n{} | {line}\n{gutter} | {pad}{carets}",
                self.line
            )?;
        }
        Ok(())
    }
}

/// Every problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
