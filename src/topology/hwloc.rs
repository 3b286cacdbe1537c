//! Discovery through hwloc: this machine, an hwloc XML export, or a captured
//! filesystem root.

use std::path::Path;
use std::sync::Mutex;

use hwlocality::object::attributes::{ObjectAttributes, PCIDeviceAttributes};
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::{BuildFlags, TypeFilter};
use hwlocality::Topology as Hw;

use super::limits::{self, MAX_CPUS, MAX_GPUS, MAX_NODES};
use super::TopologyError as Error;
use super::{
    is_accelerator, Cache, Core, NodeKind, NumaNode, Package, PcieLink, ProbeOptions, RawGpu,
    RawTopology,
};
use crate::cpulist::CpuList;

type Result<T, E = Error> = std::result::Result<T, E>;

/// hwloc reads `HWLOC_*` variables from the environment while it builds a
/// topology; numapin sets some of them (for filesystem roots) and must not
/// race with another build, so every build holds this lock.
static HWLOC_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    HWLOC_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn hw_err(what: &str, input: Option<&Path>, e: impl std::fmt::Display) -> Error {
    match input {
        Some(p) => Error::input(
            p.display().to_string(),
            format!("hwloc could not read it ({what}: {e})"),
            "give a complete hwloc XML export (`lstopo --of xml FILE`) or capture (`hwloc-gather-topology`)",
        ),
        None => Error::system(
            format!("hwloc topology discovery ({what})"),
            "install hwloc 2.8 or later (Debian/Ubuntu: libhwloc15) and check that /sys is mounted",
            e.to_string(),
        ),
    }
}

fn builder(input: Option<&Path>) -> Result<hwlocality::topology::builder::TopologyBuilder> {
    let b = Hw::builder();
    let b = b
        .with_flags(BuildFlags::INCLUDE_DISALLOWED)
        .map_err(|e| hw_err("flags", input, e))?;
    let b = b
        .with_type_filter(ObjectType::PCIDevice, TypeFilter::KeepAll)
        .map_err(|e| hw_err("PCI filter", input, e))?;
    let b = b
        .with_type_filter(ObjectType::Bridge, TypeFilter::KeepImportant)
        .map_err(|e| hw_err("bridge filter", input, e))?;
    let b = b
        .with_type_filter(ObjectType::OSDevice, TypeFilter::KeepImportant)
        .map_err(|e| hw_err("OS device filter", input, e))?;
    Ok(b)
}

/// Runs `f` and turns a panic inside hwlocality (on a hostile file) into an
/// error naming the input.
fn guarded<T>(input: Option<&Path>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match crate::platform::panic_guard::catch(f) {
        Ok(r) => r,
        Err(msg) => Err(hw_err("unexpected content", input, msg)),
    }
}

/// The `HWLOC_*` variables that make hwloc describe something other than
/// this machine (in the order hwloc honours them). The live probe refuses
/// to run under them: numapin reads such descriptions only as an explicit
/// input (`--input`), with that input's limits.
pub(crate) const HWLOC_REPLACING_VARS: [&str; 4] = [
    "HWLOC_FSROOT",
    "HWLOC_CPUID_PATH",
    "HWLOC_SYNTHETIC",
    "HWLOC_XMLFILE",
];

/// Refuses a live probe that hwloc would answer from a file or a synthetic
/// description instead of this machine.
fn check_env_overrides() -> Result<()> {
    for var in HWLOC_REPLACING_VARS {
        if let Some(v) = std::env::var_os(var) {
            return Err(Error::Env {
                variable: var.into(),
                value: v.to_string_lossy().into_owned(),
                problem: "hwloc would describe what this variable names instead of this machine".into(),
                fix: format!("unset {var} to describe this machine; to read a saved machine, give its file with --input"),
            });
        }
    }
    Ok(())
}

/// This machine, with I/O objects, restricted to what this process may use.
pub(crate) fn discover_live(opts: &ProbeOptions) -> Result<RawTopology> {
    check_env_overrides()?;
    // The lock covers the whole life of the hwloc topology, its destruction
    // included: hwloc takes a process-wide mutex in init and destroy, and a
    // file reader forks (crate::isolate) only while holding this lock, so
    // the child never inherits that mutex locked.
    let mut raw = {
        let _g = lock();
        let topo = guarded(None, || {
            builder(None)?.build().map_err(|e| hw_err("build", None, e))
        })?;
        let raw = guarded(None, || {
            extract(&topo, opts, Some(Path::new("/")), "this machine")
        })?;
        drop(topo);
        raw
    };
    let affinity = crate::platform::sys::sched_getaffinity_self()
        .map_err(|e| Error::system("sched_getaffinity", "report this as a bug", e))?;
    raw.allowed.cpus = raw.allowed.cpus.intersection(&affinity);
    if raw.allowed.cpus.is_empty() {
        raw.allowed.cpus = affinity;
    }
    Ok(raw)
}

/// An hwloc XML export (its text). Read in a child process: hwloc aborts
/// on some malformed files, and that must not take numapin down.
pub(crate) fn discover_xml(xml: &str, source: &str, opts: &ProbeOptions) -> Result<RawTopology> {
    let _g = lock();
    let input = Path::new(source);
    isolated(source, || {
        let b = builder(Some(input))?
            .from_xml(xml)
            .map_err(|e| hw_err("XML", Some(input), e))?;
        let topo = b.build().map_err(|e| hw_err("XML", Some(input), e))?;
        extract(&topo, opts, None, source)
    })
}

/// Runs a file reader in a child process (see [`crate::platform::isolate`]).
fn isolated(source: &str, f: impl FnOnce() -> Result<RawTopology>) -> Result<RawTopology> {
    use crate::platform::isolate::{in_child, ChildError};
    in_child(source, || {
        // Errors cross the process boundary as text: the message with its
        // causes, the fix, and whether the system (not the file) failed.
        guarded(Some(Path::new(source)), f).map_err(|e| match e {
            Error::Input {
                input,
                problem,
                fix,
                source,
            } => ChildError {
                input,
                problem: match source {
                    Some(s) => format!("{problem}: {s}"),
                    None => problem,
                },
                fix,
                system: false,
            },
            Error::System { what, fix, source } => ChildError {
                input: what,
                problem: source.to_string(),
                fix,
                system: true,
            },
            other => ChildError {
                input: source.to_string(),
                problem: crate::report::with_causes(&other),
                fix: "check the file".into(),
                system: false,
            },
        })
    })
    .map_err(|c| {
        if c.system {
            Error::System {
                what: c.input,
                fix: c.fix,
                source: c.problem.into(),
            }
        } else {
            Error::input(c.input, c.problem, c.fix)
        }
    })
}

/// A captured filesystem root (a folder holding `sys/` and `proc/`, already
/// checked by [`super::capture`]).
pub(crate) fn discover_fsroot(
    root: &Path,
    source: &str,
    opts: &ProbeOptions,
) -> Result<RawTopology> {
    let input = Path::new(source);
    let raw = {
        let _g = lock();
        let saved: Vec<(&str, Option<std::ffi::OsString>)> = [
            "HWLOC_FSROOT",
            "HWLOC_THISSYSTEM",
            "HWLOC_COMPONENTS",
            "HWLOC_HIDE_ERRORS",
        ]
        .iter()
        .map(|k| (*k, std::env::var_os(k)))
        .collect();
        // hwloc reads these while it builds; HWLOC_LOCK keeps other builds
        // out until they are restored, and numapin sets no other variable
        // from other threads. HWLOC_FSROOT comes first among the variables
        // hwloc honours, so a user's HWLOC_XMLFILE cannot replace it.
        std::env::set_var("HWLOC_FSROOT", root);
        std::env::set_var("HWLOC_THISSYSTEM", "0");
        // A capture of a machine with broken firmware makes hwloc print a
        // banner; numapin reports what it found instead.
        std::env::set_var("HWLOC_HIDE_ERRORS", "2");
        // Only the Linux reader: the x86 CPUID reader would describe the
        // machine running numapin, not the captured one.
        std::env::set_var("HWLOC_COMPONENTS", "-x86");
        let r = isolated(source, || {
            // hwloc's Linux reader needs a few descriptors at once; without
            // them it would skip files and describe a smaller machine.
            crate::platform::sys::check_free_fds(8)
                .map_err(|e| Error::io_named(source, "reading the capture", e))?;
            let topo = builder(Some(input))?
                .build()
                .map_err(|e| hw_err("filesystem root", Some(input), e))?;
            extract(&topo, opts, Some(root), source)
        });
        for (k, v) in saved {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
        r?
    };
    if raw.numa_nodes.is_empty() && raw.packages.is_empty() {
        return Err(Error::input(
            source,
            "hwloc found no CPUs or NUMA nodes in the capture",
            "give a capture made by hwloc-gather-topology",
        ));
    }
    Ok(raw)
}

/// The members of an hwloc bitmap, refused (before it is expanded) when it
/// is infinite or names a number from `bound` on.
fn members<B: std::borrow::Borrow<hwlocality::bitmap::Bitmap>>(
    set: Option<impl std::ops::Deref<Target = B>>,
    what: &str,
    bound: u32,
    source: &str,
) -> Result<Vec<u32>> {
    let Some(set) = set else {
        return Ok(Vec::new());
    };
    let b: &hwlocality::bitmap::Bitmap = (*set).borrow();
    limits::check_bitmap(
        source,
        what,
        b.weight(),
        b.last_set().map(usize::from),
        bound,
    )?;
    Ok(b.iter_set().map(|i| usize::from(i) as u32).collect())
}

/// A CPU set as a list, within [`MAX_CPUS`].
fn cpus_of(
    set: Option<impl std::ops::Deref<Target = hwlocality::cpu::cpuset::CpuSet>>,
    source: &str,
) -> Result<CpuList> {
    members(set, "a CPU set", MAX_CPUS, source).map(CpuList::from_iter_unsorted)
}

/// A node set as a list, within [`MAX_NODES`].
fn nodes_of(
    set: Option<impl std::ops::Deref<Target = hwlocality::memory::nodeset::NodeSet>>,
    source: &str,
) -> Result<Vec<u32>> {
    members(set, "a NUMA node set", MAX_NODES, source)
}

fn special_subtype(obj: &TopologyObject) -> Option<String> {
    obj.subtype().map(|s| s.to_string_lossy().into_owned())
}

/// What numapin needs of an hwloc topology; `source` names it in errors.
fn extract(
    topo: &Hw,
    opts: &ProbeOptions,
    sysfs_root: Option<&Path>,
    source: &str,
) -> Result<RawTopology> {
    let mut raw = RawTopology::default();
    // What this process may use (checked first: a description whose sets
    // run to infinity fails here, before anything is expanded).
    raw.allowed.cpus = cpus_of(Some(topo.allowed_cpuset()), source)?;
    raw.allowed.numa_nodes = nodes_of(Some(topo.allowed_nodeset()), source)?;
    cpus_of(Some(topo.complete_cpuset()), source)?;
    nodes_of(Some(topo.complete_nodeset()), source)?;

    // Packages.
    let pkg_objs: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::Package).collect();
    limits::check_count(source, "packages", pkg_objs.len(), MAX_CPUS as usize)?;
    for p in &pkg_objs {
        raw.packages.push(Package {
            index: p.logical_index() as u32,
            cpus: cpus_of(p.cpuset(), source)?,
            numa_nodes: Vec::new(),
        });
    }

    // NUMA nodes: a node's own CPUs are its cpuset less the CPUs of nodes
    // attached deeper (hwloc gives a CPU-less node its parent's cpuset); among
    // nodes left with the same CPUs, ordinary memory keeps them.
    let mut node_objs: Vec<&TopologyObject> =
        topo.objects_with_type(ObjectType::NUMANode).collect();
    limits::check_count(source, "NUMA nodes", node_objs.len(), MAX_NODES as usize)?;
    node_objs.sort_by_key(|n| n.os_index().unwrap_or(usize::MAX));
    let full: Vec<CpuList> = node_objs
        .iter()
        .map(|n| cpus_of(n.cpuset(), source))
        .collect::<Result<_>>()?;
    let subtypes: Vec<Option<String>> = node_objs.iter().map(|n| special_subtype(n)).collect();
    let mut own: Vec<CpuList> = full
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut mine = c.clone();
            for (j, d) in full.iter().enumerate() {
                if i != j && d.is_subset(c) && d != c {
                    mine = mine.difference(d);
                }
            }
            mine
        })
        .collect();
    for i in 0..own.len() {
        if own[i].is_empty() {
            continue;
        }
        let holder = (0..own.len())
            .filter(|&j| own[j] == own[i])
            .min_by_key(|&j| (subtypes[j].as_deref().is_some_and(|s| s != "DRAM"), j))
            .unwrap_or(i);
        if holder != i {
            own[i] = CpuList::new();
        }
    }
    for (i, n) in node_objs.iter().enumerate() {
        let os_index = n.os_index().unwrap_or(i);
        if os_index >= MAX_NODES as usize {
            return Err(limits::over(
                source,
                format!(
                    "it names NUMA node {os_index}, beyond the limit of {MAX_NODES} nodes (0-{})",
                    MAX_NODES - 1
                ),
            ));
        }
        let os_index = os_index as u32;
        let memory_bytes = match n.attributes() {
            Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
            _ => 0,
        };
        // The package holding all of the node's CPUs; for a node without
        // CPUs, the package it is attached under.
        let package = if !own[i].is_empty() {
            package_holding(&raw.packages, &own[i])
        } else {
            n.first_ancestor_with_type(ObjectType::Package)
                .map(|p| p.logical_index() as u32)
                .or_else(|| package_holding(&raw.packages, &full[i]))
        };
        let kind = if subtypes[i].as_deref() == Some("GPUMemory") {
            NodeKind::GpuMemory
        } else if memory_bytes == 0 {
            NodeKind::Memoryless
        } else if own[i].is_empty() {
            NodeKind::Cpuless
        } else {
            NodeKind::Normal
        };
        raw.numa_nodes.push(NumaNode {
            os_index,
            package,
            cpus: own[i].clone(),
            memory_bytes,
            distances: Vec::new(),
            kind,
        });
    }
    for node in &raw.numa_nodes {
        if let Some(p) = node.package {
            if let Some(pkg) = raw.packages.iter_mut().find(|x| x.index == p) {
                pkg.numa_nodes.push(node.os_index);
            }
        }
    }

    // Distances between NUMA nodes (hwloc's "NUMALatency" matrix).
    if let Ok(all) = topo.distances(None) {
        let n = raw.numa_nodes.len();
        for d in all {
            let objs: Vec<Option<&TopologyObject>> = d.objects().collect();
            if objs.len() != n
                || objs
                    .iter()
                    .any(|o| o.is_none_or(|o| o.object_type() != ObjectType::NUMANode))
            {
                continue;
            }
            let idx: Vec<usize> = objs
                .iter()
                .filter_map(|o| {
                    let os = o.and_then(|o| o.os_index())? as u32;
                    raw.numa_nodes.iter().position(|x| x.os_index == os)
                })
                .collect();
            if idx.len() != n {
                continue;
            }
            let values = d.distances();
            for (a, &ia) in idx.iter().enumerate() {
                let mut row = vec![0u32; n];
                for (b, &ib) in idx.iter().enumerate() {
                    row[ib] = values
                        .get(a * n + b)
                        .copied()
                        .unwrap_or(0)
                        .min(u64::from(u32::MAX)) as u32;
                }
                raw.numa_nodes[ia].distances = row;
            }
            break;
        }
    }

    // Cores and last-level caches.
    let cores = topo.objects_with_type(ObjectType::Core);
    limits::check_count(source, "cores", cores.len(), MAX_CPUS as usize)?;
    for c in cores {
        let cpus = cpus_of(c.cpuset(), source)?;
        if cpus.is_empty() {
            continue;
        }
        let numa_node = raw
            .numa_nodes
            .iter()
            .find(|n| n.cpus.contains(cpus.as_slice()[0]))
            .map(|n| n.os_index);
        raw.cores.push(Core { cpus, numa_node });
    }
    for (ty, level) in [
        (ObjectType::L5Cache, 5u8),
        (ObjectType::L4Cache, 4),
        (ObjectType::L3Cache, 3),
        (ObjectType::L2Cache, 2),
    ] {
        let caches: Vec<&TopologyObject> = topo.objects_with_type(ty).collect();
        if caches.is_empty() {
            continue;
        }
        limits::check_count(source, "caches", caches.len(), MAX_CPUS as usize)?;
        // An L4 that spans a whole package (a memory-side cache) is not a
        // core complex: prefer the level below when the upper spans a node.
        for c in caches {
            let size_bytes = match c.attributes() {
                Some(ObjectAttributes::Cache(a)) => a.size().map(|s| s.get()),
                _ => None,
            };
            raw.caches.push(Cache {
                level,
                size_bytes,
                cpus: cpus_of(c.cpuset(), source)?,
            });
        }
        break;
    }

    // GPUs and chosen accelerators.
    let mut pcis: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::PCIDevice).collect();
    pcis.sort_by_key(|o| match o.attributes() {
        Some(ObjectAttributes::PCIDevice(a)) => {
            (a.domain(), a.bus_id(), a.bus_device(), a.function())
        }
        _ => (u16::MAX, 0, 0, 0),
    });
    for obj in pcis {
        let Some(ObjectAttributes::PCIDevice(a)) = obj.attributes() else {
            continue;
        };
        if !is_accelerator(
            a.vendor_id(),
            a.device_id(),
            a.class_id(),
            &opts.accelerator_ids,
        ) {
            continue;
        }
        let bus_id = bus_id_of(a);
        if raw.gpus.len() == MAX_GPUS {
            return Err(limits::over(
                source,
                format!("it has more than {MAX_GPUS} GPUs, the limit"),
            ));
        }
        let (numa_node, package, local_cpus) = io_locality(obj, &raw, source)?;
        // Names and UUIDs that hwloc's CUDA/NVML/OpenCL readers recorded.
        let mut name = None;
        let mut uuid = None;
        for od in obj.io_children() {
            if name.is_none() {
                name = od
                    .info("GPUModel")
                    .map(|s| s.to_string_lossy().into_owned());
            }
            if uuid.is_none() {
                uuid = od
                    .info("NVIDIAUUID")
                    .map(|s| s.to_string_lossy().into_owned());
            }
        }
        if name.is_none() {
            name = obj
                .info("PCIDevice")
                .map(|s| s.to_string_lossy().into_owned());
        }
        let pcie = pcie_of(sysfs_root, &bus_id, a.link_speed());
        raw.gpus.push(RawGpu {
            pci_bus_id: bus_id,
            vendor: a.vendor_id(),
            device: a.device_id(),
            class: a.class_id(),
            name,
            uuid: uuid.map(|u| {
                if u.starts_with("GPU-") {
                    u
                } else {
                    format!("GPU-{u}")
                }
            }),
            numa_node,
            package,
            local_cpus,
            pcie,
        });
    }

    // NICs and drives, and where everything sits in the PCI tree.
    raw.io = super::iodev::hwloc::scan(topo, &raw, opts, sysfs_root, source)?;
    Ok(raw)
}

/// A PCI function's bus id, `0000:07:00.0` form.
pub(super) fn bus_id_of(a: &PCIDeviceAttributes) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        a.domain(),
        a.bus_id(),
        a.bus_device(),
        a.function()
    )
}

/// Where an I/O object hangs: its NUMA node and package (each `None` when
/// unknown) and its local CPUs, the CPU set of its first non-I/O ancestor.
/// The node is the one node of that ancestor that has CPUs among them (or
/// its only node); a machine-wide ancestor on a multi-node machine gives
/// none, never a guessed node 0.
pub(super) fn io_locality(
    obj: &TopologyObject,
    raw: &RawTopology,
    source: &str,
) -> Result<(Option<u32>, Option<u32>, CpuList)> {
    let anc = obj.first_non_io_ancestor();
    let local_cpus = cpus_of(anc.and_then(|o| o.cpuset()), source)?;
    let anc_nodes = nodes_of(anc.and_then(|o| o.nodeset()), source)?;
    let with_cpus: Vec<u32> = anc_nodes
        .iter()
        .copied()
        .filter(|n| {
            raw.numa_nodes
                .iter()
                .any(|x| x.os_index == *n && !x.cpus.is_empty() && !x.cpus.is_disjoint(&local_cpus))
        })
        .collect();
    let numa_node = match (with_cpus.as_slice(), anc_nodes.as_slice()) {
        ([one], _) => Some(*one),
        ([], [one]) => Some(*one),
        _ => None,
    };
    let package = anc.and_then(|o| {
        if o.object_type() == ObjectType::Package {
            Some(o.logical_index() as u32)
        } else {
            o.first_ancestor_with_type(ObjectType::Package)
                .map(|p| p.logical_index() as u32)
        }
    });
    let package = package.or_else(|| package_holding(&raw.packages, &local_cpus));
    Ok((numa_node, package, local_cpus))
}

/// The one package holding all of `cpus`; `None` for no CPUs, or when no
/// package or several do.
fn package_holding(packages: &[Package], cpus: &CpuList) -> Option<u32> {
    if cpus.is_empty() {
        return None;
    }
    let mut hits = packages.iter().filter(|p| cpus.is_subset(&p.cpus));
    match (hits.next(), hits.next()) {
        (Some(p), None) => Some(p.index),
        _ => None,
    }
}

/// A PCI function's link: from sysfs under `sysfs_root` (live and captured
/// machines) and hwloc's link speed in GB/s (0 when unknown).
pub(super) fn pcie_of(sysfs_root: Option<&Path>, bus_id: &str, speed: f32) -> Option<PcieLink> {
    let mut pcie = sysfs_root.and_then(|r| read_pcie(r, bus_id));
    if speed > 0.0 {
        pcie.get_or_insert_with(PcieLink::default).speed_gbps = Some(speed);
    }
    pcie
}

/// Reads a PCI device's link state from sysfs under `root`.
pub(crate) fn read_pcie(root: &Path, bus_id: &str) -> Option<PcieLink> {
    let dir = root.join("sys/bus/pci/devices").join(bus_id);
    // A sysfs attribute is a page at most: read no more than that.
    let read = |f: &str| {
        use std::io::Read;
        let mut s = String::new();
        std::fs::File::open(dir.join(f))
            .ok()?
            .take(4096)
            .read_to_string(&mut s)
            .ok()?;
        Some(s)
    };
    let link = PcieLink {
        current_gen: read("current_link_speed").and_then(|s| gen_of_speed(&s)),
        current_width: read("current_link_width").and_then(|s| s.trim().parse().ok()),
        max_gen: read("max_link_speed").and_then(|s| gen_of_speed(&s)),
        max_width: read("max_link_width").and_then(|s| s.trim().parse().ok()),
        speed_gbps: None,
    };
    (link.current_gen.is_some() || link.current_width.is_some() || link.max_gen.is_some())
        .then_some(link)
}

/// PCIe generation from a sysfs or NCCL link speed (`16.0 GT/s PCIe`).
pub(crate) fn gen_of_speed(s: &str) -> Option<u8> {
    let num: f32 = s.split_whitespace().next()?.parse().ok()?;
    Some(match num {
        x if x < 3.0 => 1,
        x if x < 6.0 => 2,
        x if x < 10.0 => 3,
        x if x < 20.0 => 4,
        x if x < 40.0 => 5,
        x if x < 80.0 => 6,
        _ => 7,
    })
}

/// This machine's hwloc XML (with I/O objects), as `lstopo --of xml`
/// writes it.
pub fn export_live_xml() -> Result<Vec<u8>> {
    check_env_overrides()?;
    // Held until the topology is gone (see discover_live).
    let _g = lock();
    let topo = guarded(None, || {
        builder(None)?.build().map_err(|e| hw_err("build", None, e))
    })?;
    let xml = topo
        .export_xml(hwlocality::topology::export::xml::XMLExportFlags::empty())
        .map_err(|e| hw_err("XML export", None, e))?;
    let bytes = xml.as_str().as_bytes().to_vec();
    drop(xml);
    drop(topo);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speed_generations() {
        assert_eq!(gen_of_speed("2.5 GT/s PCIe\n"), Some(1));
        assert_eq!(gen_of_speed("16.0 GT/s PCIe"), Some(4));
        assert_eq!(gen_of_speed("32.0 GT/s PCIe"), Some(5));
        assert_eq!(gen_of_speed("16 GT/s"), Some(4));
        assert_eq!(gen_of_speed("Unknown"), None);
    }
}
