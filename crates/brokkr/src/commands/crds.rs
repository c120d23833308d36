//! `brokkr crds`: the CustomResourceDefinitions of brokkr's controllers, generated from their Rust
//! types, as a YAML stream or a JSON `List` for `kubectl apply -f -`.

use anyhow::Result;
use clap::{Args, ValueEnum};

#[derive(Args)]
pub struct CrdsArgs {
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Yaml)]
    output: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// One YAML document per CRD.
    Yaml,
    /// A `v1` `List` of every CRD.
    Json,
}

/// Prints every CRD.
pub async fn run(args: CrdsArgs) -> Result<()> {
    let crds = brokkr_controller::resources::crds();
    match args.output {
        Format::Yaml => {
            for crd in &crds {
                println!("---\n{}", serde_saphyr::to_string(crd)?.trim_end());
            }
        }
        Format::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": crds});
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
    }
    Ok(())
}
