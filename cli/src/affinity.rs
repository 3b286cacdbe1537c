//! `numapin affinity`: print each local rank's binding.

use numapin::affinity::launcher;
use numapin::affinity::{
    plan, probe_memory_binding, Binding, MemPolicy, Plan, PlanOptions, RankPlan,
};
use numapin::text::Table;
use numapin::topology::Topology;
use numapin::{CpuList, CudaOrdinal};

use crate::error::{CliError, Result};
use crate::output;
use crate::source::{ModeArg, TopoSource};
use numapin::topology::limits::{MAX_GPUS, MAX_RANKS};

/// How the plan is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Aligned columns for a person, warnings below.
    Table,
    /// `{"mode":..,"ranks":[{"local_rank":0,"gpu":0,...}],"memory_binding":{"applies":..}}`.
    Json,
    /// `export NUMAPIN_CPUS_<rank>=...` lines (and unsuffixed ones for a
    /// single rank).
    Shell,
    /// A `numactl --physcpubind=... --membind=...` prefix per rank.
    Numactl,
    /// A `taskset -c ...` prefix per rank.
    Taskset,
}

/// Arguments of `numapin affinity`.
#[derive(Debug, clap::Args)]
pub(crate) struct AffinityArgs {
    /// Where the description comes from.
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// How CPUs are chosen: node, socket, exclusive, cache (core-complex), core.
    #[arg(long, value_enum, default_value_t = ModeArg::Node)]
    pub(crate) mode: ModeArg,
    /// CUDA devices, one per local rank, in rank order (`0-3`, `3,2,1,0`;
    /// default: every GPU this process sees). Devices 0-1023, at most 8192
    /// entries (ranks).
    #[arg(long, value_name = "LIST", conflicts_with = "local_rank")]
    pub(crate) gpus: Option<String>,
    /// Print only this local rank's binding (its GPU chosen as `numapin
    /// exec` would). 0-65535.
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(0..=i64::from(launcher::MAX_LOCAL_RANK)))]
    pub(crate) local_rank: Option<u32>,
    /// In core mode, one hardware thread per rank instead of the whole core.
    #[arg(long)]
    pub(crate) no_smt: bool,
    /// In numactl output, prefer the nodes instead of binding to them.
    #[arg(long)]
    pub(crate) preferred: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
    /// Print JSON (the same as `--format json`, as `topo`, `bench` and
    /// `doctor` take it).
    #[arg(long, conflicts_with = "format")]
    pub(crate) json: bool,
}

impl AffinityArgs {
    /// The output format asked for (`--json` or `--format`).
    fn output_format(&self) -> Format {
        if self.json {
            Format::Json
        } else {
            self.format
        }
    }
}

/// Parses `--gpus`: comma-separated ordinals or ranges, order kept; each
/// device below [`MAX_GPUS`], at most [`MAX_RANKS`] entries.
fn parse_gpus(text: &str) -> Result<Vec<CudaOrdinal>> {
    let shown = numapin::text::quote(text);
    let usage = |problem: String| {
        CliError::Usage {
        problem: format!("--gpus {shown}: {problem}"),
        fix: format!(
            "list CUDA devices (0-{}) like 0-3 or 3,2,1,0, one entry per rank, at most {MAX_RANKS} entries",
            MAX_GPUS - 1
        ),
    }
    };
    let mut out = Vec::new();
    for part in text.split(',') {
        let set = CpuList::parse(part).map_err(|e| usage(e.to_string()))?;
        if set.is_empty() {
            return Err(usage("has an empty entry".into()));
        }
        if let Some(o) = set.iter().find(|&o| o as usize >= MAX_GPUS) {
            return Err(usage(format!(
                "CUDA device {o} is beyond the limit of {MAX_GPUS} devices"
            )));
        }
        if out.len() + set.len() > MAX_RANKS {
            return Err(usage(format!(
                "lists more than {MAX_RANKS} ranks, the limit"
            )));
        }
        out.extend(set.iter().map(CudaOrdinal));
    }
    Ok(out)
}

fn no_gpus(t: &Topology) -> CliError {
    CliError::Usage {
        problem: format!("{} has no GPU this process sees", t.source),
        fix: "run on a machine with GPUs (check CUDA_VISIBLE_DEVICES), or bind to a NUMA node with `numapin exec --node N`".into(),
    }
}

pub(crate) fn run(a: &AffinityArgs) -> Result<i32> {
    let t = a.source.topology()?;
    let mut opts = PlanOptions::default();
    opts.smt = !a.no_smt;
    let mode = a.mode.into();
    let plan = match (&a.gpus, a.local_rank) {
        (Some(list), _) => {
            let ordinals = parse_gpus(list)?;
            let gpus = ordinals
                .iter()
                .map(|&o| launcher::gpu_of_ordinal(&t, o, "--gpus"))
                .collect::<Result<Vec<_>, _>>()?;
            plan(&t, &gpus, mode, &opts)?
        }
        (None, Some(r)) => {
            let (slot, gpu) = launcher::slot_for_rank(&t, r, "--local-rank")?;
            let mut p = plan(&t, &launcher::rank_gpus(&t), mode, &opts)?;
            if slot >= p.ranks.len() {
                return Err(CliError::Usage {
                    problem: format!("GPU {gpu} is not among the GPUs this process plans for"),
                    fix: "check CUDA_VISIBLE_DEVICES".into(),
                });
            }
            let mut one = p.ranks.swap_remove(slot);
            one.local_rank = r;
            Plan {
                mode: p.mode,
                ranks: vec![one],
            }
        }
        (None, None) => {
            let gpus = launcher::rank_gpus(&t);
            if gpus.is_empty() {
                return Err(no_gpus(&t));
            }
            plan(&t, &gpus, mode, &opts)?
        }
    };
    let policy = if a.preferred {
        MemPolicy::Preferred
    } else {
        MemPolicy::Bind
    };
    if a.output_format() != Format::Table && a.output_format() != Format::Json {
        for r in &plan.ranks {
            for w in &r.warnings {
                output::eprintln(&format!("numapin: warning: rank {}: {w}", r.local_rank));
            }
        }
    }
    // What `numapin exec` in this process would apply.
    let mems: Vec<u32> = plan.ranks.iter().flat_map(|r| r.mems.clone()).collect();
    let binding = probe_memory_binding(&mems);
    if let (Binding::CpusOnly { reason }, Format::Shell | Format::Numactl | Format::Taskset) =
        (&binding, a.output_format())
    {
        output::eprintln(&format!("numapin: warning: {reason}"));
    }
    output::print(&render(&t, &plan, a.output_format(), policy, &binding))?;
    Ok(0)
}

fn nodes(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The `numactl` options of a binding (`--physcpubind=0-15 --membind=0`).
pub(crate) fn numactl_args(r: &RankPlan, policy: MemPolicy) -> Vec<String> {
    let mut v = vec![format!("--physcpubind={}", r.cpus)];
    match (policy, r.mems.len()) {
        (_, 0) => {}
        (MemPolicy::Bind, _) => v.push(format!("--membind={}", nodes(&r.mems))),
        (MemPolicy::Preferred, 1) => v.push(format!("--preferred={}", r.mems[0])),
        (MemPolicy::Preferred, _) => v.push(format!("--preferred-many={}", nodes(&r.mems))),
    }
    v
}

/// A rank's NICs for people: `mlx5_0 (PIX)`, `-` when it has none.
pub(crate) fn rank_nics(t: &Topology, r: &RankPlan) -> String {
    if r.nics.is_empty() {
        return "-".into();
    }
    r.nics
        .iter()
        .map(|n| {
            let label = t
                .nics
                .get(n.nic)
                .map_or_else(|| format!("NIC {}", n.nic), |d| d.label());
            format!("{label} ({})", n.relation)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The plan in one of the output formats.
/// The plan in one of the output formats; `binding` is what `numapin exec`
/// in this process would apply (JSON carries it as `memory_binding`, the
/// table says when memory would not be bound).
pub(crate) fn render(
    t: &Topology,
    plan: &Plan,
    format: Format,
    policy: MemPolicy,
    binding: &Binding,
) -> String {
    let mut out = String::new();
    match format {
        Format::Json => {
            let mut v = serde_json::to_value(plan).expect("a plan always serializes");
            v["memory_binding"] = serde_json::to_value(binding).expect("a binding serializes");
            out.push_str(&serde_json::to_string_pretty(&v).expect("JSON values serialize"));
            out.push('\n');
        }
        Format::Table => {
            let mut header = vec!["RANK", "GPU", "CUDA", "BUS ID", "CPUS", "N", "MEMS"];
            // The NIC column only where there are NICs: the table of a
            // machine without stays as it was.
            let with_nics = !t.nics.is_empty();
            if with_nics {
                header.push("NICS");
            }
            let mut tab = Table::new(header);
            for r in &plan.ranks {
                let g = r.gpu.and_then(|g| t.gpu(g));
                let mut row = vec![
                    r.local_rank.to_string(),
                    r.gpu.map_or("-".into(), |g| g.to_string()),
                    g.and_then(|g| g.cuda_ordinal)
                        .map_or("-".into(), |o| o.to_string()),
                    r.pci_bus_id.clone().unwrap_or_else(|| "-".into()),
                    r.cpus.to_string(),
                    r.cpus.len().to_string(),
                    nodes(&r.mems),
                ];
                if with_nics {
                    row.push(rank_nics(t, r));
                }
                tab.row(row);
            }
            out.push_str(&format!("mode {}; {}\n\n", plan.mode, t.source));
            out.push_str(&tab.render());
            let warned: Vec<&RankPlan> = plan
                .ranks
                .iter()
                .filter(|r| !r.warnings.is_empty())
                .collect();
            if let Binding::CpusOnly { reason } = binding {
                out.push_str(&format!("\nCPUs only: {reason}\n"));
            }
            if !warned.is_empty() {
                out.push_str("\nWarnings:\n");
                for r in warned {
                    for w in &r.warnings {
                        out.push_str(&format!("  - rank {}: {w}\n", r.local_rank));
                    }
                }
            }
        }
        Format::Shell => {
            for r in &plan.ranks {
                let n = r.local_rank;
                out.push_str(&format!("export NUMAPIN_CPUS_{n}={}\n", r.cpus));
                out.push_str(&format!("export NUMAPIN_MEMS_{n}={}\n", nodes(&r.mems)));
                if let Some(g) = r.gpu {
                    out.push_str(&format!("export NUMAPIN_GPU_{n}={g}\n"));
                }
            }
            if let [r] = plan.ranks.as_slice() {
                out.push_str(&format!("export NUMAPIN_CPUS={}\n", r.cpus));
                out.push_str(&format!("export NUMAPIN_MEMS={}\n", nodes(&r.mems)));
                out.push_str(&format!("export OMP_NUM_THREADS={}\n", r.cpus.len()));
            }
        }
        Format::Numactl => {
            for r in &plan.ranks {
                out.push_str(&format!("numactl {}\n", numactl_args(r, policy).join(" ")));
            }
        }
        Format::Taskset => {
            for r in &plan.ranks {
                out.push_str(&format!("taskset -c {}\n", r.cpus));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_lists_keep_their_order() {
        let ords = |v: &[u32]| v.iter().copied().map(CudaOrdinal).collect::<Vec<_>>();
        assert_eq!(parse_gpus("0-3").unwrap(), ords(&[0, 1, 2, 3]));
        assert_eq!(parse_gpus("3,2,1,0").unwrap(), ords(&[3, 2, 1, 0]));
        assert_eq!(parse_gpus("1,1").unwrap(), ords(&[1, 1]));
        for bad in ["", "a", "1,,2", "3-1", "1024", "0-2000"] {
            let e = parse_gpus(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            assert!(e.to_string().contains("--gpus"), "{e}");
        }
    }

    #[test]
    fn numactl_prefixes() {
        let r: RankPlan = serde_json::from_value(serde_json::json!({
            "local_rank": 0, "gpu": 0, "pci_bus_id": null, "cpus": "0-3,8",
            "mems": [0, 1], "warnings": []
        }))
        .unwrap();
        assert_eq!(r.cpus, CpuList::parse("0-3,8").unwrap());
        assert_eq!(
            numactl_args(&r, MemPolicy::Bind),
            ["--physcpubind=0-3,8", "--membind=0,1"]
        );
        assert_eq!(
            numactl_args(&r, MemPolicy::Preferred),
            ["--physcpubind=0-3,8", "--preferred-many=0,1"]
        );
        let mut one = r.clone();
        one.mems = vec![1];
        assert_eq!(numactl_args(&one, MemPolicy::Preferred)[1], "--preferred=1");
    }
}
