//! This machine's live state, as the checks read it, and the parsers for
//! the kernel files it comes from.
//!
//! [`SystemView::read`] is the only place `numapin doctor` reads live state
//! (besides the pin probe); the checks take a [`SystemView`], so tests build
//! one by hand.

use std::path::Path;

use numapin::internals::cgroup::MemoryLimits;
use numapin::internals::container::{self, ContainerEvidence};
use numapin::internals::probe::CallState;
use numapin::internals::sys::SecurityStatus;
use numapin::topology::Topology;

/// Whether the CUDA driver could be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DriverState {
    /// Loaded; the driver's version (`12080` for 12.8).
    Loaded(u32),
    /// Not available, and why (not installed, failed to initialise,
    /// `NUMAPIN_NO_CUDA`).
    Unavailable(String),
    /// Not loaded because `--no-cuda` asked for that.
    NotLoaded,
}

/// How the IOMMU is set up, as far as it can be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IommuView {
    /// The kernel command line (`/proc/cmdline`), if readable.
    pub(crate) cmdline: Option<String>,
    /// The IOMMU units the kernel registered (`/sys/class/iommu/*`: `dmar0`,
    /// `ivhd0`, ...); `None` when the folder is unreadable.
    pub(crate) units: Option<Vec<String>>,
    /// How many IOMMU groups exist (`/sys/kernel/iommu_groups`).
    pub(crate) groups: Option<usize>,
    /// Each GPU's IOMMU domain type (`iommu_group/type` of its PCI device:
    /// `DMA`, `DMA-FQ`, `identity`, `unmanaged`, `blocked`), by GPU index;
    /// `None` when the GPU has no group or the file is unreadable.
    pub(crate) gpu_domains: Vec<(numapin::GpuIndex, Option<String>)>,
}

/// This machine's live state that the checks read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SystemView {
    /// RLIMIT_MEMLOCK `(soft, hard)` in bytes (`u64::MAX` = unlimited), or
    /// why it could not be read.
    pub(crate) memlock: Result<(u64, u64), String>,
    /// Whether the process has CAP_IPC_LOCK.
    pub(crate) cap_ipc_lock: bool,
    /// The CUDA driver.
    pub(crate) cuda_driver: DriverState,
    /// The calling thread's memory policy `(mode, nodes)` from
    /// `get_mempolicy(2)` (mode 0 default, 1 preferred, 2 bind, 3
    /// interleave, 4 local, 5 preferred-many, 6 weighted interleave), or why
    /// it could not be read. When `get_mempolicy` is refused, read from the
    /// main thread's `stack` line of `/proc/self/numa_maps` instead.
    pub(crate) mempolicy: Result<(i32, Vec<u32>), String>,
    /// Where `mempolicy` came from when not from `get_mempolicy` (a
    /// phrase for the evidence).
    pub(crate) mempolicy_note: Option<String>,
    /// The NUMA system calls, probed ([`numapin::internals::probe`]).
    pub(crate) numa_calls: Vec<(&'static str, CallState)>,
    /// `Seccomp:`, `CapEff:` and friends from `/proc/self/status`.
    pub(crate) security: SecurityStatus,
    /// What suggests a container.
    pub(crate) container: ContainerEvidence,
    /// The memory cgroup limits over this process.
    pub(crate) cgroup: MemoryLimits,
    /// `/sys/kernel/mm/transparent_hugepage/enabled`, if readable.
    pub(crate) thp_enabled: Option<String>,
    /// `/sys/kernel/mm/transparent_hugepage/defrag`, if readable.
    pub(crate) thp_defrag: Option<String>,
    /// The hugetlb pools of every node and the THP mode.
    pub(crate) huge_pages: super::huge_pages::HugePagesView,
    /// `/proc/sys/kernel/numa_balancing`, if readable.
    pub(crate) numa_balancing: Option<String>,
    /// The IOMMU.
    pub(crate) iommu: IommuView,
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

impl SystemView {
    /// Reads this machine's state (`cuda` false: do not load the driver).
    pub(crate) fn read(topo: &Topology, cuda: bool) -> Self {
        let cuda_driver = if !cuda {
            DriverState::NotLoaded
        } else {
            match numapin::internals::cuda::driver_version() {
                Ok(v) => DriverState::Loaded(v),
                Err(numapin::gpu::CudaError::NoDriver(why)) => {
                    DriverState::Unavailable(why.to_string())
                }
                Err(e) => DriverState::Unavailable(e.to_string()),
            }
        };
        let units = std::fs::read_dir("/sys/class/iommu").ok().map(|d| {
            let mut v: Vec<String> = d
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        });
        let groups = std::fs::read_dir("/sys/kernel/iommu_groups")
            .ok()
            .map(|d| d.count());
        let gpu_domains = topo
            .gpus
            .iter()
            .map(|g| {
                let t = read(format!(
                    "/sys/bus/pci/devices/{}/iommu_group/type",
                    g.pci_bus_id
                ));
                (g.index, t.map(|s| s.trim().to_string()))
            })
            .collect();
        let (mempolicy, mempolicy_note) = match numapin::affinity::get_mempolicy() {
            Ok(p) => (Ok(p), None),
            Err(e) if numapin::internals::numa::is_refusal(&e) => {
                let name = numapin::internals::numa::errno_name(&e);
                let from_maps = std::fs::read("/proc/self/numa_maps")
                    .ok()
                    .and_then(|t| numapin::internals::numa_maps::task_policy(&t))
                    .and_then(|p| parse_policy(&p));
                match from_maps {
                    Some(p) => (
                        Ok(p),
                        Some(format!(
                            "read from /proc/self/numa_maps: get_mempolicy is refused ({name})"
                        )),
                    ),
                    None => (Err(format!("get_mempolicy refused ({name}) and /proc/self/numa_maps shows no policy")), None),
                }
            }
            Err(e) => (Err(e.to_string()), None),
        };
        SystemView {
            memlock: numapin::internals::sys::memlock_limit().map_err(|e| e.to_string()),
            cap_ipc_lock: numapin::internals::sys::has_cap_ipc_lock(),
            cuda_driver,
            mempolicy,
            mempolicy_note,
            numa_calls: numapin::internals::probe::probe_calls(),
            security: SecurityStatus::read_self(),
            container: container::detect_self(),
            cgroup: numapin::internals::cgroup::read_self(),
            thp_enabled: read("/sys/kernel/mm/transparent_hugepage/enabled"),
            thp_defrag: read("/sys/kernel/mm/transparent_hugepage/defrag"),
            huge_pages: super::huge_pages::HugePagesView::read(
                Path::new("/"),
                numapin::internals::numa::populate_write_supported(),
            ),
            numa_balancing: read("/proc/sys/kernel/numa_balancing"),
            iommu: IommuView {
                cmdline: read("/proc/cmdline"),
                units,
                groups,
                gpu_domains,
            },
        }
    }
}

/// The selected word of a sysfs choice file such as
/// `always [madvise] never` (`madvise`); a file holding one plain word gives
/// that word.
pub(super) fn selected(text: &str) -> Option<&str> {
    let text = text.trim();
    if let Some(start) = text.find('[') {
        let rest = &text[start + 1..];
        let end = rest.find(']')?;
        let word = rest[..end].trim();
        return (!word.is_empty()).then_some(word);
    }
    let mut words = text.split_whitespace();
    match (words.next(), words.next()) {
        (Some(w), None) => Some(w),
        _ => None,
    }
}

/// The IOMMU parameters of a kernel command line (`iommu=`, `intel_iommu=`,
/// `amd_iommu=`, `iommu.passthrough=`), in order, as `(name, value)`. Parameters after a lone
/// `--` belong to init and are ignored.
pub(super) fn iommu_params(cmdline: &str) -> Vec<(&str, &str)> {
    cmdline
        .split_whitespace()
        .take_while(|w| *w != "--")
        .filter_map(|w| w.split_once('='))
        .filter(|(k, _)| {
            matches!(
                *k,
                "iommu" | "intel_iommu" | "amd_iommu" | "iommu.passthrough"
            )
        })
        .collect()
}

/// A policy as `numa_maps` prints it (`default`, `bind:0-1`,
/// `prefer (many)=static:1`) as `(mode, nodes)` in `get_mempolicy`'s
/// numbers; `None` for text it does not know.
pub(super) fn parse_policy(text: &str) -> Option<(i32, Vec<u32>)> {
    let (name, nodes) = match text.split_once(':') {
        Some((n, l)) => (n, numapin::CpuList::parse(l).ok()?.iter().collect()),
        None => (text, Vec::new()),
    };
    // Mode flags (`=static`, `=relative`) follow the name.
    let name = name.split('=').next().unwrap_or(name);
    let mode = match name {
        "default" => 0,
        "prefer" => 1,
        "bind" => 2,
        "interleave" => 3,
        "local" => 4,
        "prefer (many)" => 5,
        "weighted interleave" => 6,
        _ => return None,
    };
    Some((mode, nodes))
}

/// The name of a memory policy mode as `numactl` and `numa_maps` say it.
pub(super) fn mempolicy_name(mode: i32) -> &'static str {
    // Flags (MPOL_F_STATIC_NODES, ...) sit in the high bits.
    match mode & 0xff {
        0 => "default",
        1 => "preferred",
        2 => "bind",
        3 => "interleave",
        4 => "local",
        5 => "preferred-many",
        6 => "weighted-interleave",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn selected_word() {
        assert_eq!(selected("always [madvise] never\n"), Some("madvise"));
        assert_eq!(
            selected("always defer defer+madvise [madvise] never"),
            Some("madvise")
        );
        assert_eq!(selected("[never]"), Some("never"));
        assert_eq!(selected("1\n"), Some("1"));
        assert_eq!(selected(""), None);
        assert_eq!(selected("a b"), None);
        assert_eq!(selected("a [b"), None);
        assert_eq!(selected("[]"), None);
    }

    #[test]
    fn iommu_parameters() {
        let c = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt quiet -- iommu=off";
        assert_eq!(
            iommu_params(c),
            [("intel_iommu", "on"), ("iommu", "pt")],
            "init's arguments after -- are not the kernel's"
        );
        assert!(iommu_params("quiet amd_iommu_intr=legacy").is_empty());
        assert_eq!(iommu_params("amd_iommu=off"), [("amd_iommu", "off")]);
    }

    #[test]
    fn policies_from_numa_maps_text() {
        assert_eq!(parse_policy("default"), Some((0, vec![])));
        assert_eq!(parse_policy("bind:0-1"), Some((2, vec![0, 1])));
        assert_eq!(parse_policy("prefer:3"), Some((1, vec![3])));
        assert_eq!(
            parse_policy("prefer (many)=static:1,3"),
            Some((5, vec![1, 3]))
        );
        assert_eq!(
            parse_policy("interleave=relative:0-3").map(|p| p.0),
            Some(3)
        );
        assert_eq!(parse_policy("weighted interleave:0"), Some((6, vec![0])));
        assert_eq!(parse_policy("bind:x"), None);
        assert_eq!(parse_policy("nonsense"), None);
    }

    #[test]
    fn mempolicy_names() {
        assert_eq!(mempolicy_name(2), "bind");
        // MPOL_F_STATIC_NODES (1 << 15) does not change the mode.
        assert_eq!(mempolicy_name(2 | 1 << 15), "bind");
        assert_eq!(mempolicy_name(99), "unknown");
    }

    #[test]
    fn reads_this_machine() {
        let t = numapin::topology::Topology {
            schema_version: 1,
            source: "test".into(),
            packages: vec![],
            numa_nodes: vec![],
            gpus: vec![],
            allowed: Default::default(),
            warnings: vec![],
            cores: vec![],
            caches: vec![],
            cuda: Default::default(),
            nics: vec![],
            storage: vec![],
        };
        let v = SystemView::read(&t, false);
        assert_eq!(v.cuda_driver, DriverState::NotLoaded);
        let (soft, hard) = v.memlock.clone().unwrap();
        assert!(soft <= hard);
        // Tests run with the default policy unless someone wrapped them in
        // numactl; either way the call works.
        assert!(v.mempolicy.is_ok(), "{:?}", v.mempolicy);
        assert!(v.iommu.cmdline.is_some());
    }

    proptest! {
        /// Whatever the file holds, the parser returns a word of it or nothing.
        #[test]
        fn selected_is_a_word_of_the_input(words in proptest::collection::vec("[a-z+]{1,8}", 1..6), pick in 0usize..6) {
            let pick = pick % words.len();
            let text = words
                .iter()
                .enumerate()
                .map(|(i, w)| if i == pick { format!("[{w}]") } else { w.clone() })
                .collect::<Vec<_>>()
                .join(" ");
            prop_assert_eq!(selected(&text), Some(words[pick].as_str()));
        }

        #[test]
        fn selected_never_panics(s in "\\PC*") {
            if let Some(w) = selected(&s) {
                prop_assert!(s.contains(w));
            }
        }
    }
}
