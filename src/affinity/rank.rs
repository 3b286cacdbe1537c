//! [`rank_plan`]: the binding of one rank of a job, chosen the way
//! `numapin exec` chooses it: an explicit GPU, else the launcher's local
//! rank, else the only GPU a launcher left visible.

use super::launcher::{self, LocalRank};
use super::{plan, AffinityError as Error, Mode, PlanOptions, RankPlan};
use crate::gpu::CudaOrdinal;
use crate::topology::Topology;

/// Which rank's binding is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RankChoice {
    /// This CUDA device, whatever the rank (`numapin exec --gpu`).
    pub gpu: Option<CudaOrdinal>,
    /// The local rank, when the caller knows it (otherwise the launcher's
    /// variables are read: [`launcher::local_rank`]).
    pub local_rank: Option<u32>,
    /// What named [`gpu`](Self::gpu), for messages: a command-line flag
    /// such as `--gpu` (`None`: "the chosen GPU").
    pub gpu_from: Option<&'static str>,
    /// Where [`local_rank`](Self::local_rank) came from, for messages: a
    /// launcher variable such as `LOCAL_RANK` (`None`: "the caller").
    pub local_rank_from: Option<&'static str>,
    /// Do not read this process's launcher variables when
    /// [`local_rank`](Self::local_rank) is `None`: the plan is for another
    /// process, whose variables the caller read (`numapin ps`).
    pub ignore_environment: bool,
}

with_setters!(RankChoice {
    with_gpu => gpu: Option<CudaOrdinal>,
    with_local_rank => local_rank: Option<u32>,
    with_gpu_from => gpu_from: Option<&'static str>,
    with_local_rank_from => local_rank_from: Option<&'static str>,
    with_ignore_environment => ignore_environment: bool,
});

/// The binding of one rank, planned among all the ranks of this machine
/// (so that ranks sharing a node divide it the same way in every process),
/// and a sentence saying how its GPU was chosen.
///
/// The GPU is `choice.gpu` when given; else CUDA device = local rank (from
/// `choice.local_rank` or the launcher's variables), or the only GPU in
/// `CUDA_VISIBLE_DEVICES` when the launcher gave each process one. Without
/// any of them, an error naming the variables read.
///
/// # Errors
///
/// [`AffinityError::Request`](Error::Request) when no GPU can be chosen
/// (naming the variables read) or the chosen one is not seen, as
/// [`launcher::gpu_of_ordinal`] says; [`AffinityError::Env`](Error::Env)
/// for a launcher variable that is not a local rank; and [`plan`]'s
/// errors.
pub fn rank_plan(
    topo: &Topology,
    choice: RankChoice,
    mode: Mode,
    opts: &PlanOptions,
) -> Result<(RankPlan, String), Error> {
    let rank = match choice.local_rank {
        Some(r) => Some(LocalRank {
            rank: r,
            variable: choice.local_rank_from.unwrap_or("the caller"),
        }),
        None if choice.ignore_environment => None,
        None => launcher::local_rank()?,
    };
    let (slot, gpu, why) =
        match (choice.gpu, rank) {
            (Some(g), _) => {
                let (what, label) = choice
                    .gpu_from
                    .map_or(("the chosen GPU", "chosen"), |f| (f, f));
                let (s, gpu) = launcher::slot_of_ordinal(topo, g, what)?;
                (s, gpu, format!("CUDA device {g} ({label})"))
            }
            (None, Some(r)) => {
                let (s, gpu) = launcher::slot_for_rank(topo, r.rank, r.variable)?;
                let how = if launcher::one_visible_gpu(topo) {
                    "the only GPU in CUDA_VISIBLE_DEVICES"
                } else {
                    "CUDA device = local rank"
                };
                (
                    s,
                    gpu,
                    format!("local rank {} from {} ({how})", r.rank, r.variable),
                )
            }
            (None, None) if launcher::one_visible_gpu(topo) => {
                let (s, gpu) = launcher::slot_of_ordinal(
                    topo,
                    topo.cuda.ordinals[0].ordinal,
                    "CUDA_VISIBLE_DEVICES",
                )?;
                (s, gpu, "the only GPU in CUDA_VISIBLE_DEVICES".to_string())
            }
            (None, None) => return Err(Error::request(
                format!(
                    "no local rank: none of {} is set",
                    launcher::LOCAL_RANK_VARS.join(", ")
                ),
                "run under a launcher (torchrun, srun, mpirun), or pass the local rank or the GPU",
            )),
        };
    let slots = launcher::rank_gpus(topo);
    let mut p = plan(topo, &slots, mode, opts)?;
    if slot >= p.ranks.len() {
        return Err(Error::request(
            format!("GPU {gpu} is not among the GPUs this process plans for"),
            "check CUDA_VISIBLE_DEVICES",
        ));
    }
    let mut r = p.ranks.swap_remove(slot);
    r.local_rank = rank.map_or(crate::num::u32_saturating(slot), |r| r.rank);
    let line = format!(
        "GPU {gpu} ({}) chosen by {why}; mode {mode}",
        r.pci_bus_id.as_deref().unwrap_or("?")
    );
    Ok((r, line))
}
