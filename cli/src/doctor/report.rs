//! What `numapin doctor` prints, as data: the checks that ran, the huge
//! page pools, the checks that did not run, and the summary with the exit
//! code (1 when any check fails). `--json` prints it as it is.

use serde::Serialize;

use numapin::doctor::{Check, Verdict};
use numapin::system::HugePages;

/// A check that was not run, and why.
#[derive(Debug, Serialize)]
pub(super) struct NotRun {
    pub(super) name: &'static str,
    pub(super) reason: String,
}

/// The counts per verdict and the exit code.
#[derive(Debug, Serialize)]
pub(super) struct Summary {
    pub(super) ok: usize,
    pub(super) warn: usize,
    pub(super) fail: usize,
    pub(super) exit_code: i32,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub(super) struct Report<'a> {
    /// `live`, or the `--input` path.
    pub(super) source: &'a str,
    /// The checks that ran, in report order.
    pub(super) checks: Vec<&'a Check>,
    /// Each node's hugetlb pools and the THP mode (this machine only).
    pub(super) huge_pages: Option<&'a HugePages>,
    /// The checks that did not run.
    pub(super) not_run: Vec<NotRun>,
    pub(super) summary: Summary,
}

impl<'a> Report<'a> {
    /// The report of `found` for the topology of `source`; the skipped
    /// pin probe is said to be skipped by `--no-pin-probe` when that flag
    /// was given on this machine.
    pub(super) fn new(
        source: &'a str,
        found: &'a numapin::doctor::Report,
        no_pin_probe: bool,
    ) -> Self {
        let live = found.system.is_some();
        let (skipped, checks): (Vec<&Check>, Vec<&Check>) = found
            .checks
            .iter()
            .partition(|c| c.verdict == Verdict::Skip);
        let not_run = skipped
            .into_iter()
            .map(|c| NotRun {
                name: c.name,
                reason: if live && no_pin_probe && c.name == "pin_probe" {
                    "--no-pin-probe".into()
                } else {
                    c.evidence.clone()
                },
            })
            .collect();
        let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
        let summary = Summary {
            ok: count(Verdict::Ok),
            warn: count(Verdict::Warn),
            fail: count(Verdict::Fail),
            exit_code: i32::from(count(Verdict::Fail) > 0),
        };
        Report {
            source,
            checks,
            huge_pages: found.system.as_ref().map(|s| &s.huge_pages),
            not_run,
            summary,
        }
    }
}
