//! Where each field of a configuration file is written, so that errors found after parsing can
//! name a line and a column and show the line.
//!
//! A [`SourceMap`] walks a file's YAML events (with the parser behind serde-saphyr) and records,
//! for every node, its field path in the form the validator reports — `blueprints[0].instance.
//! steps[1].target` — and its position. A scalar or a flow collection is located where its value
//! starts; a block collection under a key is located at its key, which is the line a reader looks
//! for. A path that was not written (a missing field) is located at its nearest written ancestor.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser, Span, StructureStyle};

/// A position in a file: 1-based line and column (in characters), and how many characters the
/// node spans on that line (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// Characters to underline, at least 1.
    pub width: usize,
}

impl Position {
    fn of(span: &Span) -> Self {
        let (start, end) = (span.start, span.end);
        let width = if end.line() == start.line() {
            end.col().saturating_sub(start.col())
        } else {
            1
        };
        Self {
            line: start.line(),
            column: start.col() + 1,
            width: width.max(1),
        }
    }
}

/// The positions of the fields of one file, and its lines for snippets.
#[derive(Debug, Default)]
pub struct SourceMap {
    positions: HashMap<String, Position>,
    /// Where each mapping key is written, by the path of its value.
    keys: HashMap<String, Position>,
    lines: Vec<String>,
}

impl SourceMap {
    /// Maps the first document of `text`. Events after a syntax error are not mapped (such a
    /// file never reaches validation anyway).
    pub fn new(text: &str) -> Self {
        let mut map = Self {
            positions: HashMap::new(),
            keys: HashMap::new(),
            lines: text.lines().map(str::to_owned).collect(),
        };
        let mut events = Parser::new_from_str(text)
            .map_while(Result::ok)
            .skip_while(|(e, _)| !e.is_node())
            .peekable();
        map.walk(&mut events, String::new(), None);
        map
    }

    fn walk<'a>(
        &mut self,
        events: &mut std::iter::Peekable<impl Iterator<Item = (Event<'a>, Span)>>,
        path: String,
        key: Option<Position>,
    ) {
        let Some((event, span)) = events.next() else {
            return;
        };
        let here = Position::of(&span);
        let block_under_key = |style: StructureStyle| match (style, key) {
            (StructureStyle::Block, Some(key)) => key,
            _ => here,
        };
        match event {
            Event::SequenceStart(style, ..) => {
                self.positions.insert(path.clone(), block_under_key(style));
                let mut i = 0;
                while events
                    .peek()
                    .is_some_and(|(e, _)| !matches!(e, Event::SequenceEnd))
                {
                    self.walk(events, format!("{path}[{i}]"), None);
                    i += 1;
                }
                events.next();
            }
            Event::MappingStart(style, ..) => {
                self.positions.insert(path.clone(), block_under_key(style));
                while events
                    .peek()
                    .is_some_and(|(e, _)| !matches!(e, Event::MappingEnd))
                {
                    let key = match events.peek() {
                        Some((Event::Scalar(name, ..), span)) => {
                            Some((name.to_string(), Position::of(span)))
                        }
                        _ => None,
                    };
                    match key {
                        Some((name, at)) => {
                            events.next();
                            let child = if path.is_empty() {
                                name
                            } else {
                                format!("{path}.{name}")
                            };
                            self.keys.insert(child.clone(), at);
                            self.walk(events, child, Some(at));
                        }
                        // A complex key: skip it and its value; neither has a field path.
                        None => {
                            let mut scratch = Self::default();
                            scratch.walk(events, String::new(), None);
                            scratch.walk(events, String::new(), None);
                        }
                    }
                }
                events.next();
            }
            Event::Scalar(..) | Event::Alias(..) => {
                self.positions.insert(path, here);
            }
            // Metadata that is not a node (anchors, comments): the node follows.
            _ if !event.is_node() => self.walk(events, path, key),
            _ => {}
        }
    }

    /// The position of `field`, or of its nearest ancestor that is written in the file.
    pub fn locate(&self, field: &str) -> Option<Position> {
        let mut path = field;
        loop {
            if let Some(p) = self.positions.get(path) {
                return Some(*p);
            }
            if path.is_empty() {
                return None;
            }
            let cut = path.rfind(['.', '[']).unwrap_or(0);
            path = &path[..cut];
        }
    }

    /// Where the key of `field` is written (`stepz` in `stepz: []`); for a field that is not a
    /// mapping key, where [`locate`](Self::locate) places it.
    pub fn locate_key(&self, field: &str) -> Option<Position> {
        self.keys.get(field).copied().or_else(|| self.locate(field))
    }

    /// The keys written in the mapping at `field`, in no particular order.
    pub fn keys_of<'a>(&'a self, field: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.keys.keys().filter_map(move |path| {
            let rest = if field.is_empty() {
                path.as_str()
            } else {
                path.strip_prefix(field)?.strip_prefix('.')?
            };
            (!rest.contains(['.', '['])).then_some(rest)
        })
    }

    /// The paths of every key named `name`, anywhere in the file.
    pub fn keys_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.keys
            .keys()
            .map(String::as_str)
            .filter(move |path| path.rsplit_once('.').map_or(*path, |(_, last)| last) == name)
    }

    /// Line `n` (1-based) of the file.
    pub fn line(&self, n: usize) -> Option<&str> {
        n.checked_sub(1)
            .and_then(|i| self.lines.get(i))
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "\
targets:
  pg: {kind: postgres, url_env: PG}
blueprints:
- service: s
  plan: p
  instance:
    steps:
    - name: one
      target: nope
      templates: [a, {kind: X}]
";

    fn at(field: &str) -> (usize, usize, usize) {
        let p = SourceMap::new(YAML).locate(field).unwrap();
        (p.line, p.column, p.width)
    }

    #[test]
    fn locates_values_keys_and_ancestors() {
        assert_eq!(at("targets.pg"), (2, 7, 1), "a flow mapping at its brace");
        assert_eq!(at("targets.pg.url_env"), (2, 33, 2));
        assert_eq!(at("blueprints[0].plan"), (5, 9, 1));
        assert_eq!(
            at("blueprints[0].instance"),
            (6, 3, 8),
            "a block mapping at its key"
        );
        assert_eq!(at("blueprints[0].instance.steps[0].target"), (9, 15, 4));
        assert_eq!(
            at("blueprints[0].instance.steps[0].templates[1]"),
            (10, 22, 1)
        );
        assert_eq!(
            at("blueprints[0].instance.steps[0].templates[1].kind"),
            (10, 29, 1)
        );
        assert_eq!(at("blueprints[0].instance.steps[0].when"), (8, 7, 1));
        assert_eq!(at("blueprints[3]"), (3, 1, 10), "the list, at its key");
        assert_eq!(SourceMap::new(YAML).line(9), Some("      target: nope"));
    }
}
