//! The environment that points a rank's communication library at its NICs.
//!
//! `UCX_NET_DEVICES` takes verbs devices with their port (`mlx5_3:1`) and,
//! for UCX's TCP transport, interface names (`eth0`). `NCCL_IB_HCA` takes
//! verbs devices; its entries are prefixes unless the list starts with `=`
//! (`mlx5_1` would also select `mlx5_10` and `mlx5_11`), so numapin always
//! writes the exact form, `=mlx5_3:1`. A NIC the description does not name
//! (NCCL topology files often carry no names) is refused, never guessed.

use super::AffinityError as Error;
use super::RankPlan;
use crate::topology::{IoDevice, Topology};

type Result<T, E = Error> = std::result::Result<T, E>;

/// Which library's variable to set (`numapin exec --nic-env`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicEnv {
    /// `UCX_NET_DEVICES` (UCX, and what uses it: UCC, NIXL, Open MPI's UCX PML).
    Ucx,
    /// `NCCL_IB_HCA` (NCCL's InfiniBand/RoCE transport).
    Nccl,
}

impl NicEnv {
    /// The variable's name.
    pub fn variable(self) -> &'static str {
        match self {
            NicEnv::Ucx => "UCX_NET_DEVICES",
            NicEnv::Nccl => "NCCL_IB_HCA",
        }
    }
}

/// The verbs device and port, `mlx5_3:1` (port 1 when the source gives none).
fn verbs(n: &IoDevice) -> Option<String> {
    n.rdma_device
        .as_ref()
        .map(|d| format!("{d}:{}", n.rdma_port.unwrap_or(1)))
}

/// The variable and its value that select `rank`'s NICs for `which`.
///
/// # Errors
///
/// [`AffinityError::Request`](Error::Request): the rank has no
/// NIC (a machine without one, a binding to a node), a NIC of the rank has
/// no name in the description, or for [`NicEnv::Nccl`] a NIC without RDMA
/// (NCCL reaches those through its socket transport, `NCCL_SOCKET_IFNAME`).
pub fn nic_env(topo: &Topology, rank: &RankPlan, which: NicEnv) -> Result<(&'static str, String)> {
    let var = which.variable();
    if rank.nics.is_empty() {
        return Err(Error::Request {
            problem: format!(
                "{var}: rank {} has no NIC ({})",
                rank.local_rank,
                if rank.gpu.is_none() {
                    "it is bound to a NUMA node, not to a GPU".to_string()
                } else {
                    format!("{} lists none", topo.source)
                }
            ),
            fix: "drop --nic-env, or bind near a GPU on a machine with NICs (`numapin topo` lists them)".into(),
        });
    }
    let mut parts = Vec::new();
    for rn in &rank.nics {
        let Some(n) = topo.nics.get(rn.nic) else {
            return Err(Error::Request {
                problem: format!(
                    "{var}: rank {}'s plan names NIC {}, which {} does not list",
                    rank.local_rank, rn.nic, topo.source
                ),
                fix: "make the plan from the same topology".into(),
            });
        };
        let part = match (which, verbs(n), n.names.first()) {
            (_, Some(v), _) => v,
            (NicEnv::Ucx, None, Some(name)) if !n.kind.is_rdma() => name.clone(),
            (NicEnv::Nccl, None, Some(name)) if !n.kind.is_rdma() => {
                return Err(Error::Request {
                    problem: format!(
                        "NCCL_IB_HCA: rank {}'s NIC {name} ({}) is {} without RDMA; NCCL_IB_HCA selects InfiniBand and RoCE devices only",
                        rank.local_rank,
                        n.pci_bus_id.as_deref().unwrap_or("no PCI function"),
                        n.kind
                    ),
                    fix: format!(
                        "NCCL reaches this NIC through its socket transport: drop --nic-env nccl, or set NCCL_SOCKET_IFNAME={name} yourself if the job should use it"
                    ),
                });
            }
            _ => {
                return Err(Error::Request {
                    problem: format!(
                        "{var}: rank {}'s NIC {} ({}) has no {} name in {}",
                        rank.local_rank,
                        rn.nic,
                        n.label(),
                        if n.kind.is_rdma() { "verbs device" } else { "OS" },
                        topo.source
                    ),
                    fix: "NCCL topology files and some exports carry no NIC names: run on the machine itself, or give an hwloc export with I/O devices (`numapin topo --export FILE`), or set the variable yourself".into(),
                });
            }
        };
        parts.push(part);
    }
    let value = match which {
        NicEnv::Ucx => parts.join(","),
        NicEnv::Nccl => format!("={}", parts.join(",")),
    };
    Ok((var, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::{plan, plan_node, Mode, PlanOptions};
    use crate::gpu::GpuIndex;
    use crate::topology::ProbeOptions;

    fn fixture(name: &str) -> Topology {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("topology")
            .join(name);
        Topology::load(&p, &ProbeOptions::default()).unwrap()
    }

    fn rank(t: &Topology, gpu: u32) -> RankPlan {
        let all: Vec<GpuIndex> = (0..u32::try_from(t.gpus.len()).unwrap())
            .map(GpuIndex)
            .collect();
        let mut p = plan(t, &all, Mode::Node, &PlanOptions::default()).unwrap();
        p.ranks.swap_remove(gpu as usize)
    }

    #[test]
    fn verbs_devices_with_their_port_and_nccl_exact_match() {
        let t = fixture("dgx-h100.xml");
        let r = rank(&t, 3);
        assert_eq!(r.nics.len(), 1);
        assert_eq!(r.nics[0].names[0], "mlx5_3");
        assert_eq!(
            nic_env(&t, &r, NicEnv::Ucx).unwrap(),
            ("UCX_NET_DEVICES", "mlx5_3:1".to_string())
        );
        assert_eq!(
            nic_env(&t, &r, NicEnv::Nccl).unwrap(),
            ("NCCL_IB_HCA", "=mlx5_3:1".to_string())
        );
        // Two NICs, the second on its second port.
        let mut two = r.clone();
        two.nics.push(rank(&t, 4).nics[0].clone());
        let mut t2 = t.clone();
        t2.nics[two.nics[1].nic].rdma_port = Some(2);
        assert_eq!(
            nic_env(&t2, &two, NicEnv::Ucx).unwrap().1,
            "mlx5_3:1,mlx5_4:2"
        );
        assert_eq!(
            nic_env(&t2, &two, NicEnv::Nccl).unwrap().1,
            "=mlx5_3:1,mlx5_4:2"
        );
    }

    #[test]
    fn plain_ethernet_is_for_ucx_only() {
        let mut t = fixture("pcie-switch-2s.xml");
        t.nics.retain(|n| !n.kind.is_rdma());
        let r = rank(&t, 0);
        assert_eq!(nic_env(&t, &r, NicEnv::Ucx).unwrap().1, "eno1");
        let e = nic_env(&t, &r, NicEnv::Nccl).unwrap_err();
        assert!(e.to_string().contains("without RDMA"), "{e}");
        assert!(
            e.fix().unwrap().contains("NCCL_SOCKET_IFNAME=eno1"),
            "{e:?}"
        );
    }

    #[test]
    fn unnamed_nics_and_ranks_without_nics_are_refused() {
        // DGX A100 fixture: InfiniBand NICs without OS devices.
        let t = fixture("dgx-a100-nps4.xml");
        let e = nic_env(&t, &rank(&t, 0), NicEnv::Ucx).unwrap_err();
        assert!(e.to_string().contains("no verbs device name"), "{e}");
        assert_eq!(e.kind(), crate::ErrorKind::Input);
        let node = plan_node(&t, 3).unwrap();
        let e = nic_env(&t, &node, NicEnv::Nccl).unwrap_err();
        assert!(e.to_string().contains("bound to a NUMA node"), "{e}");
        let none = fixture("cloud-vm-1n.xml");
        let e = nic_env(&none, &rank(&none, 0), NicEnv::Ucx).unwrap_err();
        assert!(e.to_string().contains("lists none"), "{e}");
    }
}
