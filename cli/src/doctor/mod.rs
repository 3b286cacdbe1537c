//! `numapin doctor`: what is misconfigured on this machine.

use serde::Serialize;

use crate::TopoSource;
mod checks;
mod containers;
mod huge_pages;
mod pin_probe;
mod report;
mod storage;
pub(crate) mod system;

pub(crate) use report::*;

use crate::error::Result;
use report as doctor;

/// Arguments of `numapin doctor`.
#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {
    /// Where the description comes from. With `--input`, only the checks of
    /// the described topology run; those that read this machine's live
    /// state (limits, driver, memory policy, kernel settings, pin probe)
    /// are listed as not run.
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// Print the checks as JSON (`{"checks":[{"name","verdict","evidence","fix","gpu","node","nic"}],"huge_pages":{...},...}`).
    #[arg(long)]
    pub(crate) json: bool,
    /// Do not pin a probe region on each NUMA node.
    #[arg(long)]
    pub(crate) no_pin_probe: bool,
}

/// A check that was not run, and why.
#[derive(Debug, Serialize)]
struct NotRun {
    name: &'static str,
    reason: String,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    source: &'a str,
    checks: &'a [Check],
    /// Each node's hugetlb pools and the THP mode (this machine only).
    huge_pages: Option<&'a huge_pages::HugePagesView>,
    not_run: Vec<NotRun>,
    summary: Summary,
}

#[derive(Debug, Serialize)]
struct Summary {
    ok: usize,
    warn: usize,
    fail: usize,
    exit_code: i32,
}

pub(crate) fn run(a: &DoctorArgs) -> Result<i32> {
    let t = a.source.topology()?;
    let live = a.source.input.is_none();
    let opts = DoctorOptions {
        live,
        cuda: !a.source.no_cuda,
        pin_probe: !a.no_pin_probe,
        ..Default::default()
    };
    let (checks, view) = doctor::run_checks(&t, &opts);
    let mut not_run = Vec::new();
    if !live {
        for &name in doctor::LIVE_CHECKS {
            not_run.push(NotRun {
                name,
                reason: format!("reads this machine's live state, not {}'s", t.source),
            });
        }
    } else if !opts.pin_probe {
        not_run.push(NotRun {
            name: "pin_probe",
            reason: "--no-pin-probe".into(),
        });
    }
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    let code = doctor::exit_code(&checks);
    let report = Report {
        source: &t.source,
        checks: &checks,
        huge_pages: view.as_ref().map(|v| &v.huge_pages),
        not_run,
        summary: Summary {
            ok: count(Verdict::Ok),
            warn: count(Verdict::Warn),
            fail: count(Verdict::Fail),
            exit_code: code,
        },
    };
    if a.json {
        crate::output::println(
            &serde_json::to_string_pretty(&report).expect("a report always serializes"),
        )?;
    } else {
        crate::output::print(&render(&report))?;
    }
    Ok(code)
}

fn subject(c: &Check) -> String {
    match (c.gpu, c.node, c.nic) {
        (Some(g), _, _) => format!("{} (GPU {g})", c.name),
        (None, Some(n), _) => format!("{} (node {n})", c.name),
        (None, None, Some(n)) => format!("{} (NIC {n})", c.name),
        (None, None, None) => c.name.to_string(),
    }
}

/// The text report: one line per check, verdict first, its fix under it.
fn render(r: &Report) -> String {
    let mut out = String::new();
    if r.source == "live" {
        out.push_str("numapin doctor: this machine\n\n");
    } else {
        out.push_str(&format!(
            "numapin doctor: {} (a saved machine: only the checks of its topology)\n\n",
            r.source
        ));
    }
    let width = r.checks.iter().map(|c| subject(c).len()).max().unwrap_or(0);
    for c in r.checks {
        let v = match c.verdict {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        };
        out.push_str(&format!("{v:<4}  {:<width$}  {}\n", subject(c), c.evidence));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("      {:<width$}  fix: {fix}\n", ""));
        }
    }
    if let Some(h) = r.huge_pages {
        out.push('\n');
        out.push_str(&h.render());
    }
    if !r.not_run.is_empty() {
        let names: Vec<&str> = r.not_run.iter().map(|n| n.name).collect();
        out.push_str(&format!(
            "\nnot run: {} ({})\n",
            names.join(", "),
            r.not_run[0].reason
        ));
    }
    let s = &r.summary;
    out.push_str(&format!(
        "\n{} checks: {} ok, {} warn, {} fail\n",
        r.checks.len(),
        s.ok,
        s.warn,
        s.fail
    ));
    out
}

/// Test helper: fails naming the first of `parts` that `text` lacks.
#[cfg(test)]
#[track_caller]
pub(crate) fn assert_contains_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}
