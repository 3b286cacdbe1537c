//! What launchers tell a process: its local rank, and from it its GPU.
//!
//! torchrun sets `LOCAL_RANK`, Slurm's srun `SLURM_LOCALID`, Open MPI's
//! mpirun `OMPI_COMM_WORLD_LOCAL_RANK`, MVAPICH `MV2_COMM_WORLD_LOCAL_RANK`
//! and MPICH/Hydra and Intel MPI `PMI_LOCAL_RANK`. The first one present (in
//! that order) is the local rank; a value that is not a small non-negative
//! integer is an error naming the variable, never a silent rank 0.

use std::ffi::OsString;

use super::AffinityError as Error;

type Result<T, E = Error> = std::result::Result<T, E>;
use crate::gpu::{CudaOrdinal, GpuIndex};
use crate::topology::Topology;

/// The variables read for the local rank, in the order they are tried.
pub const LOCAL_RANK_VARS: [&str; 5] = [
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PMI_LOCAL_RANK",
];

/// Local ranks above this are refused as implausible (no machine has that
/// many GPUs; a value like that is a mistake in a script).
pub const MAX_LOCAL_RANK: u32 = 65_535;

/// A local rank and the variable it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRank {
    /// The rank.
    pub rank: u32,
    /// The variable that gave it (one of [`LOCAL_RANK_VARS`]).
    pub variable: &'static str,
}

/// Finds the local rank through `get` (a variable lookup, so tests need not
/// touch the process environment). `Ok(None)` when no variable is set.
///
/// # Errors
///
/// [`AffinityError::Env`](Error::Env) naming the first launcher variable set to
/// something that is not a local rank (an integer up to the limit).
pub fn local_rank_with(get: impl Fn(&str) -> Option<OsString>) -> Result<Option<LocalRank>> {
    for var in LOCAL_RANK_VARS {
        let Some(raw) = get(var) else { continue };
        let text = raw.to_string_lossy();
        let t = text.trim();
        let rank = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            t.parse::<u32>().ok()
        } else {
            None
        };
        return match rank {
            Some(rank) if rank <= MAX_LOCAL_RANK => Ok(Some(LocalRank { rank, variable: var })),
            _ => Err(Error::Env(crate::report::EnvError::new(
                var,
                text,
                format!("not a local rank (expected an integer from 0 to {MAX_LOCAL_RANK})"),
                format!("unset {var} or set it to this process's rank on its machine (the launcher normally does)"),
            ))),
        };
    }
    Ok(None)
}

/// The local rank of this process, from its environment.
///
/// # Errors
///
/// As [`local_rank_with`].
pub fn local_rank() -> Result<Option<LocalRank>> {
    local_rank_with(|k| std::env::var_os(k))
}

/// Whether the launcher gave this process exactly one GPU
/// (`CUDA_VISIBLE_DEVICES` lists one device): then that GPU is the rank's,
/// whatever the rank number.
pub fn one_visible_gpu(topo: &Topology) -> bool {
    topo.cuda.visible_devices.is_some() && topo.cuda.ordinals.len() == 1
}

/// The GPU this process sees as CUDA ordinal `ordinal`. `what` says where
/// the ordinal came from, for errors.
///
/// # Errors
///
/// [`AffinityError::Request`](Error::Request) when this process sees no CUDA
/// device `ordinal` (the message names `what`, the devices seen and
/// `CUDA_VISIBLE_DEVICES`), or when that device cannot be matched to a PCI
/// device without the driver.
pub fn gpu_of_ordinal(topo: &Topology, ordinal: CudaOrdinal, what: &str) -> Result<GpuIndex> {
    let seen = topo.cuda.ordinals.len();
    let Some(entry) = topo.visible_entry(ordinal) else {
        let cvd = match &topo.cuda.visible_devices {
            Some(v) => format!(" (CUDA_VISIBLE_DEVICES={})", crate::report::quote(v)),
            None => String::new(),
        };
        return Err(Error::Request {
            problem: format!(
                "{what} asks for CUDA device {ordinal}, but this process sees {seen} GPU{}{cvd}",
                if seen == 1 { "" } else { "s" }
            ),
            fix: if seen == 0 {
                "run on a machine with GPUs, or bind to a NUMA node with `numapin exec --node N`"
                    .into()
            } else {
                format!(
                    "use a device from 0 to {}, or start no more ranks than GPUs",
                    seen - 1
                )
            },
        });
    };
    entry.gpu.ok_or_else(|| Error::Request {
        problem: format!(
            "CUDA device {ordinal} (CUDA_VISIBLE_DEVICES entry {:?}) cannot be matched to a PCI device without the CUDA driver",
            entry.entry
        ),
        fix: "load the CUDA driver (drop --no-cuda), or name GPUs by index in CUDA_VISIBLE_DEVICES".into(),
    })
}

/// The rank slot in [`rank_gpus`] and the GPU of local rank `rank` (read
/// from `variable`): the only visible GPU when the launcher gave this process
/// one, otherwise CUDA ordinal `rank`.
///
/// # Errors
///
/// As [`gpu_of_ordinal`] for the rank's device.
pub fn slot_for_rank(topo: &Topology, rank: u32, variable: &str) -> Result<(usize, GpuIndex)> {
    if one_visible_gpu(topo) {
        return slot_of_ordinal(topo, topo.cuda.ordinals[0].ordinal, "CUDA_VISIBLE_DEVICES");
    }
    slot_of_ordinal(
        topo,
        CudaOrdinal(rank),
        &format!("local rank {rank} (from {variable})"),
    )
}

/// The rank slot of CUDA ordinal `ordinal` in [`rank_gpus`], and its GPU.
///
/// # Errors
///
/// As [`gpu_of_ordinal`].
pub fn slot_of_ordinal(
    topo: &Topology,
    ordinal: CudaOrdinal,
    what: &str,
) -> Result<(usize, GpuIndex)> {
    let gpu = gpu_of_ordinal(topo, ordinal, what)?;
    // The slot is the ordinal's place among those rank_gpus lists: ordinals
    // whose GPU is unknown (a MIG UUID without the driver) take none.
    let slot = if one_visible_gpu(topo) {
        gpu.as_usize()
    } else {
        topo.cuda
            .ordinals
            .iter()
            .filter(|e| e.gpu.is_some() && e.ordinal < ordinal)
            .count()
    };
    debug_assert_eq!(rank_gpus(topo).get(slot), Some(&gpu));
    Ok((slot, gpu))
}

/// The GPUs a plan for this machine's ranks should cover, one per rank slot:
/// every GPU this process sees, in CUDA ordinal order; when the launcher gave
/// each process one GPU, every GPU of the machine, in index order, so that
/// ranks which cannot see each other's GPUs still divide nodes the same way.
pub fn rank_gpus(topo: &Topology) -> Vec<GpuIndex> {
    if one_visible_gpu(topo) || topo.cuda.ordinals.is_empty() {
        return (0..crate::num::u32_saturating(topo.gpus.len()))
            .map(GpuIndex)
            .collect();
    }
    let mut v: Vec<(CudaOrdinal, GpuIndex)> = topo
        .cuda
        .ordinals
        .iter()
        .filter_map(|e| Some((e.ordinal, e.gpu?)))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn first_present_variable_wins() {
        assert_eq!(local_rank_with(env(&[])).unwrap(), None);
        for var in LOCAL_RANK_VARS {
            let r = local_rank_with(env(&[(var, "3")])).unwrap().unwrap();
            assert_eq!(
                r,
                LocalRank {
                    rank: 3,
                    variable: var
                }
            );
        }
        let r = local_rank_with(env(&[("PMI_LOCAL_RANK", "5"), ("SLURM_LOCALID", "2")]))
            .unwrap()
            .unwrap();
        assert_eq!(r.variable, "SLURM_LOCALID");
        assert_eq!(r.rank, 2);
        assert_eq!(
            local_rank_with(env(&[("LOCAL_RANK", " 7\n")]))
                .unwrap()
                .unwrap()
                .rank,
            7
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for bad in ["", "-1", "one", "1.5", "99999999999", "70000"] {
            let e = local_rank_with(env(&[("SLURM_LOCALID", bad), ("PMI_LOCAL_RANK", "0")]))
                .unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Input);
            let msg = e.to_string();
            assert!(msg.starts_with("SLURM_LOCALID="), "{msg}");
            assert!(
                e.fix().is_some_and(|f| f.contains("SLURM_LOCALID")),
                "{msg}"
            );
        }
    }

    #[test]
    fn non_utf8_value_is_an_error_not_a_panic() {
        use std::os::unix::ffi::OsStringExt;
        let get = |k: &str| (k == "LOCAL_RANK").then(|| OsString::from_vec(vec![0xff, b'1']));
        assert!(local_rank_with(get).is_err());
    }
}
