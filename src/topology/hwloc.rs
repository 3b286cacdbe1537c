//! Discovery through hwloc: this machine, an hwloc XML export, or a captured
//! filesystem root.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hwlocality::object::attributes::{ObjectAttributes, PCIDeviceAttributes};
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::{BuildFlags, TypeFilter};
use hwlocality::Topology as Hw;

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

/// This machine, with I/O objects, restricted to what this process may use.
pub(crate) fn discover_live(opts: &ProbeOptions) -> Result<RawTopology> {
    // The lock covers the whole life of the hwloc topology, its destruction
    // included: hwloc takes a process-wide mutex in init and destroy, and a
    // file reader forks (crate::isolate) only while holding this lock, so
    // the child never inherits that mutex locked.
    let mut raw = {
        let _g = lock();
        let topo = guarded(None, || {
            builder(None)?.build().map_err(|e| hw_err("build", None, e))
        })?;
        let raw = guarded(None, || extract(&topo, opts, Some(Path::new("/"))))?;
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

/// An hwloc XML export. Read in a child process: hwloc aborts on some
/// malformed files, and that must not take numapin down.
pub(crate) fn discover_xml(path: &Path, opts: &ProbeOptions) -> Result<RawTopology> {
    let _g = lock();
    isolated(path, || {
        let b = builder(Some(path))?
            .from_xml_file(path)
            .map_err(|e| hw_err("XML", Some(path), e))?;
        let topo = b.build().map_err(|e| hw_err("XML", Some(path), e))?;
        extract(&topo, opts, None)
    })
}

/// Runs a file reader in a child process (see [`crate::platform::isolate`]).
fn isolated(path: &Path, f: impl FnOnce() -> Result<RawTopology>) -> Result<RawTopology> {
    use crate::platform::isolate::{in_child, ChildError};
    in_child(&path.display().to_string(), || {
        // Errors cross the process boundary as text: the message with its
        // causes, and the fix.
        guarded(Some(path), f).map_err(|e| match e {
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
            },
            other => ChildError {
                input: path.display().to_string(),
                problem: crate::report::with_causes(&other),
                fix: "check the file".into(),
            },
        })
    })
    .map_err(|c| Error::input(c.input, c.problem, c.fix))
}

/// A captured filesystem root (folder or tarball holding `sys/` and `proc/`).
pub(crate) fn discover_fsroot(path: &Path, opts: &ProbeOptions) -> Result<RawTopology> {
    let tmp;
    let root: PathBuf = if path.is_dir() {
        path.to_path_buf()
    } else {
        tmp = tempfile::tempdir().map_err(|e| {
            Error::system(
                "creating a temporary folder",
                "set TMPDIR to a writable folder",
                e,
            )
        })?;
        unpack(path, tmp.path())?;
        tmp.path().to_path_buf()
    };
    let root = find_root(&root).ok_or_else(|| Error::input(
        path.display().to_string(),
        "no `sys/devices/system` folder found in it",
        "give a folder (or .tar.gz/.tar.bz2 of one) captured by hwloc-gather-topology, holding sys/ and proc/",
    ))?;
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
        // from other threads.
        std::env::set_var("HWLOC_FSROOT", &root);
        std::env::set_var("HWLOC_THISSYSTEM", "0");
        // A capture of a machine with broken firmware makes hwloc print a
        // banner; numapin reports what it found instead.
        std::env::set_var("HWLOC_HIDE_ERRORS", "2");
        // Only the Linux reader: the x86 CPUID reader would describe the
        // machine running numapin, not the captured one.
        std::env::set_var("HWLOC_COMPONENTS", "-x86");
        let r = isolated(path, || {
            let topo = builder(Some(path))?
                .build()
                .map_err(|e| hw_err("filesystem root", Some(path), e))?;
            extract(&topo, opts, Some(&root))
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
            path.display().to_string(),
            "hwloc found no CPUs or NUMA nodes in the capture",
            "give a capture made by hwloc-gather-topology",
        ));
    }
    Ok(raw)
}

/// Largest capture numapin unpacks (a bomb guard; real captures are a few MiB).
const MAX_UNPACKED: u64 = 512 << 20;

fn unpack(archive: &Path, dest: &Path) -> Result<()> {
    let bad = |problem: String| {
        Error::input(
            archive.display().to_string(),
            problem,
            "give a .tar.gz or .tar.bz2 made by hwloc-gather-topology, or the unpacked folder",
        )
    };
    // Read the magic bytes, then rewind the same file for the decoder.
    let mut f = std::fs::File::open(archive).map_err(|e| Error::io_input(archive, e))?;
    let mut head = [0u8; 3];
    {
        use std::io::{Read, Seek};
        let n = f.read(&mut head).map_err(|e| Error::io_input(archive, e))?;
        if n < head.len() {
            head = [0; 3];
        }
        f.rewind().map_err(|e| Error::io_input(archive, e))?;
    }
    let reader: Box<dyn std::io::Read> = if head.starts_with(b"BZh") {
        Box::new(bzip2::read::BzDecoder::new(f))
    } else if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(f))
    } else {
        Box::new(f)
    };
    let mut ar = tar::Archive::new(reader);
    ar.set_preserve_permissions(false);
    let mut total = 0u64;
    let entries = ar
        .entries()
        .map_err(|e| bad(format!("not a readable tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("corrupt archive: {e}")))?;
        total = total.saturating_add(entry.header().size().unwrap_or(0));
        if total > MAX_UNPACKED {
            return Err(bad(format!(
                "unpacks to more than {} MiB",
                MAX_UNPACKED >> 20
            )));
        }
        // unpack_in refuses paths that would land outside `dest`.
        entry
            .unpack_in(dest)
            .map_err(|e| bad(format!("corrupt archive: {e}")))?;
    }
    Ok(())
}

fn find_root(dir: &Path) -> Option<PathBuf> {
    if dir.join("sys/devices/system").is_dir() {
        return Some(dir.to_path_buf());
    }
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect();
    subdirs.sort();
    subdirs
        .into_iter()
        .find(|d| d.join("sys/devices/system").is_dir())
}

fn cpus_of(set: Option<impl std::ops::Deref<Target = hwlocality::cpu::cpuset::CpuSet>>) -> CpuList {
    match set {
        Some(s) => s.iter_set().map(|i| usize::from(i) as u32).collect(),
        None => CpuList::new(),
    }
}

fn nodes_of(
    set: Option<impl std::ops::Deref<Target = hwlocality::memory::nodeset::NodeSet>>,
) -> Vec<u32> {
    match set {
        Some(s) => s.iter_set().map(|i| usize::from(i) as u32).collect(),
        None => Vec::new(),
    }
}

fn special_subtype(obj: &TopologyObject) -> Option<String> {
    obj.subtype().map(|s| s.to_string_lossy().into_owned())
}

fn extract(topo: &Hw, opts: &ProbeOptions, sysfs_root: Option<&Path>) -> Result<RawTopology> {
    let mut raw = RawTopology::default();

    // Packages.
    let pkg_objs: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::Package).collect();
    for p in &pkg_objs {
        raw.packages.push(Package {
            index: p.logical_index() as u32,
            cpus: cpus_of(p.cpuset()),
            numa_nodes: Vec::new(),
        });
    }

    // NUMA nodes: a node's own CPUs are its cpuset less the CPUs of nodes
    // attached deeper (hwloc gives a CPU-less node its parent's cpuset); among
    // nodes left with the same CPUs, ordinary memory keeps them.
    let mut node_objs: Vec<&TopologyObject> =
        topo.objects_with_type(ObjectType::NUMANode).collect();
    node_objs.sort_by_key(|n| n.os_index().unwrap_or(usize::MAX));
    let full: Vec<CpuList> = node_objs.iter().map(|n| cpus_of(n.cpuset())).collect();
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
        let os_index = n.os_index().unwrap_or(i) as u32;
        let memory_bytes = match n.attributes() {
            Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
            _ => 0,
        };
        // The package holding all of the node's CPUs; for a node without
        // CPUs, the package it is attached under.
        let package = if !own[i].is_empty() {
            let hits: Vec<u32> = raw
                .packages
                .iter()
                .filter(|p| own[i].is_subset(&p.cpus))
                .map(|p| p.index)
                .collect();
            (hits.len() == 1).then(|| hits[0])
        } else {
            n.first_ancestor_with_type(ObjectType::Package)
                .map(|p| p.logical_index() as u32)
                .or_else(|| {
                    let c = &full[i];
                    let hits: Vec<u32> = raw
                        .packages
                        .iter()
                        .filter(|p| !c.is_empty() && c.is_subset(&p.cpus))
                        .map(|p| p.index)
                        .collect();
                    (hits.len() == 1).then(|| hits[0])
                })
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
    for c in topo.objects_with_type(ObjectType::Core) {
        let cpus = cpus_of(c.cpuset());
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
                cpus: cpus_of(c.cpuset()),
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
        let (numa_node, package, local_cpus) = io_locality(obj, &raw);
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

    // What this process may use.
    raw.allowed.cpus = cpus_of(Some(topo.allowed_cpuset()));
    raw.allowed.numa_nodes = nodes_of(Some(topo.allowed_nodeset()));
    // NICs and drives, and where everything sits in the PCI tree.
    raw.io = super::iodev::hwloc::scan(topo, &raw, opts, sysfs_root);
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
) -> (Option<u32>, Option<u32>, CpuList) {
    let anc = obj.first_non_io_ancestor();
    let local_cpus = cpus_of(anc.and_then(|o| o.cpuset()));
    let anc_nodes = nodes_of(anc.and_then(|o| o.nodeset()));
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
    let package = package.or_else(|| {
        let hits: Vec<u32> = raw
            .packages
            .iter()
            .filter(|p| !local_cpus.is_empty() && local_cpus.is_subset(&p.cpus))
            .map(|p| p.index)
            .collect();
        (hits.len() == 1).then(|| hits[0])
    });
    (numa_node, package, local_cpus)
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
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
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

/// Writes this machine's hwloc XML (with I/O objects) to `path`.
pub fn export_live_xml(path: &Path) -> Result<()> {
    // Held until the topology is gone (see discover_live).
    let _g = lock();
    let topo = guarded(None, || {
        builder(None)?.build().map_err(|e| hw_err("build", None, e))
    })?;
    topo.export_xml_file(
        Some(path),
        hwlocality::topology::export::xml::XMLExportFlags::empty(),
    )
    .map_err(|e| {
        Error::input(
            path.display().to_string(),
            format!("cannot write the XML: {e}"),
            "give a path in a writable folder",
        )
    })
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
