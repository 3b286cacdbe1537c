//! `numapin topo`: the machine at a glance.

use std::path::PathBuf;

use crate::error::{CliError, Result};
use crate::TopoSource;

/// Arguments of `numapin topo`.
#[derive(Debug, clap::Args)]
pub(crate) struct TopoArgs {
    /// Where the description comes from.
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// Print the JSON form (schema in docs/topology-json.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write this machine's hwloc XML to FILE (for a bug report).
    #[arg(long, value_name = "FILE")]
    pub(crate) export: Option<PathBuf>,
}

pub(crate) fn run(a: &TopoArgs) -> Result<i32> {
    if let Some(path) = &a.export {
        if a.source.input.is_some() {
            return Err(CliError::Usage {
                problem:
                    "--export writes this machine's topology and cannot be combined with --input"
                        .into(),
                fix: "drop one of the two options".into(),
            });
        }
        numapin::internals::export_live_xml(path)?;
        eprintln!(
            "numapin: wrote this machine's hwloc XML to {}",
            path.display()
        );
    }
    let t = a.source.topology()?;
    if a.json {
        println!("{}", t.to_json());
    } else {
        print!("{}", t.to_text());
    }
    Ok(0)
}
