//! Step kinds written in Rust and compiled into a brokkr binary ([`StepKinds`]), which `serve`
//! offers to blueprints besides the built-in ones.

use std::sync::Arc;

use brokkr_engine::step::StepKind;

/// Step kinds written in Rust and compiled into a brokkr binary, by the name blueprints `run`.
#[derive(Clone, Default)]
pub struct StepKinds(pub(crate) Vec<(String, Arc<dyn StepKind>)>);

impl StepKinds {
    /// No step kinds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `kind` under `name`.
    pub fn with(mut self, name: &str, kind: Arc<dyn StepKind>) -> Self {
        self.0.push((name.to_owned(), kind));
        self
    }

    /// The names, in the order they were added.
    pub(crate) fn names(&self) -> Vec<String> {
        self.0.iter().map(|(name, _)| name.clone()).collect()
    }
}
