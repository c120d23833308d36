//! One module per `brokkr` command, each an `async fn run(args) -> anyhow::Result<()>`.

pub mod bench;
pub mod catalog;
pub mod check;
pub mod controller;
pub mod crds;
pub mod osb;
pub mod render;
pub mod seed;
pub mod serve;
pub mod store;
pub mod upgrade;
