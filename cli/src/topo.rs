//! `numapin topo`: the machine at a glance.

use std::path::PathBuf;

use crate::error::{CliError, Result};
use crate::output;
use crate::source::TopoSource;

/// Arguments of `numapin topo`.
#[derive(Debug, clap::Args)]
pub(crate) struct TopoArgs {
    /// Where the description comes from.
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// Print the JSON form (schema in docs/topology-json.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write this machine's hwloc XML to FILE (for a bug report):
    /// written only once the machine has been described without error,
    /// through a temporary file renamed over FILE.
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
        // Everything that can be refused is refused before the file is
        // touched: the target, then the description itself.
        output::check_target(path, "--export")?;
    }
    let t = a.source.topology()?;
    if let Some(path) = &a.export {
        let xml = numapin::topology::export_live_xml()?;
        output::write_file(path, &xml, "--export")?;
        output::eprintln(&format!(
            "numapin: wrote this machine's hwloc XML to {}",
            path.display()
        ));
    }
    if a.json {
        output::println(&t.to_json())?;
    } else {
        output::print(&t.to_text())?;
    }
    Ok(0)
}
