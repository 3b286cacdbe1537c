//! `numapin exec`: bind this rank near its GPU, then become the command.
//!
//! The rank comes from the launcher's variables (or `--gpu`, or `--node`);
//! the binding is applied with `sched_setaffinity` and `set_mempolicy`, and
//! `execvp` replaces numapin with the command, so its exit status and signals
//! are the command's own. Every failure before that exits with code 2 and
//! runs nothing. When `set_mempolicy` is refused (a seccomp profile such as
//! Docker's default without CAP_SYS_NICE), the CPUs are bound alone with a
//! warning on standard error, or, with `--strict`, that is a failure too.

use std::ffi::OsString;

use crate::affinity::numactl_args;
use crate::source::TopoSource;
use numapin::affinity as apply;
use numapin::affinity::{
    bind_current_process, launcher, nic_env, plan_node, probe_memory_binding, rank_plan, Binding,
    MemPolicy, Mode, NicEnv, PlanOptions, RankChoice, RankPlan,
};
use numapin::topology::Topology;
use numapin::CudaOrdinal;

use crate::error::{CliError, Result};
use crate::output::{self, report};
use crate::source::ModeArg;
use numapin::topology::limits::{MAX_GPUS, MAX_NODES};

/// Which variable `--nic-env` sets: the library's [`NicEnv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum NicEnvArg {
    /// UCX_NET_DEVICES (UCX, UCC, NIXL, Open MPI with UCX).
    Ucx,
    /// NCCL_IB_HCA (NCCL's InfiniBand/RoCE transport).
    Nccl,
}

impl From<NicEnvArg> for NicEnv {
    fn from(a: NicEnvArg) -> Self {
        match a {
            NicEnvArg::Ucx => NicEnv::Ucx,
            NicEnvArg::Nccl => NicEnv::Nccl,
        }
    }
}

/// Arguments of `numapin exec`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExecArgs {
    /// Where the description comes from. `--input` describes another
    /// machine, whose binding means nothing here: it needs `--dry-run`.
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// How CPUs are chosen: node, socket, exclusive, cache (core-complex),
    /// core (default node).
    #[arg(long, value_enum)]
    pub(crate) mode: Option<ModeArg>,
    /// Use this CUDA device instead of the local rank's (0-1023).
    #[arg(long, value_name = "G", conflicts_with = "node",
          value_parser = clap::value_parser!(u32).range(0..MAX_GPUS as i64))]
    pub(crate) gpu: Option<u32>,
    /// Bind to this NUMA node's CPUs and memory directly (machines without
    /// GPUs, or jobs that are not one rank per GPU). 0-1023.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..i64::from(MAX_NODES)))]
    pub(crate) node: Option<u32>,
    /// Allocate memory only on the plan's nodes (the default).
    #[arg(long, conflicts_with = "preferred")]
    pub(crate) membind: bool,
    /// Prefer the plan's nodes for memory, falling back to others when full.
    #[arg(long)]
    pub(crate) preferred: bool,
    /// Set OMP_NUM_THREADS to the number of CPUs bound to.
    #[arg(long)]
    pub(crate) threads_env: bool,
    /// Point the command's communication library at the rank's NICs (its
    /// GPU's nearest): `ucx` sets UCX_NET_DEVICES (`mlx5_3:1`), `nccl` sets
    /// NCCL_IB_HCA (`=mlx5_3:1`, an exact match). Nothing is set unless
    /// asked; a NIC the description does not name is an error.
    #[arg(long, value_enum, value_name = "LIB")]
    pub(crate) nic_env: Option<NicEnvArg>,
    /// In core mode, one hardware thread instead of the whole core.
    #[arg(long)]
    pub(crate) no_smt: bool,
    /// Print the binding to standard error before running the command.
    #[arg(long, short)]
    pub(crate) verbose: bool,
    /// Print the binding as JSON and exit without binding or running.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Fail (exit 2, running nothing) when the memory policy cannot be set
    /// (`set_mempolicy` refused by a seccomp profile), instead of binding
    /// the CPUs only with a warning.
    #[arg(long)]
    pub(crate) strict: bool,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub(crate) command: Vec<OsString>,
}

pub(crate) fn run(a: &ExecArgs) -> Result<i32> {
    // Only failures come back: on success the process is the command now.
    match exec(a) {
        Ok(code) => Ok(code),
        Err(e) => {
            report(&e);
            Ok(2)
        }
    }
}

/// The binding this invocation asks for, and a line saying where it came from.
fn choose(a: &ExecArgs, t: &Topology) -> Result<(RankPlan, String)> {
    if let Some(n) = a.node {
        if let Some(m) = a.mode.map(Mode::from).filter(|&m| m != Mode::Node) {
            return Err(CliError::Usage {
                problem: format!(
                    "--node binds to a whole NUMA node and cannot be combined with --mode {m}"
                ),
                fix: "drop --mode, or drop --node to bind near the rank's GPU".into(),
            });
        }
        return Ok((plan_node(t, n)?, format!("NUMA node {n} (--node)")));
    }
    let mode = a.mode.map_or(Mode::Node, Mode::from);
    if a.gpu.is_none() && launcher::local_rank()?.is_none() && !launcher::one_visible_gpu(t) {
        return Err(CliError::Usage {
            problem: format!(
                "no local rank: none of {} is set",
                launcher::LOCAL_RANK_VARS.join(", ")
            ),
            fix:
                "run under a launcher (torchrun, srun, mpirun), or choose with --gpu G or --node N"
                    .into(),
        });
    }
    let mut opts = PlanOptions::default();
    opts.smt = !a.no_smt;
    let choice = RankChoice::default()
        .with_gpu(a.gpu.map(CudaOrdinal))
        .with_gpu_from(Some("--gpu"));
    Ok(rank_plan(t, choice, mode, &opts)?)
}

fn exec(a: &ExecArgs) -> Result<i32> {
    if let (Some(input), false) = (&a.source.input, a.dry_run) {
        return Err(CliError::Usage {
            problem: format!(
                "--input {} describes a saved machine: its binding cannot be applied to this one",
                numapin::text::shorten(&input.display().to_string())
            ),
            fix: "add --dry-run to print the binding the file gives, or drop --input to bind on this machine".into(),
        });
    }
    let policy = if a.preferred {
        MemPolicy::Preferred
    } else {
        MemPolicy::Bind
    };
    let t = a.source.topology()?;
    let (r, why) = choose(a, &t)?;
    for w in &r.warnings {
        output::eprintln(&format!("numapin: warning: {w}"));
    }
    let nic_var = match a.nic_env {
        Some(which) => Some(nic_env(&t, &r, which.into())?),
        None => None,
    };
    if r.cpus.is_empty() {
        return Err(CliError::Usage {
            problem: format!("{why}: the CPU set is empty"),
            fix: "check the topology with `numapin topo`".into(),
        });
    }
    if a.dry_run {
        let out = serde_json::json!({
            "binding": r,
            "chosen_by": why,
            "mempolicy": policy.as_str(),
            "memory_binding": probe_memory_binding(&r.mems),
            "environment": nic_var.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<std::collections::BTreeMap<_, _>>(),
            "command": a.command.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>(),
        });
        // Output that cannot be written is a failure of its own (exit 1),
        // not one of the binding (exit 2).
        let text = serde_json::to_string_pretty(&out).expect("JSON values serialize");
        return Ok(match output::println(&text) {
            Ok(()) => 0,
            Err(e) => report(&e),
        });
    }
    apply::find_program(&a.command[0])?;
    if a.verbose {
        output::eprintln(&format!(
            "numapin: {why}: numactl {}",
            numactl_args(&r, policy).join(" ")
        ));
        if !r.nics.is_empty() {
            output::eprintln(&format!(
                "numapin: NICs: {}",
                crate::affinity::rank_nics(&t, &r)
            ));
        }
        if let Some((k, v)) = &nic_var {
            output::eprintln(&format!("numapin: {k}={v}"));
        }
    }
    if let Binding::CpusOnly { reason } = bind_current_process(&r, policy)? {
        if a.strict {
            return Err(CliError::system(
                "--strict asks for the memory binding, and it cannot be applied",
                "give the container CAP_SYS_NICE (`docker run --cap-add SYS_NICE`; Kubernetes securityContext.capabilities.add: [\"SYS_NICE\"]) or a seccomp profile that allows set_mempolicy; or drop --strict to bind the CPUs only",
                reason,
            ));
        }
        output::eprintln(&format!("numapin: warning: {reason}"));
    }
    let mut set: Vec<(OsString, OsString)> = Vec::new();
    if a.threads_env {
        set.push(("OMP_NUM_THREADS".into(), r.cpus.len().to_string().into()));
    }
    if let Some((k, v)) = nic_var {
        set.push((k.into(), v.into()));
    }
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| set.iter().all(|(s, _)| s != k))
        .collect();
    env.extend(set);
    Err(apply::exec(&a.command, &env).into())
}
