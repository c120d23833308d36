//! An example of a brokkr binary with a step kind written in Rust.
//!
//! `brokkr-custom` is the whole `brokkr` command plus a step kind named `record`, which appends
//! one line per run — `<instance id> <binding id or -> <step> <process id>` — to the file named
//! by the step's `with: {file: PATH}`. A blueprint uses it like any other step:
//!
//! ```yaml
//! steps:
//!   - {name: audit, run: record, with: {file: /var/log/brokkr-audit.log}}
//! ```
//!
//! Build it with `cargo build -p brokkr-example-custom-step`; run it as `brokkr-custom serve …`.
//! The test suite also uses it to count how often steps run across crashes.

use std::io::Write;
use std::sync::Arc;

use brokkr::step::{StepContext, StepKind, StepOutcome, async_trait};

/// Appends a line per run to a file; appending the same fact twice is harmless, which is what
/// makes it safe to run again after a crash.
struct Record;

#[async_trait]
impl StepKind for Record {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        let Some(path) = ctx.with["file"].as_str() else {
            return StepOutcome::Fail("`with: {file: PATH}` is required".into());
        };
        let key = &ctx.resource.key;
        let line = format!(
            "{} {} {} {}\n",
            key.instance_id,
            key.binding_id.as_deref().unwrap_or("-"),
            ctx.step,
            std::process::id()
        );
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        match written {
            Ok(()) => StepOutcome::Done,
            // A full disk may clear up: try again shortly.
            Err(e) => StepOutcome::retry(std::time::Duration::from_secs(1), format!("{path}: {e}")),
        }
    }
}

fn main() -> std::process::ExitCode {
    brokkr::main_with(brokkr::StepKinds::new().with("record", Arc::new(Record)))
}
