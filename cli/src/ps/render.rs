//! The text and JSON forms of a `numapin ps` report.

use numapin::doctor::{Check, Subject, Verdict};
use numapin::procs::{DriverReport, NodeUse, ProcessReport, Unlisted};
use numapin::runtime::MachineUsage;
use numapin::text::{fmt_bytes, Table};

use super::Report;
use crate::error::Result;

/// Prints one pass: pretty JSON, one JSON line per pass with --watch, or text.
pub(super) fn print(r: &Report, json: bool, watch: bool) -> Result<()> {
    if json {
        let text = if watch {
            serde_json::to_string(r)
        } else {
            serde_json::to_string_pretty(r)
        };
        return crate::output::println(&text.expect("a report always serializes"));
    }
    crate::output::print(&text(r, watch))
}

/// The whole text report.
fn text(r: &Report, watch: bool) -> String {
    let mut out = String::new();
    let what = if r.named {
        format!("{} process(es) named", r.processes.len())
    } else {
        format!(
            "{} process(es) with a GPU open, of {} looked at",
            r.processes.len(),
            r.looked_at
        )
    };
    let machine = if r.source == "live" {
        "this machine".to_string()
    } else {
        format!("judged against {}", r.source)
    };
    let pass = if watch {
        format!("pass {} at +{:.1} s; ", r.pass, r.elapsed_s)
    } else {
        String::new()
    };
    let root = if r.root == "/" {
        String::new()
    } else {
        format!("; processes under {}", r.root)
    };
    out.push_str(&format!("numapin ps: {pass}{what} ({machine}{root})\n"));
    out.push_str(&gpu_source(&r.nvml));
    for p in &r.processes {
        out.push('\n');
        process(&mut out, p);
    }
    if !r.nodes.is_empty() && !r.processes.is_empty() {
        out.push('\n');
        nodes(&mut out, &r.nodes);
        checks(&mut out, &r.node_checks, "");
    }
    for m in &r.machine_budget {
        out.push('\n');
        machine_budget(&mut out, m);
    }
    unlisted(
        &mut out,
        &r.unreadable,
        "not readable by this user (run as root, or as their user, to check them)",
    );
    unlisted(&mut out, &r.exited, "ended while read");
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    nvml_notes(&mut out, &r.nvml, r.named);
    let s = &r.summary;
    let skip = if s.skip > 0 {
        format!(", {} skip", s.skip)
    } else {
        String::new()
    };
    out.push_str(&format!(
        "\n{} process(es); checks: {} ok, {} warn, {} fail{skip}\n",
        r.processes.len(),
        s.ok,
        s.warn,
        s.fail
    ));
    out
}

/// Where the processes' GPUs come from, in one line.
fn gpu_source(d: &DriverReport) -> String {
    match (&d.lists, &d.unavailable) {
        (Some(l), _) => {
            let who = if d.asked == "given" {
                "the given per-GPU process lists".to_string()
            } else {
                let version = l
                    .driver_version
                    .as_deref()
                    .map_or(String::new(), |v| format!("driver {v}; "));
                format!(
                    "NVML's per-GPU process lists ({version}{} GPU(s); {:.2} s)",
                    l.gpus.len(),
                    d.elapsed_s
                )
            };
            format!("GPUs of each process: {who}; device files where NVML lists no context of it (approximate)\n")
        }
        (None, why) => format!(
            "GPUs of each process: device files, approximate (the CUDA driver opens and maps every GPU it can see): {}\n",
            why.as_deref().unwrap_or("NVML not asked")
        ),
    }
}

/// What NVML said beside the lists: older calls used, GPUs whose lists
/// failed, and (a scan) processes it lists that were not read.
fn nvml_notes(out: &mut String, d: &DriverReport, named: bool) {
    let Some(l) = &d.lists else {
        return;
    };
    for n in &l.notes {
        out.push_str(&format!("note: NVML: {n}\n"));
    }
    for g in &l.gpus {
        if let Some(e) = &g.error {
            let name = match (g.gpu, &g.bus_id) {
                (Some(i), Some(b)) => format!("GPU {i} ({b})"),
                (None, Some(b)) => b.clone(),
                _ => "a GPU of unknown bus id".into(),
            };
            out.push_str(&format!("note: NVML: {name}: {e}\n"));
        }
    }
    if !named && !d.not_read.is_empty() {
        let pids: Vec<String> = d.not_read.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "note: NVML lists {} process(es) not read here (another user's, or ended meanwhile): pid {}\n",
            pids.len(),
            pids.join(", ")
        ));
    }
}

/// A process: header, facts, checks.
fn process(out: &mut String, p: &ProcessReport) {
    let s = &p.snapshot;
    let uid = s.uid.map_or(String::new(), |u| format!("  uid {u}"));
    let cmd = if s.cmdline.is_empty() {
        format!("[{}]", s.command)
    } else {
        s.cmdline.clone()
    };
    // Its own pid, where it runs in another PID namespace (a container).
    let inner = match s.nspid.as_slice() {
        [_, .., last] => format!(" ({last} in its own PID namespace)"),
        _ => String::new(),
    };
    out.push_str(&format!(
        "pid {}{inner}  {}{uid}  {cmd}\n",
        s.pid, s.command
    ));
    for f in &p.facts {
        out.push_str(&format!("    {f}\n"));
    }
    checks(out, &p.checks, "  ");
}

/// Checks as `numapin doctor` prints them: verdict, name, evidence; the fix
/// below. A process's checks sit under it; others name their subject.
fn checks(out: &mut String, cs: &[Check], indent: &str) {
    let names: Vec<String> = cs
        .iter()
        .map(|c| match (&c.subject, c.subject.label()) {
            (Subject::Process(_), _) | (_, None) => c.name.to_string(),
            (_, Some(l)) => format!("{} ({l})", c.name),
        })
        .collect();
    let width = names.iter().map(String::len).max().unwrap_or(0);
    for (c, name) in cs.iter().zip(&names) {
        let v = match c.verdict {
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Ok => "ok",
            _ => "skip",
        };
        out.push_str(&format!("{indent}{v:<4}  {name:<width$}  {}\n", c.evidence));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("{indent}      {:<width$}  fix: {fix}\n", ""));
        }
    }
}

/// The table per node.
fn nodes(out: &mut String, rows: &[NodeUse]) {
    let mut t = Table::new([
        "NODE", "MEMORY", "BUDGET", "DATA", "FILES", "NUMAPIN", "PROCS",
    ]);
    for r in rows {
        t.row([
            r.node.to_string(),
            fmt_bytes(r.memory_bytes),
            fmt_bytes(r.default_budget_bytes),
            fmt_bytes(r.data_bytes),
            fmt_bytes(r.file_bytes),
            fmt_bytes(r.numapin_pinned_bytes),
            r.processes.to_string(),
        ]);
    }
    out.push_str(&t.render());
    out.push_str("DATA, FILES = the listed processes' own memory and mapped files on the node; BUDGET = one numapin runtime's default pinned budget (half the node); NUMAPIN = what their numapin arenas pin there\n");
}

/// The machine budget of one state file: a line per node with live
/// holders.
fn machine_budget(out: &mut String, m: &MachineUsage) {
    out.push_str(&format!(
        "machine budget of user {} ({}): what every numapin process of the user pins per node\n",
        m.uid,
        m.path.display()
    ));
    let mut t = Table::new(["NODE", "BUDGET", "USED", "BY"]);
    for n in &m.nodes {
        let budget = if n.limit_min == n.limit_max {
            fmt_bytes(n.limit_min)
        } else {
            format!("{} to {}", fmt_bytes(n.limit_min), fmt_bytes(n.limit_max))
        };
        let by: Vec<String> = n.holders.iter().map(ToString::to_string).collect();
        t.row([n.node.to_string(), budget, fmt_bytes(n.used), by.join(", ")]);
    }
    out.push_str(&t.render());
}

/// A line for processes not listed.
fn unlisted(out: &mut String, list: &[Unlisted], what: &str) {
    if list.is_empty() {
        return;
    }
    const SHOWN: usize = 10;
    let shown: Vec<String> = list
        .iter()
        .take(SHOWN)
        .map(|u| match &u.command {
            Some(c) => format!("{} ({c})", u.pid),
            None => u.pid.to_string(),
        })
        .collect();
    let more = if list.len() > SHOWN {
        format!(" and {} more", list.len() - SHOWN)
    } else {
        String::new()
    };
    out.push_str(&format!(
        "\n{what}: {} process(es): pid {}{more}\n",
        list.len(),
        shown.join(", ")
    ));
    if list.len() <= SHOWN {
        for u in list {
            out.push_str(&format!("    pid {}: {}\n", u.pid, u.why));
        }
    }
}
