//! Each GPU's nearest NICs, shared evenly among GPUs at the same distance.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{IoDevice, Relation};

/// One NIC chosen for a GPU ([`Topology::nic_pairing`](crate::Topology::nic_pairing)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicChoice {
    /// The NIC: its position in [`Topology::nics`](crate::Topology::nics).
    pub nic: usize,
    /// How the GPU reaches it.
    pub relation: Relation,
}

/// Each GPU's NICs, preferred first (one list per GPU, empty when the
/// machine has no NIC).
///
/// 1. The NICs considered are the RDMA ones (InfiniBand, RoCE, EFA, ...)
///    when there are any, otherwise all of them.
/// 2. Each GPU's candidates are the NICs at its best relation.
/// 3. GPUs with the same best relation and the same candidates form a
///    group; groups are served best relation first.
/// 4. A group of `k` GPUs (in GPU order) over `m` candidates (those fewest
///    GPUs use so far first, then in bus order) gives GPU `i` the slice
///    `[i*m/k, max((i+1)*m/k, i*m/k+1))`: one to one when `m == k`, `k/m`
///    neighbouring GPUs per NIC when `m < k`, `m/k` NICs per GPU when
///    `m > k`.
///
/// Every rank that computes it from the same machine gets the same answer,
/// whatever its `CUDA_VISIBLE_DEVICES`: the pairing covers every GPU.
pub(crate) fn pair(nics: &[IoDevice], gpus: usize) -> Vec<Vec<NicChoice>> {
    let mut out = vec![Vec::new(); gpus];
    let rdma: Vec<usize> = (0..nics.len())
        .filter(|&n| nics[n].kind.is_rdma())
        .collect();
    let considered: Vec<usize> = if rdma.is_empty() {
        (0..nics.len()).collect()
    } else {
        rdma
    };
    if considered.is_empty() {
        return out;
    }
    let rel = |g: usize, n: usize| {
        nics[n]
            .gpu_relations
            .get(g)
            .copied()
            .unwrap_or(Relation::Sys)
    };
    let mut groups: BTreeMap<(Relation, Vec<usize>), Vec<usize>> = BTreeMap::new();
    for g in 0..gpus {
        let best = considered
            .iter()
            .map(|&n| rel(g, n))
            .min()
            .unwrap_or(Relation::Sys);
        let candidates: Vec<usize> = considered
            .iter()
            .copied()
            .filter(|&n| rel(g, n) == best)
            .collect();
        groups.entry((best, candidates)).or_default().push(g);
    }
    let mut load = vec![0usize; nics.len()];
    for ((best, mut candidates), members) in groups {
        candidates.sort_by_key(|&n| (load[n], n));
        let (k, m) = (members.len(), candidates.len());
        for (i, &g) in members.iter().enumerate() {
            let lo = i * m / k;
            let hi = ((i + 1) * m / k).max(lo + 1);
            out[g] = candidates[lo..hi]
                .iter()
                .map(|&nic| NicChoice {
                    nic,
                    relation: best,
                })
                .collect();
            for c in &out[g] {
                load[c.nic] += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::DeviceKind;
    use Relation::*;

    /// NICs of `kind` whose relations to the GPUs are the columns of `rel`
    /// (`rel[g][n]`).
    fn nics(rel: &[Vec<Relation>], kind: DeviceKind) -> Vec<IoDevice> {
        (0..rel[0].len())
            .map(|n| IoDevice {
                pci_bus_id: Some(format!("0000:{n:02x}:00.0")),
                kind,
                names: vec![],
                rdma_device: None,
                rdma_port: None,
                numa_node: None,
                package: None,
                pcie: None,
                gpu_relations: rel.iter().map(|row| row[n]).collect(),
                vendor_id: String::new(),
                device_id: String::new(),
                class_id: String::new(),
            })
            .collect()
    }

    fn pairs(rel: &[Vec<Relation>]) -> Vec<Vec<usize>> {
        pair(&nics(rel, DeviceKind::Infiniband), rel.len())
            .into_iter()
            .map(|l| l.into_iter().map(|c| c.nic).collect())
            .collect()
    }

    #[test]
    fn one_nic_per_gpu_when_each_has_its_own_switch() {
        let rel: Vec<Vec<Relation>> = (0..8)
            .map(|g| {
                (0..8)
                    .map(|n| {
                        if g == n {
                            Pix
                        } else if g / 4 == n / 4 {
                            Node
                        } else {
                            Sys
                        }
                    })
                    .collect()
            })
            .collect();
        assert_eq!(pairs(&rel), (0..8).map(|i| vec![i]).collect::<Vec<_>>());
        let choices = pair(&nics(&rel, DeviceKind::Infiniband), 8);
        assert!(choices.iter().all(|c| c[0].relation == Pix));
    }

    #[test]
    fn eight_gpus_four_nics_pair_two_to_one_with_neighbours() {
        let rel: Vec<Vec<Relation>> = (0..8)
            .map(|g| {
                (0..4)
                    .map(|n| if g / 4 == n / 2 { Node } else { Sys })
                    .collect()
            })
            .collect();
        assert_eq!(
            pairs(&rel),
            [[0], [0], [1], [1], [2], [2], [3], [3]].map(|v| v.to_vec())
        );
    }

    #[test]
    fn more_nics_than_gpus_split_the_nics() {
        assert_eq!(
            pairs(&vec![vec![Phb; 8]; 4]),
            [[0, 1], [2, 3], [4, 5], [6, 7]].map(|v| v.to_vec())
        );
        assert_eq!(pairs(&vec![vec![Phb; 3]; 2]), vec![vec![0], vec![1, 2]]);
    }

    #[test]
    fn a_gpu_farther_away_prefers_the_nics_nobody_uses_yet() {
        // GPU 0 is PIX with NIC 0 only; GPU 1 is PXB with both.
        assert_eq!(
            pairs(&[vec![Pix, Pxb], vec![Pxb, Pxb]]),
            vec![vec![0], vec![1, 0]]
        );
    }

    #[test]
    fn rdma_nics_win_over_nearer_plain_ethernet() {
        // NIC 0: Ethernet on the GPU's switch; NIC 1: InfiniBand across.
        let mut list = nics(&[vec![Pix, Sys]], DeviceKind::Infiniband);
        list[0].kind = DeviceKind::Ethernet;
        let p = pair(&list, 1);
        assert_eq!(
            p,
            vec![vec![NicChoice {
                nic: 1,
                relation: Sys
            }]]
        );
        // Without RDMA NICs, Ethernet is paired.
        list[1].kind = DeviceKind::Ethernet;
        assert_eq!(pair(&list, 1)[0][0].nic, 0);
    }

    #[test]
    fn no_nics_no_pairs() {
        assert_eq!(pair(&[], 3), vec![Vec::new(); 3]);
        assert!(pair(&[], 0).is_empty());
    }

    proptest::proptest! {
        /// Every GPU gets NICs when there are any, all at its best
        /// relation, and GPUs sharing a best set use each NIC about as often.
        #[test]
        fn every_gpu_gets_its_nearest(
            gpus in 1usize..10,
            nics_n in 1usize..10,
            cells in proptest::collection::vec(0usize..6, 100),
        ) {
            let rel: Vec<Vec<Relation>> = (0..gpus)
                .map(|g| (0..nics_n).map(|n| Relation::ALL[cells[g * 10 + n]]).collect())
                .collect();
            let p = pair(&nics(&rel, DeviceKind::Infiniband), gpus);
            for (g, chosen) in p.iter().enumerate() {
                let best = *rel[g].iter().min().unwrap();
                proptest::prop_assert!(!chosen.is_empty());
                for c in chosen {
                    proptest::prop_assert_eq!(c.relation, best);
                    proptest::prop_assert_eq!(rel[g][c.nic], best);
                }
                let mut ids: Vec<usize> = chosen.iter().map(|c| c.nic).collect();
                ids.sort_unstable();
                ids.dedup();
                proptest::prop_assert_eq!(ids.len(), chosen.len(), "no NIC twice");
            }
            // All at one distance: the NICs are spread as evenly as can be.
            let flat = vec![vec![Phb; nics_n]; gpus];
            let p = pair(&nics(&flat, DeviceKind::Infiniband), gpus);
            let mut uses = vec![0usize; nics_n];
            for c in p.iter().flatten() {
                uses[c.nic] += 1;
            }
            let (lo, hi) = (uses.iter().min().unwrap(), uses.iter().max().unwrap());
            proptest::prop_assert!(hi - lo <= 1, "{:?}", uses);
        }
    }
}
