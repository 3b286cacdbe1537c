//! Affinity plans: which CPUs and memory nodes each local rank should use.
//!
//! [`plan`] is a pure function of a [`Topology`]: it reads nothing from the
//! running system, so the same code answers for this machine and for any
//! saved description.
//!
//! Every rank first gets a *home*: the allowed CPUs (and memory nodes) of its
//! GPU's NUMA node, or of its GPU's package in [`Mode::Socket`]. Ranks whose
//! GPUs share a home then divide it according to the mode. When the home is
//! unknown (no NUMA node for the GPU, as on many VMs) or holds no CPU this
//! process may use, the home falls back to the GPU's local CPUs or to the
//! allowed CPUs, and the rank carries a warning naming the cause; numapin
//! never guesses node 0.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::AffinityError as Error;
use crate::cpulist::CpuList;
use crate::gpu::GpuIndex;
use crate::topology::{NicChoice, NodeKind, Relation, Topology};

type Result<T, E = Error> = std::result::Result<T, E>;

/// How a rank's CPUs are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every allowed CPU of the GPU's NUMA node; memory on that node.
    Node,
    /// Every allowed CPU of the GPU's package (all of its nodes under
    /// SNC/NPS); memory on the package's nodes.
    Socket,
    /// The node's allowed physical cores divided into disjoint, contiguous
    /// shares among the ranks whose GPUs share the node.
    Exclusive,
    /// One last-level cache (core complex, L3 domain) of the node per rank.
    Cache,
    /// One physical core of the node per rank.
    Core,
}

impl Mode {
    /// Every mode, in the order the documentation lists them.
    pub const ALL: [Mode; 5] = [
        Mode::Node,
        Mode::Socket,
        Mode::Exclusive,
        Mode::Cache,
        Mode::Core,
    ];

    /// The name used on the command line and in JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Node => "node",
            Mode::Socket => "socket",
            Mode::Exclusive => "exclusive",
            Mode::Cache => "cache",
            Mode::Core => "core",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    /// Parses a mode's name (`core-complex` is another name for `cache`).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "core-complex" {
            return Ok(Mode::Cache);
        }
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not a mode (node, socket, exclusive, cache, core)"))
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options of [`plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanOptions {
    /// In [`Mode::Core`], give each rank its core's SMT siblings too (on by
    /// default); off gives one hardware thread per rank.
    pub smt: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self { smt: true }
    }
}

with_setters!(PlanOptions { with_smt => smt: bool });

/// One rank's binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlan {
    /// The local rank (position in the GPU list given to [`plan`]).
    pub local_rank: u32,
    /// The GPU (its index in [`Topology::gpus`], PCI bus order); `None`
    /// for a binding to a node chosen directly ([`plan_node`]).
    pub gpu: Option<GpuIndex>,
    /// The GPU's PCI bus id.
    pub pci_bus_id: Option<String>,
    /// The CPUs the rank may run on (never empty).
    pub cpus: CpuList,
    /// The NUMA nodes its memory should come from (OS indexes, ascending).
    pub mems: Vec<u32>,
    /// What a person should know about this binding (fallbacks, exclusions).
    pub warnings: Vec<String>,
    /// The rank's NICs, its GPU's nearest ([`Topology::nic_pairing`]),
    /// preferred first; empty when the machine has none and for a binding
    /// to a node ([`plan_node`]).
    #[serde(default)]
    pub nics: Vec<RankNic>,
}

/// A NIC of a rank ([`RankPlan::nics`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankNic {
    /// Its position in [`Topology::nics`].
    pub nic: usize,
    /// Its PCI bus id (`None` for a network device without a PCI function).
    pub pci_bus_id: Option<String>,
    /// Its OS names (verbs device first; empty when the source names none).
    pub names: Vec<String>,
    /// How the rank's GPU reaches it.
    pub relation: Relation,
}

/// A plan: one binding per local rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The mode it was made with.
    pub mode: Mode,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankPlan>,
}

/// What a rank's CPUs are drawn from, before the mode divides it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HomeKey {
    Node(u32),
    Package(u32),
    /// The GPU's local CPUs (its NUMA node is unknown but hwloc places it
    /// under a smaller object than the machine).
    Local(CpuList),
    /// Everything this process may use.
    Allowed,
    /// In the modes that give each rank CPUs of its own: what the fallback
    /// homes hold beyond the nodes of the other ranks, shared by every rank
    /// with a fallback home.
    Leftover,
}

#[derive(Debug, Clone)]
struct Home {
    key: HomeKey,
    /// Allowed CPUs of the home, never empty.
    cpus: CpuList,
    mems: Vec<u32>,
    warnings: Vec<String>,
}

impl Home {
    fn describe(&self) -> String {
        match &self.key {
            HomeKey::Node(n) => format!("NUMA node {n}"),
            HomeKey::Package(p) => format!("package {p}"),
            HomeKey::Local(c) => format!("the GPU's local CPUs {c}"),
            HomeKey::Allowed => "the allowed CPUs".into(),
            HomeKey::Leftover => format!(
                "the CPUs shared by ranks without a usable NUMA node ({})",
                self.cpus
            ),
        }
    }
}

/// The view of the topology every plan uses: allowed CPUs and nodes, with
/// the "unknown" cases filled in.
struct View<'a> {
    topo: &'a Topology,
    /// Every CPU of the machine.
    all: CpuList,
    allowed_cpus: CpuList,
    /// Allowed nodes that can hold ordinary memory.
    allowed_mem_nodes: Vec<u32>,
}

impl<'a> View<'a> {
    fn new(topo: &'a Topology) -> Result<Self> {
        let all = topo.all_cpus();
        let allowed_cpus = if topo.allowed.cpus.is_empty() {
            all.clone()
        } else {
            topo.allowed.cpus.clone()
        };
        if allowed_cpus.is_empty() {
            return Err(Error::Input {
                input: topo.source.clone(),
                problem: "the description lists no CPUs this process may use".into(),
                fix: "check the file (its NUMA nodes and allowed CPUs), or probe this machine instead".into(),
            });
        }
        let allowed_nodes: Vec<u32> = if topo.allowed.numa_nodes.is_empty() {
            topo.numa_nodes.iter().map(|n| n.os_index).collect()
        } else {
            topo.allowed.numa_nodes.clone()
        };
        let allowed_mem_nodes = allowed_nodes
            .into_iter()
            .filter(|&n| topo.node(n).is_none_or(|n| holds_memory(n.kind)))
            .collect();
        Ok(Self {
            topo,
            all,
            allowed_cpus,
            allowed_mem_nodes,
        })
    }

    fn allowed_home(&self, warnings: Vec<String>) -> Home {
        Home {
            key: HomeKey::Allowed,
            cpus: self.allowed_cpus.clone(),
            mems: self.allowed_mem_nodes.clone(),
            warnings,
        }
    }

    /// Allowed memory nodes among `nodes`; the allowed ones when none is.
    fn mems_of(
        &self,
        nodes: impl IntoIterator<Item = u32>,
        what: &str,
        warnings: &mut Vec<String>,
    ) -> Vec<u32> {
        let mut m: Vec<u32> = nodes
            .into_iter()
            .filter(|n| self.allowed_mem_nodes.contains(n))
            .collect();
        m.sort_unstable();
        m.dedup();
        if m.is_empty() {
            warnings.push(format!(
                "{what} has no memory node this process may allocate on: memory comes from the allowed nodes {}",
                join(&self.allowed_mem_nodes)
            ));
            return self.allowed_mem_nodes.clone();
        }
        m
    }

    /// The home of a GPU whose NUMA node is unknown or unusable.
    fn fallback_home(&self, gpu: GpuIndex, mut warnings: Vec<String>) -> Home {
        let g = &self.topo.gpus[gpu.as_usize()];
        let local = g.local_cpus.intersection(&self.allowed_cpus);
        if !g.local_cpus.is_empty()
            && g.local_cpus != self.all
            && !local.is_empty()
            && !self.allowed_cpus.is_subset(&g.local_cpus)
        {
            let nodes: Vec<u32> = self
                .topo
                .numa_nodes
                .iter()
                .filter(|n| !n.cpus.is_disjoint(&local))
                .map(|n| n.os_index)
                .collect();
            warnings.push(format!(
                "GPU {gpu} ({}): using its local CPUs {local}, which span NUMA nodes {}",
                g.pci_bus_id,
                join(&nodes)
            ));
            let mems = self.mems_of(nodes, &format!("GPU {gpu}'s local CPUs"), &mut warnings);
            return Home {
                key: HomeKey::Local(local),
                cpus: self.allowed_cpus.intersection(&g.local_cpus),
                mems,
                warnings,
            };
        }
        warnings.push(format!(
            "GPU {gpu} ({}): falling back to every CPU this process may use ({})",
            g.pci_bus_id, self.allowed_cpus
        ));
        self.allowed_home(warnings)
    }

    /// The allowed part of `what` (a GPU's node or package, CPUs `set`),
    /// with a warning when some of it is excluded; the fallback home, with
    /// a warning naming the cause, when all of it is.
    fn restrict(
        &self,
        gpu: GpuIndex,
        what: &str,
        set: &CpuList,
    ) -> std::result::Result<(CpuList, Vec<String>), Home> {
        let cpus = set.intersection(&self.allowed_cpus);
        if cpus.is_empty() {
            let g = &self.topo.gpus[gpu.as_usize()];
            return Err(self.allowed_home(vec![
                format!(
                    "GPU {gpu} ({}): every CPU of its {what} ({set}) is outside the CPUs this process may use ({}); widen the cpuset or taskset to bind near the GPU",
                    g.pci_bus_id, self.allowed_cpus
                ),
                format!("GPU {gpu}: falling back to every CPU this process may use ({})", self.allowed_cpus),
            ]));
        }
        let mut warnings = Vec::new();
        if cpus.len() < set.len() {
            warnings.push(format!(
                "GPU {gpu}: {} of {what}'s CPUs ({}) are outside the CPUs this process may use; using {cpus}",
                set.len() - cpus.len(),
                set.difference(&cpus)
            ));
        }
        Ok((cpus, warnings))
    }

    fn node_home(&self, gpu: GpuIndex) -> Home {
        let g = &self.topo.gpus[gpu.as_usize()];
        let Some(n) = g.numa_node else {
            let w = format!(
                "GPU {gpu} ({}): its NUMA node is unknown (the firmware reports none, as on many VMs); numapin does not guess node 0",
                g.pci_bus_id
            );
            return self.fallback_home(gpu, vec![w]);
        };
        let Some(node) = self.topo.node(n) else {
            let w = format!(
                "GPU {gpu} ({}): names NUMA node {n}, which the description does not list",
                g.pci_bus_id
            );
            return self.fallback_home(gpu, vec![w]);
        };
        if node.cpus.is_empty() {
            let w = format!(
                "GPU {gpu} ({}): its NUMA node {n} has no CPUs",
                g.pci_bus_id
            );
            return self.fallback_home(gpu, vec![w]);
        }
        let (cpus, mut warnings) = match self.restrict(gpu, &format!("NUMA node {n}"), &node.cpus) {
            Ok(r) => r,
            Err(home) => return home,
        };
        let mems = self.mems_of([n], &format!("NUMA node {n}"), &mut warnings);
        Home {
            key: HomeKey::Node(n),
            cpus,
            mems,
            warnings,
        }
    }

    fn socket_home(&self, gpu: GpuIndex) -> Home {
        let g = &self.topo.gpus[gpu.as_usize()];
        let pkg = g.package.or_else(|| {
            g.numa_node
                .and_then(|n| self.topo.node(n))
                .and_then(|n| n.package)
        });
        let Some(p) = pkg.and_then(|p| self.topo.package(p)) else {
            let mut h = self.node_home(gpu);
            if g.numa_node.is_some() {
                h.warnings.insert(0, format!("GPU {gpu}: the description has no package (socket) information; binding to its NUMA node instead"));
            }
            return h;
        };
        let (cpus, mut warnings) =
            match self.restrict(gpu, &format!("package {}", p.index), &p.cpus) {
                Ok(r) => r,
                Err(home) => return home,
            };
        let mut nodes = p.numa_nodes.clone();
        if nodes.is_empty() {
            nodes = self
                .topo
                .numa_nodes
                .iter()
                .filter(|n| !n.cpus.is_disjoint(&p.cpus))
                .map(|n| n.os_index)
                .collect();
        }
        let mems = self.mems_of(nodes, &format!("package {}", p.index), &mut warnings);
        Home {
            key: HomeKey::Package(p.index),
            cpus,
            mems,
            warnings,
        }
    }

    /// The physical cores within `cpus`, each reduced to its CPUs in `cpus`,
    /// ordered by their lowest CPU. Without core information each CPU is a
    /// core; CPUs no listed core holds count as cores of their own.
    fn cores_in(&self, cpus: &CpuList) -> Vec<CpuList> {
        let mut out: Vec<CpuList> = Vec::new();
        for c in &self.topo.cores {
            let part = c.cpus.intersection(cpus);
            if !part.is_empty() {
                out.push(part);
            }
        }
        let covered = CpuList::from_iter_unsorted(out.iter().flat_map(CpuList::iter));
        out.extend(
            cpus.difference(&covered)
                .iter()
                .map(|c| CpuList::from_iter_unsorted([c])),
        );
        out.sort_by_key(|c| c.first());
        out
    }

    /// The last-level caches within `cpus`, most CPUs first, ties to the
    /// lower CPU numbers. Without cache information the set is one cache.
    fn caches_in(&self, cpus: &CpuList) -> Vec<CpuList> {
        let mut out: Vec<CpuList> = Vec::new();
        // CPUs already given to a cache (a CPU in two caches goes to the
        // first).
        let mut covered = std::collections::HashSet::new();
        for c in &self.topo.caches {
            let part: CpuList = c
                .cpus
                .intersection(cpus)
                .iter()
                .filter(|&x| covered.insert(x))
                .collect();
            if !part.is_empty() {
                out.push(part);
            }
        }
        let rest: CpuList = cpus.iter().filter(|x| !covered.contains(x)).collect();
        if !rest.is_empty() {
            out.push(rest);
        }
        out.sort_by(|a, b| b.len().cmp(&a.len()).then(a.first().cmp(&b.first())));
        out
    }
}

fn holds_memory(kind: NodeKind) -> bool {
    matches!(kind, NodeKind::Normal | NodeKind::Cpuless)
}

/// How errors name the machine: "this machine", or the file read.
fn machine(topo: &Topology) -> String {
    if topo.source == "live" {
        "this machine".into()
    } else {
        topo.source.clone()
    }
}

fn join(v: &[u32]) -> String {
    if v.is_empty() {
        return "(none)".into();
    }
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Computes the binding of each local rank: rank `i` drives GPU `gpus[i]`
/// (an index into [`Topology::gpus`]; a GPU may appear more than once).
///
/// # Errors
///
/// [`AffinityError::Request`](Error::Request) for a GPU index that is not
/// in the topology, and in [`Mode::Exclusive`] and [`Mode::Core`] for fewer
/// physical cores in a home than ranks sharing it (the error names the
/// node and the counts); [`AffinityError::Input`](Error::Input) when the
/// description leaves this process no allowed CPU at all.
///
/// # Examples
///
/// Eight ranks, one per GPU of a DGX H100 (a saved machine, in numapin's
/// repository), each with its share of its GPU's node:
///
/// ```
/// use std::path::Path;
/// use numapin::affinity::{plan, Mode, PlanOptions};
/// use numapin::topology::{ProbeOptions, Topology};
///
/// let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topology/dgx-h100.xml");
/// let t = Topology::load(&path, &ProbeOptions::default())?;
/// let gpus: Vec<_> = t.gpus.iter().map(|g| g.index).collect();
/// let p = plan(&t, &gpus, Mode::Exclusive, &PlanOptions::default())?;
/// for (r, rank) in p.ranks.iter().enumerate() {
///     let gpu = &t.gpus[r];
///     assert_eq!(rank.mems, [gpu.numa_node.expect("known")], "memory on the GPU's node");
///     assert!(rank.cpus.is_subset(&gpu.local_cpus), "CPUs near the GPU");
///     for other in &p.ranks[r + 1..] {
///         assert!(rank.cpus.is_disjoint(&other.cpus), "no CPU shared");
///     }
///     println!("rank {r}: GPU {}, CPUs {}", gpu.index, rank.cpus.to_cpulist());
/// }
/// # Ok::<(), numapin::Error>(())
/// ```
pub fn plan(topo: &Topology, gpus: &[GpuIndex], mode: Mode, opts: &PlanOptions) -> Result<Plan> {
    let view = View::new(topo)?;
    check_gpus(topo, gpus)?;
    let (mut homes, rank_home) = homes_of(&view, gpus, mode);
    if matches!(mode, Mode::Exclusive | Mode::Core) {
        share_fallbacks(&mut homes, &rank_home)?;
    }
    let (places, sharing) = places_in_homes(&homes, &rank_home);
    let mut divider = Divider {
        mode,
        smt: opts.smt,
        parts: HashMap::new(),
    };
    // Each GPU's NICs, paired once for the whole machine.
    let pairing = topo.nic_pairing();
    let mut ranks = Vec::with_capacity(gpus.len());
    for (r, (&g, &h)) in gpus.iter().zip(&rank_home).enumerate() {
        let home = &homes[h];
        let (cpus, warning) = divider.cpus(&view, home, places[r], sharing[&home.key])?;
        debug_assert!(!cpus.is_empty());
        let mut warnings = home.warnings.clone();
        warnings.extend(warning);
        ranks.push(RankPlan {
            local_rank: crate::num::u32_saturating(r),
            gpu: Some(g),
            pci_bus_id: Some(topo.gpus[g.as_usize()].pci_bus_id.clone()),
            cpus,
            mems: home.mems.clone(),
            warnings,
            nics: rank_nics(topo, &pairing[g.as_usize()]),
        });
    }
    Ok(Plan { mode, ranks })
}

/// Refuses a GPU index that is not in the topology.
fn check_gpus(topo: &Topology, gpus: &[GpuIndex]) -> Result<()> {
    for &g in gpus {
        if g.as_usize() >= topo.gpus.len() {
            return Err(Error::Request {
                problem: format!(
                    "GPU {g} is not in {} (it has {} GPU{})",
                    machine(topo),
                    topo.gpus.len(),
                    if topo.gpus.len() == 1 { "" } else { "s" }
                ),
                fix: "pick GPUs from `numapin topo`".into(),
            });
        }
    }
    Ok(())
}

/// One home per GPU, whatever the number of ranks on it (in the order the
/// ranks first name the GPUs), and the index of each rank's home.
fn homes_of(view: &View, gpus: &[GpuIndex], mode: Mode) -> (Vec<Home>, Vec<usize>) {
    let mut index_of: HashMap<GpuIndex, usize> = HashMap::new();
    let mut distinct: Vec<Home> = Vec::new();
    let rank_home: Vec<usize> = gpus
        .iter()
        .map(|&g| {
            *index_of.entry(g).or_insert_with(|| {
                distinct.push(match mode {
                    Mode::Socket => view.socket_home(g),
                    _ => view.node_home(g),
                });
                distinct.len() - 1
            })
        })
        .collect();
    (distinct, rank_home)
}

/// Each rank's place among the ranks sharing its home, in rank order, and
/// how many ranks share each home.
fn places_in_homes<'h>(
    homes: &'h [Home],
    rank_home: &[usize],
) -> (Vec<usize>, HashMap<&'h HomeKey, usize>) {
    let mut sharing: HashMap<&HomeKey, usize> = HashMap::new();
    let places: Vec<usize> = rank_home
        .iter()
        .map(|&h| {
            let n = sharing.entry(&homes[h].key).or_insert(0);
            *n += 1;
            *n - 1
        })
        .collect();
    (places, sharing)
}

/// Divides each home's CPUs among the ranks sharing it, as the mode says;
/// the cores and caches of each home are worked out once.
struct Divider<'h> {
    mode: Mode,
    /// [`PlanOptions::smt`]: a core's every CPU in [`Mode::Core`].
    smt: bool,
    parts: HashMap<&'h HomeKey, Vec<CpuList>>,
}

impl<'h> Divider<'h> {
    /// The CPUs of the rank at place `pos` among the `n` ranks of `home`,
    /// and a warning where it must share a cache with another rank.
    fn cpus(
        &mut self,
        view: &View,
        home: &'h Home,
        pos: usize,
        n: usize,
    ) -> Result<(CpuList, Option<String>)> {
        let mode = self.mode;
        let parts = &mut self.parts;
        Ok(match mode {
            Mode::Node | Mode::Socket => (home.cpus.clone(), None),
            Mode::Exclusive => {
                let cores = parts
                    .entry(&home.key)
                    .or_insert_with(|| view.cores_in(&home.cpus));
                if cores.len() < n {
                    return Err(too_few_cores(home, cores.len(), n, mode));
                }
                let (per, extra) = (cores.len() / n, cores.len() % n);
                let start = pos * per + pos.min(extra);
                let end = start + per + usize::from(pos < extra);
                let cpus =
                    CpuList::from_iter_unsorted(cores[start..end].iter().flat_map(CpuList::iter));
                (cpus, None)
            }
            Mode::Cache => {
                let caches = parts
                    .entry(&home.key)
                    .or_insert_with(|| view.caches_in(&home.cpus));
                let warning = (caches.len() < n && pos >= caches.len()).then(|| {
                    format!(
                        "{} has {} last-level cache(s) for {n} ranks: this rank shares one",
                        home.describe(),
                        caches.len()
                    )
                });
                (caches[pos % caches.len()].clone(), warning)
            }
            Mode::Core => {
                let cores = parts
                    .entry(&home.key)
                    .or_insert_with(|| view.cores_in(&home.cpus));
                if cores.len() < n {
                    return Err(too_few_cores(home, cores.len(), n, mode));
                }
                let core = &cores[pos];
                let cpus = if self.smt {
                    core.clone()
                } else {
                    CpuList::from_iter_unsorted(core.first())
                };
                (cpus, None)
            }
        })
    }
}

/// A rank's NICs: those paired with its GPU.
fn rank_nics(topo: &Topology, pairing: &[NicChoice]) -> Vec<RankNic> {
    pairing
        .iter()
        .map(|c| {
            let n = &topo.nics[c.nic];
            RankNic {
                nic: c.nic,
                pci_bus_id: n.pci_bus_id.clone(),
                names: n.names.clone(),
                relation: c.relation,
            }
        })
        .collect()
}

/// Makes the homes (one per GPU; `rank_home` gives each rank's) of a plan
/// whose ranks get CPUs of their own disjoint:
/// node homes never overlap each other, but a fallback home (the allowed
/// CPUs, a GPU's local CPUs) overlaps them. The ranks with a fallback home
/// share what those homes hold beyond the other ranks' nodes; when that is
/// nothing, they share the overlapping nodes with those nodes' ranks.
fn share_fallbacks(homes: &mut [Home], rank_home: &[usize]) -> Result<()> {
    let is_fallback = |h: &Home| matches!(h.key, HomeKey::Local(_) | HomeKey::Allowed);
    let fallback: Vec<usize> = (0..homes.len())
        .filter(|&i| is_fallback(&homes[i]))
        .collect();
    if fallback.is_empty() {
        return Ok(());
    }
    // Each distinct home once (many ranks may share one).
    let union_of = |idx: &mut dyn Iterator<Item = usize>| {
        let mut seen = HashSet::new();
        CpuList::from_iter_unsorted(
            idx.filter(|&i| seen.insert(&homes[i].key))
                .flat_map(|i| homes[i].cpus.iter())
                .collect::<Vec<_>>(),
        )
    };
    let claimed = union_of(&mut (0..homes.len()).filter(|&i| !is_fallback(&homes[i])));
    let wanted = union_of(&mut fallback.iter().copied());
    let leftover = wanted.difference(&claimed);
    let (group, cpus, note) = if leftover.is_empty() {
        let group: Vec<usize> = (0..homes.len())
            .filter(|&i| !homes[i].cpus.is_disjoint(&wanted))
            .collect();
        let cpus = union_of(&mut group.iter().copied());
        let ranks = rank_home
            .iter()
            .enumerate()
            .filter(|(_, h)| fallback.contains(h))
            .map(|(r, _)| r.to_string())
            .collect::<Vec<_>>()
            .join(",");
        (group, cpus.clone(), format!("every CPU of the fallback is on another rank's NUMA node: ranks {ranks} (no usable node) share {cpus} with that node's ranks"))
    } else {
        (fallback, leftover.clone(), format!("the other ranks' NUMA nodes are left to them: this rank's share comes from {leftover}"))
    };
    let mut mems: Vec<u32> = group.iter().flat_map(|&i| homes[i].mems.clone()).collect();
    mems.sort_unstable();
    mems.dedup();
    for &i in &group {
        let h = &mut homes[i];
        if h.cpus != cpus {
            h.warnings.push(note.clone());
        }
        h.key = HomeKey::Leftover;
        h.cpus = cpus.clone();
        h.mems = mems.clone();
    }
    Ok(())
}

fn too_few_cores(home: &Home, cores: usize, ranks: usize, mode: Mode) -> Error {
    Error::Request {
        problem: format!(
            "{} has {cores} physical core(s) this process may use ({}), but {ranks} ranks' GPUs sit on it: mode {mode} needs a core per rank",
            home.describe(),
            home.cpus
        ),
        fix: "use --mode node or --mode cache (ranks then share CPUs), run fewer ranks per node, or widen the allowed CPUs".into(),
    }
}

/// The binding to NUMA node `node` itself, for machines without GPUs: every
/// allowed CPU of the node, memory on the node.
///
/// # Errors
///
/// [`AffinityError::Request`](Error::Request) (usage, exit code 2): the
/// node is not in the topology, holds no CPU this process may use, or may
/// not be allocated on; [`AffinityError::Input`](Error::Input) when the
/// description leaves this process no allowed CPU at all.
pub fn plan_node(topo: &Topology, node: u32) -> Result<RankPlan> {
    let view = View::new(topo)?;
    let nodes: Vec<u32> = topo.numa_nodes.iter().map(|n| n.os_index).collect();
    let Some(n) = topo.node(node) else {
        return Err(Error::Request {
            problem: format!(
                "NUMA node {node} is not in {} (its nodes: {})",
                machine(topo),
                join(&nodes)
            ),
            fix: "pick a node from `numapin topo`".into(),
        });
    };
    let cpus = n.cpus.intersection(&view.allowed_cpus);
    if cpus.is_empty() {
        return Err(Error::Request {
            problem: format!(
                "NUMA node {node} has no CPU this process may use (node CPUs: {}; allowed: {})",
                if n.cpus.is_empty() {
                    "none".to_string()
                } else {
                    n.cpus.to_string()
                },
                view.allowed_cpus
            ),
            fix: "pick a node with CPUs from `numapin topo`, or widen the cpuset or taskset".into(),
        });
    }
    if !view.allowed_mem_nodes.contains(&node) {
        return Err(Error::Request {
            problem: format!(
                "NUMA node {node} is not a memory node this process may allocate on (allowed: {})",
                join(&view.allowed_mem_nodes)
            ),
            fix: "pick an allowed node, or widen the cpuset's mems".into(),
        });
    }
    let mut warnings = Vec::new();
    if cpus.len() < n.cpus.len() {
        warnings.push(format!(
            "{} of NUMA node {node}'s CPUs ({}) are outside the CPUs this process may use; using {cpus}",
            n.cpus.len() - cpus.len(),
            n.cpus.difference(&cpus)
        ));
    }
    Ok(RankPlan {
        local_rank: 0,
        gpu: None,
        pci_bus_id: None,
        cpus,
        mems: vec![node],
        warnings,
        nics: Vec::new(),
    })
}
