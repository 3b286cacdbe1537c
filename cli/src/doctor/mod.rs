//! `numapin doctor`: what is misconfigured on this machine. The checks are
//! the library's ([`numapin::doctor`]); this command runs them and prints
//! them, as text or JSON, and turns a failed check into exit code 1.

mod report;
mod text;

use crate::error::Result;
use crate::source::TopoSource;
use numapin::doctor::DoctorOptions;

/// Arguments of `numapin doctor`.
#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    /// Where the description comes from. With `--input`, only the checks of
    /// the described topology run; those that read this machine's live
    /// state (limits, driver, memory policy, kernel settings, pin probe)
    /// are listed as not run.
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// Print the checks as JSON (`{"checks":[{"name","verdict","evidence","fix","gpu","node","nic","subject"}],"huge_pages":{...},...}`).
    #[arg(long)]
    pub(crate) json: bool,
    /// Do not pin a probe region on each NUMA node.
    #[arg(long)]
    pub(crate) no_pin_probe: bool,
}

pub(crate) fn run(a: &DoctorArgs) -> Result<i32> {
    let t = a.source.topology()?;
    let opts = DoctorOptions::default()
        .with_live_state(a.source.input.is_none())
        .with_cuda(!a.source.no_cuda)
        .with_pin_probe(!a.no_pin_probe);
    let found = numapin::doctor::run(&t, &opts);
    let report = report::Report::new(&t.source, &found, a.no_pin_probe);
    if a.json {
        crate::output::println(
            &serde_json::to_string_pretty(&report).expect("a report always serializes"),
        )?;
    } else {
        crate::output::print(&text::render(&report))?;
    }
    Ok(report.summary.exit_code)
}
