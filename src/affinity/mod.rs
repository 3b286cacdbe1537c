//! Launch-time affinity: each rank on its GPU's CPUs, its memory on its
//! GPU's node.
//!
//! * [`plan()`] computes, from a [`crate::Topology`] alone, the CPU set and
//!   memory nodes of each local rank by [`Mode`] (`node`, `socket`,
//!   `exclusive`, `cache`, `core`); [`plan_node`] binds to a node directly.
//! * [`launcher`] reads the local rank that torchrun, srun, mpirun and
//!   friends set, and maps it to a GPU (respecting `CUDA_VISIBLE_DEVICES`).
//! * Each rank's plan names its NICs (its GPU's nearest); [`nic_env`] gives
//!   the `UCX_NET_DEVICES` or `NCCL_IB_HCA` value that selects them.
//! * [`bind_current_thread`] and [`bind_current_process`] apply a binding;
//!   `numapin exec` applies one and then `execvp`s the command.
//!
//! See `docs/affinity.md` for the rules and how they differ from torchrun's.

pub(crate) mod apply;
mod error;
pub mod launcher;
mod nic_env;
mod plan;
mod rank;

pub use apply::{
    bind_current_process, bind_current_process_cpus, bind_current_thread, exec, find_program,
    get_mempolicy, probe_memory_binding, set_mempolicy, Binding, MemPolicy,
};
pub use error::AffinityError;
pub use launcher::{local_rank, LocalRank};
pub use nic_env::{nic_env, NicEnv};
pub use plan::{plan, plan_node, Mode, Plan, PlanOptions, RankNic, RankPlan};
pub use rank::{rank_plan, RankChoice};
