//! Every block of docs/configuration.md marked `yaml config` is a complete configuration that
//! loads; errors point at the lines of the file.

use brokkr_blueprint::load::load_str;

const DOC: &str = include_str!("../../../docs/configuration.md");

/// The `yaml config` blocks, with the line each starts on.
fn config_blocks() -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in DOC.lines().enumerate() {
        match &mut current {
            // Blank lines first, so that error positions are those of the file.
            None if line.trim_end() == "```yaml config" => {
                current = Some((i + 2, "\n".repeat(i + 1)));
            }
            Some((_, body)) if line.trim_end() != "```" => {
                body.push_str(line);
                body.push('\n');
            }
            Some(_) => out.extend(current.take()),
            None => {}
        }
    }
    assert!(current.is_none(), "unterminated `yaml config` block");
    out
}

#[test]
fn configuration_examples_load() {
    let blocks = config_blocks();
    assert!(blocks.len() >= 2, "only {} examples", blocks.len());
    for (line, body) in &blocks {
        if let Err(e) = load_str("docs/configuration.md", body) {
            panic!("the example starting at docs/configuration.md:{line} does not load:\n{e}");
        }
    }
}
