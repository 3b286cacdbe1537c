//! Kernel settings read from sysfs and procfs: transparent huge pages and
//! the IOMMU; and the parsers for their files.

use std::path::Path;

use crate::gpu::GpuIndex;
use crate::topology::Topology;

/// A file's text, `None` when it cannot be read.
pub(super) fn read_text(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The transparent huge page settings, as the files hold them
/// (`always [madvise] never`); `None` when a file is unreadable (a kernel
/// without THP).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Thp {
    /// `sys/kernel/mm/transparent_hugepage/enabled`.
    pub enabled: Option<String>,
    /// `sys/kernel/mm/transparent_hugepage/defrag`.
    pub defrag: Option<String>,
}

impl Thp {
    /// The files under `root` (`/` for this machine).
    pub fn read_under(root: &Path) -> Self {
        let (enabled, defrag) = crate::platform::hugetlb::thp_files(root);
        Thp { enabled, defrag }
    }

    /// The selected `enabled` mode (`always`, `madvise`, `never`).
    pub fn enabled_mode(&self) -> Option<&str> {
        self.enabled.as_deref().and_then(selected_word)
    }

    /// The selected `defrag` mode (`always`, `defer`, `defer+madvise`,
    /// `madvise`, `never`).
    pub fn defrag_mode(&self) -> Option<&str> {
        self.defrag.as_deref().and_then(selected_word)
    }
}

/// How the IOMMU is set up, as far as it can be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Iommu {
    /// The kernel command line (`proc/cmdline`), if readable.
    pub cmdline: Option<String>,
    /// The IOMMU units the kernel registered (`sys/class/iommu/*`: `dmar0`,
    /// `ivhd0`, ...), sorted; `None` when the folder is unreadable.
    pub units: Option<Vec<String>>,
    /// How many IOMMU groups exist (`sys/kernel/iommu_groups`).
    pub groups: Option<usize>,
    /// Each GPU's IOMMU domain type (`iommu_group/type` of its PCI device:
    /// `DMA`, `DMA-FQ`, `identity`, `unmanaged`, `blocked`), by GPU index;
    /// `None` when the GPU has no group or the file is unreadable.
    pub gpu_domains: Vec<(GpuIndex, Option<String>)>,
}

impl Iommu {
    /// Reads the IOMMU's files under `root` for the GPUs of `topo`.
    pub fn read_under(root: &Path, topo: &Topology) -> Self {
        let units = std::fs::read_dir(root.join("sys/class/iommu"))
            .ok()
            .map(|d| {
                let mut v: Vec<String> = d
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            });
        let groups = std::fs::read_dir(root.join("sys/kernel/iommu_groups"))
            .ok()
            .map(|d| d.count());
        let gpu_domains = topo
            .gpus
            .iter()
            .map(|g| {
                let path = root.join(format!(
                    "sys/bus/pci/devices/{}/iommu_group/type",
                    g.pci_bus_id
                ));
                (g.index, read_text(&path).map(|s| s.trim().to_string()))
            })
            .collect();
        Iommu {
            cmdline: read_text(&root.join("proc/cmdline")),
            units,
            groups,
            gpu_domains,
        }
    }

    /// The IOMMU parameters of the kernel command line (`iommu=`,
    /// `intel_iommu=`, `amd_iommu=`, `iommu.passthrough=`), in order, as
    /// `(name, value)`; empty when the command line is unreadable.
    pub fn params(&self) -> Vec<(&str, &str)> {
        self.cmdline
            .as_deref()
            .map(iommu_params)
            .unwrap_or_default()
    }
}

/// The selected word of a sysfs choice file such as
/// `always [madvise] never` (`madvise`); a file holding one plain word gives
/// that word.
pub(crate) fn selected_word(text: &str) -> Option<&str> {
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

/// The IOMMU parameters of a kernel command line, in order, as
/// `(name, value)`. Parameters after a lone `--` belong to init and are
/// ignored.
pub(crate) fn iommu_params(cmdline: &str) -> Vec<(&str, &str)> {
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
